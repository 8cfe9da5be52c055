#!/usr/bin/env python3
"""Expectations for `hybrid-trainer check-hf` at real model sizes (issue 30, item 6).

usage: python3 scripts/hf_gpu_parity.py OUT_ROOT [--device cuda|cpu] [--small] [--only NAME]
                                        [--seed S] [--init-range R]

For each of four configurations with the real hyper-parameters of Llama-3.2-1B, Qwen2.5-0.5B
and GPT-2 124M (written inline below; nothing is downloaded), builds a randomly initialised
model with `transformers` (`AutoModelForCausalLM.from_config`, eager attention, float32,
seeded, initialised on the CPU so that the weights do not depend on --device), saves it with
`save_pretrained` to OUT_ROOT/<name> (config.json, model.safetensors or shards with their
index; generation_config.json is deleted) and writes OUT_ROOT/<name>/expected.safetensors:

  input_ids      int64   [1, 32]       a seeded random prompt
  logits         float32 [1, 32, V]    model(input_ids).logits in float32 on --device
  greedy         int64   [1, 32 + 64]  generate(input_ids, 64 new tokens, do_sample=False,
                                       eos None): the prompt, then the 64 greedy tokens
  greedy_margins float32 [64]          per new token, top1 - top2 of the logits that chose it
                                       (from one uncached forward over `greedy`)
  logits_bf16    float32 [1, 32, V]    model.to(bfloat16)(input_ids).logits, widened to f32

with metadata naming the versions, device, seed and initializer range. The greedy tokens are
checked against the argmax of the uncached forward (a mismatch means generate itself met a
near tie: it is printed and the script exits 1 after writing everything). The margins are
stored because a tie closer than the engines' rounding can legitimately flip a token when the
sums are ordered differently; `check-hf` accepts a differing token only at such a step.

After init, as in scripts/hf_fixtures.py, every norm weight is set to 1 + 0.1*randn and every
bias (Qwen2's q/k/v biases, all of GPT-2's, the norms' biases) to 0.1*randn, so that a loader
that drops them fails.

Initializer range: with the real configs' 0.02 a randomly initialised deep model says nearly the
same thing at every position: the real GPT-2 config gave one token repeated 64 times (logits
std 0.57), so the greedy check would only see a constant. The default 0.05 (--init-range) gave
24 distinct tokens of 64 there (std 1.41) and 60 of 64 for the small Llama, exercising
attention, positions and the MLPs. The architecture hyper-parameters stay the real ones. The
printed logits std, the distinct greedy tokens and the minimum margin say how informative a
run was.

--small shrinks every config (2 layers, width / 4 with the same head counts, vocab 1000) to
run the whole pipeline on a CPU in seconds. TF32 is disabled: both sides compute in f32.
"""
import argparse
import os
import sys
import time

# Deterministic cuBLAS (torch.use_deterministic_algorithms) needs this before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config  # noqa: E402

from hf_fixtures import build, save_model  # noqa: E402

PROMPT_LEN = 32
NEW_TOKENS = 64


def configs(small, init_range):
    """(name, seed, config, perturb all biases?) with the real hyper-parameters."""
    llama = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                 num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
                 rope_theta=500000.0,
                 rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192},
                 tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
                 mlp_bias=False, bos_token_id=128000, eos_token_id=128001)
    qwen = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                sliding_window=None, max_window_layers=24, bos_token_id=151643,
                eos_token_id=151643)
    gpt2 = dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                activation_function="gelu_new", layer_norm_epsilon=1e-5,
                tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256)
    if small:
        llama.update(vocab_size=1000, hidden_size=512, intermediate_size=2048,
                     num_hidden_layers=2, head_dim=16, bos_token_id=1, eos_token_id=2)
        qwen.update(vocab_size=1000, hidden_size=224, intermediate_size=1216,
                    num_hidden_layers=2, max_window_layers=2, bos_token_id=1, eos_token_id=2)
        gpt2.update(vocab_size=1000, n_embd=192, n_layer=2, bos_token_id=1, eos_token_id=2)
    # A Mistral-shaped model (the Llama 1B's sizes, no rope scaling) with a sliding window of
    # 16 slots on every layer, shorter than the 32-token prompt: both CUDA attention paths
    # (prefill and decode) windowed.
    mistral = {k: v for k, v in llama.items()
               if k not in ("rope_scaling", "attention_bias", "mlp_bias")}
    mistral.update(rope_theta=10000.0, sliding_window=16, tie_word_embeddings=False)
    for c in (llama, qwen, gpt2, mistral):
        c["initializer_range"] = init_range
    return [
        ("llama-3.2-1b", 11, LlamaConfig(**llama), False),
        ("qwen2.5-0.5b", 12, Qwen2Config(**qwen), True),
        ("gpt2-124m", 13, GPT2Config(**gpt2), True),
        ("mistral-sw16", 14, MistralConfig(**mistral), False),
    ]


