#!/usr/bin/env bash
# Whether a change to kernels/ changed any machine code, without a GPU: compiles each named
# module from REV (default HEAD) and from the working tree for sm_80 and sm_90 (the fatbin's
# machine code, which gpu-cuda loads by default), disassembles both with cuobjdump, and
# compares them function by function, with each cubin's constant data (the literals the SASS
# text only points at). nvcc's internal-namespace hash (it follows the source's
# bytes) is masked; nothing else is. A refactor that prints "identical" for every module runs
# the very instructions the GPU ran before it. ptxas's sm_90 code is not always the same for the
# same source (seen: nn_attention's attn_fwd_d128_f32 and attn_bwd_dkdv_d128_f32 in about 1 of
# 3 compiles), so each side is compiled TRIES times (default 3) and a function differs only
# when no compile of one side matches any compile of the other.
#   [TRIES=N] scripts/sass-diff.sh [--rev REV] MODULE...      (MODULE: kernels/MODULE.cu)
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
  tries=${TRIES:-3}
  for t in $(seq "$tries"); do
    (cd "$work/old" && "$nvcc" "${flags[@]}" -o "$work/$m.old.$t.fatbin")
    "$nvcc" "${flags[@]}" -o "$work/$m.new.$t.fatbin"
    for side in old new; do
      for arch in sm_80 sm_90; do
        cuobjdump -sass -arch $arch "$work/$m.$side.$t.fatbin" |
          sed -E 's/_INTERNAL_[0-9a-f]{8}_/_INTERNAL_X_/g' > "$work/$m.$side.$arch.$t.sass"
      done
      # The cubins, for the constant data that the SASS text only points at (c[0x3][...]).
      mkdir -p "$work/x.$m.$side.$t"
      (cd "$work/x.$m.$side.$t" && cuobjdump -xelf all "$work/$m.$side.$t.fatbin" >/dev/null)
    done
  done
  python3 - "$work" "$m" "$tries" <<'PY' || status=1
import re, sys
work, m, tries = sys.argv[1], sys.argv[2], int(sys.argv[3])
import glob, struct
def constants(cubin):
    """The bytes of the cubin's constant and global-initialiser sections, by masked name."""
    b = open(cubin, "rb").read()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    size, count, names = struct.unpack_from("<HHH", b, 0x3a)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * size) for i in range(count)]
    base = hdrs[names][4]
    out = {}
    for h in hdrs:
        name = b[base + h[0]:b.index(b"\0", base + h[0])].decode()
        if name.startswith((".nv.constant", ".nv.global.init")):
            name = re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_X_", name)
            out["data " + name] = b[h[4]:h[4] + h[5]] if h[1] != 8 else h[5]
    return out
def functions(path):
    parts = re.split(r"\n\s*Function : ", open(path).read())
    f = {p.split("\n", 1)[0].strip(): p.split("\n", 1)[1] for p in parts[1:]}
    mod, side, arch, t, _ = path.rsplit("/", 1)[1].split(".")
    cubins = glob.glob(f"{work}/x.{mod}.{side}.{t}/*.{arch}.cubin")
    assert len(cubins) == 1, cubins
    return f | constants(cubins[0])
same = True
for arch in ("sm_80", "sm_90"):
    old, new = ([functions(f"{work}/{m}.{s}.{arch}.{t}.sass") for t in range(1, tries + 1)]
                for s in ("old", "new"))
    names = set().union(*old, *new)
    def matches(k):
        return any(o.get(k) is not None and o.get(k) == n.get(k) for o in old for n in new)
    diff = sorted(k for k in names if not matches(k))
    same &= bool(old[0]) and not diff
    n = [sum(not k.startswith("data ") for k in x[0]) for x in (old, new)]
    print(f"{m} {arch}: {n[0]} functions before, {n[1]} after (and their constant data); differing: {diff or 'none'}")
print(f"{m}: machine code {'identical' if same else 'DIFFERS'}")
sys.exit(0 if same else 1)
PY
done
exit $status
