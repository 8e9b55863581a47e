# shellcheck shell=bash
# The pass/fail counting every shell test shares (tests/*/test_*.sh, and through
# tests/slurm/slurm_test_setup.sh the private-Slurm ones): source it once $tmp, the test's
# temporary directory, exists. It defines
#   check NAME CONDITION-COMMAND...   runs the condition in this shell, its output kept in
#                                     $tmp/check.out; counts a pass, or prints FAIL: NAME and that
#                                     output and returns 1 (so `check ... || show more` works)
#   contains FILE TEXT                TEXT occurs in FILE (fixed string)
#   not_matches FILE REGEX            no line of FILE matches the extended REGEX (prints those
#                                     that do)
#   report [NAME]                     prints "[NAME: ]P passed, F failed"; true when nothing failed
failures=0
passes=0
check() {
  local name="$1"; shift
  if "$@" >"$tmp/check.out" 2>&1; then
    passes=$((passes + 1))
  else
    echo "FAIL: $name"
    sed 's/^/  /' "$tmp/check.out"
    failures=$((failures + 1))
    return 1
  fi
}
contains() { grep -qF -- "$2" "$1"; }
not_matches() { ! grep -E -- "$2" "$1"; }
report() {
  echo "${1:+$1: }$passes passed, $failures failed"
  test "$failures" -eq 0
}