def expectations(model, seed, vocab, device):
    """The prompt, its f32 logits, the greedy tokens and their margins (float32 model on
    `device`). Returns (tensors, self-check passed)."""
    g = torch.Generator().manual_seed(seed + 1000)
    ids = torch.randint(0, vocab, (1, PROMPT_LEN), generator=g, dtype=torch.int64)
    gc = model.generation_config
    gc.eos_token_id, gc.bos_token_id, gc.pad_token_id = None, None, 0
    dev_ids = ids.to(device)
    with torch.no_grad():
        logits = model(dev_ids).logits.float().cpu()
        t = time.time()
        greedy = model.generate(dev_ids, attention_mask=torch.ones_like(dev_ids),
                                max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=0, eos_token_id=None).cpu()
        gen_s = time.time() - t
        assert greedy.shape == (1, PROMPT_LEN + NEW_TOKENS), greedy.shape
        assert torch.equal(greedy[:, :PROMPT_LEN], ids)
        # Self-check: the cached greedy tokens are the argmax of one uncached forward.
        full = model(greedy.to(device)).logits.float()[0, PROMPT_LEN - 1:-1].cpu()
    chosen = full.argmax(-1)
    ok = torch.equal(chosen, greedy[0, PROMPT_LEN:])
    top2 = full.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).contiguous()
    scale = logits.abs().max().item()
    new = greedy[0, PROMPT_LEN:].tolist()
    print(f"  logits: std {logits.std().item():.4f}, max |logit| {scale:.4f}")
    print(f"  greedy ({gen_s:.1f} s): {len(set(new))} distinct of {len(new)}: {new}")
    print(f"  greedy == argmax of the uncached forward: {ok}; min top1-top2 margin "
          f"{margins.min().item():.3e} ({margins.min().item() / scale:.2e} of max |logit|) "
          f"at step {margins.argmin().item()}")
    if not ok:
        bad = (chosen != greedy[0, PROMPT_LEN:]).nonzero().flatten().tolist()
        print(f"  !! SELF-CHECK FAILED: generate and the uncached argmax differ at steps {bad}")
    return {"input_ids": ids.contiguous(), "logits": logits.contiguous(),
            "greedy": greedy.contiguous(), "greedy_margins": margins}, ok


def bf16_logits(model, ids, device):
    """The prompt's logits from the model cast to bfloat16, widened to float32."""
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        return model(ids.to(device)).logits.float().cpu().contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_root")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="shrunken configs, for a CPU")
    ap.add_argument("--only", action="append", help="a model name (repeatable)")
    ap.add_argument("--seed", type=int, default=0, help="added to every model's seed")
    ap.add_argument("--init-range", type=float, default=0.05,
                    help="initializer_range of every model (the real configs say 0.02)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but torch sees no GPU")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"device {a.device}" + (f" ({torch.cuda.get_device_name(0)})"
                                  if a.device == "cuda" else ""))
    # warn_only: an op without a deterministic CUDA kernel must not stop the run.
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Plain f32 products on both sides (TF32 is off by default; say so explicitly).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out_root, exist_ok=True)
    all_ok = True
    for name, seed, cfg, biases in configs(a.small, a.init_range):
        if a.only and name not in a.only:
            continue
        seed += a.seed
        t = time.time()
        print(f"== {name} (seed {seed}, initializer_range {a.init_range}"
              f"{', small' if a.small else ''})")
        model = build(cfg, seed, biases)
        n = sum(p.numel() for p in model.parameters())
        print(f"  {n / 1e6:.1f}M parameters, built in {time.time() - t:.1f} s")
        d = os.path.join(a.out_root, name)
        save_model(model, d)
        model = model.to(a.device)
        exp, ok = expectations(model, seed, cfg.vocab_size, a.device)
        all_ok &= ok
        exp["logits_bf16"] = bf16_logits(model, exp["input_ids"], a.device)
        err = (exp["logits_bf16"] - exp["logits"]).abs().max().item()
        print(f"  bf16 logits: max |bf16 - f32| {err:.4f}")
        meta = {"name": name, "seed": str(seed), "initializer_range": str(a.init_range),
                "small": str(a.small), "device": a.device, "torch": torch.__version__,
                "transformers": transformers.__version__, "greedy_selfcheck": str(ok)}
        safetensors.torch.save_file(exp, os.path.join(d, "expected.safetensors"), meta)
        del model
        if a.device == "cuda":
            torch.cuda.empty_cache()
        mib = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 2**20
        print(f"  wrote {d} ({mib:.1f} MiB) in {time.time() - t:.1f} s")
    if not all_ok:
        sys.exit("a greedy self-check failed (see above)")


if __name__ == "__main__":
    main()
