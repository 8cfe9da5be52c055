"""PyTorch DDP peer of `hybrid-trainer launch -- train-gpt` (docs/multi-gpu.md): GPT training
throughput on 1 or more GPUs, and all-reduce bus bandwidth, for the same-run comparison.

    torchrun --nproc_per_node N torch_ddp.py gpt --data input.txt [--layers 6 --heads 6
        --embd 384 --block 256 --batch 64 (per rank) --iters 200 --precision bf16]
    torchrun --nproc_per_node N torch_ddp.py allreduce [--sizes-mib 1,16,64,256]

The model is torch_peer.py's NanoGpt (nanoGPT's, tied head, no bias), wrapped in
DistributedDataParallel (25 MiB buckets, gradients as bucket views), bf16 autocast, fused
AdamW, clipping at 1.0; the loss is read every 10 steps. Rank 0 prints one JSON line.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_peer import NanoGpt, backward_and_step


def setup():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    return rank, world, torch.device("cuda", local)


def gpt(a):
    rank, world, dev = setup()
    torch.backends.cuda.matmul.allow_tf32 = True
    text = open(a.data, encoding="utf-8").read()
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text[: len(text) * 9 // 10]], dtype=torch.long)
    torch.manual_seed(1337)
    model = NanoGpt(len(chars), a.layers, a.heads, a.embd, a.block, dropout=0.0).to(dev)
    ddp = DDP(model, device_ids=[dev.index], gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16")
    gen = torch.Generator().manual_seed(1000 + rank)

    def step():
        ix = torch.randint(len(data) - a.block, (a.batch,), generator=gen)
        x = torch.stack([data[j:j + a.block] for j in ix]).to(dev, non_blocking=True)
        y = torch.stack([data[j + 1:j + a.block + 1] for j in ix]).to(dev, non_blocking=True)
        with ctx:
            loss = ddp(x, y)
        backward_and_step(model, opt, loss)
        return loss

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(a.iters // 10):
        t0 = time.perf_counter()
        for _ in range(10):
            loss = step()
        loss.item()
        times.append((time.perf_counter() - t0) / 10)
    ms = statistics.median(times) * 1e3
    if rank == 0:
        print(json.dumps({
            "peer": "torch_ddp", "world": world, "layers": a.layers, "embd": a.embd,
            "block": a.block, "batch_per_rank": a.batch, "precision": a.precision,
            "params": sum(p.numel() for p in model.parameters()), "ms_per_step": ms,
            "tokens_per_s": world * a.batch * a.block / (ms / 1e3),
        }))
    dist.destroy_process_group()


def allreduce(a):
    rank, world, dev = setup()
    rows = []
    for mib in [int(s) for s in a.sizes_mib.split(",")]:
        n = mib * (1 << 20) // 4
        x = torch.ones(n, device=dev)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        # NCCL's bus bandwidth of an all-reduce: bytes * 2 (n - 1) / n per second.
        rows.append({"mib": mib, "us": t * 1e6, "busbw_gbs": 4 * n * 2 * (world - 1) / world / t / 1e9})
    if rank == 0:
        print(json.dumps({"peer": "torch_allreduce", "world": world, "rows": rows}))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpt")
    g.add_argument("--data", required=True)
    g.add_argument("--layers", type=int, default=6)
    g.add_argument("--heads", type=int, default=6)
    g.add_argument("--embd", type=int, default=384)
    g.add_argument("--block", type=int, default=256)
    g.add_argument("--batch", type=int, default=64, help="sequences per rank")
    g.add_argument("--iters", type=int, default=200)
    g.add_argument("--precision", default="bf16", choices=["bf16", "tf32"])
    r = sub.add_parser("allreduce")
    r.add_argument("--sizes-mib", default="1,16,64,256")
    r.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    if a.cmd == "gpt" and a.iters < 10:
        p.error("--iters must be at least 10 (steps are timed in groups of 10)")
    if a.cmd == "allreduce" and a.reps < 1:
        p.error("--reps must be at least 1")
    gpt(a) if a.cmd == "gpt" else allreduce(a)


if __name__ == "__main__":
    main()
