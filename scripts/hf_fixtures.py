#!/usr/bin/env python3
"""Parity fixtures for crates/models: tiny Hugging Face causal LMs with random weights.

usage: python3 scripts/hf_fixtures.py [OUT_DIR] [--only NAME,NAME]
       (OUT_DIR default crates/models/tests/fixtures/hf; --only: just those fixtures, the others
       left as they are, e.g. --only mistral-sw,qwen2-sw)

Each fixture is built from a config (no download), seeded, in float32 with eager attention,
saved with save_pretrained (config.json + model.safetensors; generation_config.json is
deleted), and gets an expected.safetensors with:
  input_ids        int64   [1, 12]       a fixed random prompt
  logits           float32 [1, 12, V]    model(input_ids).logits
  greedy           int64   [1, 28]       generate(input_ids, max_new_tokens=16, greedy, no EOS)
  batch_input_ids  int64   [2, 12]       row 0 = input_ids, row 1 another prompt (no padding)
  batch_logits     float32 [2, 12, V]    one batched forward
After init, every norm weight is set to 1 + 0.1*randn and, where the family has biases (qwen2's
q/k/v, every GPT-2 bias), every bias to 0.1*randn, from the fixture's seeded generator, so a
loader that drops them fails the parity check. `llama3-bf16` is `llama3`'s model rounded to
bf16 and saved in bf16; its expectations are float32 computation on the bf16-rounded weights.
`mistral-sw` (sliding_window 5 on every layer) and `qwen2-sw` (use_sliding_window, window 4,
max_window_layers 1: layer 0 full, layer 1 sliding; transformers writes layer_types) have
windows shorter than the 12-token prompt and the 28-token greedy sequence.
"""
import json
import os
import shutil
import sys

import safetensors
import safetensors.torch
import torch
import transformers
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig,
                          Qwen2Config)

VOCAB = 96
MAX_POS = 64
PROMPT_LEN = 12
NEW_TOKENS = 16
# hidden 64 / 4 heads (head_dim 16), 2 layers. The MLP width is 48 (not 128) and GPT-2's
# n_inner is 48 (not 4*64) so every model.safetensors stays under ~250 KB; 48 keeps the MLP
# matrices non-square, so a transposed load fails on shape, not only on values.
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=MAX_POS, rms_norm_eps=1e-5,
              initializer_range=0.1)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def configs():
    """(name, seed, config, perturb biases?) per fixture."""
    return [
        ("llama3", 1, LlamaConfig(**COMMON, num_key_value_heads=2, rope_theta=500000.0,
                                  rope_scaling=dict(LLAMA3_ROPE), tie_word_embeddings=False),
         False),
        ("llama-tied", 2, LlamaConfig(**COMMON, num_key_value_heads=4, rope_theta=10000.0,
                                      tie_word_embeddings=True), False),
        ("qwen2", 3, Qwen2Config(**COMMON, num_key_value_heads=2, rope_theta=1000000.0,
                                 use_sliding_window=False, sliding_window=None,
                                 tie_word_embeddings=True), True),
        ("mistral", 4, MistralConfig(**COMMON, num_key_value_heads=1, sliding_window=None,
                                     tie_word_embeddings=False), False),
        ("mistral-sw", 6, MistralConfig(**COMMON, num_key_value_heads=1, sliding_window=5,
                                        tie_word_embeddings=False), False),
        ("qwen2-sw", 7, Qwen2Config(**COMMON, num_key_value_heads=2, rope_theta=1000000.0,
                                    use_sliding_window=True, sliding_window=4,
                                    max_window_layers=1, tie_word_embeddings=True), True),
        ("gpt2", 5, GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_inner=48,
                               n_positions=MAX_POS, activation_function="gelu_new",
                               initializer_range=0.1, tie_word_embeddings=True), True),
    ]


