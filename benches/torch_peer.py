#!/usr/bin/env python3
"""PyTorch peer of gpu-bench: the same ops, sizes and timing method (CUDA events, median of
timed calls after 3 warm-ups, inputs rotated over two sets). Prints a JSON list of rows."""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

ROWS, COLS = 8192, 4096


def time_us(fn, reps):
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(reps):
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    reps = ap.parse_args().reps
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []

    def add(id_, us, bytes_=None, flops=None):
        rows.append({"id": id_, "what": id_, "median_us": us, "bytes": bytes_, "flops": flops})

    n = 1 << 28
    src, dst = torch.randn(n, device=dev), torch.empty(n, device=dev)
    add("copy", time_us(lambda i: dst.copy_(src), reps), 2.0 * n * 4)
    del src, dst
    for id_, size, tf32 in [("sgemm_1024", 1024, False), ("sgemm_4096", 4096, False),
                            ("sgemm_8192", 8192, False), ("tf32_4096", 4096, True)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = torch.randn(size, size, device=dev), torch.randn(size, size, device=dev)
        c = torch.empty(size, size, device=dev)
        add(id_, time_us(lambda i: torch.mm(a, b, out=c), reps), None, 2.0 * size ** 3)
    torch.backends.cuda.matmul.allow_tf32 = False

    nb = ROWS * COLS * 4.0
    xs = [torch.rand(ROWS, COLS, device=dev) * 8 - 4 for _ in range(2)]
    ys = [torch.rand(ROWS, COLS, device=dev) * 8 - 4 for _ in range(2)]
    o = torch.empty(ROWS, COLS, device=dev)
    add("vector_add", time_us(lambda i: torch.add(xs[i % 2], ys[i % 2], out=o), reps), 3 * nb)
    add("add", time_us(lambda i: torch.add(xs[i % 2], ys[i % 2], out=o), reps), 3 * nb)
    add("mul", time_us(lambda i: torch.mul(xs[i % 2], ys[i % 2], out=o), reps), 3 * nb)
    add("relu", time_us(lambda i: torch.clamp_min(xs[i % 2], 0.0, out=o), reps), 2 * nb)
    add("sigmoid", time_us(lambda i: torch.sigmoid(xs[i % 2], out=o), reps), 2 * nb)
    add("tanh", time_us(lambda i: torch.tanh(xs[i % 2], out=o), reps), 2 * nb)
    add("softmax", time_us(lambda i: torch.softmax(xs[i % 2], dim=-1), reps), 2 * nb)
    g, b = torch.randn(COLS, device=dev), torch.randn(COLS, device=dev)
    add("layernorm", time_us(lambda i: F.layer_norm(xs[i % 2], (COLS,), g, b, 1e-5), reps), 2 * nb)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
