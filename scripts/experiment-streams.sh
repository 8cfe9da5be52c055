#!/usr/bin/env bash
# Several streams of issue 41's runs at once on a machine with several GPUs, one stream a card
# (the protocol: one run at a time per GPU; a two-GPU machine gives two streams). Each stream
# is one `scripts/experiment-call.sh` with its own card, logs and copies of the binary and
# corpora; the curves of all of them are packed once, after the last, into $OUT/exp.tgz.
# Needs the slim binary (target/expcall, `scripts/experiment-prepare.sh`). On the GPU machine,
# from the repository root:
#   bash scripts/experiment-streams.sh SECONDS 'w4=ARMS;ARMS...' 'w6=ARMS...' ...
# where stream i (from 0) runs on card i: its workload, then its `;`-separated comma lists of
# arms in turn, until SECONDS have passed. Streams that share a workload must not share an arm.
set -u
secs=$1; shift
exp=${EXP:-target/exp}
[ -f target/expcall/hybrid-trainer.xz ] || { echo "experiment-streams: no target/expcall" >&2; exit 1; }
cards=$(nvidia-smi -L | grep -c '^GPU')
[ "$#" -le "$cards" ] || { echo "experiment-streams: $# streams, $cards cards" >&2; exit 1; }
mkdir -p "$OUT"
i=0
for stream in "$@"; do
  w=${stream%%=*}
  IFS=';' read -ra lists <<< "${stream#*=}"
  GPU=$i TAG=-$i WORKLOADS=$w bash scripts/experiment-call.sh "$secs" 0 "${lists[@]}" &
  i=$((i + 1))
done
wait
tar czf "$OUT/exp.tgz" -C "$(dirname "$exp")" "$(basename "$exp")"
