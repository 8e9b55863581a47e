#!/usr/bin/env bash
# scripts/demo.sh: on a fresh Debian 12 machine (root, apt reachable) install what moepeak
# needs, build it into build/, and run the embedded-default job on the CPU.
#
# The embedded default grows with the product; today it shows the build and the resolved
# configuration that `moepeak train` will use.
set -euo pipefail
source "$(dirname "$0")/common.sh"

install_packages
MOEPEAK_TARGETS=moepeak configure_and_build
log "moepeak --version"
"$MOEPEAK_BUILD_DIR/moepeak" --version
log "moepeak config show   (the embedded default job: tiny model, synthetic copy task)"
"$MOEPEAK_BUILD_DIR/moepeak" config show
