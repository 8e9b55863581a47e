#!/usr/bin/env bash
# scripts/demo.sh: on a fresh Debian 12 machine (root, apt reachable) install what moepeak
# needs, build it into build/, and run the embedded-default job on the CPU.
#
# The embedded default job: the tiny Mixtral-architecture MoE (2 layers, 4 experts, top-2) learns
# the synthetic long-range copy task on the CPU in about half a minute; the loss on the copied half
# stays near ln(256) = 5.5 until the model finds the copy (near step 80 at the default seed on a
# 2-core VM; when varies with the seed) and then falls, to about 1.3 by step 300, and the run ends
# with the peak of each live set. Then the same model at a 1,536-token context on 2 ranks of
# 24 MiB: refused with every schedule standard, trained with all four bounded ones.
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

# The point of moepeak: the same model, batch and context on 2 ranks of 24 MiB each, twice. All
# standard schedules do not fit 1,536 tokens — the plan says so and the launch check refuses the
# run; all four bounded schedules (PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW) fit and train,
# and the run ends with each live set's measured peak beside its planned bound.
# (`moepeak bench reach` finds each stack's real limit: docs/perf.md.)
log "the same 1,536-token context on 2 ranks of 24 MiB: all standard, then all four bounded"
reach=(-c configs/tiny.toml --set runtime.device_memory=24MiB --set training.batch_size=4
       --set training.seq_len=1536 --set model.max_position_embeddings=1536
       --set training.steps=4 --set metrics.log_freq=1 --set runtime.threads=1)
standard=(--set schedules.dispatch=standard --set schedules.vocab=materialized
          --set schedules.checkpoint=standard --set optimizer.placement=resident)
bounded=(--set schedules.dispatch=pipelined_llep --set schedules.vocab=ring_dtp
         --set schedules.checkpoint=sco --set optimizer.placement=offload_stream)
log "moepeak plan -n 2 ... (all standard)"
"$MOEPEAK_BUILD_DIR/moepeak" plan -n 2 "${reach[@]}" "${standard[@]}" || true
log "mpirun -np 2 moepeak train ... (all standard): the launch check refuses it"
if mpirun -np 2 "$MOEPEAK_BUILD_DIR/moepeak" train "${reach[@]}" "${standard[@]}" \
     --set job.name=demo-standard; then
  echo "demo: the all-standard run was expected to be refused" >&2
  exit 1
fi
log "moepeak plan -n 2 ... (all four bounded)"
"$MOEPEAK_BUILD_DIR/moepeak" plan -n 2 "${reach[@]}" "${bounded[@]}"
log "mpirun -np 2 moepeak train ... (all four bounded)"
rm -rf runs/demo-bounded
mpirun -np 2 "$MOEPEAK_BUILD_DIR/moepeak" train "${reach[@]}" "${bounded[@]}" \
  --set job.name=demo-bounded
