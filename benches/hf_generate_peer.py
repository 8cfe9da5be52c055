#!/usr/bin/env python3
"""Hugging Face `transformers` peer of the Rust inference engine (issue 30, item 7).

usage: python3 benches/hf_generate_peer.py [--models 1b,3b] [--new-tokens 128] [--repeats 3]
           [--save DIR] [--out FILE.json] [--no-static] [--static-timeout 300] [--tiny]

Models: Llama-3.2-1B and -3B shapes and GPT-2 124M (CONFIGS below), random weights (seeded, nothing
downloaded), bf16, on cuda, attention through PyTorch's SDPA (attn_implementation="sdpa"; the
JSON records what transformers reports). --tiny: a 2-layer model on the CPU, to test the script.

Prompts: seeded random ids, the same for every model: prompt_512 [1, 512], prompt_2048
[1, 2048], batch16_512 [16, 512] (16 distinct prompts). --save DIR writes them to
DIR/prompts.safetensors (int64) and each model to DIR/<name> with save_pretrained (bf16
model.safetensors, config.json; generation_config.json deleted), plus DIR/<name>/greedy.safetensors
with eager generate's new tokens (b1 [1, N], b16 [16, N]), so the Rust engine times identical
work on the very same weights and can check its tokens.

Timing: a run is timed by the host clock (perf_counter) between two torch.cuda.synchronize()
calls, so it includes transformers' host work, as a user sees it. Each figure is the median of
its timed runs; warm-up runs are not timed. Every sample goes to the JSON (--out).

Figures, per model (N = --new-tokens, P = 512, b = batch):
  ttft_ms           generate(prompt_512, max_new_tokens=1), batch 1: the prompt's forward (the
                    head on the last position only) and the greedy pick. Median of 10, 2 warm-ups.
  prefill_tok_s[L]  L / the time of one forward model(ids, use_cache=True, logits_to_keep=1) over
                    prompt_512 or prompt_2048 at batch 1 (the KV cache written, the head on the
                    last position, as generate's prefill). Median of 10 after 2 warm-ups.
  eager decode_tok_s[b]  b = 1 (prompt_512) or 16 (batch16_512): greedy generate with the default
                    DynamicCache, N new tokens (min_new_tokens = N, so EOS never stops it), total
                    time T_N (median of --repeats after 1 warm-up); prefill time T_1 = the same
                    call with max_new_tokens=1 (median of 10 after 2 warm-ups).
                    decode_tok_s = (N-1)*b / (T_N - T_1): the prefill gives the first token, the
                    N-1 decode steps the rest.
  static decode_tok_s[b]  the same with cache_implementation="static" and
                    compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead",
                    dynamic=False): transformers 5's generate then runs the decode steps through
                    torch.compile (CUDA graphs) and the prefill eagerly. It runs in a child process
                    that is killed after --static-timeout s (build, compile and timing); a failure or
                    time-out is recorded as its error string. 2 untimed warm-up calls (the first
                    compiles: compile_s; graphs_compiled > graphs_after_first_call would mean it
                    recompiled later, cudagraph_skips > 0 that CUDA graphs were not used).
                    agree_tokens: the leading new tokens equal to eager's (least over the rows;
                    bf16 rounding in other kernels can part them).
Bandwidth (once):
  copy_GBps         2*S / t: the median time t of a device-to-device copy of S = 2 GiB of random
                    bf16, counting bytes read plus bytes written. Median of 20 after 3 warm-ups,
                    CUDA events.
  bytes_per_step[b] parameter bytes (each tensor once: the tied embedding counted once, as the head)
                    + b embedding rows (the lookup) + the KV cache read at the mean context of the
                    decode steps: b * (P + N/2) * layers * 2 * kv_heads * head_dim * 2 bytes.
  limit_steps_s[b]  copy_GBps / bytes_per_step[b]: the decode steps/s that reading those bytes once
                    a step allows (limit_tok_s = that * b). weights_limit_steps_s: parameters alone.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

# transformers 5's form of rope_theta and the llama3 rope_scaling (config.json keeps it so)
ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=8192)
LLAMA32 = dict(vocab_size=128256, intermediate_size=8192, num_key_value_heads=8,
               rms_norm_eps=1e-5, rope_parameters=ROPE, hidden_act="silu",
               max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000,
               eos_token_id=128001, initializer_range=0.02, attention_bias=False, mlp_bias=False)
# key: (directory name, seed, config kwargs)
CONFIGS = {
    "1b": ("llama-3.2-1b", 1, dict(LLAMA32, hidden_size=2048, num_hidden_layers=16,
                                   num_attention_heads=32)),
    "3b": ("llama-3.2-3b", 2, dict(LLAMA32, hidden_size=3072, num_hidden_layers=28,
                                   num_attention_heads=24)),
    # GPT-2 124M (a context of 1024: no 2048-token prefill); run it alone (its own --save), as
    # the prompts are drawn below the first model's vocabulary.
    "gpt2": ("gpt2-124m", 4, dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12,
                                  n_head=12, bos_token_id=50256, eos_token_id=50256)),
    "tiny": ("llama-tiny", 3, dict(LLAMA32, vocab_size=512, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, bos_token_id=510, eos_token_id=511)),
}
PROMPT, LONG, BATCH = 512, 2048, 16
PROMPT_SEED = 1234
SHORT_REPS = 10  # timed runs of the short calls (1-token generate, one forward)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench(fn, dev, warmup, reps):
    """(median seconds, all samples, the last run's result); host clock between syncs."""
    for _ in range(warmup):
        fn()
    samples, out = [], None
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        out = fn()
        sync(dev)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples), samples, out


