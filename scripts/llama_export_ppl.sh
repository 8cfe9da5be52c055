#!/usr/bin/env bash
# The project's GPT, Llama variant: train on tinyshakespeare with the main job's shape, export it
# as a Hugging Face LlamaForCausalLM directory (`export-hf`), and print its perplexity on the
# validation split (the last 10% of the text; its first MAX_TOKENS characters) through the
# reference engine (f32; --quant int8/int4 computes from the dequantized weights) and the fast
# engine (f32, bf16, bf16 with int8/int4 projections kept quantized). docs/inference.md,
# "The project's own GPT, exported", has the figures of a CPU run.
#
# usage: scripts/llama_export_ppl.sh [--device cpu|cuda|cuda:N] [--data FILE] [--out DIR]
#                                    [--iters N] [--max-tokens N]
# Needs only the binary (BIN, default target/release/hybrid-trainer) and coreutils: no network,
# no Rust. The text must be ASCII (one byte a character) for the split to be train-gpt's.
set -euo pipefail

BIN=${BIN:-target/release/hybrid-trainer}
DEVICE=cpu
DATA=../shared/data/tinyshakespeare.txt
OUT=llama-export-ppl
ITERS=1500
MAX_TOKENS=20000
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --data) DATA=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --iters) ITERS=$2; shift 2 ;;
        --max-tokens) MAX_TOKENS=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$BIN" ] || { echo "no binary at $BIN (set BIN)" >&2; exit 1; }
[ -f "$DATA" ] || { echo "no text at $DATA (--data)" >&2; exit 1; }
if LC_ALL=C grep -q '[^[:print:][:space:]]' "$DATA"; then
    echo "$DATA is not ASCII: the byte split would not be train-gpt's" >&2
    exit 1
fi
mkdir -p "$OUT"

set -x
"$BIN" --device "$DEVICE" train-gpt --data "$DATA" --variant llama --layers 4 --heads 4 \
    --embd 128 --block 64 --batch 12 --iters "$ITERS" --lr 3e-3 \
    --save "$OUT/llama.safetensors" 2>&1 | tee "$OUT/train.log"
rm -rf "$OUT/hf"
"$BIN" export-hf --model "$OUT/llama.safetensors" --data "$DATA" --out "$OUT/hf"
set +x

# train-gpt's validation split: the characters from ⌊0.9·n⌋ on.
n=$(wc -c < "$DATA")
tail -c +$((n * 9 / 10 + 1)) "$DATA" > "$OUT/val.txt"

row() {
    local what=$1
    shift
    local line
    line=$("$BIN" --device "$DEVICE" perplexity --model "$OUT/hf" --text "$OUT/val.txt" \
        --max-tokens "$MAX_TOKENS" "$@" | grep '^perplexity ')
    printf '| %s | `%s` | %s |\n' "$what" "$*" "$line"
}

echo "| engine, weights | flags | result |"
echo "|---|---|---|"
row "reference f32" --engine reference
row "reference, int8 (dequantized)" --engine reference --quant int8
row "reference, int4 (dequantized)" --engine reference --quant int4
row "fast f32" --engine fast --dtype f32
row "fast f32 + int8" --engine fast --dtype f32 --quant int8
row "fast f32 + int4" --engine fast --dtype f32 --quant int4
row "fast bf16" --engine fast --dtype bf16
row "fast bf16 + int8" --engine fast --dtype bf16 --quant int8
row "fast bf16 + int4" --engine fast --dtype bf16 --quant int4