def build(cfg, seed, biases):
    """The seeded random model (on the CPU, float32, eager attention), norms and biases
    perturbed (`hf_gpu_parity.py` builds its models with this too)."""
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = "norm" in name or ".ln_" in name or name.startswith("ln_")
            if is_norm and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias") and (biases or is_norm):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def expectations(model, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    batch = torch.randint(0, VOCAB, (2, PROMPT_LEN), generator=g, dtype=torch.int64)
    ids = batch[:1].clone()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        logits = model(ids).logits.float()
        batch_logits = model(batch).logits.float()
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids),
                                max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
        assert greedy.shape == (1, PROMPT_LEN + NEW_TOKENS), greedy.shape
        assert torch.equal(greedy[:, :PROMPT_LEN], ids)
        # Self-check: the cached greedy tokens are the argmax of an uncached full forward.
        full = model(greedy).logits
        ok = torch.equal(full[0, PROMPT_LEN - 1:-1].argmax(-1), greedy[0, PROMPT_LEN:])
        top2 = full[0, PROMPT_LEN - 1:-1].float().topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
    assert torch.allclose(batch_logits[:1], logits, atol=1e-5), "batch row 0 != single"
    print(f"  logits std {logits.std().item():.4f}, greedy == uncached argmax: {ok}, "
          f"min top1-top2 margin {margin:.2e}, max |batch[0]-single| "
          f"{(batch_logits[:1] - logits).abs().max().item():.2e}")
    print(f"  greedy: {greedy[0].tolist()}")
    return {"input_ids": ids.contiguous(), "logits": logits.contiguous(),
            "greedy": greedy.contiguous(), "batch_input_ids": batch.contiguous(),
            "batch_logits": batch_logits.contiguous()}


def char_tokenizer(path):
    """A character tokenizer of the fixtures' 96 ids (printable ASCII and the newline): a BPE
    model without merges splits text into characters; the Fuse decoder joins them back."""
    from tokenizers import Tokenizer, decoders, models
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.save(path)
    ids = Tokenizer.from_file(path).encode("Hello, world!\n").ids
    assert ids == [chars.index(c) for c in "Hello, world!\n"], ids


def save_model(model, d):
    """`model` alone in directory `d` (replaced): its safetensors and config, no
    generation_config.json."""
    if os.path.isdir(d):
        shutil.rmtree(d)
    model.save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)


def save(model, outdir, name, exp):
    d = os.path.join(outdir, name)
    save_model(model, d)
    safetensors.torch.save_file(exp, os.path.join(d, "expected.safetensors"))
    char_tokenizer(os.path.join(d, "tokenizer.json"))
    with safetensors.safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        print(f"  model.safetensors tensors ({f.metadata()}):")
        for k in sorted(f.keys()):
            t = f.get_tensor(k)
            print(f"    {k} {t.dtype} {list(t.shape)}")
    for fn in sorted(os.listdir(d)):
        print(f"  {fn}: {os.path.getsize(os.path.join(d, fn))} bytes")
    print(f"  config.json:\n{open(os.path.join(d, 'config.json')).read()}")


def check_window(outdir, name):
    """The saved config.json of a windowed fixture holds what crates/models reads."""
    cfgj = json.load(open(os.path.join(outdir, name, "config.json")))
    want = {"mistral-sw": (5, None), "qwen2-sw": (4, ["full_attention", "sliding_attention"])}
    window, types = want[name]
    assert cfgj.get("sliding_window") == window, f"{name}: sliding_window {cfgj.get('sliding_window')}"
    if types is not None:
        assert cfgj.get("layer_types") == types, f"{name}: layer_types {cfgj.get('layer_types')}"
        assert cfgj.get("use_sliding_window") is True, f"{name}: use_sliding_window"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--only")]
    only = None
    for i, a in enumerate(sys.argv[1:], 1):
        if a == "--only" and i + 1 < len(sys.argv):
            only = sys.argv[i + 1].split(",")
            args.remove(sys.argv[i + 1])
        elif a.startswith("--only="):
            only = a.split("=", 1)[1].split(",")
    outdir = args[0] if args else "crates/models/tests/fixtures/hf"
    known = {c[0] for c in configs()} | {"llama3-bf16"}
    if only and not set(only) <= known:
        sys.exit(f"--only: unknown fixture(s) {sorted(set(only) - known)}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"safetensors {safetensors.__version__}")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for name, seed, cfg, biases in configs():
        wanted = only is None or name in only or (name == "llama3" and "llama3-bf16" in only)
        if not wanted:
            continue
        print(f"== {name} (seed {seed})")
        model = build(cfg, seed, biases)
        save(model, outdir, name, expectations(model, seed))
        if name.endswith("-sw"):
            check_window(outdir, name)
        if name == "llama3":
            print("== llama3-bf16 (llama3's weights rounded to bf16)")
            # Round the parameters in place and keep the model float32 (buffers such as rope's
            # inv_freq stay float32, as a bf16 engine computes them), then save a bf16 copy.
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
            exp = expectations(model, seed)  # float32 math on bf16-rounded weights
            model = model.to(torch.bfloat16)
            save(model, outdir, "llama3-bf16", exp)
            d = os.path.join(outdir, "llama3-bf16")
            cfgj = json.load(open(os.path.join(d, "config.json")))
            dt = cfgj.get("dtype", cfgj.get("torch_dtype"))
            assert dt == "bfloat16", f"llama3-bf16 config dtype {dt}"


if __name__ == "__main__":
    main()
