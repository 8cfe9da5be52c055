#!/usr/bin/env python3
"""Replays `hybrid-trainer parity-dump` in PyTorch: the same GPT (GPT-2 or Llama variant) built
from the dumped safetensors weights, one forward/backward on the dumped batch, compared with our
loss, logits and every gradient.

Criteria (f32): loss and logits relative error < 1e-4 (norm-wise for logits); every gradient
elementwise |ours - ref| <= 1e-4 + 1e-3 * |ref|. Exit status 0 when all pass.

A bf16 dump (`parity-dump --precision bf16`) is compared with PyTorch's autocast bf16 recipe
(torch.autocast(dtype=torch.bfloat16) around the forward, f32 parameters). Two bf16 programs
round at slightly different places (PyTorch's attention rounds its probabilities to bf16 for
P·V; ours computes attention in f32 and rounds its output where c_proj casts it), so neither is
"the" bf16 result: both are measured against the exact f32 result of the same weights and batch,
and ours passes when its error is at most 2x PyTorch autocast's own error (+1e-4) in the loss,
in the logits (norm-wise) and in every gradient (norm-wise). Its distance to PyTorch autocast is
printed too.
Usage: torch_parity.py DUMP.safetensors [--device cuda|cpu]
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open


def load(path, device):
    tensors = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        for k in f.keys():
            tensors[k] = f.get_tensor(k).to(device)
    return json.loads(meta["config"]), tensors


def rope(x, base=10000.0):
    # x: [B, H, T, D], rotate-half convention, positions 0..T-1.
    _, _, t, d = x.shape
    half = d // 2
    inv = base ** (-torch.arange(0, half, device=x.device, dtype=torch.float64) * 2.0 / d)
    ang = torch.arange(t, device=x.device, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().float(), ang.sin().float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(cfg, p, x):
    llama = cfg["variant"] == "Llama"
    b, t = x.shape
    c, nh = cfg["n_embd"], cfg["n_head"]
    hd = c // nh

    def norm(h, pre, llama_name):
        if llama:
            w = p[f"{llama_name}.weight"]
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w
        return F.layer_norm(h, (c,), p[f"{pre}.weight"], p.get(f"{pre}.bias"), 1e-5)

    def linear(h, pre):
        return F.linear(h, p[f"{pre}.weight"], p.get(f"{pre}.bias"))

    h = p["transformer.wte.weight"][x]
    if not llama:
        h = h + p["transformer.wpe.weight"][torch.arange(t, device=x.device)]
    for l in range(cfg["n_layer"]):
        pre = f"transformer.h.{l}"
        a = norm(h, f"{pre}.ln_1", f"{pre}.attention_norm")
        q, k, v = linear(a, f"{pre}.attn.c_attn").split(c, dim=2)
        q, k, v = (z.view(b, t, nh, hd).transpose(1, 2) for z in (q, k, v))
        if llama:
            q, k = rope(q), rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        h = h + linear(y, f"{pre}.attn.c_proj")
        m = norm(h, f"{pre}.ln_2", f"{pre}.ffn_norm")
        if llama:
            m = linear(F.silu(linear(m, f"{pre}.mlp.w1")) * linear(m, f"{pre}.mlp.w3"), f"{pre}.mlp.w2")
        else:
            m = linear(F.gelu(linear(m, f"{pre}.mlp.c_fc")), f"{pre}.mlp.c_proj")
        h = h + m
    h = norm(h, "transformer.ln_f", "transformer.ln_f")
    head = p["lm_head.weight"] if llama else p["transformer.wte.weight"]
    return F.linear(h, head)


def run(cfg, t, names, device, bf16):
    """Loss, logits and gradients of PyTorch's model on the dump's weights and batch."""
    params = {k: t[k].clone().requires_grad_(True) for k in names}
    x, y = t["batch.x"].long(), t["batch.y"].long()
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        logits = forward(cfg, params, x)
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    return loss.item(), logits.detach().float(), {k: params[k].grad for k in names}


def compare_bf16(cfg, t, device):
    names = [k for k in t if not k.startswith(("grad.", "batch.", "out."))]
    exact = run(cfg, t, names, device, bf16=False)
    torch_bf16 = run(cfg, t, names, device, bf16=True)
    ours = (t["out.loss"].item(), t["out.logits"], {k: t[f"grad.{k}"] for k in names})

    def rel(a, b):
        if isinstance(a, float):
            return abs(a - b) / abs(b)
        return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()

    ok = True
    rows = [("loss", 0), ("logits", 1)] + [(f"grad {k}", k) for k in names]
    print(f"{'':46s} {'ours vs f32':>12s} {'torch bf16 vs f32':>18s} {'ours vs torch bf16':>19s}")
    for label, key in rows:
        pick = (lambda r: r[2][key]) if isinstance(key, str) else (lambda r: r[key])
        e_ours, e_torch = rel(pick(ours), pick(exact)), rel(pick(torch_bf16), pick(exact))
        e_between = rel(pick(ours), pick(torch_bf16))
        good = e_ours <= 2.0 * e_torch + 1e-4
        ok &= good
        print(f"{label:46s} {e_ours:12.2e} {e_torch:18.2e} {e_between:19.2e}  {'ok' if good else 'FAIL'}")
    print(f"{cfg['variant']} bf16: {'PASS' if ok else 'FAIL'} (criterion: ours vs f32 <= 2x torch autocast vs f32 + 1e-4)")
    return ok


def parse_args():
    """The command line of a parity script (the dump, --device); turns TF32 off, so that both
    sides compute in f32 (`torch_gru_parity.py` reads its command line with this too)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return args


def main():
    args = parse_args()
    cfg, t = load(args.dump, args.device)
    with safe_open(args.dump, framework="pt") as f:
        precision = f.metadata().get("precision", "fp32")
    if precision == "bf16":
        sys.exit(0 if compare_bf16(cfg, t, args.device) else 1)
    names = [k for k in t if not k.startswith(("grad.", "batch.", "out."))]
    params = {k: t[k].clone().requires_grad_(True) for k in names}
    x, y = t["batch.x"].long(), t["batch.y"].long()
    logits = forward(cfg, params, x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    loss.backward()

    ok = True
    ours_loss = t["out.loss"].item()
    rel = abs(ours_loss - loss.item()) / abs(loss.item())
    print(f"loss: ours {ours_loss:.7f}  torch {loss.item():.7f}  rel err {rel:.2e}")
    ok &= rel < 1e-4
    lo, lr = t["out.logits"], logits.detach()
    rel = ((lo - lr).norm() / lr.norm()).item()
    print(f"logits: norm-wise rel err {rel:.2e}, max abs diff {(lo - lr).abs().max().item():.2e}")
    ok &= rel < 1e-4
    worst = (0.0, "")
    for k in names:
        ours, ref = t[f"grad.{k}"], params[k].grad
        excess = ((ours - ref).abs() - (1e-4 + 1e-3 * ref.abs())).max().item()
        relg = ((ours - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if excess > worst[0] or not worst[1]:
            worst = (excess, k)
        status = "ok" if excess <= 0 else "FAIL"
        ok &= excess <= 0
        print(f"grad {k:40s} rel {relg:.2e}  max(|d| - tol) {excess:+.2e}  {status}")
    print(f"{cfg['variant']}: {'PASS' if ok else 'FAIL'} ({len(names)} gradients; tightest: {worst[1]})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
