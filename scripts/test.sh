#!/usr/bin/env bash
# scripts/test.sh: on a fresh Debian 12 machine (root, apt reachable) install what the build
# needs, check the formatting, build everything into build/ with warnings as errors, and run the
# whole test suite.
# GPU tests (ctest label `cuda`) skip themselves where no GPU is usable.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -R arena        # extra arguments go to ctest
set -euo pipefail
source "$(dirname "$0")/common.sh"

install_packages
log "checking the formatting (scripts/format.sh --check)"
"$MOEPEAK_ROOT/scripts/format.sh" --check
configure_and_build -DMOEPEAK_WERROR=ON
log "running the test suite"
ctest --test-dir "$MOEPEAK_BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
