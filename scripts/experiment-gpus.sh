#!/usr/bin/env bash
# One device-tool call of `hybrid-trainer experiment` spread over the machine's GPUs, from the
# carried bundle (target/gpu-bundle.tar.xz): each argument is one GPU's experiment flags, run
# by its own process (GPU i gets argument i). The runs resume from the curves in target/exp,
# stop after EXP_SECONDS, and the curves and logs are packed into $OUT/exp.tgz.
#   (EXP_TAG names the logs: $OUT/${EXP_TAG}0.log, ...)
#   scripts/experiment-gpus.sh "--workloads w1 --arms adamw,hybrid" "--workloads w2 --jobs 4"
set -u -o pipefail
export NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" target/exp
[ -d /tmp/gpu-bundle ] || tar xJf target/gpu-bundle.tar.xz -C /tmp || exit 1
bin=/tmp/gpu-bundle/bin/hybrid-trainer
data=/tmp/gpu-bundle/data/tinyshakespeare.txt
gpu=0
for flags in "$@"; do
  # shellcheck disable=SC2086 # each argument is a list of flags
  CUDA_VISIBLE_DEVICES=$gpu timeout "${EXP_SECONDS:-540}" "$bin" --device cuda experiment \
    --data "$data" --out target/exp $flags > "$OUT/${EXP_TAG:-gpu}$gpu.log" 2>&1 &
  gpu=$((gpu + 1))
done
wait
tar czf "$OUT/exp.tgz" -C target exp
