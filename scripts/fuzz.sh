#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: fuzz every parser of outside input (tests/fuzz/, docs/reliability.md)
# with libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer, SECONDS each (default 60).
# Builds build-fuzz/ with clang 14 (-DMOEPEAK_FUZZ=ON, CPU only), then runs each target on a
# scratch copy of its committed corpus (tests/fuzz/corpus/TARGET/, left unchanged). A crash, a
# leak, a timeout (10 s per input), an out-of-memory (2 GiB) or a UB report is a failure: the
# reproducer is kept in build-fuzz/findings/TARGET/ and the script exits 1 after the table.
#
#   scripts/fuzz.sh 600                       # 10 minutes per target
#   MOEPEAK_FUZZ_TARGETS="fuzz_config" scripts/fuzz.sh 30
#
# Replay a finding: build-fuzz/tests/fuzz/TARGET build-fuzz/findings/TARGET/crash-*
set -euo pipefail
source "$(dirname "$0")/common.sh"

seconds="${1:-60}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }
MOEPEAK_PACKAGES+=(clang-14 libclang-rt-14-dev)  # clang and its sanitizer/libFuzzer runtimes
install_packages

dir="${MOEPEAK_FUZZ_BUILD_DIR:-$MOEPEAK_ROOT/build-fuzz}"
targets="${MOEPEAK_FUZZ_TARGETS:-fuzz_config fuzz_safetensors fuzz_hf_config fuzz_hf_index fuzz_token_bin fuzz_megatron_idx fuzz_probe_file fuzz_shard_manifest fuzz_hf_tokenizer}"
CC=clang-14 CXX=clang++-14 MOEPEAK_BUILD_DIR="$dir" MOEPEAK_TARGETS=fuzz_targets \
  configure_and_build -DMOEPEAK_FUZZ=ON -DMOEPEAK_CUDA=OFF

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$MOEPEAK_ROOT/tests/sanitize/lsan.supp:print_suppressions=0"
failed=0
rows=()
for t in $targets; do
  work="$dir/work/$t" findings="$dir/findings/$t"
  rm -rf "$work"
  mkdir -p "$work" "$findings"
  cp "$MOEPEAK_ROOT/tests/fuzz/corpus/$t"/* "$work/"
  log "fuzzing $t for $seconds s"
  rc=0
  "$dir/tests/fuzz/$t" "$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$dir/$t.log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/$t.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/$t.log" | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  result=ok
  if [[ $rc -ne 0 ]]; then
    result="FAILED (rc $rc; $dir/$t.log, $findings/)"
    failed=1
  fi
  rows+=("$(printf '  %-22s %8s %12s %10s %8s  %s' "$t" "$seconds" "${execs:-?}" "${rate:-?}" \
    "$corpus" "$result")")
done
printf '# %-22s %8s %12s %10s %8s  %s\n' target seconds executions exec/s corpus result
printf '%s\n' "${rows[@]}"
exit "$failed"
