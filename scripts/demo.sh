#!/usr/bin/env bash
# scripts/demo.sh: on a fresh Debian 12 machine (root, apt reachable) install what moepeak
# needs, build it into build/, and run the embedded-default job on the CPU.
#
# The embedded default job: the tiny Mixtral-architecture MoE (2 layers, 4 experts, top-2) learns
# the synthetic long-range copy task on the CPU in about half a minute; the loss on the copied half
# falls from ln(256) = 5.5 to near zero, and the run ends with the peak of each live set.
set -euo pipefail
source "$(dirname "$0")/common.sh"

install_packages
MOEPEAK_TARGETS=moepeak configure_and_build
log "moepeak --version"
"$MOEPEAK_BUILD_DIR/moepeak" --version
log "moepeak train   (the embedded default job: tiny model, synthetic copy task; config: moepeak config show)"
cd "$MOEPEAK_ROOT"
rm -rf runs/demo  # a fresh run each time (metrics.jsonl appends)
"$MOEPEAK_BUILD_DIR/moepeak" train --set job.name=demo --set metrics.log_freq=25
