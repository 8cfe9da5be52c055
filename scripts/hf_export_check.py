#!/usr/bin/env python3
"""Checks a model directory written by `models::export_gpt2` with Hugging Face `transformers`.

usage: python3 scripts/hf_export_check.py DIR PROMPT [--new-tokens N] [--compare OURS.json]

Loads DIR with AutoModelForCausalLM (float32, eager attention) and its tokenizer with
PreTrainedTokenizerFast(tokenizer_file=DIR/tokenizer.json), encodes PROMPT (no special
tokens; a character outside the vocabulary is an error), greedy-generates N tokens (default
20; do_sample=False, no EOS, so exactly N), and prints one JSON object: the prompt's ids, the
generated ids and their text, and whether AutoTokenizer (DIR/tokenizer_config.json) encodes
the prompt the same way.

With --compare OURS.json (what crates/models/tests/export.rs writes beside each exported
directory when MODELS_EXPORT_KEEP is set: prompt_ids, greedy, text, logits_shape, logits),
also compares: the prompt ids, the greedy ids and text (equal), and the prompt's logits (max
absolute difference within 2e-4 * max|logit|: the same f32 functions in another summation
order, the bound of the Rust test). Exits 1 when any comparison fails.

Needs torch and transformers (tested with torch 2.15 CPU, transformers 5.24).
"""
import argparse
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

LOGIT_BOUND = 2e-4


def generate(model, ids, new_tokens):
    """Greedy decoding of exactly new_tokens tokens after ids [1, t]."""
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=None,
        pad_token_id=None,
    )
    return out[0, ids.shape[1]:].tolist()


def compare(report, logits, path):
    """Adds the comparison with our record at path to report; returns whether all agree."""
    with open(path) as f:
        ours = json.load(f)
    shape = ours["logits_shape"]
    theirs = logits.reshape(-1).tolist()
    ok = list(logits.shape) == shape and len(theirs) == len(ours["logits"])
    diff = max((abs(a - b) for a, b in zip(theirs, ours["logits"])), default=float("inf"))
    scale = max(abs(x) for x in theirs)
    report["compare"] = {
        "prompt_ids_equal": report["prompt_ids"] == ours["prompt_ids"],
        "greedy_equal": report["greedy"] == ours["greedy"],
        "text_equal": report["text"] == ours["text"],
        "logits_shape_equal": ok,
        "logits_max_abs": scale,
        "logits_max_abs_diff": diff,
        "logits_bound": LOGIT_BOUND * scale,
    }
    c = report["compare"]
    return (c["prompt_ids_equal"] and c["greedy_equal"] and c["text_equal"] and ok
            and diff <= c["logits_bound"])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("prompt")
    p.add_argument("--new-tokens", type=int, default=20)
    p.add_argument("--compare", metavar="OURS_JSON")
    args = p.parse_args()

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args.dir, "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(
        args.dir, dtype=torch.float32, attn_implementation="eager").eval()
    prompt_ids = tok(args.prompt, add_special_tokens=False)["input_ids"]
    auto_ids = AutoTokenizer.from_pretrained(args.dir)(
        args.prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(ids).logits[0]
        greedy = generate(model, ids, args.new_tokens)
    report = {
        "transformers_class": type(model).__name__,
        "activation": model.config.activation_function,
        "prompt": args.prompt,
        "prompt_ids": prompt_ids,
        "auto_tokenizer_ids_equal": auto_ids == prompt_ids,
        "greedy": greedy,
        "text": tok.decode(greedy),
        "round_trip": tok.decode(prompt_ids) == args.prompt,
    }
    ok = report["auto_tokenizer_ids_equal"] and report["round_trip"]
    if args.compare:
        ok = compare(report, logits, args.compare) and ok
    # One key a line, lists kept on their line.
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in report.items()]
    print("{\n" + ",\n".join(lines) + "\n}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
