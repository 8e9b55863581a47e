#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU, behind a stand-in nvidia-smi: the harness the
# next GPU session depends on, checked where CI can run it. Every step's command fails here (no
# CUDA device), so this tests what wraps them: one summary row per step written as it finishes,
# report.md with each step's output, the --archive file, the time budget (steps it leaves no
# time for are `skipped`, a step past its limit is a TIMEOUT), the missing-library check
# naming every library before any step, and the targets table (scripts/gpu_targets.py) both from
# this run (nothing measured) and from synthetic bench JSONs on either side of each threshold.
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
steps="cuda-tests bench-gemm bench-gemm-1024 bench-attention-bf16 bench-attention-f32 bench-vocab
       bench-dispatch bench-sco bench-adamw train-float32 train-bfloat16"

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
check "report.md has the targets table" grep -q '^### The GPU targets$' "$tmp/gc/report.md"
check "a failed bench's target is not measured" \
  grep -qE '^\| Ring-DTP, P = 1, strips of V/8 \| – \| +\| not measured \|$' "$tmp/gc/report.md"
check "the run's own time is judged" grep -qE '^\| gpu-check on one GPU \| [0-9]+ s \| < 480 s \| MET \|$' "$tmp/gc/report.md"
check "the archive holds the summary, the report and the step logs" \
  sh -c "tar tzf '$tmp/gc.tar.gz' | grep -q 'gc/summary.txt' && tar tzf '$tmp/gc.tar.gz' | grep -q 'gc/report.md' && tar tzf '$tmp/gc.tar.gz' | grep -q 'gc/bench-adamw.log'"

# The targets from synthetic results: each figure computed from the JSONs and judged against its
# threshold, first all met, then each missed.
targets() {  # targets DIR ELAPSED -> the table on stdout
  python3 "$root/scripts/gpu_targets.py" "$1" "$2"
}
write_results() {  # write_results DIR GEMM_BEST VOCAB_S VOCAB_GIB STREAM_S FLOOR_RATIO LOSS_REL
  local logits
  logits=$(python3 -c "print(int($4 * 2**30))")
  mkdir -p "$1/runs/small-cuda-float32" "$1/runs/small-cuda-bfloat16"
  cat >"$1/bench-gemm.json" <<JSON
{"shape": {"ceiling_gflops": 760000}, "rows": [
 {"schedule": "router forward", "percent_of_ceiling": 3.1, "percent_of_best_algorithm": $2},
 {"schedule": "experts_w2 forward", "percent_of_ceiling": 70.0, "percent_of_best_algorithm": 97.0},
 {"schedule": "lm_head_strip forward", "percent_of_ceiling": 91.0, "percent_of_best_algorithm": 99.0}]}
JSON
  cat >"$1/bench-vocab.json" <<JSON
{"rows": [
 {"schedule": "materialized", "time_s": 0.120, "peak_bytes": {"logits": 3276800000}},
 {"schedule": "ring_dtp", "payload": "weights", "kept_strips": 0, "time_s": 0.150, "peak_bytes": {"logits": 409800000}},
 {"schedule": "ring_dtp", "payload": "weights", "kept_strips": 6, "time_s": $3, "peak_bytes": {"logits": $logits}}]}
JSON
  cat >"$1/bench-adamw.json" <<JSON
{"shape": {"floor_s": 0.0607}, "rows": [
 {"schedule": "resident", "time_s": 0.004, "floor_ratio": 0.07},
 {"schedule": "offload_serial", "time_s": 0.900, "floor_ratio": 14.8},
 {"schedule": "offload_stream", "bucket_params": 8388608, "staging_slots": 2, "time_s": 0.090, "floor_ratio": 1.48},
 {"schedule": "offload_stream", "bucket_params": 2097152, "staging_slots": 3, "time_s": $5, "floor_ratio": $6}]}
JSON
  # 10 steps each, the first 3 at LOSS_REL relative from the CPU's (scripts/gpu_reference_losses.json)
  python3 - "$1" "$7" "$root/scripts/gpu_reference_losses.json" <<'PY'
import json, sys
out, rel, reference = sys.argv[1], float(sys.argv[2]), json.load(open(sys.argv[3]))
for dtype, cpu in reference.items():
    with open(f"{out}/runs/small-cuda-{dtype}/metrics.jsonl", "w") as f:
        for step in range(1, 11):
            loss = cpu[step - 1] * (1 + rel) if step <= len(cpu) else 8.0
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
PY
}
write_results "$tmp/met" 88.0 0.112 2.67 0.074 1.22 5e-7
targets "$tmp/met" 300 >"$tmp/met.out"
check "targets: six rows, all MET" test "$(grep -c '| MET |$' "$tmp/met.out")" -eq 6
check "targets: GEMMs judged by each shape's best (88.0% for the router)" \
  grep -qF '| GEMMs within 85% of cuBLAS | lowest 88.0% (router forward); lowest of the 760 TFLOP/s ceiling 3.1% (router forward) |' "$tmp/met.out"