def copy_bandwidth(dev, nbytes):
    """Bytes read plus bytes written per second by dst.copy_(src) of nbytes of bf16."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    if dev.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            dst.copy_(src)
        samples = []
        for _ in range(20):
            start.record()
            dst.copy_(src)
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1e3)
        t = statistics.median(samples)
    else:
        t, samples, _ = bench(lambda: dst.copy_(src), dev, 3, 20)
    assert torch.equal(dst, src), "copy check failed"
    return {"bytes": nbytes, "median_s": t, "samples_s": samples, "GBps": 2 * nbytes / t / 1e9,
            "definition": "2 * bytes / median time of dst.copy_(src) (read + written)"}


def make_prompts(vocab):
    g = torch.Generator().manual_seed(PROMPT_SEED)
    high = min(vocab, 128000)  # below Llama 3's special tokens
    return {"prompt_512": torch.randint(0, high, (1, PROMPT), generator=g),
            "prompt_2048": torch.randint(0, high, (1, LONG), generator=g),
            "batch16_512": torch.randint(0, high, (BATCH, PROMPT), generator=g)}


def build(key, dev):
    name, seed, kw = CONFIGS[key]
    cfg = GPT2Config(**kw) if key == "gpt2" else LlamaConfig(**kw)
    torch.manual_seed(seed)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                 dtype=torch.bfloat16)
    return name, model.eval()


def gen(model, ids, n, **kw):
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=n, min_new_tokens=n,
                          pad_token_id=model.config.eos_token_id, **kw)


def decode_rate(model, ids, n, reps, dev, **kw):
    """T_1, T_N and (N-1)*b/(T_N - T_1) for greedy generate over ids; the last run's new tokens."""
    b = ids.shape[0]
    t1, s1, _ = bench(lambda: gen(model, ids, 1, **kw), dev, 2, SHORT_REPS)
    tn, sn, out = bench(lambda: gen(model, ids, n, **kw), dev, 1, reps)
    assert out.shape == (b, ids.shape[1] + n), out.shape
    rate = (n - 1) * b / (tn - t1) if tn > t1 else float("nan")
    return {"batch": b, "prompt_len": ids.shape[1], "new_tokens": n, "prefill_s": t1,
            "prefill_samples_s": s1, "total_s": tn, "total_samples_s": sn,
            "decode_tok_s": rate}, out[:, ids.shape[1]:].cpu()


def bytes_per_step(model, b, n):
    c = model.config
    params = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: once
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    kv_pos = c.num_hidden_layers * 2 * kv_heads * head_dim * 2  # bf16 K and V
    ctx = PROMPT + n / 2  # mean positions attended over the N-1 decode steps
    emb_rows = b * c.hidden_size * 2
    return params, params + emb_rows + b * ctx * kv_pos, kv_pos


