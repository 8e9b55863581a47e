#!/usr/bin/env bash
# scripts/gpu-check.sh: on a machine with an NVIDIA GPU, check the CUDA backend: build (or reuse a
# build), run every GPU test (the ctest label `cuda`), run the benches at GPU sizes (gemm,
# attention, and the paper's four component tests: dispatch, vocab, sco, adamw), train the small
# preset with every bounded operator on, and print a summary table. Meant to finish within 8
# minutes on one H200.
#
#   scripts/gpu-check.sh                       build into build/ when moepeak is missing there
#   scripts/gpu-check.sh --no-build            reuse $MOEPEAK_BUILD_DIR (default build/) as it
#                                              is, e.g. a build made elsewhere and copied here
#                                              (scripts/device-bundle.sh packs one, with the
#                                              libraries a bare GPU machine lacks)
#   scripts/gpu-check.sh --out DIR             keep every log and bench JSON in DIR
#   scripts/gpu-check.sh --budget SECONDS      stop starting steps after this long (default 540,
#                                              inside a 10-minute lease call); each step also has
#                                              its own time limit, cut to what the budget leaves
#   scripts/gpu-check.sh --archive FILE        also pack DIR into FILE (.tar.gz) when done: one
#                                              file to bring back from a machine that returns
#                                              only a few
#
# Each step's output goes to DIR/<step>.log; the summary says passed/failed per step and, for the
# benches, the figure the GPU targets are about. The summary is also written to
# DIR/summary.txt row by row as the steps finish, so a run stopped from outside still leaves what
# it measured, and DIR/report.md gathers every step's table (the benches' `#` headers and rows,
# the tests' and runs' last lines) in the form docs/perf.md takes, after a table of the GPU
# targets, each MET, NOT MET or not measured (scripts/gpu_targets.py). A step that outlives its
# limit is killed and reported as `TIMEOUT`; the steps after it still run. Exit status: 0 when
# every step passed (whatever the targets' verdicts).
# Results worth keeping go to docs/perf.md with the device and the date.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${MOEPEAK_BUILD_DIR:-$root/build}"
out=""
build=auto
budget=540
archive=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=no ;;
    --out) out="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --archive) archive="$2"; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
out="${out:-$(mktemp -d)}"
mkdir -p "$out"
bin="$build_dir/moepeak"

log() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU is usable here (nvidia-smi -L failed)" >&2
  exit 1
fi
gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
idle_used="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1)"

if [ "$build" = auto ] && [ ! -x "$bin" ]; then
  log "building into $build_dir (MOEPEAK_CUDA=ON)"
  # shellcheck source=scripts/common.sh
  MOEPEAK_BUILD_DIR="$build_dir" source "$root/scripts/common.sh"
  install_packages
  configure_and_build -DMOEPEAK_CUDA=ON || exit 1
fi
if [ ! -x "$bin" ]; then
  echo "gpu-check: $bin not found (build first, or drop --no-build)" >&2
  exit 1
fi

# A bundle from scripts/device-bundle.sh keeps, beside its build folder, libraries a GPU machine
# may or may not have (Open MPI's): searched last, so the machine's own copies win.
if [ -d "$build_dir/../fallback-lib" ]; then
  fallback="$(cd "$build_dir/../fallback-lib" && pwd)"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$fallback"
fi
# Every shared library the binaries need must resolve: name all the missing ones at once (one
# lease call on a bare machine is precious) instead of failing on the first.
missing="$(for b in "$bin" "$build_dir"/tests/runtime/test_cuda_backend \
             "$build_dir"/tests/comm/test_comm_nccl "$build_dir"/tests/ops/test_backend_ops; do
             [ -x "$b" ] && ldd "$b" 2>/dev/null; done | awk '/not found/ { print $1 }' | sort -u)"
if [ -n "$missing" ]; then
  echo "gpu-check: shared libraries not found (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}):" >&2
  printf '    %s\n' $missing >&2
  exit 1
fi

summary="$out/summary.txt"
started=$(date +%s)
{
  echo "# moepeak gpu-check: $gpu; started $(date -u '+%Y-%m-%d %H:%M:%S UTC'); logs in $out"
  echo "# $("$bin" --version 2>/dev/null | head -1); device memory used before the check: $idle_used"
  printf '# %-20s %-12s %9s  %s\n' step result seconds note
} >"$summary"