check "targets: Ring-DTP's fastest row under the memory cap" \
  grep -qF '| Ring-DTP, P = 1, strips of V/8 | 112.0 ms = 0.97x 115 ms, logits 2.67 GiB (6 strips kept, weights) |' "$tmp/met.out"
check "targets: the streamed optimizer against the floor and the serial offload" \
  grep -qF '| OffloadStreamAdamW, 268M parameters | 74.0 ms = 1.22x floor (60.7 ms), 12.2x our serial offload, 5.1x 380 ms (beta 2097152, s 3) |' "$tmp/met.out"
check "targets: the GPU's first losses against the CPU's" \
  grep -qE '^\| small preset, every operator on, bf16, vs CPU \| 10 GPU steps, loss .* steps 1-3 within 5\.0e-07 of the CPU.s \| relative difference <= 2e-03 \| MET \|$' "$tmp/met.out"
# The 5x is against the 380 ms anchor (gpu_targets.py): a serial offload of ours that is
# fast does not fail a streamed step at 1.22x the floor, and a step over 76 ms fails even within
# 1.25x of a slower link's floor.
adamw_case() {  # adamw_case DIR SERIAL_S FLOOR_S STREAM_S FLOOR_RATIO -> the optimizer's row
  cp -r "$tmp/met" "$1"
  cat >"$1/bench-adamw.json" <<JSON
{"shape": {"floor_s": $3}, "rows": [
 {"schedule": "offload_serial", "time_s": $2, "floor_ratio": 2.5},
 {"schedule": "offload_stream", "bucket_params": 2097152, "staging_slots": 3, "time_s": $4, "floor_ratio": $5}]}
JSON
  targets "$1" 300 | grep -F '| OffloadStreamAdamW, 268M parameters |' >"$1.row"
}
adamw_case "$tmp/fast-serial" 0.150 0.0607 0.074 1.22
check "targets: 5x the 380 ms anchor, whatever our own serial offload's time" \
  grep -qE '2\.0x our serial offload, 5\.1x 380 ms .*\| MET \|$' "$tmp/fast-serial.row"
# The working weights' dtype, when the bench names it, heads the figure.
cp -r "$tmp/met" "$tmp/bf16-weights"
sed -i 's/{"floor_s": 0.0607}/{"floor_s": 0.0607, "dtype": "bf16"}/' "$tmp/bf16-weights/bench-adamw.json"
check "targets: the optimizer's figure names bf16 working weights" \
  sh -c "python3 '$root/scripts/gpu_targets.py' '$tmp/bf16-weights' 300 | grep -qF '| OffloadStreamAdamW, 268M parameters | bf16 weights: 74.0 ms = 1.22x floor'"
adamw_case "$tmp/slow-link" 0.900 0.0650 0.078 1.20
check "targets: over 76 ms is NOT MET even within 1.25x of the floor" \
  grep -qE '\| NOT MET \|$' "$tmp/slow-link.row"
write_results "$tmp/missed" 84.0 0.140 2.60 0.080 1.32 3e-3
targets "$tmp/missed" 500 >"$tmp/missed.out"
check "targets: each one missed" test "$(grep -c '| NOT MET |$' "$tmp/missed.out")" -eq 6
write_results "$tmp/over" 88.0 0.100 2.80 0.074 1.22 5e-7
targets "$tmp/over" 300 >"$tmp/over.out"
check "targets: a fast Ring-DTP row over 15% of 18.3 GiB does not count" \
  grep -qE '^\| Ring-DTP, P = 1, strips of V/8 \| 150.0 ms = 1.30x 115 ms, logits 0.38 GiB \(0 strips kept, weights\) \|.*\| NOT MET \|$' "$tmp/over.out"

# A budget that leaves no step its 5 seconds: every step is skipped, none runs.
MOEPEAK_BUILD_DIR="$build" "$root/scripts/gpu-check.sh" --no-build --out "$tmp/skip" \
  --budget 3 >"$tmp/out" 2>&1; rc=$?
check "a spent budget is a failure" test $rc -ne 0
check "steps past the budget are skipped" \
  test "$(grep -cE '^  [a-z0-9-]+ +skipped' "$tmp/skip/summary.txt")" -eq 11
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
check "the steps after it are skipped" grep -qE '^  train-bfloat16 +skipped' "$tmp/hung/summary.txt"
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
