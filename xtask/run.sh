#!/usr/bin/env bash
# GPU test bundle runner (made by `cargo xtask gpu-bundle`). Runs on a GPU machine with no Rust.
#
#   ./run.sh [--bench] [--no-sanitizer] [--no-tests] [--sanitize-only] [--parity] [--hf-parity]
#            [--train ITERS]
#
# Runs every test binary, counts the GPU tests (named gpu_*): ran, passed, failed, skipped.
# Exits non-zero if any test failed, or if any GPU test skipped while a GPU is present.
# Where compute-sanitizer exists, runs the kernel tests under memcheck and racecheck.
# --bench also runs gpu-bench (with the PyTorch peer) and writes out/benchmarks.md, and, where a
# Vulkan loader is present, wgpu-bench on the same GPU (out/wgpu-bench.md).
# wgpu: where a Vulkan loader is present (carry libvulkan1 and unpack it first: the device
# README), the wgpu tests must run on the GPU's Vulkan driver (HYBRID_REQUIRE_WGPU=1); without
# one they skip and are counted apart.
# --parity runs the PyTorch parity checks of the GPT (scripts/torch_parity.py; fp32, and bf16
# against PyTorch's autocast) and of the GRU cell (scripts/torch_gru_parity.py).
# --hf-parity builds random models with the real configs of Llama-3.2-1B, Qwen2.5-0.5B and
# GPT-2 124M, and a Mistral of the 1B's sizes with a 16-slot sliding window, in transformers (hf_gpu_parity.py, on cuda, into $HF_PARITY_DIR or a temporary
# folder removed afterwards; ~8 GB) and checks each with `hybrid-trainer check-hf --device
# cuda`: the prompt's logits within the stated f32 bound and the same 64 greedy tokens. Logs and
# the PASS/FAIL lines (hf-parity-summary.txt) go to $OUT_DIR; $HF_PARITY_ARGS is passed to the
# script (e.g. --small for a quick smoke run).
# --train N trains the shakespeare-char GPT for N iterations on data/tinyshakespeare.txt.
# --wgpu-bench measures issue 42's item 4 in one call (with a Vulkan loader): wgpu-bench with
# its profile, gpu-bench's cuBLAS ceilings and CUDA GPT steps (--only-ceilings --only-gpt), the
# burn peer (bin/burn-peer, where the bundle has it: BUNDLE_BURN_PEER=1 cargo xtask gpu-bundle), and batch-1 decode of a random
# Llama-3.2-1B (hf_generate_peer.py --save) by the fast engine in f32 on CUDA and on wgpu
# (bench-generate); outputs in $OUT_DIR/wgpu-*.
set -u -o pipefail
cd "$(dirname "$0")"
bench=0; sanitize=1; tests=1; parity=0; hf_parity=0; train=0; wgpu_bench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1 ;;
    --wgpu-bench) wgpu_bench=1 ;;
    --no-sanitizer) sanitize=0 ;;
    --no-tests) tests=0; sanitize=0 ;;
    --sanitize-only) tests=0; sanitize=1 ;;
    --parity) parity=1 ;;
    --hf-parity) hf_parity=1 ;;
    --train) shift; train="$1" ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
OUT_DIR="${OUT_DIR:-$PWD/out}"
mkdir -p "$OUT_DIR"
export HYBRID_GPU_SKIP_LOG="$OUT_DIR/skips.log"
: > "$HYBRID_GPU_SKIP_LOG"
# Multi-GPU tests (multigpu_*) are counted on their own line: most machines have one GPU.
export HYBRID_MULTI_GPU_SKIP_LOG="$OUT_DIR/multi-skips.log"
: > "$HYBRID_MULTI_GPU_SKIP_LOG"
export HYBRID_TRAINER_BIN="$PWD/bin/hybrid-trainer"
# The tests' fixtures travel in the bundle: the binaries' compiled-in source paths are absent here.
export HYBRID_HF_FIXTURES="$PWD/fixtures/hf" HYBRID_RESULT_CURVES="$PWD/fixtures/curves"
export NCCL_NVLS_ENABLE=0

