#!/usr/bin/env bash
# scripts/test.sh: on a fresh Debian 12 machine (root, apt reachable) install what the build
# needs, check the formatting, build everything into build/ with warnings as errors, and run the
# whole test suite; then build the CUDA backend on the CPU emulation of CUDA into
# build-emulated/ (-DMOEPEAK_CUDA=EMULATED, docs/design.md#backends) and run the GPU tests there
# (ctest label `cuda-emulated`), so every kernel runs in CI without a GPU.
# In build/, GPU tests (label `cuda`) skip themselves where no GPU is usable.
#
#   scripts/test.sh                   # everything; the emulated suite without its extra pass
#   scripts/test.sh -L cuda-emulated  # ... and the whole emulated suite (with the extra pass:
#                                     # every op again, threads run in reverse order)
#   scripts/test.sh -R arena          # extra arguments go to ctest (build/ only, unless they
#                                     # name cuda-emulated)
# With no arguments it ends with the sanitized CI subset: the ground layers' tests (tests/sanitize/)
# under ThreadSanitizer in build-tsan/ and under AddressSanitizer + UBSan in build-asan/.
#
#   scripts/test.sh --sanitize address,undefined [ctest args]   # build-asan/: every test that
#                                     # can run under it (or the ctest args' selection)
#   scripts/test.sh --sanitize thread [ctest args]              # build-tsan/: the threaded and
#                                     # race tests (sanitize_default_tests in common.sh)
# Another LIST builds into build-sanitize-LIST/. Sanitized trees are CPU-only (-DMOEPEAK_CUDA=OFF)
# with warnings as errors; docs/reliability.md#sanitizers says what runs where and why.
set -euo pipefail
source "$(dirname "$0")/common.sh"

if [[ "${1:-}" == "--sanitize" ]]; then
  if [[ $# -lt 2 || -z "$2" ]]; then
    echo "usage: scripts/test.sh --sanitize LIST [ctest args]   (LIST: address,undefined | thread)" >&2
    exit 2
  fi
  list="$2"
  shift 2
  install_packages
  ccache_zero
  trap ccache_report EXIT
  # Without ctest arguments, only what the default selection runs is built.
  if [[ $# -eq 0 && -z "${MOEPEAK_TARGETS:-}" ]]; then
    MOEPEAK_TARGETS="$(sanitize_default_targets "$list")"
  fi
  MOEPEAK_TARGETS="${MOEPEAK_TARGETS:-}" sanitized_build "$list"
  sanitized_ctest "$list" "$@"
  exit 0
fi

install_packages
ccache_zero
trap ccache_report EXIT
log "checking the formatting (scripts/format.sh --check)"
"$MOEPEAK_ROOT/scripts/format.sh" --check
configure_and_build -DMOEPEAK_WERROR=ON
log "running the test suite"
ctest --test-dir "$MOEPEAK_BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"

emulated_args=()
if [[ $# -eq 0 ]]; then
  emulated_args=(-L cuda-emulated -LE cuda-emulated-extra)
elif [[ " $* " == *cuda-emulated* ]]; then
  emulated_args=(-L cuda-emulated "$@")
else
  exit 0
fi
emulated_dir="${MOEPEAK_EMULATED_BUILD_DIR:-$MOEPEAK_ROOT/build-emulated}"
MOEPEAK_BUILD_DIR="$emulated_dir" MOEPEAK_TARGETS=cuda_emulated_tests \
  configure_and_build -DMOEPEAK_CUDA=EMULATED -DMOEPEAK_WERROR=ON
log "running the GPU tests on the CPU emulation of CUDA (${emulated_args[*]})"
ctest --test-dir "$emulated_dir" --output-on-failure -j "$(nproc)" "${emulated_args[@]}"

if [[ $# -eq 0 ]]; then
  # The CI-sized sanitized subset: only its own targets are built (tests/sanitize/CMakeLists.txt).
  for list in thread address,undefined; do
    MOEPEAK_TARGETS=sanitize_ci sanitized_build "$list"
    sanitized_ctest "$list" -L sanitize-ci
  done
fi
