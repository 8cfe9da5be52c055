#!/usr/bin/env python3
"""numpy and PyTorch CPU peer of `cpu-bench`: the same rows timed in this run, 2 threads.

Rows (one `id median_us` line each, then a JSON list):
  sgemm_1024, sgemm_2048   fp32 C = A·B, n³; numpy (its BLAS) as `numpy_sgemm_*`, torch.mm as
                           `torch_sgemm_*`
  gpt_cpu_step             the tiny GPT (vocab of the text, 4 layers, 4 heads, width 128, ctx 64,
                           batch 12, dropout 0, GELU MLP, no biases, tied head; tensor-ops'
                           `GptConfig::tiny`), one training step:
                           batch, forward, backward, clip 1.0, AdamW (non-fused, CPU), loss.item()
Usage: python3 benches/torch_cpu_peer.py [--reps N] [--gpt-text FILE] [--threads N]
                                        [--sizes 1024,1536,2048]
"""
import argparse
import json

from host_timing import median_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--gpt-text", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="1024,2048", help="SGEMM sizes, comma-separated ('' for none)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []

    def add(id_, us):
        rows.append({"id": id_, "median_us": us})
        print(f"{id_} {us:.1f}", flush=True)

    import numpy as np
    rng = np.random.default_rng(1)
    for n in sizes:
        a = rng.uniform(-2, 2, (n, n)).astype(np.float32)
        b = rng.uniform(-2, 2, (n, n)).astype(np.float32)
        add(f"numpy_sgemm_{n}", median_us(lambda: a @ b, args.reps))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
        for n in sizes:
            a = torch.rand(n, n) * 4 - 2
            b = torch.rand(n, n) * 4 - 2
            add(f"torch_sgemm_{n}", median_us(lambda: torch.mm(a, b), args.reps))
        if args.gpt_text:
            gpt_row(torch, add, args.gpt_text, args.reps)
    print(json.dumps(rows))


def gpt_row(torch, add, path, reps):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # gpu-bench's peer: the same GPT (no biases, tied head) and the same timed step.
    from torch_peer import NanoGpt, gpt_train_step

    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    idx = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([idx[c] for c in text[: len(text) * 9 // 10]], dtype=torch.long)
    T, B = 64, 12

    torch.manual_seed(1)
    model = NanoGpt(len(chars), n_layer=4, n_head=4, c=128, block=T, dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)

    def step():
        gpt_train_step(model, opt, data, T, B, "cpu", g)

    add("gpt_cpu_step", median_us(step, max(reps, 20), warmup=5))


if __name__ == "__main__":
    main()
