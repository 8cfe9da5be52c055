#!/usr/bin/env python3
"""PyTorch peer of gpu-bench: the same ops, sizes and timing method (CUDA events around a burst
of calls queued back to back, the median over samples after 3 warm-ups, inputs rotated over two
sets). Prints a JSON list of rows."""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

ROWS, COLS = 8192, 4096
# The bf16 rows: 8192 × 8192 bf16, 128 MiB a tensor (the f32 rows' bytes).
BROWS, BCOLS = 8192, 8192


# Calls a sample times back to back (gpu-bench's --burst): 1 times each call alone.
BURST = 10


def time_us(fn, reps, burst=None):
    """Median µs per call: each of `reps` samples times `burst` (default BURST) calls queued
    back to back. The world model's rows pass 1, as gpu-bench times its whole calls alone."""
    burst = BURST if burst is None else burst
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(reps):
        start.record()
        for j in range(burst):
            fn(i * burst + j)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / burst)
    return statistics.median(samples)


def time_graph_us(fn, reps, burst=None, side=None):
    """As `time_us`, with each burst captured once as a CUDA graph and replayed: the kernels'
    own throughput where PyTorch's host work per call outlasts them (SDPA at these sizes).
    A backward is captured on `side`, the stream its forward ran on."""
    burst = BURST if burst is None else burst
    side = torch.cuda.Stream() if side is None else side
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for j in range(burst):
            fn(j)
    return time_us(lambda i: graph.replay(), reps, 1) / burst


def bf16_rows(add, reps, dev):
    """The memory-bound bf16 kernels (ids as gpu-bench's nn_bf16 rows)."""
    hb = BROWS * BCOLS * 2.0
    xb = [(torch.rand(BROWS, BCOLS, device=dev) * 8 - 4).to(torch.bfloat16) for _ in range(2)]
    db = [torch.randn(BROWS, BCOLS, device=dev).to(torch.bfloat16) for _ in range(2)]
    o = torch.empty_like(xb[0])
    add("copy_bf16", time_us(lambda i: o.copy_(xb[i % 2]), reps), 2 * hb)
    xs = [z.float() for z in xb]
    add("cast_f32_bf16", time_us(lambda i: xs[i % 2].to(torch.bfloat16), reps), 3 * hb)
    del xs
    add("cast_bf16_f32", time_us(lambda i: xb[i % 2].float(), reps), 3 * hb)
    add("add_bf16", time_us(lambda i: torch.add(xb[i % 2], db[0], out=o), reps), 3 * hb)
    add("gelu_bf16", time_us(lambda i: F.gelu(xb[i % 2]), reps), 2 * hb)
    add("gelu_bwd_bf16", time_us(lambda i: torch.ops.aten.gelu_backward(db[i % 2], xb[0]), reps), 3 * hb)
    add("dropout_bf16", time_us(lambda i: F.dropout(xb[i % 2], 0.2, True), reps), 2 * hb)
    bias = db[1][0].clone()
    add("bias_add_bf16", time_us(lambda i: torch.add(xb[i % 2], bias, out=o), reps), 2 * hb)
    add("sum_rows_bf16", time_us(lambda i: xb[i % 2].sum(1), reps), hb)
    add("sum_cols_bf16", time_us(lambda i: xb[i % 2].sum(0), reps), hb)
    pshape = (BROWS * BCOLS // (256 * 4 * 64), 256, 4, 64)
    oshape = (pshape[0], pshape[2], pshape[1], pshape[3])
    add("permute_bf16", time_us(lambda i: o.view(oshape).copy_(xb[i % 2].view(pshape).permute(0, 2, 1, 3)), reps), 2 * hb)
    del xb, db, o


def nn_rows(add, reps, dev):
    nb = ROWS * COLS * 4.0
    xs = [torch.rand(ROWS, COLS, device=dev) * 8 - 4 for _ in range(2)]
    dys = [torch.randn(ROWS, COLS, device=dev) for _ in range(2)]
    add("gelu", time_us(lambda i: F.gelu(xs[i % 2]), reps), 2 * nb)
    add("silu", time_us(lambda i: F.silu(xs[i % 2]), reps), 2 * nb)
    x = xs[0].clone().requires_grad_(True)
    y = torch.softmax(x, -1)
    add("softmax_bwd", time_us(lambda i: torch.autograd.grad(y, x, dys[i % 2], retain_graph=True), reps), 3 * nb)
    w, b = torch.rand(COLS, device=dev) + 0.5, torch.randn(COLS, device=dev)
    add("layernorm_fwd", time_us(lambda i: F.layer_norm(xs[i % 2], (COLS,), w, b, 1e-5), reps), 2 * nb)
    y = F.layer_norm(x, (COLS,), w, b, 1e-5)
    add("layernorm_bwd", time_us(lambda i: torch.autograd.grad(y, x, dys[i % 2], retain_graph=True), reps), 3 * nb)
    add("rmsnorm_fwd", time_us(lambda i: F.rms_norm(xs[i % 2], (COLS,), w, 1e-5), reps), 2 * nb)
    y = F.rms_norm(x, (COLS,), w, 1e-5)
    add("rmsnorm_bwd", time_us(lambda i: torch.autograd.grad(y, x, dys[i % 2], retain_graph=True), reps), 3 * nb)
    del x, y
    del xs, dys
    # bf16 SDPA on the views a GPT makes of its fused projection (as gpu-bench's bf16 rows).
    n, h, t, d = 64, 6, 256, 64
    qkv = torch.randn(n, t, 3 * h * d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    qb, kb, vb = (z.view(n, t, h, d).transpose(1, 2) for z in qkv.split(h * d, 2))
    flops_b = 4.0 * n * h * t * t * d / 2
    # SDPA's host work per call is about as long as its kernels here: its bursts are timed as
    # replayed CUDA graphs (gpu-bench's own launches keep ahead of the GPU).
    add("attn_fwd_bf16", time_graph_us(lambda i: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True), reps), None, flops_b)
    bwd_stream = torch.cuda.Stream()
    bwd_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(bwd_stream):  # the whole forward, leaf and views too, on that stream
        qkv = qkv.detach().clone().requires_grad_(True)
        qb, kb, vb = (z.view(n, t, h, d).transpose(1, 2) for z in qkv.split(h * d, 2))
        ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
        dob = torch.randn_like(ob)
    add("attn_bwd_bf16", time_graph_us(lambda i: torch.autograd.grad(ob, qkv, dob, retain_graph=True), reps,
                                       side=bwd_stream), None, 2.5 * flops_b)
    del qkv, qb, kb, vb, ob, dob
    q, k, v = (torch.randn(n, h, t, d, device=dev, requires_grad=True) for _ in range(3))
    flops = 4.0 * n * h * t * t * d / 2
    add("attn_fwd", time_us(lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps), None, flops)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    do = torch.randn_like(o)
    add("attn_bwd", time_us(lambda i: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), reps), None, 2.5 * flops)
    del q, k, v, o, do
    model = NanoGpt(65).to(dev)
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    total = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    add("adamw", time_us(lambda i: opt.step(), reps), 7.0 * 4 * total)


