#!/usr/bin/env bash
# Time to validation loss 1.50 on the shakespeare-char GPT (nanoGPT's model and recipe, bf16),
# ours against PyTorch eager and torch.compile in the same call, one run at a time on one GPU.
# Runs in an unpacked GPU bundle (`cargo xtask gpu-bundle`), which carries this script,
# benches/torch_train_gpt.py and data/tinyshakespeare.txt.
#
#   ./time_to_150.sh [--iters N] [--compile-seeds "S ..."] SEED...
#
# Logs go to $OUT_DIR (default ./out): ttt-ours-S.log, ttt-eager-S.log, ttt-compile-S.log, and one
# summary line a run in ttt-summary.txt (the evaluation lines and the first iteration <= 1.50).
set -u -o pipefail
cd "$(dirname "$0")"
iters=2000; compile_seeds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --iters) shift; iters="$1" ;;
    --compile-seeds) shift; compile_seeds="$1" ;;
    *) break ;;
  esac
  shift
done
OUT_DIR="${OUT_DIR:-$PWD/out}"; mkdir -p "$OUT_DIR"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
data=data/tinyshakespeare.txt
[ -f "$data" ] || { echo "no $data in this bundle" >&2; exit 2; }
summary="$OUT_DIR/ttt-summary.txt"
status=0
record() { # arm seed log
  { echo "== $1 seed $2"; grep -E 'val|tokens/s' "$3" | tail -12; } >> "$summary"
}
for s in "$@"; do
  log="$OUT_DIR/ttt-ours-$s.log"
  bin/hybrid-trainer --device cuda train-gpt --data "$data" --precision bf16 --seed "$s" \
    --iters "$iters" > "$log" 2>&1 || status=1
  record ours "$s" "$log"
  log="$OUT_DIR/ttt-eager-$s.log"
  python3 torch_train_gpt.py "$data" --precision bf16 --seed "$s" --iters "$iters" > "$log" 2>&1 || status=1
  record "pytorch-eager" "$s" "$log"
done
for s in $compile_seeds; do
  log="$OUT_DIR/ttt-compile-$s.log"
  python3 torch_train_gpt.py "$data" --precision bf16 --seed "$s" --iters "$iters" --compile > "$log" 2>&1 || status=1
  record "pytorch-compile" "$s" "$log"
done
cat "$summary"
exit $status
