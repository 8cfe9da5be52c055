#!/usr/bin/env bash
# Before/after benchmarks of two builds in one device call (issue 40, item 6): the GPT step
# (fp32, TF32; pipelined TF32 and bf16, eager and graphed), the world model's rollout, and the
# fast engine's prefill and decode at batch 1 and 16 on a Llama-3.2-1B shape. The builds run
# alternately, ROUNDS times each (A B A B ...), so that drift of the GPU hits both alike.
#
#   scripts/bench-ab.sh A_DIR B_DIR OUT_DIR
#
# A_DIR and B_DIR each hold bin/gpu-bench and bin/hybrid-trainer of one build (stripped release
# binaries, as `cargo xtask gpu-bundle` makes them). Needs python3 with torch and transformers
# (for the model: benches/hf_generate_peer.py --save, random weights, nothing downloaded) and
# data/tinyshakespeare.txt beside this script or in $TEXT. Env: ROUNDS (default 2), MODEL_DIR
# (reuse a saved model), SKIP (space-separated parts to skip: gpt rssm decode train). The train
# part runs the same model on both builds (`train-gpt --dropout 0`, 600 steps, bf16 and TF32,
# graphed), so that a build whose default model differs is still compared like for like.
set -u -o pipefail
[ $# -eq 3 ] || { echo "usage: $0 A_DIR B_DIR OUT_DIR" >&2; exit 2; }
a=$1 b=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
text=${TEXT:-$here/data/tinyshakespeare.txt}
rounds=${ROUNDS:-2}
skip=" ${SKIP:-} "
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" NCCL_NVLS_ENABLE=0
status=0
run() { # label log command...
  local label=$1 log=$2; shift 2
  echo "== $label: $*" >> "$log"
  "$@" >> "$log" 2>&1 || { echo "FAILED ($?): $label" | tee -a "$log"; status=1; }
}
model=${MODEL_DIR:-}
if [[ $skip != *" decode "* && -z $model ]]; then
  peer=$here/hf_generate_peer.py
  [ -f "$peer" ] || peer=$here/../benches/hf_generate_peer.py
  run "save 1B model" "$out/model.log" python3 "$peer" --models 1b --no-static --repeats 1 \
    --new-tokens 32 --save "$out/hf"
  model=$out/hf
fi
for r in $(seq "$rounds"); do
  for side in A B; do
    dir=$a; [ $side = B ] && dir=$b
    if [[ $skip != *" gpt "* ]]; then
      run "$side round $r" "$out/gpt-$side.log" "$dir/bin/gpu-bench" --only-gpt --no-torch \
        --gpt-text "$text" --out "$out/gpt-$side-$r.md"
    fi
    if [[ $skip != *" rssm "* ]]; then
      run "$side round $r" "$out/rssm-$side.log" "$dir/bin/gpu-bench" --only-rssm --no-torch \
        --out "$out/rssm-$side-$r.md"
    fi
    if [[ $skip != *" train "* ]]; then
      for prec in "--precision bf16" "--tf32"; do
        run "$side round $r $prec" "$out/train-$side.log" "$dir/bin/hybrid-trainer" --device cuda \
          train-gpt --data "$text" --dropout 0 --iters 600 --eval-interval 600 $prec
      done
    fi
    if [[ $skip != *" decode "* ]]; then
      run "$side round $r" "$out/decode-$side.log" "$dir/bin/hybrid-trainer" --device cuda \
        bench-generate --model "$model/llama-3.2-1b" --prompts "$model/prompts.safetensors" \
        --repeats 3 --out "$out/decode-$side-$r.json"
    fi
  done
done
exit $status
