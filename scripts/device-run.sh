#!/usr/bin/env bash
# One device-tool call: unpack the carried bundle, run it, and keep the logs under $OUT.
# The tree and the bundle together exceed the tool's 64 MiB: scripts/device-slim.sh out/back.
#   scripts/device-run.sh [RUN_SH_ARGS...]   (env SAN_TESTS="bin:filter ..." adds sanitizer runs)
# Each SAN_TESTS entry runs memcheck and racecheck over one test binary (a bare name: gpu-cuda's
# tests/NAME.rs; CRATE--NAME: another crate's, as rssm--gpu_rollout), limited to the tests whose
# names contain the filter (racecheck over a whole attention binary takes too long).
# SAN_TOOLS (default "memcheck racecheck") picks the tools.
set -u -o pipefail
export NCCL_NVLS_ENABLE=0
# The Vulkan loader, where the call carries `.gl` (the device README: `apt-get download
# libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2` into .gl here, then
# `carry: [".gl", ...]`): the wgpu tests then run on NVIDIA's Vulkan driver instead of skipping.
if [ -d .gl ] && ls .gl/*.deb >/dev/null 2>&1; then
  # With libvulkan1 alone carried, NVIDIA's driver was not found (forty-fourth session: "no
  # adapter"); with the README's whole list it was. Say which are missing.
  for p in libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2; do
    ls .gl/${p}_*.deb >/dev/null 2>&1 || echo "device-run: .gl lacks $p (the device README's list): the wgpu tests may find no adapter" >&2
  done
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  # NVIDIA's ICD and EGL vendor files, which the loader does not find by itself there.
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  [ -f "$icd" ] && export VK_DRIVER_FILES="${VK_DRIVER_FILES:-$icd}"
  [ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="${__EGL_VENDOR_LIBRARY_FILENAMES:-$egl}"
fi
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
tar xJf target/gpu-bundle.tar.xz -C /tmp && cd /tmp/gpu-bundle || exit 1
# RUN_TIMEOUT (seconds) bounds run.sh, so that the logs come back even when it is cut off.
OUT_DIR="$OUT/run" timeout "${RUN_TIMEOUT:-100000}" ./run.sh "$@"
status=$?
san=/usr/local/cuda/bin/compute-sanitizer
for entry in ${SAN_TESTS:-}; do
  bin=${entry%%:*} filter=${entry#*:}
  # A bare name is a gpu-cuda test binary; CRATE--NAME names any other (rssm--gpu_rollout).
  case $bin in *--*) exe=tests/$bin ;; *) exe=tests/gpu-cuda--$bin ;; esac
  if [ ! -x "$exe" ]; then
    echo "compute-sanitizer: no test binary $exe in the bundle (SAN_TESTS entry $entry)"
    status=1; continue
  fi
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    timeout "${SAN_TIMEOUT:-150}" "$san" --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$exe" --test-threads=1 "$filter" > "$OUT/san-$tool-$bin.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool $bin [$filter]: exit $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool-$bin.log" | tail -1)"
    [ $rc -eq 0 ] || status=1
  done
done
cd "$OUT" && tar czf logs.tgz run san-*.log 2>/dev/null; rm -rf "$OUT/run"
exit $status
