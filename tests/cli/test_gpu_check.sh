#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU, behind a stand-in nvidia-smi: the harness the
# next GPU session depends on, checked where CI can run it. Every step's command fails here (no
# CUDA device), so this tests what wraps them: one summary row per step written as it finishes,
# report.md with each step's output, the --archive file, the time budget (steps it leaves no
# time for are `skipped`, a step past its limit is a TIMEOUT), and the missing-library check
# naming every library before any step.
# Run: ctest -R test_gpu_check   (or: bash tests/cli/test_gpu_check.sh build)
set -u
build="$1"
tmp=$(mktemp -d)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report

mkdir -p "$tmp/bin"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in -L) echo "GPU 0: Stand-in GPU";; *) echo "Stand-in GPU, 1024 MiB, 0.0";; esac
EOF
chmod +x "$tmp/bin/nvidia-smi"
export PATH="$tmp/bin:$PATH"
steps="cuda-tests bench-gemm bench-attention-bf16 bench-attention-f32 bench-vocab bench-dispatch
       bench-sco bench-adamw train-float32 train-auto"

# A whole run: every step recorded, the report and the archive written, a failing exit status.
MOEPEAK_BUILD_DIR="$build" "$root/scripts/gpu-check.sh" --no-build --out "$tmp/gc" \
  --budget 120 --archive "$tmp/gc.tar.gz" >"$tmp/out" 2>&1; rc=$?
check "gpu-check exits non-zero when a step fails" test $rc -ne 0
check "summary.txt names the GPU" grep -q '^# moepeak gpu-check: Stand-in GPU' "$tmp/gc/summary.txt"
for s in $steps; do
  check "summary.txt has a row for $s" grep -qE "^  $s +(passed|FAILED)" "$tmp/gc/summary.txt"
  check "report.md has a section for $s" grep -qE "^### $s: " "$tmp/gc/report.md"
done
check "the benches failed (no CUDA device here)" grep -qE '^  bench-gemm +FAILED \(1\)' "$tmp/gc/summary.txt"
check "report.md quotes a failed step's error" \
  sh -c "sed -n '/^### bench-vocab:/,/^### /p' '$tmp/gc/report.md' | grep -q 'error'"
check "summary.txt ends with the run's duration" grep -qE '^# finished .*, [0-9]+ s$' "$tmp/gc/summary.txt"
check "the summary is printed at the end" grep -q '^# step  ' "$tmp/out"
check "the archive holds the summary, the report and the step logs" \
  sh -c "tar tzf '$tmp/gc.tar.gz' | grep -q 'gc/summary.txt' && tar tzf '$tmp/gc.tar.gz' | grep -q 'gc/report.md' && tar tzf '$tmp/gc.tar.gz' | grep -q 'gc/bench-adamw.log'"

# A budget that leaves no step its 5 seconds: every step is skipped, none runs.
MOEPEAK_BUILD_DIR="$build" "$root/scripts/gpu-check.sh" --no-build --out "$tmp/skip" \
  --budget 3 >"$tmp/out" 2>&1; rc=$?
check "a spent budget is a failure" test $rc -ne 0
check "steps past the budget are skipped" \
  test "$(grep -cE '^  [a-z0-9-]+ +skipped' "$tmp/skip/summary.txt")" -eq 10
check "a skipped step leaves no log" test ! -e "$tmp/skip/bench-gemm.log"

# A step that outlives its limit (a stand-in moepeak that hangs): killed and reported as TIMEOUT
# at what the budget left it, and the steps after it skipped, not waited for.
mkdir -p "$tmp/hang"
printf '#!/bin/sh
case "$1" in --version) echo "moepeak stand-in";; *) sleep 60;; esac
' \
  >"$tmp/hang/moepeak"
chmod +x "$tmp/hang/moepeak"
start=$(date +%s)
MOEPEAK_BUILD_DIR="$tmp/hang" "$root/scripts/gpu-check.sh" --no-build --out "$tmp/hung" \
  --budget 12 >"$tmp/out" 2>&1; rc=$?
check "a hung step fails the run" test $rc -ne 0
check "the hung step is reported as TIMEOUT" grep -qE '^  bench-gemm +TIMEOUT \([0-9]+ s\)' "$tmp/hung/summary.txt"
check "the steps after it are skipped" grep -qE '^  train-auto +skipped' "$tmp/hung/summary.txt"
check "the run keeps to its budget" test $(( $(date +%s) - start )) -lt 40

# A binary whose shared library is missing: named before any step runs.
mkdir -p "$tmp/fake/tests/ops" "$tmp/lib"
echo 'int moepeak_gone(void) { return 0; }' >"$tmp/gone.c"
echo 'int moepeak_gone(void); int main(void) { return moepeak_gone(); }' >"$tmp/main.c"
if cc -shared -fPIC -o "$tmp/lib/libmoepeakgone.so" "$tmp/gone.c" &&
   cc -o "$tmp/fake/moepeak" "$tmp/main.c" -L"$tmp/lib" -lmoepeakgone; then
  rm "$tmp/lib/libmoepeakgone.so"
  MOEPEAK_BUILD_DIR="$tmp/fake" "$root/scripts/gpu-check.sh" --no-build --out "$tmp/miss" \
    >"$tmp/out" 2>&1; rc=$?
  check "a missing library stops gpu-check" test $rc -eq 1
  check "it names the library" contains "$tmp/out" "libmoepeakgone.so"
  check "no step ran" test ! -e "$tmp/miss/summary.txt"
else
  check "a C compiler builds the stand-in binary" false
fi

# No GPU at all (nvidia-smi fails): a clear error.
printf '#!/bin/sh\nexit 9\n' >"$tmp/bin/nvidia-smi"
MOEPEAK_BUILD_DIR="$build" "$root/scripts/gpu-check.sh" --no-build --out "$tmp/none" \
  >"$tmp/out" 2>&1; rc=$?
check "no usable GPU is an error" test $rc -eq 1
check "it says so" contains "$tmp/out" "no NVIDIA GPU is usable here"

report test_gpu_check
