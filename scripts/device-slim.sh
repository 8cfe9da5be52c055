#!/usr/bin/env bash
# The device tool copies the working tree with the carried paths, 64 MiB in all; the tree is
# ~39 MB (the PTX and fatbins, the issue-41 curves, the HF test fixtures) and the GPU bundle
# ~60 MB, so a bundle call does not fit. A bundle call needs none of those folders (the
# binaries embed the kernels; the bundle has its own fixtures and data). The bundle of 2062dd0
# (60.3 MB) with the first three alone left (6.5 MB tracked) and the Vulkan loader was still
# refused as over 64 MiB; docs, benches and the trainer's data go too (4.5 MB left). So:
#   scripts/device-slim.sh out    # move them to $HOLD (default /tmp/device-slim)
#   ... the device call, carrying target/gpu-bundle.tar.xz ...
#   scripts/device-slim.sh back   # put them back (mv keeps their times: cargo rebuilds nothing)
# `git status` shows them deleted in between; `back` refuses to overwrite anything.
set -euo pipefail
cd "$(dirname "$0")/.."
hold=${HOLD:-/tmp/device-slim}
dirs=(crates/gpu-kernels/kernels docs benches crates/trainer/data crates/models/tests/fixtures)
case "${1:-}" in
  out)
    for d in "${dirs[@]}"; do
      if [ -e "$hold/$d" ]; then echo "device-slim: $hold/$d exists (run 'back' first)" >&2; exit 1; fi
    done
    for d in "${dirs[@]}"; do mkdir -p "$hold/$(dirname "$d")" && mv "$d" "$hold/$d"; done
    echo "moved ${dirs[*]} to $hold; tracked files left: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes" ;;
  back)
    for d in "${dirs[@]}"; do
      if [ -e "$d" ]; then echo "device-slim: $d exists here; not overwritten" >&2; exit 1; fi
    done
    for d in "${dirs[@]}"; do mv "$hold/$d" "$d"; done
    # The parents left empty in $hold would read as "exists" to the next `out`.
    find "$hold" -depth -type d -empty -delete
    echo "restored ${dirs[*]}" ;;
  *) echo "usage: $0 out|back" >&2; exit 2 ;;
esac
