#!/usr/bin/env python3
"""Reference trajectories of torch.optim.AdamW, schedulefree.AdamWScheduleFree and
prodigyopt.Prodigy in float64, for `crates/tensor-ops/tests/optim_reference.rs`.

Two parameters, `w` [4, 3] (weight-decayed) and `b` [3] (not), start from exactly
f32-representable values. Each step's gradient is that of a quadratic plus noise,
`g = p − target + 0.1·noise(step)`, with `target` and the noise from an integer hash (`noise`
below, which the test computes the same way, exact in f32); the test forms `g` in f64 from its
own f32 parameters and rounds it to f32. Hyper-parameters are rounded to f32 first, so that
both sides start from the same numbers and only arithmetic rounding differs. The learning rate
changes after step 10; the schedule-free run also swaps to x (eval) and back (train) there and
records x at the end. For Prodigy the script also runs PyTorch in float32 and records how far
that run ends from the float64 one (`f32_spread`, `d_f32`): the test's bound for Prodigy.

Regenerate the committed fixture (needs torch, schedulefree, prodigyopt; CPU torch is enough):

    pip install torch schedulefree prodigyopt
    python3 scripts/optim_reference.py > crates/tensor-ops/tests/fixtures/optim_reference.json
"""
import json
import struct
import sys

import torch
import schedulefree
import prodigyopt

STEPS = 20
SWITCH = 10
SHAPES = {"w": [4, 3], "b": [3]}


def f32(x):
    """x rounded to the nearest f32, as a Python float."""
    return struct.unpack("f", struct.pack("f", x))[0]


def noise(step, tensor, i):
    """A value in [-1, 1) with 24 significant bits, from a 32-bit integer hash."""
    x = (step * 1000003 + tensor * 10007 + i * 7919 + 12345) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return ((x >> 8) - (1 << 23)) / float(1 << 23)


def tensor_values(step, t):
    n = 1
    for s in SHAPES[["w", "b"][t]]:
        n *= s
    return [noise(step, t, i) for i in range(n)]


def params(dtype=torch.float64):
    """Initial parameters (step index 100000 of the hash)."""
    return [
        torch.tensor(tensor_values(100000, t), dtype=dtype).reshape(SHAPES[n]).requires_grad_()
        for t, n in enumerate(["w", "b"])
    ]


def set_grads(ps, step):
    """g = p − target + 0.1·noise(step): target from hash step 200000."""
    for t, p in enumerate(ps):
        target = torch.tensor(tensor_values(200000, t), dtype=p.dtype).reshape(p.shape)
        noise_t = torch.tensor(tensor_values(step, t), dtype=p.dtype).reshape(p.shape)
        p.grad = p.detach() - target + 0.1 * noise_t


def values(ps):
    return {n: p.detach().flatten().tolist() for n, p in zip(["w", "b"], ps)}


def set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


def groups(ps, wd):
    return [{"params": [ps[0]], "weight_decay": wd}, {"params": [ps[1]], "weight_decay": 0.0}]


def run(make, lrs, hooks=None, dtype=torch.float64):
    ps = params(dtype)
    opt = make(ps)
    if hooks and "start" in hooks:
        hooks["start"](opt)
    out = {}
    for k in range(STEPS):
        set_lr(opt, lrs[k])
        set_grads(ps, k)
        opt.step()
        if k + 1 == SWITCH:
            out["after_10"] = values(ps)
            if hooks and "switch" in hooks:
                out.update(hooks["switch"](opt, ps))
    out["after_20"] = values(ps)
    if hooks and "end" in hooks:
        out.update(hooks["end"](opt, ps))
    return out


def main():
    torch.set_default_dtype(torch.float64)
    wd = f32(0.1)
    b1, b2, eps = f32(0.9), f32(0.999), f32(1e-8)
    lr_a = [f32(0.01)] * SWITCH + [f32(0.005)] * (STEPS - SWITCH)
    runs = {}
    runs["adamw"] = dict(
        hp=dict(beta1=b1, beta2=b2, eps=eps, weight_decay=wd),
        lr=lr_a,
        **run(lambda ps: torch.optim.AdamW(groups(ps, wd), lr=lr_a[0], betas=(b1, b2), eps=eps), lr_a),
    )

    def sf_switch(opt, ps):
        opt.eval()
        x = values(ps)
        opt.train()
        return {"x_at_10": x}

    def sf_end(opt, ps):
        opt.eval()
        return {"x_at_20": values(ps)}

    runs["schedule_free"] = dict(
        hp=dict(beta1=b1, beta2=b2, eps=eps, weight_decay=wd, warmup_steps=5, r=0.0, weight_lr_power=2.0),
        lr=lr_a,
        **run(
            lambda ps: schedulefree.AdamWScheduleFree(
                groups(ps, wd), lr=lr_a[0], betas=(b1, b2), eps=eps, warmup_steps=5, foreach=False
            ),
            lr_a,
            {"start": lambda opt: opt.train(), "switch": sf_switch, "end": sf_end},
        ),
    )
    lr_p = [1.0] * SWITCH + [0.5] * (STEPS - SWITCH)
    for name, extra in [
        ("prodigy", dict(decouple=True, use_bias_correction=False)),
        ("prodigy_coupled_bc", dict(decouple=False, use_bias_correction=True)),
    ]:
        holder = {}

        def make(ps, extra=extra):
            opt = prodigyopt.Prodigy(groups(ps, wd), lr=1.0, betas=(b1, b2), eps=eps, d0=f32(1e-6), **extra)
            holder["opt"] = opt
            return opt

        out = run(make, lr_p)
        d = holder["opt"].param_groups[0]["d"]
        # PyTorch's own float32 run: how far f32 storage alone moves Prodigy (its d comes from
        # p0 − p, which f32 resolves poorly while the steps are ~d0), the test's bound.
        out32 = run(make, lr_p, dtype=torch.float32)
        spread = {
            k: max(abs(a - b) for n in ["w", "b"] for a, b in zip(out[k][n], out32[k][n]))
            for k in ["after_10", "after_20"]
        }
        runs[name] = dict(
            hp=dict(beta1=b1, beta2=b2, eps=eps, weight_decay=wd, d0=f32(1e-6), **extra),
            lr=lr_p,
            d=d,
            d_f32=holder["opt"].param_groups[0]["d"],
            f32_spread=spread,
            **out,
        )
    fixture = {
        "about": "scripts/optim_reference.py (torch %s, schedulefree, prodigyopt), float64" % torch.__version__,
        "steps": STEPS,
        "switch": SWITCH,
        "init": values(params()),
        "runs": runs,
    }
    json.dump(fixture, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
