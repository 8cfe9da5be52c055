#!/usr/bin/env bash
# One device-tool call of `hybrid-trainer experiment` on the GPU, from the carried bundle
# (target/gpu-bundle.tar.xz). Resumes from the curves in target/exp (carry it back in: a run
# whose curve exists is not run again), stops after EXP_SECONDS, and packs the curves and logs
# into $OUT/exp.tgz.
#   scripts/experiment-gpu.sh [EXPERIMENT_FLAGS...]    e.g. --workloads w1,w2 --seeds 1 --jobs 4
set -u -o pipefail
export NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" target/exp
[ -d /tmp/gpu-bundle ] || tar xJf target/gpu-bundle.tar.xz -C /tmp || exit 1
data=/tmp/gpu-bundle/data/tinyshakespeare.txt
[ -f "$data" ] && set -- --data "$data" "$@"
timeout "${EXP_SECONDS:-540}" /tmp/gpu-bundle/bin/hybrid-trainer --device cuda experiment \
  --out target/exp "$@"
status=$?
tar czf "$OUT/exp.tgz" -C target exp
exit $status
