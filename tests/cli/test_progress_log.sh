#!/usr/bin/env bash
# The progress line reaches the user's terminal only (core/progress_line.h), with the default
# metrics.progress = "auto":
#   - `mpirun -np 2 moepeak train > run.log 2>&1` (OpenMPI hands each rank a pty): run.log has the
#     log lines and no carriage return or escape code; the same for a plain process and for
#     `mpirun -np 2 moepeak tune`;
#   - the checks can fail: metrics.progress = "always" puts the line's "\r" and "ESC[K" into the
#     same file; and under a terminal (script(1), a pty with a window) mpirun's ranks draw it,
#     while a terminal without a window (what OpenMPI leaves when mpirun's output is no terminal)
#     gets none.
# Every run is under `timeout 120`: a hang is a failure (exit 124).
# Run: ctest -R test_progress_log   (or: OMPI_MCA_btl=self,vader
#   OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_ALLOW_RUN_AS_ROOT=1
#   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash tests/cli/test_progress_log.sh build/moepeak "$(which mpirun)" .)
set -u
bin="$1"
mpirun="$2"
src="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report

mpi=("$mpirun" --allow-run-as-root --oversubscribe -np 2)
# train_args NAME: sets `args` to 3 steps of configs/tiny.toml as job NAME, metrics.progress left
# at its default.
train_args() {
  args=(train --config "$src/configs/tiny.toml" --set training.steps=3
    --set job.run_dir="$tmp/runs" --set job.name="$1")
}
# no_control FILE: FILE holds no carriage return and no escape character.
no_control() { ! grep -c $'\r' "$1" && ! grep -c $'\x1b' "$1"; }
has_redraw() { grep -q $'\r\x1b\\[K' "$1"; }  # the progress line's "\r ESC[K"

# 1. mpirun into a file: log lines only.
train_args mpi
timeout -k 10 120 "${mpi[@]}" "$bin" "${args[@]}" >"$tmp/mpi.log" 2>&1; rc=$?
check "mpirun -np 2 train > file exits 0 (rc $rc)" test $rc -eq 0
check "mpirun -np 2 train > file: the step log lines are there" grep -qE 'step: +3 +loss:' "$tmp/mpi.log"
check "mpirun -np 2 train > file: the memory table is there" grep -qE '^  total ' "$tmp/mpi.log"
check "mpirun -np 2 train > file: no carriage return or escape code" no_control "$tmp/mpi.log"

# 2. A plain process into a file, and mpirun piped into a file (tee's input is a pipe).
train_args plain
timeout -k 10 120 "$bin" "${args[@]}" >"$tmp/plain.log" 2>&1; rc=$?
check "train > file exits 0 (rc $rc)" test $rc -eq 0
check "train > file: no carriage return or escape code" no_control "$tmp/plain.log"
train_args piped
timeout -k 10 120 "${mpi[@]}" "$bin" "${args[@]}" 2>&1 | cat >"$tmp/piped.log"
check "mpirun -np 2 train | cat: the step log lines are there" grep -qE 'step: +3 +loss:' "$tmp/piped.log"
check "mpirun -np 2 train | cat: no carriage return or escape code" no_control "$tmp/piped.log"

# 3. tune's bar follows the same rule: plain `# tune [i/n]` lines in a file.
timeout -k 10 120 "${mpi[@]}" "$bin" tune --config "$src/configs/tiny.toml" --out "$tmp/tune" \
  --only dispatch --repeats 1 --warmup 0 >"$tmp/tune.log" 2>&1; rc=$?
check "mpirun -np 2 tune > file exits 0 (rc $rc)" test $rc -eq 0
check "mpirun -np 2 tune > file: plain progress lines" grep -qE '^# tune \[1/[0-9]+\] dispatch' "$tmp/tune.log"
check "mpirun -np 2 tune > file: no carriage return or escape code" no_control "$tmp/tune.log"

# 4. The checks above can fail: "always" draws into the file.
train_args always
timeout -k 10 120 "${mpi[@]}" "$bin" "${args[@]}" --set metrics.progress=always \
  >"$tmp/always.log" 2>&1; rc=$?
check "metrics.progress = always exits 0 (rc $rc)" test $rc -eq 0
check "metrics.progress = always: the line is redrawn in the file" has_redraw "$tmp/always.log"

# 5. On a terminal (script(1): a pty for mpirun's own output), with and without a window size.
if command -v script >/dev/null 2>&1; then
  for size in "cols 100 rows 40" "cols 0 rows 0"; do
    name="tty_${size// /_}"
    train_args "$name"
    command=$(printf '%q ' "${mpi[@]}" "$bin" "${args[@]}")
    timeout -k 10 120 script -qec "stty $size; $command" "$tmp/$name.typescript" >/dev/null 2>&1
    rc=$?
    check "under a terminal ($size): exits 0 (rc $rc)" test $rc -eq 0
    if [ "$size" = "cols 100 rows 40" ]; then
      check "mpirun on a terminal with a window: the ranks draw the line" has_redraw "$tmp/$name.typescript"
    else
      check "mpirun on a terminal without a window: no line" not_matches "$tmp/$name.typescript" $'\x1b\\[K'
    fi
  done
else
  echo "script(1) not found: the terminal cases are skipped"
fi

report test_progress_log
