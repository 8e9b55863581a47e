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
set -euo pipefail
source "$(dirname "$0")/common.sh"

install_packages
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