def eager_arm(key, prompts, args, dev, bw):
    name, model = build(key, dev)
    c = model.config
    r = {"name": name, "attn_implementation": c._attn_implementation,
         "dtype": str(next(model.parameters()).dtype),
         "params": sum(p.numel() for p in model.parameters()),
         "param_init_std": next(p for n, p in model.named_parameters()
                                if n.endswith(("mlp.up_proj.weight", "mlp.c_fc.weight"))
                                ).float().std().item()}
    p = {k: v.to(dev) for k, v in prompts.items()}
    with torch.no_grad():
        for L, ids in ((PROMPT, p["prompt_512"]), (LONG, p["prompt_2048"])):
            if L > c.max_position_embeddings:
                r[f"prefill_{L}"] = {"skipped": f"context {c.max_position_embeddings}"}
                continue
            t, s, _ = bench(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1),
                            dev, 2, SHORT_REPS)
            r[f"prefill_{L}"] = {"median_s": t, "samples_s": s, "tok_s": L / t}
            log(f"  {name} prefill {L}: {L / t:.0f} tok/s")
        greedy = {}
        for tag, ids in (("b1", p["prompt_512"]), ("b16", p["batch16_512"])):
            r[f"eager_{tag}"], greedy[tag] = decode_rate(model, ids, args.new_tokens,
                                                        args.repeats, dev)
            log(f"  {name} eager {tag}: {r[f'eager_{tag}']['decode_tok_s']:.1f} tok/s")
    r["ttft_ms"] = r["eager_b1"]["prefill_s"] * 1e3
    for tag, b in (("b1", 1), ("b16", BATCH)):
        params, total, kv_pos = bytes_per_step(model, b, args.new_tokens)
        r[f"limit_{tag}"] = {"bytes_per_step": total, "kv_bytes_per_position": kv_pos,
                             "mean_context": PROMPT + args.new_tokens / 2,
                             "limit_steps_s": bw / total, "limit_tok_s": bw / total * b}
    r["weight_bytes"] = params
    r["weights_limit_steps_s"] = bw / params
    if args.save:
        save(model, os.path.join(args.save, name), greedy)
    return r, greedy


def save(model, d, greedy):
    model.save_pretrained(d)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    safetensors.torch.save_file({k: v.contiguous() for k, v in greedy.items()},
                                os.path.join(d, "greedy.safetensors"))
    log(f"  saved {d}: " + ", ".join(f"{f} {os.path.getsize(os.path.join(d, f))} B"
                                     for f in sorted(os.listdir(d))))


