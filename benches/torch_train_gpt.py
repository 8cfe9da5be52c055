#!/usr/bin/env python3
"""PyTorch's side of the time-to-validation-loss row: nanoGPT's shakespeare-char recipe with the
hyperparameters `hybrid-trainer train-gpt` uses by default (6 layers × 6 heads × width 384,
context 256, batch 64, dropout 0.2 (embeddings, attention probabilities, residual branches), no biases, tied head, nanoGPT's init, AdamW lr 1e-3 betas
(0.9, 0.99) weight decay 0.1 on matrices, warm-up 100, cosine to 1e-4 over the run's iterations
(nanoGPT's config: 5000 of 5000; `--lr-decay-iters` sets another length), clip 1.0;
evaluation every 250 iterations on 50 random batches of each split). Training time excludes
the evaluations (synchronised at their boundaries), as `train-gpt` reports it.

Usage: torch_train_gpt.py TEXT [--precision bf16|tf32|fp32] [--iters N] [--compile] [--seed S]
                          [--lr PEAK] [--lr-decay-iters N]
Prints one line per evaluation, the first iteration whose validation loss is <= 1.50 and the
best validation loss.
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import NanoGpt, backward_and_step  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--iters", type=int, default=1500)
    ap.add_argument("--eval-interval", type=int, default=250)
    ap.add_argument("--eval-iters", type=int, default=50)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="peak rate; the cosine ends at a tenth of it (train-gpt's --lr, --min-lr)")
    ap.add_argument("--lr-decay-iters", type=int, default=None,
                    help="cosine decay length (default: --iters, at least the warm-up; as train-gpt)")
    a = ap.parse_args()
    dev = "cuda"
    decay_iters = a.lr_decay_iters if a.lr_decay_iters is not None else max(a.iters, 100)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = a.precision != "fp32"
    torch.backends.cudnn.allow_tf32 = a.precision != "fp32"
    text = open(a.text, encoding="utf-8").read()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    n = len(ids) * 9 // 10
    splits = {"train": ids[:n], "val": ids[n:]}
    block, batch = 256, 64

    def get_batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - block, (batch,))
        x = torch.stack([d[i:i + block] for i in ix]).pin_memory().to(dev, non_blocking=True)
        y = torch.stack([d[i + 1:i + block + 1] for i in ix]).pin_memory().to(dev, non_blocking=True)
        return x, y

    model = NanoGpt(len(chars)).to(dev)
    # nanoGPT's init: N(0, 0.02), the residual projections scaled by 1/sqrt(2·n_layer).
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * 6) if name.endswith(("c_proj.weight", "proj.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.99), fused=True)
    m = torch.compile(model) if a.compile else model
    ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def lr_at(it):
        if it < 100:
            return a.lr * (it + 1) / 101
        if it > decay_iters:
            return a.lr / 10
        r = (it - 100) / max(decay_iters - 100, 1)
        return a.lr / 10 + 0.5 * (1.0 + math.cos(math.pi * r)) * (a.lr - a.lr / 10)

    @torch.no_grad()
    def evaluate():
        m.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(a.eval_iters)
            for k in range(a.eval_iters):
                x, y = get_batch(split)
                with ctx:
                    losses[k] = m(x, y).item()
            out[split] = losses.mean().item()
        m.train()
        return out

    train_s, reached, best = 0.0, None, (math.inf, 0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for it in range(a.iters + 1):
        if it % a.eval_interval == 0 or it == a.iters:
            torch.cuda.synchronize()
            train_s += time.perf_counter() - t0
            ev = evaluate()
            print(f"iter {it}: train {ev['train']:.4f} val {ev['val']:.4f} "
                  f"({train_s:.1f} s of training)", flush=True)
            if ev["val"] < best[0]:
                best = (ev["val"], it)
            if reached is None and ev["val"] <= 1.50:
                reached = (it, train_s)
            if it == a.iters:
                break
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        x, y = get_batch("train")
        with ctx:
            loss = m(x, y)
        backward_and_step(model, opt, loss)
    tokens = a.iters * batch * block
    print(f"{a.precision}{' compiled' if a.compile else ''}: {tokens / train_s / 1e3:.0f}K tokens/s; "
          + (f"val <= 1.50 first at iter {reached[0]} after {reached[1]:.1f} s of training"
             if reached else "val never <= 1.50")
          + f"; best val {best[0]:.4f} at iter {best[1]}")


if __name__ == "__main__":
    main()
