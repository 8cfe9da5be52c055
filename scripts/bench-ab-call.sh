#!/usr/bin/env bash
# One device call of scripts/bench-ab.sh with a slim carry: the two builds' stripped binaries,
# xz-compressed, in target/ab/{A,B}/bin/{gpu-bench,hybrid-trainer}.xz (the whole bundle does
# not fit beside the tree in the device tool's 64 MiB). Make a side here with
#   cargo build --release -p benches --bin gpu-bench && cargo build --release -p hybrid-trainer
#   for b in gpu-bench hybrid-trainer; do strip -o /tmp/$b target/release/$b &&
#     xz -6 -c /tmp/$b > target/ab/SIDE/bin/$b.xz; done
# (A: the same in a worktree of the base commit), run scripts/device-slim.sh out (the tree and
# the ~35 MB of binaries exceed 64 MiB otherwise; back afterwards), carry target/ab, and run on the GPU machine
# from the repository root:  [ROUNDS=2] [SKIP=...] bash scripts/bench-ab-call.sh
# Outputs: $OUT/ab.tgz (bench-ab's logs and tables) and $OUT/gpu.txt (card, binaries' sums).
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/ab
for side in A B; do
  mkdir -p /tmp/ab/$side/bin
  for b in gpu-bench hybrid-trainer; do
    xz -dc target/ab/$side/bin/$b.xz > /tmp/ab/$side/bin/$b || exit 1
    chmod +x /tmp/ab/$side/bin/$b
  done
done
gunzip -c crates/trainer/data/tinyshakespeare.txt.gz > /tmp/ab/tinyshakespeare.txt || exit 1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  sha256sum /tmp/ab/*/bin/*; } > "$OUT/gpu.txt"
TEXT=/tmp/ab/tinyshakespeare.txt timeout "${AB_TIMEOUT:-560}" \
  bash scripts/bench-ab.sh /tmp/ab/A /tmp/ab/B "$OUT/ab"
status=$?
rm -rf "$OUT/ab/hf"
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
exit $status