export HYBRID_WGPU_SKIP_LOG="$OUT_DIR/wgpu-skips.log"
: > "$HYBRID_WGPU_SKIP_LOG"
vulkan=0
if ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1'; then
  vulkan=1
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="${VK_DRIVER_FILES:-$icd}"; fi
  export HYBRID_REQUIRE_WGPU=1
  echo "Vulkan loader present: the wgpu tests must run"
else
  echo "no Vulkan loader: the wgpu tests will skip (counted in $HYBRID_WGPU_SKIP_LOG)"
fi

gpu=0
if nvidia-smi -L > "$OUT_DIR/gpus.txt" 2>&1 && grep -q GPU "$OUT_DIR/gpus.txt"; then
  gpu=1
  export HYBRID_REQUIRE_GPU=1
  export HYBRID_REQUIRE_GPUS=$(grep -c '^GPU' "$OUT_DIR/gpus.txt")
  echo "GPU present: $(head -1 "$OUT_DIR/gpus.txt") ($HYBRID_REQUIRE_GPUS in all)"
else
  echo "no GPU present: GPU tests will skip"
fi

status=0
: > "$OUT_DIR/tests.log"
[ -f data/tinyshakespeare.txt ] && export TINYSHAKESPEARE="$PWD/data/tinyshakespeare.txt"
for t in $( [ "$tests" = 1 ] && ls tests/* ); do
  name=$(basename "$t")
  echo "== $name"
  "$t" > "$OUT_DIR/$name.log" 2>&1
  rc=$?
  cat "$OUT_DIR/$name.log" >> "$OUT_DIR/tests.log"
  grep -E '^test |^test result|SKIP|panicked' "$OUT_DIR/$name.log"
  if [ "$rc" -ge 128 ]; then
    # The binary crashed: run its tests one by one to name the one that crashes.
    echo "!! $name crashed (exit $rc); running its tests one at a time"
    "$t" --list 2>/dev/null | sed -n 's/: test$//p' | while read -r one; do
      "$t" --exact "$one" > "$OUT_DIR/$name.$one.log" 2>&1
      one_rc=$?
      grep -E '^test ' "$OUT_DIR/$name.$one.log" >> "$OUT_DIR/tests.log"
      [ "$one_rc" -ge 128 ] && { echo "test $one ... FAILED" >> "$OUT_DIR/tests.log"; echo "!! $one crashed (exit $one_rc)"; }
    done
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "!! $name failed (exit $rc)"; status=1
  fi
done

# A result may share its line with another test's output, before or after it (stdout and stderr
# interleave: "test a ... okSKIP b: ..."): results are counted wherever they stand in a line.
results() { grep -oE "test ([^ ]*::)?$1[^ ]*( - should panic)? \\.\\.\\. $2" "$OUT_DIR/tests.log" | grep -c . ; }
ran=$(results gpu_ '(ok|FAILED)')
passed=$(results gpu_ ok)
failed=$(results gpu_ FAILED)
skipped=$(sort -u "$HYBRID_GPU_SKIP_LOG" | grep -c . )
all_passed=$(results '' ok)
all_failed=$(results '' FAILED)
# A test that skipped reported "ok" to the harness: it is not a pass.
passed=$((passed - skipped))
echo
echo "GPU tests: ran $ran, passed $passed, failed $failed, skipped $skipped"
m_ran=$(results multigpu_ '(ok|FAILED)')
m_failed=$(results multigpu_ FAILED)
m_skipped=$(sort -u "$HYBRID_MULTI_GPU_SKIP_LOG" | grep -c . )
m_passed=$(( $(results multigpu_ ok) - m_skipped ))
echo "multi-GPU tests: ran $m_ran, passed $m_passed, failed $m_failed, skipped $m_skipped (GPUs here: ${HYBRID_REQUIRE_GPUS:-0})"
w_skipped=$(sort -u "$HYBRID_WGPU_SKIP_LOG" | grep -c . )
echo "wgpu tests skipped (no adapter): $w_skipped (Vulkan loader here: $vulkan)"
echo "all tests: $all_passed ok, $all_failed failed (skips included in ok: $((skipped + m_skipped + w_skipped)))"
if [ "$tests" = 1 ] && [ "$gpu" = 1 ] && [ "$skipped" -gt 0 ]; then
  echo "!! GPU present but $skipped GPU test(s) skipped"; status=1
fi
[ "$failed" -eq 0 ] && [ "$all_failed" -eq 0 ] || status=1

san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ "$sanitize" = 1 ] && [ "$gpu" = 1 ] && [ -n "$san" ]; then
  # memcheck over every kernel test binary; racecheck over those whose kernels share memory.
  for tool in memcheck racecheck; do
    # A name without a package is a gpu-cuda test binary; tensor-ops--bf16 runs the bf16 kernels
    # (elementwise, reductions, attention) from the tensor level.
    for bin in ${SANITIZE_BINS:-matmul nn_elementwise nn_rows nn_rows_extreme nn_attention nn_attention_bf16 nn_optim tensor-ops--bf16}; do
      case "$bin" in *--*) name="$bin" ;; *) name="gpu-cuda--$bin" ;; esac
      t=$(ls tests/"$name" 2>/dev/null) || continue
      [ "$tool" = racecheck ] && [ "$bin" = nn_optim ] && continue
      log="$OUT_DIR/sanitizer-$tool-$bin.log"
      timeout "${SANITIZER_TIMEOUT:-300}" "$san" --tool "$tool" --error-exitcode 99 --print-limit 20 \
        "$t" --test-threads=1 > "$log" 2>&1
      rc=$?
      summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
      if [ $rc -eq 0 ]; then echo "compute-sanitizer $tool $bin: clean (${summary:-no summary})";
      elif [ $rc -eq 124 ]; then echo "!! compute-sanitizer $tool $bin: did not finish in ${SANITIZER_TIMEOUT:-300} s"; status=1;
      else echo "!! compute-sanitizer $tool $bin: exit $rc (${summary:-see $log})"; status=1; fi
    done
  done
elif [ "$gpu" = 1 ]; then
  echo "compute-sanitizer: not run (${san:-not found}; sanitize=$sanitize)"
fi

if [ "$gpu" = 1 ] && [ "$tests" = 1 ]; then
  echo "== demo"
  bin/hybrid-trainer --device cuda demo 2>&1 | tee "$OUT_DIR/demo.log" || status=1
fi
if [ "$parity" = 1 ]; then
  for v in gpt2 llama; do
    for p in fp32 bf16; do
      echo "== PyTorch parity ($v, $p)"
      bin/hybrid-trainer --device cuda parity-dump --variant "$v" --precision "$p" --out "$OUT_DIR/parity-$v-$p.safetensors" || status=1
      python3 torch_parity.py "$OUT_DIR/parity-$v-$p.safetensors" 2>&1 | tee "$OUT_DIR/parity-$v-$p.log" | tail -4
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
  done
  echo "== PyTorch parity (GRU cell)"
  bin/hybrid-trainer --device cuda parity-dump --model gru --out "$OUT_DIR/parity-gru.safetensors" || status=1
  python3 torch_gru_parity.py "$OUT_DIR/parity-gru.safetensors" 2>&1 | tee "$OUT_DIR/parity-gru.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "$hf_parity" = 1 ]; then
  echo "== Hugging Face parity at real sizes (hf_gpu_parity.py, then check-hf on cuda)"
  hf_dir="${HF_PARITY_DIR:-$(mktemp -d)}"
  # shellcheck disable=SC2086
  python3 hf_gpu_parity.py "$hf_dir" --device cuda ${HF_PARITY_ARGS:-} 2>&1 | tee "$OUT_DIR/hf-parity-expected.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "!! hf_gpu_parity.py failed"; status=1; }
  : > "$OUT_DIR/hf-parity-summary.txt"
  for m in llama-3.2-1b qwen2.5-0.5b gpt2-124m mistral-sw16; do
    echo "== check-hf $m"
    if [ -f "$hf_dir/$m/expected.safetensors" ]; then
      # The reference engine (f32) and the fast engine (f32, bf16) on every model.
      runs=("reference f32" "fast f32" "fast bf16")
      for r in "${runs[@]}"; do
        set -- $r
        log="$OUT_DIR/hf-parity-$m-$1-$2.log"
        bin/hybrid-trainer check-hf --model "$hf_dir/$m" --device cuda --engine "$1" --dtype "$2" 2>&1 | tee "$log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "!! check-hf $m ($r) failed"; status=1; }
        grep -E '^(PASS|FAIL) ' "$log" | sed "s/^/[$r] /" >> "$OUT_DIR/hf-parity-summary.txt"
      done
    else
      echo "!! $m: no expectations ($hf_dir/$m/expected.safetensors)"; status=1
      echo "FAIL $m: no expectations" >> "$OUT_DIR/hf-parity-summary.txt"
    fi
  done
  echo "== Hugging Face parity summary"; cat "$OUT_DIR/hf-parity-summary.txt"
  [ -n "${HF_PARITY_DIR:-}" ] || rm -rf "$hf_dir"
fi
gpt_text=()
[ -f data/tinyshakespeare.txt ] && gpt_text=(--gpt-text data/tinyshakespeare.txt)
if [ "$bench" = 1 ]; then
  echo "== bench"
  bin/gpu-bench --out "$OUT_DIR/benchmarks.md" --torch-script torch_peer.py "${gpt_text[@]}" 2>&1 | tee "$OUT_DIR/bench.log" || status=1
  if [ "$vulkan" = 1 ]; then
    bin/wgpu-bench --out "$OUT_DIR/wgpu-bench.md" "${gpt_text[@]}" 2>&1 | tee "$OUT_DIR/wgpu-bench.log" || status=1
  fi
fi
if [ "$wgpu_bench" = 1 ]; then
  echo "== wgpu bench (issue 42, item 4)"
  bin/wgpu-bench --reps 5 --burst 3 --profile --out "$OUT_DIR/wgpu-bench.md" "${gpt_text[@]}" 2>&1 | tee "$OUT_DIR/wgpu-bench.log" || status=1
  bin/gpu-bench --only-ceilings --only-gpt --no-torch "${gpt_text[@]}" --out "$OUT_DIR/wgpu-cuda-rows.md" 2>&1 | tee "$OUT_DIR/wgpu-cuda-rows.log" || status=1
  if [ -x bin/burn-peer ]; then
    bin/burn-peer 2>&1 | tee "$OUT_DIR/wgpu-burn.log" || status=1
  fi
  hf="$(mktemp -d)"
  python3 hf_generate_peer.py --models 1b --save "$hf" --no-static --new-tokens 8 --repeats 1 > "$OUT_DIR/wgpu-hf.log" 2>&1 || status=1
  for dev in cuda wgpu; do
    bin/hybrid-trainer --device "$dev" bench-generate --model "$hf/llama-3.2-1b" --prompts "$hf/prompts.safetensors" --dtype f32 --new-tokens 32 --repeats 2 --profile-steps 8 --out "$OUT_DIR/wgpu-decode-$dev.json" 2>&1 | tee "$OUT_DIR/wgpu-decode-$dev.log" || status=1
  done
  rm -rf "$hf"
fi
if [ "$train" != 0 ]; then
  echo "== train-gpt ($train iterations)"
  bin/hybrid-trainer --device cuda train-gpt --data data/tinyshakespeare.txt --iters "$train" --sample 300 2>&1 | tee "$OUT_DIR/train.log" || status=1
fi
exit $status
