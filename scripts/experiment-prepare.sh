#!/usr/bin/env bash
# Prepares the carry of `scripts/experiment-call.sh` for issue 41's runs on a fresh checkout:
# bffda6b's `hybrid-trainer` (the build every W2–W4 run used), rebuilt in a worktree, stripped
# and checked against its sha256 (rustc 1.95.0); W6's and W8's corpus (`scripts/corpus-kjv.sh`);
# and target/exp filled with the curves in docs/results-curves/issue41 (H100 runs only), so that
# a run already made is not made again. Usage: scripts/experiment-prepare.sh (from the root).
set -euo pipefail
want=4ddcc3d491796e418e8795fe250365d68814df3065e2df0fa12c50ee42ff453f
wt=${TMPDIR:-/tmp}/wt-bffda6b
mkdir -p target/expcall target/kjv target/exp
if [ ! -f target/expcall/hybrid-trainer.xz ]; then
  [ -d "$wt" ] || git worktree add -f "$wt" bffda6b
  (cd "$wt" && CARGO_TARGET_DIR="$wt/target" cargo build --release -p hybrid-trainer)
  strip -o "$wt/ht" "$wt/target/release/hybrid-trainer"
  got=$(sha256sum "$wt/ht" | cut -d' ' -f1)
  [ "$got" = "$want" ] || echo "experiment-prepare: warning: sha256 $got, not bffda6b's $want" >&2
  xz -6 -c "$wt/ht" >target/expcall/hybrid-trainer.xz
fi
if [ ! -f target/kjv/kjv.txt.gz ]; then
  bash scripts/corpus-kjv.sh "$wt.kjv.txt"
  gzip -9 -c "$wt.kjv.txt" >target/kjv/kjv.txt.gz
fi
for w in docs/results-curves/issue41/w[1-8]; do
  mkdir -p "target/exp/$(basename "$w")"
  cp -n "$w"/*.json "target/exp/$(basename "$w")/"
done
echo "carry: target/expcall target/exp (and target/kjv for W6 and W8)"
