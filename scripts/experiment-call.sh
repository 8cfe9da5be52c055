#!/usr/bin/env bash
# One device call of `hybrid-trainer experiment` on one GPU, with a slim carry: the stripped,
# xz-compressed `hybrid-trainer` binary alone (11 MB against the 60 MB bundle, so the source
# tree travels beside it within the device tool's 64 MiB); without it, the carried bundle's
# binary (target/gpu-bundle.tar.xz). Make the slim binary here:
#   cargo build --release -p hybrid-trainer && mkdir -p target/expcall &&
#   strip -o /tmp/ht target/release/hybrid-trainer && xz -6 -c /tmp/ht > target/expcall/hybrid-trainer.xz
# (`scripts/experiment-prepare.sh` does this, the corpus and the curves so far, on a fresh checkout;
# issue 41's runs: bffda6b's build; with rustc 1.95.0 its stripped binary's sha256 is
# 4ddcc3d491796e418e8795fe250365d68814df3065e2df0fa12c50ee42ff453f, printed into gpu.txt),
# and carry target/expcall, target/kjv (W6's and W8's corpus, kjv.txt.gz, given as --kjv when
# present) and the curves so far (EXP, default target/exp: a run whose curve
# exists is not run again). On the GPU machine, from the repository root:
#   [EXP=DIR] [WORKLOADS=w1] [EXTRA="--w7-lr R"] [GPU=N TAG=-N] \
#     bash scripts/experiment-call.sh SECONDS TORCH(0|1) ARMS [ARMS...]
# runs, with TORCH=1, PyTorch's AdamW at 1× and 3× on W1 (seed 1, the peer with attention
# dropout), then each comma list of arms in turn until SECONDS have passed, and packs the
# curves and logs into $OUT/exp.tgz and the card's name into $OUT/gpu.txt. GPU=N runs on that
# card alone; TAG names this stream's files ($OUT/gpu$TAG.txt, exp$TAG.log, its own copies of
# the binary and corpora) and leaves the packing to the caller: several streams at once, one a
# card, is `scripts/experiment-streams.sh`.
set -u
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
secs=$1; torch=$2; shift 2
exp=${EXP:-target/exp}
gpu=${GPU:-}; tag=${TAG:-}
[ -z "$gpu" ] || export CUDA_VISIBLE_DEVICES=$gpu
start=$(date +%s)
B=/tmp/hybrid-trainer$tag
if [ -f target/expcall/hybrid-trainer.xz ]; then
  xz -dc target/expcall/hybrid-trainer.xz > $B && chmod +x $B || exit 1
else
  [ -d /tmp/gpu-bundle ] || tar xJf target/gpu-bundle.tar.xz -C /tmp || exit 1
  B=/tmp/gpu-bundle/bin/hybrid-trainer
fi
mkdir -p "$exp" "$OUT"
data=/tmp/tinyshakespeare$tag.txt
gunzip -c crates/trainer/data/tinyshakespeare.txt.gz > $data || exit 1
# W6's and W8's corpus (docs/protocol-41.md), when carried: `experiment` checks its sha256.
kjv=
if [ -f target/kjv/kjv.txt.gz ]; then
  gunzip -c target/kjv/kjv.txt.gz > /tmp/kjv$tag.txt && kjv="--kjv /tmp/kjv$tag.txt" || exit 1
fi
log="$OUT/exp$tag.log"; card="$OUT/gpu$tag.txt"
{ date -u; echo "${WORKLOADS:-w1} on card ${gpu:-all}"
  nvidia-smi ${gpu:+-i $gpu} --query-gpu=name,driver_version,memory.total --format=csv
  sha256sum $B; } > "$card"
if [ "$torch" = 1 ]; then
  for lr in 1e-3 3e-3; do
    python3 benches/torch_train_gpt.py $data --precision bf16 --seed 1 --iters 2000 \
      --eval-interval 25 --eval-iters 20 --lr $lr > "$OUT/torch-w1-lr$lr-seed1.log" 2>&1
    echo "torch lr $lr rc=$? at $(( $(date +%s) - start )) s" >> "$card"
  done
fi
for arms in "$@"; do
  left=$(( secs - ($(date +%s) - start) ))
  [ $left -gt 20 ] || break
  timeout $left $B --device cuda experiment --workloads "${WORKLOADS:-w1}" --arms "$arms" \
    --out "$exp" --data $data $kjv ${EXTRA:-} >> "$log" 2>&1
  echo "experiment $arms rc=$? at $(( $(date +%s) - start )) s" >> "$card"
done
[ -n "$tag" ] || tar czf "$OUT/exp.tgz" -C "$(dirname "$exp")" "$(basename "$exp")"
