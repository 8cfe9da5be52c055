#!/usr/bin/env bash
# Interleaved same-run rounds of the CPU rows (docs/cpu-speed.md), each run wrapped to record how
# much CPU the other processes on the box used meanwhile (/proc/stat minus the run's own user +
# system time, in cores). Per round: [a baseline cpu-bench], ours (fast), the numpy/PyTorch peer,
# ours (exact). Each round waits until the box is quiet (< 0.15 of a core for 2 s).
#
#   OUT=dir ROUNDS=20 PY=/path/to/python TXT=tinyshakespeare.txt [BASE_BIN=old/cpu-bench] \
#     benches/cpu-rounds/run.sh          # from the repository root, after a release build
#
# GPT_ONLY=1: only the GPT step row, no SGEMM rows and no exact-mode run; BASE_BIN is then a
# build of this cpu-bench (e.g. another commit's), run as ours is (fast mode, --no-sgemm).
#   python3 benches/cpu-rounds/summary.py dir 0.05
set -u
OUT=${OUT:-target/cpu-rounds}; mkdir -p "$OUT"
TXT=${TXT:?the GPT text}; PY=${PY:-python3}; ROUNDS=${ROUNDS:-5}; START=${START:-1}
BENCH=target/release/cpu-bench
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
others_now() { local s0 s1; s0=$(busy); sleep 2; s1=$(busy); python3 -c "print(($s1-$s0)/200)"; }
run() {
  local name=$1; shift
  local s0 t0 t1 s1 u s
  s0=$(busy); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$OUT/$name.cpu" "$@" > "$OUT/$name.out" 2>/dev/null
  t1=$(date +%s.%N); s1=$(busy)
  read -r u s < "$OUT/$name.cpu"
  python3 -c "w=$t1-$t0; o=($s1-$s0)/100-($u+$s); print(f'{w:.2f} {max(o,0)/w:.2f}')" > "$OUT/$name.load"
}
for r in $(seq "$START" "$ROUNDS"); do
  while :; do
    o=$(others_now)
    python3 -c "import sys; sys.exit(0 if $o < 0.15 else 1)" && break
    sleep 5
  done
  if [ -n "${GPT_ONLY:-}" ]; then
    if [ -n "${BASE_BIN:-}" ]; then
      run "base_$r" "$BASE_BIN" --no-peer --no-sgemm --gpt-text "$TXT" --rounds 1 \
        --out "$OUT/base_$r.md"
    fi
    run "ours_$r" "$BENCH" --no-peer --no-sgemm --gpt-text "$TXT" --rounds 1 --out "$OUT/ours_$r.md"
    run "peer_$r" env -u OPENBLAS_CORETYPE "$PY" benches/torch_cpu_peer.py --reps 10 --threads 2 \
      --sizes '' --gpt-text "$TXT"
  else
    if [ -n "${BASE_BIN:-}" ]; then
      run "base_$r" "$BASE_BIN" --python /bin/false --gpt-text "$TXT" --out "$OUT/base_$r.md"
    fi
    run "ours_$r" "$BENCH" --no-peer --gpt-text "$TXT" --rounds 1 --out "$OUT/ours_$r.md"
    run "peer_$r" env -u OPENBLAS_CORETYPE "$PY" benches/torch_cpu_peer.py --reps 10 --threads 2 \
      --sizes 1024,1536,2048 --gpt-text "$TXT"
    run "exact_$r" "$BENCH" --cpu-mode exact --no-sgemm --no-peer --gpt-text "$TXT" --rounds 1 \
      --out "$OUT/exact_$r.md"
  fi
  echo "round $r $(date +%T) wall, others' cores: ours $(cat "$OUT/ours_$r.load") peer $(cat "$OUT/peer_$r.load")"
done