# step NAME LIMIT COMMAND...: runs the command with its output in $out/NAME.log, killed after
# LIMIT seconds or when the budget runs out, whichever is first; records the result. A step the
# budget leaves no time for is recorded as skipped.
names=() results=() seconds=() notes=()
step() {
  local name="$1" limit="$2"; shift 2
  local left=$(( budget - ($(date +%s) - started) ))
  [ "$left" -lt "$limit" ] && limit=$left
  names+=("$name")
  notes+=("")
  if [ "$limit" -lt 5 ]; then
    log "$name: skipped (the ${budget} s budget is spent)"
    results+=("skipped")
    seconds+=("0.0")
    return 1
  fi
  log "$name (limit ${limit} s): $*"
  local start end rc
  start=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1; rc=$?
  end=$(date +%s.%N)
  if [ $rc -eq 0 ]; then results+=("passed")
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then results+=("TIMEOUT (${limit} s)")
  else results+=("FAILED ($rc)"); fi
  seconds+=("$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')")
  [ $rc -eq 0 ] || tail -20 "$out/$name.log" | sed 's/^/    /'
  return $rc
}
# note TEXT...: the last step's note; writes its row to the summary file.
note() { notes[${#notes[@]}-1]="$*"; }
# row: appends the last step's row to the summary file (after its note, if any).
row() {
  local i=$(( ${#names[@]} - 1 ))
  printf '  %-20s %-12s %9s  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" \
    "${notes[$i]}" >>"$summary"
}

# ---- the GPU tests: ctest -L cuda where ctest exists, else the binaries that carry the label ----
if command -v ctest >/dev/null 2>&1 && [ -f "$build_dir/CTestTestfile.cmake" ]; then
  step cuda-tests 240 ctest --test-dir "$build_dir" -L cuda --output-on-failure
  note "$(grep -Eo '[0-9]+% tests passed.*' "$out/cuda-tests.log" | tail -1)"
  row
else
  for t in tests/runtime/test_cuda_backend tests/comm/test_comm_nccl tests/ops/test_backend_ops; do
    step "$(basename "$t")" 180 "$build_dir/$t"
    note "$(grep -Eo '\[  PASSED  \] [0-9]+ tests?' "$out/$(basename "$t").log" | tail -1)" \
         "$(grep -Eo '[0-9]+ tests?, listed below' "$out/$(basename "$t").log" | head -1)"
    row
  done
fi

# ---- benches at GPU sizes --------------------------------------------------------------------
# GEMMs of a gpt-oss-20b layer (H 2880, 32 experts top-4) at 8192 tokens (1024 rows per expert)
# and at 1024 tokens (128 rows per expert, where the experts' grouped call and the per-group loop
# trade places), bf16, against a cuBLASLt 8192^3 ceiling measured in the same run, and each
# against the fastest of cuBLASLt's first 8 algorithms for its own shape (target: every GEMM at
# least 85%).
for tokens in 8192 1024; do
  name=bench-gemm; [ "$tokens" = 8192 ] || name="bench-gemm-$tokens"
  step "$name" 60 "$bin" bench gemm -c "$root/configs/gpt-oss-20b.toml" --set runtime.backend=cuda \
    --tokens "$tokens" --warmup 3 --iters 10 --json "$out/$name.json"
  if [ -f "$out/$name.json" ]; then
    note "$(python3 - "$out/$name.json" <<'EOF' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
worst = min(rows, key=lambda r: r["percent_of_ceiling"])
searched = [r for r in rows if r.get("percent_of_best_algorithm") is not None]
text = (f"ceiling {d['shape']['ceiling_gflops'] / 1e3:.0f} TFLOP/s; lowest {worst['percent_of_ceiling']:.1f}% "
        f"of it ({worst['schedule']})")
if searched:
    b = min(searched, key=lambda r: r["percent_of_best_algorithm"])
    text += f"; lowest {b['percent_of_best_algorithm']:.1f}% of its shape's best algorithm ({b['schedule']})"
print(text)
EOF
)"
  fi
  row
done

# Attention of a gpt-oss-20b layer (64 query heads, 8 kv heads, d 64) at one 8192-token sequence:
# bf16 on the tensor-core kernels, and f32 on the SIMT ones, against the same GEMM ceiling.
for dtype in bf16 f32; do
  step "bench-attention-$dtype" 60 "$bin" bench attention -c "$root/configs/gpt-oss-20b.toml" \
    --set runtime.backend=cuda --batch 1 --seq 8192 --dtype $dtype --warmup 2 --iters 5 \
    --json "$out/bench-attention-$dtype.json"
  if [ -f "$out/bench-attention-$dtype.json" ]; then
    note "$(python3 - "$out/bench-attention-$dtype.json" <<'EOF' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
print(d["shape"]["kernels"] + ":", "; ".join(
    f"{r['schedule']} {r['time_s'] * 1e3:.1f} ms, {r['gflops'] / 1e3:.0f} TFLOP/s "
    f"({r['percent_of_ceiling']:.0f}% of ceiling)" for r in d["rows"]))
EOF
)"
  fi
  row
done

# The vocabulary projection at the target's shape (N 8192, H 7168, V 200,000, bf16): materialised
# logits vs Ring-DTP on one GPU (P = 1) with strips of V/8, none kept (4 strip GEMMs a column) and
# 6 of the 8 kept from forward to backward (3.25 GEMMs; 2.67 GiB of logits). Targets: Ring-DTP
# within 1.1x of 115 ms, its `logits` peak under 15% of 18.3 GiB (2.75 GiB).
step bench-vocab 90 "$bin" bench vocab --set runtime.backend=cuda --set runtime.device_memory=auto --tokens 8192 --hidden 7168 \
  --vocab 200000 --strips 25000 --kept 0,6 --dtype bf16 --warmup 2 --iters 5 \
  --json "$out/bench-vocab.json"
if [ -f "$out/bench-vocab.json" ]; then
  note "$(python3 - "$out/bench-vocab.json" <<'EOF' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
# The targets' anchors: PyTorch's materialised projection + cross-entropy, 115 ms and 18.3 GiB.
for r in rows:
    name = r["schedule"] + (f"/{r['strip']} kept {r['kept_strips']} {r['payload']}"
                            if r.get("strip") else "")
    gib = r["peak_bytes"].get("logits", 0) / 2**30
    print(f"{name}: {r['time_s'] * 1e3:.0f} ms ({r['time_s'] / 0.115:.2f}x 115 ms), "
          f"logits {gib:.2f} GiB ({100 * gib / 18.3:.1f}% of 18.3);", end=" ")
EOF
)"
fi
row

# Expert dispatch at a gpt-oss-20b layer's shape (H 2880, F 2880, 32 experts top-4), 16384 tokens,
# bf16, Zipf routing, on the one GPU (W = 1: the all-to-all is a copy; the rows differ in their
# dispatch buffers and chunking): standard vs LLEP vs PipelinedLLEP, peaks against the bounds.
step bench-dispatch 60 "$bin" bench dispatch --set runtime.backend=cuda --set runtime.device_memory=auto --tokens 16384 --hidden 2880 \
  --ffn 2880 --experts 32 --top-k 4 --dtype bf16 --routing zipf --warmup 2 --iters 5 \
  --json "$out/bench-dispatch.json"
if [ -f "$out/bench-dispatch.json" ]; then
  note "$(python3 - "$out/bench-dispatch.json" <<'EOF' 2>/dev/null
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    name = r["schedule"] + ("/" + r["membership"] if r.get("membership") else "")
    print(f"{name}: {r['time_s'] * 1e3:.1f} ms, dispatch {r['peak_bytes']['dispatch'] / 2**20:.0f} MiB"
          f" (bound {r['bound_bytes'] / 2**20:.0f}), err {r['max_rel_err']:.1e};", end=" ")
EOF
)"
fi
row

# Checkpoint boundaries of the small preset at 8 x 4096 tokens (f32): standard vs SCO with no,
# half and every layer offloaded through the copy stream to pinned host memory; every row's
# gradients bitwise standard's.
step bench-sco 60 "$bin" bench sco -c "$root/configs/small.toml" --set runtime.backend=cuda \
  --set training.batch_size=8 --set training.seq_len=4096 --warmup 1 --iters 5 \
  --json "$out/bench-sco.json"
if [ -f "$out/bench-sco.json" ]; then
  note "$(python3 - "$out/bench-sco.json" <<'EOF' 2>/dev/null
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(f"{r['label']}: {r['time_s'] * 1e3:.0f} ms, boundaries {r['peak_bytes']['boundaries'] / 2**20:.0f} MiB"
          f" (bound {r['bound_bytes'] / 2**20:.0f});", end=" ")
EOF
)"
fi
row

# The optimizer step for 268M parameters with bf16 working weights, as a bf16 run has them (fp32
# gradients; fp32 master, m, v on the host): resident, the serial CPU offload (fp32 gradients
# down, bf16 weights up) and OffloadStreamAdamW over a few bucket sizes. Targets:
# OffloadStreamAdamW within 1.25x of the host-link floor (12 B/param each way at the pinned
# bandwidth measured in the run) and at least 5x faster than the 380 ms serial-offload anchor
# (scripts/gpu_targets.py says why not our own serial offload, whose speedup is shown too); every
# row bitwise resident's. The pipeline
# fills and drains over about two buckets, so B buckets cost about (B + 2) / B of the steady state:
# with the duplex link at ~1.2x the one-way floor, 1.25x needs B >= 64 (buckets of 4M parameters or
# fewer).
step bench-adamw 120 "$bin" bench adamw --set runtime.backend=cuda --params 268435456 \
  --dtype bf16 --buckets 2097152,4194304,8388608,33554432 --slots 2,3 --warmup 1 --iters 3 \
  --json "$out/bench-adamw.json"
note "$(grep -E '^# target \(GPU\)' "$out/bench-adamw.log" | sed 's/^# //')" \
     "$(grep -Eo 'both at once [0-9.]+ GB/s each way' "$out/bench-adamw.log")"
row

# Training runs of the small preset with every bounded operator on (PipelinedLLEP, Ring-DTP, SCO,
# OffloadStreamAdamW), one rank, 10 steps in float32 and in bfloat16 (bf16 weights and
# activations, fp32 master and grads), as scripts/gpu_reference.sh runs them. Their first steps'
# losses must follow the CPU backend's, kept in scripts/gpu_reference_losses.json (CI checks that
# the file still matches the code; gpu_targets.py says how closely).
# The driver's view of the device while each run trains (MiB used, every 100 ms): with the
# metrics' outside_arena_bytes it is what the plan's terms beyond the arena are checked against.
for dtype in float32 bfloat16; do
  name="small-cuda-$dtype"
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 100 \
    >"$out/train-$dtype-device-memory.csv" 2>/dev/null &
  sampler=$!
  step "train-$dtype" 60 env MOEPEAK_BUILD_DIR="$build_dir" "$root/scripts/gpu_reference.sh" \
    run cuda "$dtype" 10 "$out/runs"
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  if [ -f "$out/runs/$name/metrics.jsonl" ]; then
    note "$(python3 - "$out/runs/$name/metrics.jsonl" <<'EOF' 2>/dev/null
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first, last = rows[0], rows[-1]
print(f"loss {first['loss']:.4f} -> {last['loss']:.4f} in {len(rows)} steps; "
      f"last step {last.get('step_time_s', 0):.3f} s, {last.get('tokens_per_s', 0):.0f} tokens/s, "
      f"MFU {100 * last.get('mfu', 0):.1f}%, peak {last.get('peak_gib', 0):.2f} GiB, "
      f"outside the arena {max(r.get('outside_arena_bytes', 0) for r in rows) / 2**20:.0f} MiB "
      f"(at open {last.get('device_used_before_arena_bytes', 0) / 2**20:.0f} MiB)")
EOF
)"
  fi
  row
