#!/usr/bin/env bash
# One device-tool call of the hybrid experiment on the GPU (nanoGPT's shakespeare-char model on
# the embedded tinyshakespeare, TF32 matmuls). Resumes from target/exp (carry it back in), runs
# for at most EXP_SECONDS, and packs what is done (no checkpoints) into $OUT/exp.tgz.
#   scripts/experiment-gpu.sh [EXPERIMENT_FLAGS...]
set -u -o pipefail
export NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" target/exp
tar xJf target/gpu-bundle.tar.xz -C /tmp || exit 1
timeout "${EXP_SECONDS:-540}" /tmp/gpu-bundle/bin/hybrid-trainer --device cuda experiment \
  --out target/exp/runs --results target/exp/results.md \
  --layers 6 --heads 6 --embd 384 --block 256 --batch 64 --dropout 0.2 \
  --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta2 0.99 --weight-decay 0.1 --tf32 "$@"
status=$?
tar czf "$OUT/exp.tgz" --exclude=checkpoint -C target exp
exit $status
