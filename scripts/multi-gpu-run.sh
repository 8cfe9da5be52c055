#!/usr/bin/env bash
# One device-tool call on a machine with several GPUs (nvidia-h200-x2): unpack the carried
# bundle, then the steps named in $STEPS (default: all), logs under $OUT.
#   tests  the multi-GPU tests (tests/hybrid-trainer--data_parallel), output shown
#   bench  GPT tokens/s on 1 and 2 GPUs, ours (launch) and PyTorch DDP (torchrun), for the
#          shakespeare-char model and a 12 x 768, context 1024 one (per-rank batches
#          $LARGE_BATCHES, default 16); all-reduce bus bandwidth
#   full   the whole bundle (run.sh --no-sanitizer)
set -u -o pipefail
export NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-tests bench}"
mkdir -p "$OUT"
tar xf "${BUNDLE:-target/gpu-bundle.tar.xz}" -C /tmp && cd /tmp/gpu-bundle || exit 1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export HYBRID_TRAINER_BIN="$PWD/bin/hybrid-trainer" HYBRID_REQUIRE_GPUS=$(nvidia-smi -L | grep -c '^GPU')
nvidia-smi -L
python3 -c "import nvidia.nccl, os; d=os.path.join(list(nvidia.nccl.__path__)[0], 'lib'); print('nccl wheel', d, os.listdir(d))"
status=0
for step in $STEPS; do
  case "$step" in
  tests)
    echo "== multi-GPU tests"
    timeout 400 tests/hybrid-trainer--data_parallel --nocapture --test-threads=1 > "$OUT/multigpu-tests.log" 2>&1
    rc=$?
    grep -vE '\| (iter|eval) ' "$OUT/multigpu-tests.log" | tail -40
    [ $rc -eq 0 ] || status=1
 ;;
  bench)
    if [ -z "${SKIP_ALLREDUCE:-}" ]; then
    echo "== all-reduce bandwidth"
    timeout 120 bin/hybrid-trainer launch --nproc-per-node 2 -- allreduce-bench --sizes-mib 1,16,64,256 > "$OUT/allreduce-ours.log" 2>&1 || status=1
    grep peer "$OUT/allreduce-ours.log"
    timeout 120 python3 -m torch.distributed.run --nproc_per_node 2 torch_ddp.py allreduce --sizes-mib 1,16,64,256 > "$OUT/allreduce-torch.log" 2>&1 || status=1
    grep peer "$OUT/allreduce-torch.log"
    fi
    txt=data/tinyshakespeare.txt
    # name, model flags, per-rank batch, iterations. LARGE_BATCHES: the large model's per-rank
    # batches, each a row (64 is llm.c's per-GPU batch for GPT-2 124M at context 1024).
    cfgs=()
    for lb in ${LARGE_BATCHES:-16}; do
      cfgs+=("large|--layers 12 --heads 12 --embd 768 --block 1024|$lb|${LARGE_ITERS:-60}")
    done
    cfgs+=("small|--layers 6 --heads 6 --embd 384 --block 256|64|${SMALL_ITERS:-300}")
    for cfg in "${cfgs[@]}"; do
      IFS='|' read -r name flags b iters <<< "$cfg"
      for n in ${NGPUS:-1 2}; do
        echo "== $name GPT, $n GPU(s), per-rank batch $b, ours"
        timeout ${RUN_LIMIT:-120} bin/hybrid-trainer launch --nproc-per-node $n -- train-gpt --data $txt $flags --batch $((b * n)) \
          --precision bf16 --dropout 0 --iters $iters --eval-interval 100000 --eval-iters 1 --sample 0 \
          --log-interval 20 2>&1 | tee "$OUT/ours-$name-b$b-$n.log" | grep -E 'summary|error|Error|rank' | cut -c1-400
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        [ -n "${SKIP_TORCH:-}" ] && continue
        echo "== $name GPT, $n GPU(s), PyTorch DDP"
        timeout ${RUN_LIMIT:-120} python3 -m torch.distributed.run --nproc_per_node $n torch_ddp.py gpt --data $txt $flags --batch $b \
          --iters $iters 2>&1 | tee "$OUT/torch-$name-b$b-$n.log" | grep -E 'peer|Error' | cut -c1-400
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
    done ;;
  full)
    OUT_DIR="$OUT/run" ./run.sh --no-sanitizer 2>&1 | tail -30
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
  esac
done
exit $status