def static_child(args):
    """Child process: one model, one batch, static cache + torch.compile; prints one JSON line."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig
    key, b = args.static_child.split(":")
    dev = torch.device("cpu" if args.tiny else "cuda")
    _, model = build(key, dev)
    ids = make_prompts(model.config.vocab_size)["prompt_512" if b == "1" else "batch16_512"]
    ids = ids.to(dev)
    cc = CompileConfig(fullgraph=True, mode="reduce-overhead", dynamic=False)
    if dev.type == "cpu":
        cc._compile_all_devices = True  # generate compiles on cuda only unless told
    kw = dict(cache_implementation="static", compile_config=cc)
    sync(dev)
    t = time.perf_counter()
    gen(model, ids, args.new_tokens, **kw)  # compiles the decode step
    sync(dev)
    compile_s = time.perf_counter() - t
    graphs = counters["stats"]["unique_graphs"]
    r, tokens = decode_rate(model, ids, args.new_tokens, args.repeats, dev, **kw)
    r.update(compile_s=compile_s, compile_config=cc.to_dict(), cache_implementation="static",
             graphs_compiled=counters["stats"]["unique_graphs"],  # recompiled if it grew
             graphs_after_first_call=graphs,
             cudagraph_skips=counters["inductor"]["cudagraph_skips"])  # 0 on cuda: graphs used
    torch.save(tokens, args.static_tokens)
    print("STATIC_RESULT " + json.dumps(r), flush=True)


def static_arm(key, b, eager_tokens, args):
    """Runs static_child in its own process group; kills the group after --static-timeout s."""
    with tempfile.TemporaryDirectory() as tmp:
        tok, logf = os.path.join(tmp, "tokens.pt"), os.path.join(tmp, "log.txt")
        cmd = [sys.executable, os.path.abspath(__file__), "--static-child", f"{key}:{b}",
               "--static-tokens", tok, "--new-tokens", str(args.new_tokens),
               "--repeats", str(args.repeats)] + (["--tiny"] if args.tiny else [])
        t = time.perf_counter()
        with open(logf, "w") as lf:
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(timeout=args.static_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the child and its compile workers
                proc.wait()
        wall = time.perf_counter() - t
        text = open(logf).read()
        line = [x for x in text.splitlines() if x.startswith("STATIC_RESULT ")]
        if proc.returncode == 0 and line:
            r = json.loads(line[-1][len("STATIC_RESULT "):])
            got = torch.load(tok)
            same = (got == eager_tokens).int().cumprod(dim=1).sum(dim=1)
            r["agree_tokens"] = int(same.min())
        elif proc.returncode == -signal.SIGKILL:
            r = {"error": f"timed out after {args.static_timeout} s (compile cap)",
                 "log_tail": text[-1500:]}
        else:
            errs = [x for x in text.splitlines() if "Error" in x or "error" in x]
            r = {"error": (errs[-1] if errs else f"exit code {proc.returncode}")[:500],
                 "log_tail": text[-1500:]}
        r["child_wall_s"] = wall
        return r


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def table(res):
    bw = res["copy"]["GBps"]
    out = [f"copy bandwidth: {bw:.0f} GB/s ({res['copy']['definition']}); {res['device']}, "
           f"torch {res['torch']}, transformers {res['transformers']}, "
           f"N = {res['new_tokens']} new tokens after a 512-token prompt, greedy, bf16, sdpa",
           "",
           "| model | batch | eager decode tok/s | static+compile tok/s | bandwidth limit tok/s "
           "(steps/s) | eager / limit | static / limit |",
           "|---|---|---|---|---|---|---|"]
    for m in res["models"].values():
        for tag in ("b1", "b16"):
            e, lim = m[f"eager_{tag}"], m[f"limit_{tag}"]
            s = m.get(f"static_{tag}", {})
            st = s.get("decode_tok_s")
            st_txt = fmt(st) if st is not None else (s.get("error", "not run")[:60])
            out.append(f"| {m['name']} | {e['batch']} | {e['decode_tok_s']:.1f} | {st_txt} | "
                       f"{lim['limit_tok_s']:.0f} ({lim['limit_steps_s']:.0f}) | "
                       f"{e['decode_tok_s'] / lim['limit_tok_s']:.3f} | "
                       f"{fmt(st and st / lim['limit_tok_s'], '.3f')} |")
    out += ["", "| model | params | weight bytes | weights limit steps/s | TTFT ms (512) | "
                "prefill 512 tok/s | prefill 2048 tok/s |", "|---|---|---|---|---|---|---|"]
    for m in res["models"].values():
        out.append(f"| {m['name']} | {m['params'] / 1e6:.1f}M | {m['weight_bytes'] / 1e9:.3f} GB "
                   f"| {m['weights_limit_steps_s']:.0f} | {m['ttft_ms']:.2f} | "
                   f"{m['prefill_512']['tok_s']:.0f} | "
                   f"{fmt(m['prefill_2048'].get('tok_s'), '.0f')} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="1b,3b", help="comma-separated: 1b, 3b, gpt2 (tiny: --tiny)")
    ap.add_argument("--new-tokens", type=int, default=None, help="N (default 128; --tiny 16)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each N-token generate")
    ap.add_argument("--save", help="directory for the models, prompts and greedy tokens")
    ap.add_argument("--out", help="JSON file of every figure and sample")
    ap.add_argument("--no-static", action="store_true", help="skip static cache + compile")
    ap.add_argument("--static-timeout", type=float, default=300.0,
                    help="seconds for each static-cache child (build, compile, timing)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (a test)")
    ap.add_argument("--static-child", help=argparse.SUPPRESS)
    ap.add_argument("--static-tokens", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.new_tokens is None:
        args.new_tokens = 16 if args.tiny else 128
    assert args.new_tokens >= 2 and args.repeats >= 1
    transformers.logging.set_verbosity_error()
    if args.static_child:
        with torch.no_grad():
            return static_child(args)
    keys = ["tiny"] if args.tiny else [k.strip() for k in args.models.split(",") if k.strip()]
    for k in keys:
        if k not in CONFIGS:
            sys.exit(f"unknown model {k!r}; known: 1b, 3b, gpt2 (and --tiny)")
    if not args.tiny and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --tiny on a CPU")
    dev = torch.device("cpu" if args.tiny else "cuda")
    t0 = time.perf_counter()
    res = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "dtype": "bfloat16", "new_tokens": args.new_tokens, "repeats": args.repeats,
           "prompt_len": PROMPT, "batch": BATCH, "definitions": __doc__, "models": {}}
    res["copy"] = copy_bandwidth(dev, (64 << 20) if args.tiny else (2 << 30))  # buffers freed
    log(f"copy bandwidth {res['copy']['GBps']:.0f} GB/s ({res['device']})")
    prompts = make_prompts(CONFIGS[keys[0]][2]["vocab_size"])
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        safetensors.torch.save_file({k: v.contiguous() for k, v in prompts.items()},
                                    os.path.join(args.save, "prompts.safetensors"))
    for k in keys:
        m, greedy = eager_arm(k, prompts, args, dev, res["copy"]["GBps"] * 1e9)
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the model is gone: leave its memory to the children
        res["models"][m["name"]] = m
        for tag, b in (("b1", 1), ("b16", BATCH)):
            if args.no_static:
                continue
            s = m[f"static_{tag}"] = static_arm(k, b, greedy[tag], args)
            log(f"  {m['name']} static {tag}: " + (f"{s['decode_tok_s']:.1f} tok/s, compile "
                f"{s['compile_s']:.0f} s, agree {s['agree_tokens']}/{args.new_tokens}"
                if "decode_tok_s" in s else f"FAILED: {s['error']}"))
        res["elapsed_s"] = time.perf_counter() - t0
        if args.out:  # after each model, so that a cut-off run keeps what it measured
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
    print(table(res))
    log(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
