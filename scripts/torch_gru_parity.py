#!/usr/bin/env python3
"""Replays `hybrid-trainer parity-dump --model gru` with torch.nn.GRUCell: the same cell (the
dumped weight_ih, weight_hh, bias_ih, bias_hh copied in), unrolled over the dumped inputs
x [T, B, in] from h0 [B, H], loss = sum_t <h_t, dh_t>, one backward. Compared with our hidden
states, loss and the gradients of all four parameters, of x and of h0.

Reference: PyTorch in float64 (from the same float32 weights and inputs). PyTorch in float32 is
replayed too and measured against the same reference, to show the float32 rounding level.
Criterion, per tensor and elementwise (float32 rounding passes with a wide margin; a wrong gate,
chunk order or gradient is off by O(|ref|)):

    |ours - ref64| <= 1e-5 * max|ref64| + 1e-4 * |ref64|

Exit status 0 when every tensor passes, 1 when one fails, 2 when the file is not a GRU dump.
No network; needs torch and safetensors.
Usage: torch_gru_parity.py DUMP.safetensors [--device cuda|cpu]
"""
import json
import sys

import torch
from safetensors import safe_open

from torch_parity import parse_args

ATOL_OF_MAX = 1e-5
RTOL = 1e-4


def load(path):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "config" not in meta:
        raise ValueError("no 'config' in the metadata")
    cfg = json.loads(meta["config"])
    if cfg.get("model") != "gru":
        raise ValueError(f"not a GRU dump (model {cfg.get('model')!r})")
    return cfg, tensors


def param_names(cfg):
    return ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if cfg["bias"] else [])


def replay(cfg, t, dtype, device):
    """PyTorch's GRUCell over the dumped sequence; every output as float64 on the CPU."""
    cell = torch.nn.GRUCell(
        cfg["input_size"], cfg["hidden_size"], bias=cfg["bias"], device=device, dtype=dtype
    )
    with torch.no_grad():
        for n in param_names(cfg):
            p = getattr(cell, n)
            if tuple(t[n].shape) != tuple(p.shape):
                raise ValueError(f"{n}: shape {tuple(t[n].shape)}, GRUCell has {tuple(p.shape)}")
            p.copy_(t[n].to(device=device, dtype=dtype))
    x = t["in.x"].to(device=device, dtype=dtype).clone().requires_grad_(True)
    h0 = t["in.h0"].to(device=device, dtype=dtype).clone().requires_grad_(True)
    dh = t["in.dh"].to(device=device, dtype=dtype)
    h, states = h0, []
    for s in range(x.shape[0]):
        h = cell(x[s], h)
        states.append(h)
    hs = torch.stack(states)
    loss = (hs * dh).sum()
    loss.backward()
    out = {"out.h": hs, "out.loss": loss.reshape(1), "grad.x": x.grad, "grad.h0": h0.grad}
    for n in param_names(cfg):
        out[f"grad.{n}"] = getattr(cell, n).grad
    return {k: v.detach().to("cpu", torch.float64) for k, v in out.items()}


def measure(val, ref):
    """(max(|d| - tol), max |d|, norm-wise relative error); NaN-safe (NaN fails)."""
    if not torch.isfinite(val).all():
        return float("inf"), float("inf"), float("inf")
    d = (val - ref).abs()
    tol = ATOL_OF_MAX * ref.abs().max() + RTOL * ref.abs()
    rel = (d.norm() / ref.norm().clamp_min(1e-300)).item()
    return (d - tol).max().item(), d.max().item(), rel


def main():
    args = parse_args()
    try:
        cfg, t = load(args.dump)
        keys = ["out.h", "out.loss"] + [f"grad.{n}" for n in param_names(cfg)] + ["grad.x", "grad.h0"]
        missing = [k for k in keys + param_names(cfg) + ["in.x", "in.h0", "in.dh"] if k not in t]
        if missing:
            raise ValueError(f"missing tensors: {missing}")
        ref64 = replay(cfg, t, torch.float64, args.device)
        ref32 = replay(cfg, t, torch.float32, args.device)
    except Exception as e:  # a missing, corrupt or foreign file: report, never a traceback
        print(f"GRU cell: FAIL (cannot replay {args.dump}: {e})")
        sys.exit(2)
    print(
        f"GRU cell: input {cfg['input_size']}, hidden {cfg['hidden_size']}, batch {cfg['batch']}, "
        f"{cfg['steps']} steps, dumped on {cfg.get('device', '?')}; torch {torch.__version__} on "
        f"{args.device}, reference float64"
    )
    print(f"criterion: |ours - ref64| <= {ATOL_OF_MAX:g}*max|ref64| + {RTOL:g}*|ref64|")
    print(f"{'tensor':16s} {'shape':>14s} {'max|ref|':>9s} | {'ours max|d|':>11s} {'rel':>8s} "
          f"{'excess':>9s} | {'torch32 max|d|':>14s} {'rel':>8s}")
    ok, worst = True, (float("-inf"), "")
    for k in keys:
        ours, ref = t[k].to(torch.float64), ref64[k]
        if tuple(ours.shape) != tuple(ref.shape):
            print(f"{k:16s} shape {tuple(ours.shape)} vs torch {tuple(ref.shape)}  FAIL")
            ok = False
            continue
        ex, dmax, rel = measure(ours, ref)
        _, dmax32, rel32 = measure(ref32[k], ref)
        passed = ex <= 0
        ok &= passed
        if ex > worst[0]:
            worst = (ex, k)
        shape = "x".join(str(s) for s in ours.shape)
        print(f"{k:16s} {shape:>14s} {ref.abs().max().item():9.3e} | {dmax:11.3e} {rel:8.1e} "
              f"{ex:+9.2e} | {dmax32:14.3e} {rel32:8.1e}  {'ok' if passed else 'FAIL'}")
    loss_ours, loss_ref = t["out.loss"].item(), ref64["out.loss"].item()
    print(f"loss: ours {loss_ours:.7f}  torch float64 {loss_ref:.7f}  "
          f"rel err {abs(loss_ours - loss_ref) / max(abs(loss_ref), 1e-300):.2e}")
    print(f"GRU cell: {'PASS' if ok else 'FAIL'} ({len(keys)} tensors; tightest: {worst[1]}, "
          f"excess {worst[0]:+.2e})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
