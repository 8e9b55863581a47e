#!/usr/bin/env bash
# test_layering.sh CXX FLAGS_DIR CASES: for each "layer verdict header" line of CASES, compile
# `#include "header"` with that layer's include directories (FLAGS_DIR/<layer>.flags, written by
# CMake) and check the verdict: reject = the compiler says the header does not exist; accept = it
# compiles. Every layer named in CASES must have a flags file; every layer with one must appear.
set -uo pipefail
cxx=$1 flags_dir=$2 cases=$3
failed=0 passed=0
declare -A seen
while read -r layer verdict header; do
  [[ -z "$layer" || "$layer" == \#* ]] && continue
  flags="$flags_dir/$layer.flags"
  seen[$layer]=1
  if [ ! -f "$flags" ]; then
    echo "FAIL $layer: no such layer ($flags missing)"; failed=$((failed + 1)); continue
  fi
  out=$(printf '#include "%s"\n' "$header" |
        "$cxx" -std=c++20 -fsyntax-only -x c++ @"$flags" - 2>&1)
  rc=$?
  case "$verdict" in
    reject)
      if [ $rc -ne 0 ] && grep -q "$header: No such file" <<<"$out"; then
        echo "ok   $layer cannot include $header"; passed=$((passed + 1))
      else
        echo "FAIL $layer includes $header (rc $rc), a layer above it:"; echo "$out" | head -5
        failed=$((failed + 1))
      fi ;;
    accept)
      if [ $rc -eq 0 ]; then
        echo "ok   $layer includes $header"; passed=$((passed + 1))
      else
        echo "FAIL $layer cannot compile $header:"; echo "$out" | head -10
        failed=$((failed + 1))
      fi ;;
    *) echo "FAIL bad verdict '$verdict' in $cases"; failed=$((failed + 1)) ;;
  esac
done <"$cases"
for f in "$flags_dir"/*.flags; do
  layer=$(basename "$f" .flags)
  if [ -z "${seen[$layer]:-}" ]; then
    echo "FAIL layer $layer has no case in $cases"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