done

# ---- summary ---------------------------------------------------------------------------------
elapsed=$(( $(date +%s) - started ))
echo "# finished $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $elapsed s" >>"$summary"
# The GPU targets, judged from the benches' JSON and the runs' metrics (scripts/gpu_targets.py).
if command -v python3 >/dev/null 2>&1; then
  targets="$(python3 "$root/scripts/gpu_targets.py" "$out" "$elapsed" 2>&1)"
else  # the benches' JSON is all in $out: the verdicts can be computed on any machine afterwards
  targets="python3 is not installed here, so no verdicts (and no bench notes above): run
\`scripts/gpu_targets.py $out $elapsed\` where it is, on this folder."
fi
# report.md: the summary, the targets, then each step's output as docs/perf.md quotes it.
{
  echo "## gpu-check: $gpu, $(date -u '+%Y-%m-%d')"
  echo
  echo '```'
  cat "$summary"
  echo '```'
  echo
  echo "### The GPU targets"
  echo
  echo "$targets"
  for i in "${!names[@]}"; do
    name="${names[$i]}"
    echo
    echo "### $name: ${results[$i]}, ${seconds[$i]} s"
    [ -n "${notes[$i]}" ] && { echo; echo "${notes[$i]}"; }
    [ -f "$out/$name.log" ] || continue
    echo
    echo '```'
    if [[ "$name" == bench-* ]] && [ "${results[$i]}" = passed ]; then
      grep -E '^(#|  [^ ])' "$out/$name.log" | grep -v '^# moepeak bench' | head -60
    else
      tail -15 "$out/$name.log"
    fi
    echo '```'
  done
} >"$out/report.md"
echo
cat "$summary"
echo
echo "$targets"
if [ -n "$archive" ]; then
  tar czf "$archive" --exclude=checkpoints -C "$(dirname "$out")" "$(basename "$out")" &&
    echo "gpu-check: $out packed into $archive ($(du -h "$archive" | cut -f1))"
fi
failed=0
for r in "${results[@]}"; do [ "$r" = passed ] || failed=1; done
exit $failed
