#!/usr/bin/env bash
# Where a data-parallel step's time goes (device tool, nvidia-h200-x2, carry a bundle):
# the large GPT bf16 alone on 1 GPU, as two independent 1-GPU runs at once (no communication),
# on 2 GPUs with the settings in $AB (default, pack0: no small gradients packed, chN: N NCCL
# channels, bN: N MiB buckets, or
# VAR=value+VAR=value; eager+ in front: train-gpt --eager), and, where Nsight Systems is installed
# and NO_NSYS is unset, a 2-GPU timeline summarised by scripts/nsys_overlap.py. Logs under $OUT.
# MODEL=small|large, REPS (2), ITERS, SKIP_PAIR=1 (no two-runs-at-once control),
# EAGER_BASELINE=1 (1 GPU with --eager too). A run that printed no summary reports 'no figure'.
set -u
export NCCL_NVLS_ENABLE=0
here="$(cd "$(dirname "$0")" && pwd)"
tar xf "${BUNDLE:-target/gpu-bundle-mini.tar.gz}" -C /tmp && cd /tmp/gpu-bundle || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
# MODEL=small: the shakespeare-char GPT (6 x 384, context 256), per-GPU batch 64.
if [ "${MODEL:-large}" = small ]; then model="--layers 6 --heads 6 --embd 384 --block 256"; b=64; ITERS=${ITERS:-300}
else model="--layers 12 --heads 12 --embd 768 --block 1024"; b=16; ITERS=${ITERS:-100}; fi
m=${MODEL:-large}
flags="--data data/tinyshakespeare.txt $model --precision bf16 --dropout 0 --eval-interval 100000 --eval-iters 1 --sample 0 --log-interval 20"
tps() { grep -o '"tokens_per_second":[0-9.]*' "$1" | cut -d: -f2 | cut -d. -f1 | grep . || echo "no figure (see $1)"; }
for rep in $(seq ${REPS:-2}); do
  timeout 90 bin/hybrid-trainer --device cuda:0 train-gpt $flags --batch $b --iters $ITERS > "$OUT/$m-one-$rep.log" 2>&1
  echo "$m, 1 GPU alone: $(tps "$OUT/$m-one-$rep.log") tok/s"
  if [ -z "${SKIP_PAIR:-}" ]; then
  timeout 90 bin/hybrid-trainer --device cuda:0 train-gpt $flags --batch $b --iters $ITERS > "$OUT/$m-pair0-$rep.log" 2>&1 &
  timeout 90 bin/hybrid-trainer --device cuda:1 train-gpt $flags --batch $b --iters $ITERS > "$OUT/$m-pair1-$rep.log" 2>&1
  wait
  echo "$m, 2 independent 1-GPU runs at once: $(tps "$OUT/$m-pair0-$rep.log") + $(tps "$OUT/$m-pair1-$rep.log") tok/s"
  fi
  if [ -n "${EAGER_BASELINE:-}" ]; then
    timeout 120 bin/hybrid-trainer --device cuda:0 train-gpt $flags --eager --batch $b --iters $ITERS > "$OUT/$m-one-eager-$rep.log" 2>&1
    echo "$m, 1 GPU alone, --eager: $(tps "$OUT/$m-one-eager-$rep.log") tok/s"
  fi
  for v in ${AB:-default pack0 b8 b100}; do
    extra=""
    case "$v" in eager+*) extra="--eager"; v="${v#eager+}" ;; esac
    case "$v" in
      default) env="" ;;
      pack0) env="HYBRID_PACK_BELOW_KIB=0" ;;
      ch*) env="NCCL_MAX_NCHANNELS=${v#ch}" ;;
      b*) env="HYBRID_BUCKET_MIB=${v#b}" ;;
      *) env="${v//+/ }" ;;  # VAR=value, several joined by +
    esac
    log="$OUT/$m-dp$extra-$(echo "$v" | tr -c 'A-Za-z0-9\n' _)-$rep.log"
    env $env timeout 120 bin/hybrid-trainer launch --nproc-per-node 2 -- train-gpt $flags $extra --batch $((2 * b)) --iters $ITERS > "$log" 2>&1
    echo "$m, 2 GPUs $extra $v: $(tps "$log") tok/s"
  done
done
nsys=$(ls -d /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
[ -z "$nsys" ] && nsys=$(command -v nsys)
if [ -n "$nsys" ] && [ -z "${NO_NSYS:-}" ]; then
  for n in 1 2; do
    timeout 150 "$nsys" profile -t cuda --cuda-graph-trace=node -o "/tmp/prof$n" -f true \
      bin/hybrid-trainer launch --nproc-per-node $n -- train-gpt $flags --batch $((b * n)) --iters 40 > "$OUT/$m-nsys-$n.log" 2>&1
    timeout 120 "$nsys" export --type sqlite -o "/tmp/prof$n.sqlite" -f true "/tmp/prof$n.nsys-rep" >> "$OUT/$m-nsys-$n.log" 2>&1
    echo "== nsys, $n GPU(s)"
    timeout 120 python3 "$here/nsys_overlap.py" "/tmp/prof$n.sqlite" 2>&1 | tee "$OUT/$m-overlap-$n.txt"
  done
else
  echo "no Nsight Systems here"
fi
