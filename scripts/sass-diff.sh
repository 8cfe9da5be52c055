#!/usr/bin/env bash
# Whether a change to kernels/ changed any machine code, without a GPU: compiles each named
# module from REV (default HEAD) and from the working tree for sm_80 and sm_90 (the fatbin's
# machine code, which gpu-cuda loads by default), disassembles both with cuobjdump, and
# compares them function by function. nvcc's internal-namespace hash (it follows the source's
# bytes) is masked; nothing else is. A refactor that prints "identical" for every module runs
# the very instructions the GPU ran before it.
#   scripts/sass-diff.sh [--rev REV] MODULE...      (MODULE: kernels/MODULE.cu)
# Needs `cargo xtask build-ptx` to have installed the pinned nvcc once (it lives under
# ~/.cache/hybrid-trainer/cuda-13.0); fetches cuobjdump and nvdisasm wheels into
# ~/.cache/hybrid-trainer/cuobjdump the first time (network).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=HEAD
if [ "${1:-}" = --rev ]; then rev=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [--rev REV] MODULE..." >&2; exit 2; }
cache=$HOME/.cache/hybrid-trainer
nvcc=$(ls "$cache"/cuda-13.0/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -1)
[ -x "$nvcc" ] || { echo "no pinned nvcc: run cargo xtask build-ptx once" >&2; exit 1; }
tools=$cache/cuobjdump
if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$tools/wheels"
  pip download -q --no-deps -d "$tools/wheels" nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51
  for w in "$tools"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
  chmod +x "$tools"/nvidia/cu13/bin/*
fi
export PATH=$tools/nvidia/cu13/bin:$PATH
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old"
git archive "$rev" kernels | tar x -C "$work/old"
status=0
for m in "$@"; do
  flags=(-fatbin -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90
    -O3 -std=c++17 -I kernels "kernels/$m.cu")
  (cd "$work/old" && "$nvcc" "${flags[@]}" -o "$work/$m.old.fatbin")
  "$nvcc" "${flags[@]}" -o "$work/$m.new.fatbin"
  for side in old new; do
    for arch in sm_80 sm_90; do
      cuobjdump -sass -arch $arch "$work/$m.$side.fatbin" |
        sed -E 's/_INTERNAL_[0-9a-f]{8}_/_INTERNAL_X_/g' > "$work/$m.$side.$arch.sass"
    done
  done
  python3 - "$work" "$m" <<'PY' || status=1
import re, sys
work, m = sys.argv[1:]
def functions(path):
    parts = re.split(r"\n\s*Function : ", open(path).read())
    return {p.split("\n", 1)[0].strip(): p.split("\n", 1)[1] for p in parts[1:]}
same = True
for arch in ("sm_80", "sm_90"):
    old, new = (functions(f"{work}/{m}.{s}.{arch}.sass") for s in ("old", "new"))
    diff = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    same &= bool(old) and not diff
    print(f"{m} {arch}: {len(old)} functions before, {len(new)} after; differing: {diff or 'none'}")
print(f"{m}: machine code {'identical' if same else 'DIFFERS'}")
sys.exit(0 if same else 1)
PY
done
exit $status
