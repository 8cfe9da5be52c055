#!/usr/bin/env bash
# Same-process A/B timing of the row and attention kernels of two revisions (or the working tree).
# Here (needs the pinned nvcc that `cargo xtask build-ptx` installs):
#   scripts/kernel-ab.sh build REV_A REV_B ...   -> target/ab/cubin/{NAME}-{module}.cubin, NAME = REV
#     (a REV of "work" takes the working tree's kernels/)
# On the GPU machine (the device tool, carrying target/ab):
#   python3 scripts/kernel_ab.py ROUNDS LN_NAMES ATT_NAMES [EW_NAMES [ROWS_NAMES [BF16_NAMES [MEM_NAMES [ABF_NAMES [ABB_NAMES]]]]]]
#   e.g. 60 f6ce311,work f6ce311,work f6ce311,work,torch; "-" skips a list. ABF / ABB: the bf16
#   attention forward / backward against SDPA ("torch"), graph-timed: 40 - - - - - - 74d68e3,work,torch
#   (a build named work-M1+M2=V compiles the working tree with -DM1 -DM2=V).
# The first name of each list is the baseline of its ratios.
set -euo pipefail
cmd=${1:-}; shift || true
[ "$cmd" = build ] || { sed -n 2,8p "$0"; exit 2; }
NVCC=${NVCC:-$(ls "$HOME"/.cache/hybrid-trainer/cuda-13.0/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -1)}
out=target/ab/cubin; mkdir -p "$out"
for rev in "$@"; do
  src=$(mktemp -d)
  defs=()
  # "work" or "work-M1+M2=V": the working tree's kernels, the latter compiled with -DM1 -DM2=V.
  if [[ "$rev" == work* ]]; then cp kernels/*.cu kernels/*.cuh "$src/"; [ "$rev" = work ] || { IFS=+ read -ra ms <<< "${rev#work-}"; for m in "${ms[@]}"; do defs+=("-D$m"); done; };
  else for f in $(git ls-tree --name-only "$rev" kernels/); do git show "$rev:$f" > "$src/$(basename "$f")"; done; fi
  for m in nn_rows nn_attention nn_attention_bf16 nn_elementwise nn_bf16 nn_reduce_bf16 rssm_rollout rssm_rollout_cluster; do
    [ -f "$src/$m.cu" ] || continue
    "$NVCC" -O3 -std=c++17 "${defs[@]}" -I "$src" -cubin -arch=sm_90 "$src/$m.cu" -o "$out/$rev-$m.cubin"
  done
  rm -rf "$src"; echo "built $rev"
done