class NanoGpt(torch.nn.Module):
    """nanoGPT's shakespeare-char model (6 layers, 6 heads, width 384, ctx 256, no bias, tied head)."""

    def __init__(self, vocab, n_layer=6, n_head=6, c=384, block=256, dropout=0.2):
        super().__init__()
        nn = torch.nn
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.h = nn.ModuleList()
        for _ in range(n_layer):
            blk = nn.Module()
            blk.ln_1, blk.ln_2 = nn.LayerNorm(c, bias=False), nn.LayerNorm(c, bias=False)
            blk.c_attn, blk.c_proj = nn.Linear(c, 3 * c, bias=False), nn.Linear(c, c, bias=False)
            blk.fc, blk.proj = nn.Linear(c, 4 * c, bias=False), nn.Linear(4 * c, c, bias=False)
            self.h.append(blk)
        self.ln_f = nn.LayerNorm(c, bias=False)
        self.n_head, self.c, self.p = n_head, c, dropout

    def forward(self, x, y):
        b, t = x.shape
        h = F.dropout(self.wte(x) + self.wpe(torch.arange(t, device=x.device)), self.p, self.training)
        for blk in self.h:
            q, k, v = blk.c_attn(blk.ln_1(h)).split(self.c, 2)
            q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in (q, k, v))
            # nanoGPT's attn_dropout: dropout of the attention probabilities in training.
            drop = self.p if self.training else 0.0
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
            a = a.transpose(1, 2).reshape(b, t, self.c)
            h = h + F.dropout(blk.c_proj(a), self.p, self.training)
            h = h + F.dropout(blk.proj(F.gelu(blk.fc(blk.ln_2(h)))), self.p, self.training)
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def gpt_train_step(model, opt, data, block, batch, dev, gen=None):
    """One training step as the GPT rows of gpu-bench and cpu-bench time it: a random batch of
    `batch` windows of `block` tokens, forward, backward, clip 1.0, AdamW, loss.item()."""
    gpt_step_queued(model, opt, data, block, batch, dev, gen).item()


