#!/usr/bin/env bash
# Same-call A/B of the data-parallel step's communication settings on 2 GPUs (device tool,
# carry target/gpu-bundle-mini.tar.gz or the bundle): tokens/s of train-gpt bf16 per setting.
#   AB="prio0 prio1" (HYBRID_COMM_PRIORITY) or AB="25 8 2" (HYBRID_BUCKET_MIB)
set -u
export NCCL_NVLS_ENABLE=0
tar xf "${BUNDLE:-target/gpu-bundle-mini.tar.gz}" -C /tmp && cd /tmp/gpu-bundle || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
for cfg in "small|--layers 6 --heads 6 --embd 384 --block 256 --batch 128|120" "large|--layers 12 --heads 12 --embd 768 --block 1024 --batch 32|40"; do
  IFS='|' read -r name flags iters <<< "$cfg"
  for rep in 1 2; do
    for v in ${AB:-prio0 prio1}; do
      case "$v" in prio*) env="HYBRID_COMM_PRIORITY=${v#prio}" ;; *) env="HYBRID_BUCKET_MIB=$v" ;; esac
      env $env timeout 60 bin/hybrid-trainer launch --nproc-per-node 2 -- train-gpt --data data/tinyshakespeare.txt $flags --precision bf16 --dropout 0 --iters $iters --eval-interval 100000 --eval-iters 1 --sample 0 --log-interval 20 > "$OUT/ab-$name-$v-$rep.log" 2>&1
      echo "$name $v (round $rep): $(grep -E '^iter' "$OUT/ab-$name-$v-$rep.log" | tail -2 | tr '\n' ' ' | cut -c1-200)"
    done
  done
done