def gpt_pipelined_us(step, rounds=5, per=10):
    """Median over `rounds` of the mean time of `per` steps queued back to back with one loss
    read-back at the end (training with a log interval), after one untimed round."""
    import time
    times = []
    for r in range(rounds + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per):
            loss = step()
        loss.item()
        if r > 0:
            times.append((time.perf_counter() - t0) * 1e6 / per)
    return statistics.median(times)


def gpt_step_queued(model, opt, data, block, batch, dev, gen=None):
    """`gpt_train_step` without the per-step loss.item(): returns the loss tensor."""
    ix = torch.randint(len(data) - block, (batch,), generator=gen)
    x = torch.stack([data[j:j + block] for j in ix]).to(dev)
    y = torch.stack([data[j + 1:j + block + 1] for j in ix]).to(dev)
    loss = model(x, y)
    backward_and_step(model, opt, loss)
    return loss


def backward_and_step(model, opt, loss):
    """The peers' update after a forward that gave `loss`: gradients zeroed (set to None),
    backward, `model`'s gradients clipped to a global norm of 1.0, one step of `opt`."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def gpt_rows(add, path, dev):
    import time
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text[: len(text) * 9 // 10]], dtype=torch.long)
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        model = NanoGpt(len(chars)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
        times = []
        for i in range(13):
            t0 = time.perf_counter()
            gpt_train_step(model, opt, data, 256, 64, dev)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e6)
        add("gpt_step_tf32" if tf32 else "gpt_step", statistics.median(times))
    # Steps queued with the loss read every 10 (as a training loop with a log interval), TF32
    # and bf16 autocast (nanoGPT's recipe: torch.autocast around the forward and the loss, f32
    # parameters and fused AdamW): eager, and the model under torch.compile (default mode).
    torch.backends.cuda.matmul.allow_tf32 = True
    for precision in ("tf32", "bf16"):
        for compiled in (False, True):
            model = NanoGpt(len(chars)).to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
            ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
            try:
                m = torch.compile(model) if compiled else model

                def step():
                    with ctx:
                        return gpt_step_queued(m, opt, data, 256, 64, dev)

                t0 = time.perf_counter()
                step().item()  # compiles when compiled
                print(f"gpt {precision} compiled={compiled}: first step {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                us = gpt_pipelined_us(step)
                add(f"gpt_pipe_{precision}_compile" if compiled else f"gpt_pipe_{precision}", us)
            except Exception as e:  # noqa: BLE001 - reported, the other rows stand
                print(f"gpt {precision} compiled={compiled} failed: {e}", file=sys.stderr)
    torch.backends.cuda.matmul.allow_tf32 = False


def rssm_rows(add, reps, dev):
    """Seed A's table at batch 32 and the randomized SVDs (ids as gpu-bench's rssm rows)."""
    nn = torch.nn
    torch.manual_seed(0)
    b = 32
    enc = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.ReLU()).to(dev).eval()
    x = torch.randn(b, 64, device=dev)
    with torch.no_grad():
        add("rssm_encode", time_us(lambda i: enc(x), reps, 1))
        # The rollout: Linear(64→128)+ReLU, 5 × GRUCell(128→256) × 10 steps with
        # Linear(256→128) feedback; eager and captured in a CUDA graph.
        inp = nn.Sequential(nn.Linear(64, 128), nn.ReLU()).to(dev)
        cells = [nn.GRUCell(128, 256).to(dev) for _ in range(5)]
        back = [nn.Linear(256, 128).to(dev) for _ in range(5)]

        def rollout():
            e = inp(x)
            outs = []
            for c, f in zip(cells, back):
                h = torch.zeros(b, 256, device=dev)
                z = e
                for _ in range(10):
                    h = c(z, h)
                    z = f(h)
                outs.append(h)
            return torch.stack(outs)

        add("rssm_rollout", time_us(lambda i: rollout(), reps, 1))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                rollout()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            rollout()
        add("rssm_rollout_graph", time_us(lambda i: g.replay(), reps, 1))
        for m, k in [(1024, 32), (4096, 64)]:
            gen = torch.Generator(device=dev).manual_seed(1)
            a = (torch.randn(m, k, device=dev, generator=gen) @ torch.randn(k, m, device=dev, generator=gen)
                 + 0.01 * torch.randn(m, m, device=dev, generator=gen))
            u, sv, v = torch.svd_lowrank(a, q=k, niter=2)
            err = (torch.linalg.norm(a - (u * sv) @ v.T) / torch.linalg.norm(a)).item()
            rows_id = f"svd_{m}_k{k}"
            add(rows_id, time_us(lambda i: torch.svd_lowrank(a, q=k, niter=2), min(reps, 20), 1))
            print(f"torch {rows_id}: rel err {err:.3e}", file=sys.stderr)
        w = torch.randn(1024, 1024, device=dev)
        u, sv, v = torch.randn(1024, 32, device=dev), torch.rand(32, device=dev), torch.randn(1024, 32, device=dev)
        add("correction_1024_k32", time_us(lambda i: w.addmm_(u * sv, v.T), reps, 1),
            2.0 * 1024 * 1024 * 4, 2.0 * 1024 * 1024 * 32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--burst", type=int, default=10,
                    help="calls timed back to back in each sample (1: each call alone)")
    ap.add_argument("--gpt-text", default=None)
    ap.add_argument("--only-gpt", action="store_true")
    ap.add_argument("--only-bf16", action="store_true",
                    help="only the copy ceiling and the memory-bound bf16 rows")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="run this many TF32 GPT steps after 1 warm-up step and exit (for ncu)")
    args = ap.parse_args()
    global BURST  # noqa: PLW0603 (the timing helper's default, set once from the flag)
    BURST = max(args.burst, 1)
    reps = args.reps
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []

    def add(id_, us, bytes_=None, flops=None):
        rows.append({"id": id_, "what": id_, "median_us": us, "bytes": bytes_, "flops": flops})

    if args.profile_steps:
        text = open(args.gpt_text, encoding="utf-8").read()
        chars = sorted(set(text))
        data = torch.tensor([chars.index(c) for c in text[: len(text) * 9 // 10]], dtype=torch.long)
        torch.backends.cuda.matmul.allow_tf32 = True
        model = NanoGpt(len(chars)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
        for _ in range(1 + args.profile_steps):
            gpt_step_queued(model, opt, data, 256, 64, dev)
        torch.cuda.synchronize()
        return
    if args.only_gpt:
        gpt_rows(add, args.gpt_text, dev)
        print(json.dumps(rows))
        return
    n = 1 << 28
    src, dst = torch.randn(n, device=dev), torch.empty(n, device=dev)
    add("copy", time_us(lambda i: dst.copy_(src), reps), 2.0 * n * 4)
    del src, dst
    if args.only_bf16:
        bf16_rows(add, reps, dev)
        print(json.dumps(rows))
        return
    for id_, size, tf32 in [("sgemm_1024", 1024, False), ("sgemm_4096", 4096, False),
                            ("sgemm_8192", 8192, False), ("tf32_4096", 4096, True)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = torch.randn(size, size, device=dev), torch.randn(size, size, device=dev)
        c = torch.empty(size, size, device=dev)
        add(id_, time_us(lambda i: torch.mm(a, b, out=c), reps), None, 2.0 * size ** 3)
    torch.backends.cuda.matmul.allow_tf32 = False
    for id_, m, n, k in [("bf16_4096", 4096, 4096, 4096), ("bf16_gpt_qkv", 16384, 1152, 384),
                         ("bf16_gpt_fc", 16384, 1536, 384), ("bf16_gpt_proj", 16384, 384, 1536)]:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        add(id_, time_us(lambda i: torch.mm(a, b, out=c), reps), None, 2.0 * m * n * k)
    del a, b, c

    nb = ROWS * COLS * 4.0
    xs = [torch.rand(ROWS, COLS, device=dev) * 8 - 4 for _ in range(2)]
    ys = [torch.rand(ROWS, COLS, device=dev) * 8 - 4 for _ in range(2)]
    o = torch.empty(ROWS, COLS, device=dev)
    add("add", time_us(lambda i: torch.add(xs[i % 2], ys[i % 2], out=o), reps), 3 * nb)
    add("mul", time_us(lambda i: torch.mul(xs[i % 2], ys[i % 2], out=o), reps), 3 * nb)
    add("relu", time_us(lambda i: torch.clamp_min(xs[i % 2], 0.0, out=o), reps), 2 * nb)
    add("sigmoid", time_us(lambda i: torch.sigmoid(xs[i % 2], out=o), reps), 2 * nb)
    add("tanh", time_us(lambda i: torch.tanh(xs[i % 2], out=o), reps), 2 * nb)
    add("softmax", time_us(lambda i: torch.softmax(xs[i % 2], dim=-1), reps), 2 * nb)
    g, b = torch.randn(COLS, device=dev), torch.randn(COLS, device=dev)
    del xs, ys, o
    nn_rows(add, reps, dev)
    bf16_rows(add, reps, dev)
    rssm_rows(add, reps, dev)
    if args.gpt_text:
        gpt_rows(add, args.gpt_text, dev)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
