#!/usr/bin/env bash
# `moepeak train` on W = 1 (a plain process), 2 and 4 real rank processes (mpirun), with the
# unchanged configs/tiny.toml:
#   - every step's loss and grad norm on 2 and 4 ranks equal the 1-rank ones (1e-5 relative),
#     metrics carry world_size and one peak per rank, and 4 ranks peak below one rank;
#   - the step-1 dump (--dump-step) on 4 ranks has the 1-rank dump's tensors: the same batch and
#     initial weights bitwise, gradients within 1e-5 relative, the loss within 1e-6;
#   - a checkpoint saved on 2 ranks resumes bit for bit on 2 ranks and within 1e-5 on 4 and 1;
#   - kill -9 of one rank in the middle of a save leaves the previous checkpoint as `latest` and
#     no new one, and --resume continues from it bit for bit;
#   - schedules.vocab = "ring_dtp" on 4 ranks gives 1 rank's materialised losses (1e-5), and its
#     checkpoint resumes under the materialised schedule on 4 ranks;
#   - runtime.bind: each rank binds to its share of the PUs when the launcher
#     left it unbound and the host has a PU per rank (auto), rebinding under "rank", never under
#     "none"; binding changes no loss;
#   - preemption under mpirun: USR1 to mpirun (which forwards it) stops both ranks at one step
#     boundary with a checkpoint and exit 75; --resume then ends with an uninterrupted run's
#     losses, bitwise, every step once;
#   - a config the layout cannot split over W ranks is rejected before any work (non-zero exit,
#     numbers in the message), and one rank's failure ends the whole job instead of hanging it;
#   - `bench overlap` on 4 ranks: both modes, the traffic classes, serial steps fully exposed.
# Every run is under `timeout 120`: a hang is a failure (exit 124), not a blocked test.
# Run: ctest -R test_train_ranks   (or: OMPI_MCA_btl=self,vader
#   OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_ALLOW_RUN_AS_ROOT=1
#   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash tests/cli/test_train_ranks.sh build/moepeak "$(which mpirun)" .)
set -u
bin="$1"
mpirun="$2"
src="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
is_failure() { test "$1" -ne 0 && test "$1" -ne 124; }  # non-zero, and not the timeout's 124
# shellcheck source=tests/metrics_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../metrics_checks.sh"  # py, series_match

# train W NAME LOG [ARGS...]: `moepeak train` of configs/tiny.toml on W ranks (W = 1: a plain
# process, no mpirun) as job NAME under $tmp/runs; stdout/stderr in LOG.out/LOG.err; returns
# the exit code (124: it hung and timeout ended it).
train() {
  local w="$1" name="$2" log="$3"; shift 3
  local launch=()
  if [ "$w" -gt 1 ]; then launch=("$mpirun" --allow-run-as-root --oversubscribe ${MPIRUN_EXTRA:-} -np "$w"); fi
  timeout -k 10 120 "${launch[@]}" "$bin" train --config "$src/configs/tiny.toml" \
    --set metrics.progress=off --set job.run_dir="$tmp/runs" --set job.name="$name" "$@" \
    >"$log.out" 2>"$log.err"
}
metrics() { echo "$tmp/runs/$1/metrics.jsonl"; }
# every_rank LOG W PATTERN: each of the W ranks printed the error PATTERN (ERE) to LOG.err.
every_rank() {
  local r
  for r in $(seq 0 $(($2 - 1))); do
    grep -qE -- "moepeak: error: \[[^]]* rank $r/$2\] .*$3" "$1.err" || { echo "  rank $r/$2 did not print it"; return 1; }
  done
}

# metrics_shape FILE FIRST LAST W: one line per step FIRST..LAST, world_size = W, W rank peaks.
metrics_shape() {
  "$py" - "$@" <<'PY'
import json, sys
path, first, last, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except (OSError, ValueError) as e:
    sys.exit(f"  {path}: {e}")
steps = [r["step"] for r in rows]
if steps != list(range(first, last + 1)):
    sys.exit(f"  {path}: steps {steps}, want {first}..{last}")
for r in rows:
    if r.get("world_size") != w or len(r.get("rank_peak_bytes", [])) != w:
        sys.exit(f"  {path}: step {r['step']}: world_size {r.get('world_size')}, "
                 f"rank_peak_bytes {r.get('rank_peak_bytes')}, want {w} ranks")
PY
}

# peak_below SMALL BIG: the largest per-rank peak of any step in SMALL < the largest in BIG.
peak_below() {
  "$py" - "$@" <<'PY'
import json, sys
def peak(p):
    return max(max(r["rank_peak_bytes"]) for r in (json.loads(l) for l in open(p) if l.strip()))
try:
    a, b = peak(sys.argv[1]), peak(sys.argv[2])
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"  {e}")
if not a < b:
    sys.exit(f"  largest rank peak {a} bytes is not below {b} bytes")
PY
}

# dump_cmp WHAT DIR_A DIR_B: compares two step dumps. WHAT: names (the same tensors in each
# .safetensors file), batch (bitwise), weights (bitwise), grads (each tensor: max|a-b| <=
# 1e-5 max|a|), loss (1e-6 relative). The safetensors files are read here: an 8-byte
# little-endian header length, a JSON header, then the raw tensor bytes.
dump_cmp() {
  "$py" - "$@" <<'PY'
import json, struct, sys
import numpy as np
what, da, db = sys.argv[1], sys.argv[2], sys.argv[3]
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
    return out
def pair(file):
    try:
        return load(f"{da}/{file}"), load(f"{db}/{file}")
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"  {file}: {e}")
bad = []
if what == "names":
    for file in ("model.safetensors", "grads.safetensors", "batch.safetensors"):
        a, b = pair(file)
        if not a or sorted(a) != sorted(b):
            bad.append(f"{file}: tensors {sorted(set(a) ^ set(b))} in only one dump ({len(a)}, {len(b)})")
elif what in ("batch", "weights"):
    a, b = pair("batch.safetensors" if what == "batch" else "model.safetensors")
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            bad.append(f"{name}: not bitwise equal")
    if not a:
        bad.append("no tensors")
elif what == "grads":
    a, b = pair("grads.safetensors")
    for name in sorted(set(a) & set(b)):
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            bad.append(f"{name}: shape {x.shape} vs {y.shape}")
            continue
        diff, scale = float(np.max(np.abs(x - y))), max(float(np.max(np.abs(x))), 1e-30)
        if not diff <= 1e-5 * scale:
            bad.append(f"{name}: max|a-b| {diff:.3g} > 1e-5 * max|a| {scale:.3g}")
    if not a:
        bad.append("no tensors")
elif what == "loss":
    try:
        a = json.load(open(f"{da}/loss.json"))["loss"]
        b = json.load(open(f"{db}/loss.json"))["loss"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"  loss.json: {e}")
    if not abs(a - b) <= 1e-6 * max(abs(a), abs(b)):
        bad.append(f"loss {a!r} vs {b!r}")
else:
    sys.exit(f"  dump_cmp: unknown {what}")
for line in bad[:10]:
    print(f"  {line}")
sys.exit(1 if bad else 0)
PY
}

# 1. configs/tiny.toml unchanged on 1, 2 and 4 ranks: the same losses and grad norms each step.
for w in 1 2 4; do
  train $w "w$w" "$tmp/w$w" --set training.steps=10; rc=$?
  check "tiny.toml on $w rank(s) exits 0 (rc $rc)" test $rc -eq 0
  check "tiny.toml on $w rank(s): 10 metrics lines, world_size $w, $w rank peaks" \
    metrics_shape "$(metrics w$w)" 1 10 $w
done
for w in 2 4; do
  check "losses on $w ranks equal 1 rank's (1e-5 relative)" \
    series_match "$(metrics w1)" "$(metrics w$w)" loss 1e-5
  check "grad norms on $w ranks equal 1 rank's (1e-5 relative)" \
    series_match "$(metrics w1)" "$(metrics w$w)" grad_norm 1e-5
done
check "the largest rank peak on 4 ranks is below the 1-rank peak" \
  peak_below "$(metrics w4)" "$(metrics w1)"

# 1b. Binding. mpirun --bind-to none leaves the ranks unbound, so "auto" binds them itself.
online=$(getconf _NPROCESSORS_ONLN)
MPIRUN_EXTRA="--bind-to none" train 2 bind2 "$tmp/bind2" --set training.steps=3; rc=$?
check "bind auto on 2 ranks exits 0 (rc $rc)" test $rc -eq 0
if [ "$online" -ge 2 ]; then
  check "bind auto on 2 unbound ranks: rank 0 bound to its share, PU 0" \
    contains "$tmp/bind2.err" "rank 0 bound to PUs 0 ("
else
  check "bind auto on 2 ranks of 1 PU: not bound" contains "$tmp/bind2.err" "2 ranks share 1 PUs"
fi
check "losses of bound ranks equal 1 rank's (1e-5 relative)" \
  series_match "$(metrics w1)" "$(metrics bind2)" loss 1e-5
MPIRUN_EXTRA="--bind-to none" train 2 bindnone "$tmp/bindnone" --set training.steps=1 \
  --set runtime.bind=none; rc=$?
check "bind none exits 0 (rc $rc)" test $rc -eq 0
check "bind none: not bound, says why" contains "$tmp/bindnone.err" 'not bound: runtime.bind = "none"'
# The launcher binds (OpenMPI binds 2 ranks to a core each): auto keeps it, rank rebinds.
if [ "$online" -ge 2 ]; then
  MPIRUN_EXTRA="--bind-to core" train 2 bindmpi "$tmp/bindmpi" --set training.steps=1; rc=$?
  check "bind auto under mpirun --bind-to core exits 0 (rc $rc)" test $rc -eq 0
  check "bind auto keeps the launcher's binding" contains "$tmp/bindmpi.err" "the launcher bound it already"
  MPIRUN_EXTRA="--bind-to core" train 2 bindrank "$tmp/bindrank" --set training.steps=1 \
    --set runtime.bind=rank; rc=$?
  check "bind rank under mpirun --bind-to core exits 0 (rc $rc)" test $rc -eq 0
  check "bind rank rebinds" contains "$tmp/bindrank.err" "rank 0 bound to PUs 0 ("
fi
if [ "$online" -lt 4 ]; then
  check "bind auto with 4 ranks on $online PUs: not bound" \
    contains "$tmp/w4.err" "4 ranks share $online PUs"
fi

# 1c. Preemption under mpirun (docs/slurm.md): USR1 -> checkpoint at a step boundary, exit 75.
train 2 full30 "$tmp/full30" --set training.steps=30; rc=$?
check "30 steps on 2 ranks exit 0 (rc $rc)" test $rc -eq 0
timeout -k 10 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" train \
  --config "$src/configs/tiny.toml" --set metrics.progress=off --set job.run_dir="$tmp/runs" \
  --set job.name=pre30 --set training.steps=30 >"$tmp/pre30.out" 2>"$tmp/pre30.err" &
launcher=$!
signalled=no
for _ in $(seq 2000); do  # up to ~100 s for step 2
  if [ -f "$(metrics pre30)" ] && [ "$(wc -l <"$(metrics pre30)")" -ge 2 ]; then
    pkill -USR1 -P "$launcher" && signalled=yes  # timeout's child: the launcher
    break
  fi
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
wait "$launcher"; rc=$?
check "USR1 reached mpirun after step 2" test "$signalled" = yes
check "the signalled run exits 75 (rc $rc)" test $rc -eq 75
check "the signalled run says where it stopped" contains "$tmp/pre30.err" "preempted (signal 10) after step"
train 2 pre30 "$tmp/pre30b" --set training.steps=30 --resume; rc=$?
check "--resume after the signal exits 0 (rc $rc)" test $rc -eq 0
check "the resumed run has steps 1..30 once each" metrics_shape "$(metrics pre30)" 1 30 2
check "its losses equal the uninterrupted run's (bitwise)" \
  series_match "$(metrics full30)" "$(metrics pre30)" loss 0

# 2. The step-1 dump does not depend on W (beyond the order of gradient sums).
for w in 1 4; do
  train $w "dump$w" "$tmp/dump$w" --set training.steps=1 --dump-step "$tmp/dump$w"; rc=$?
  check "--dump-step on $w rank(s) exits 0 (rc $rc)" test $rc -eq 0
  for f in model.safetensors grads.safetensors batch.safetensors loss.json config.json; do
    check "--dump-step on $w rank(s) writes $f" test -s "$tmp/dump$w/$f"
  done
done
check "dumps on 1 and 4 ranks hold the same tensor names" dump_cmp names "$tmp/dump1" "$tmp/dump4"
check "dumps on 1 and 4 ranks hold the same batch" dump_cmp batch "$tmp/dump1" "$tmp/dump4"
check "initial weights on 1 and 4 ranks are bitwise equal" dump_cmp weights "$tmp/dump1" "$tmp/dump4"
check "gradients on 4 ranks equal 1 rank's (1e-5 relative)" dump_cmp grads "$tmp/dump1" "$tmp/dump4"
check "loss.json on 4 ranks equals 1 rank's (1e-6 relative)" dump_cmp loss "$tmp/dump1" "$tmp/dump4"

# 3. A checkpoint saved on 2 ranks resumes on 2 (bit for bit), 4 and 1 rank(s).
ckpt=(--set checkpoint.enable=true --set checkpoint.interval=3 --set checkpoint.keep_latest=5)
train 2 ck2 "$tmp/ck2" --set training.steps=6 "${ckpt[@]}"; rc=$?
check "2 ranks with checkpoints exits 0 (rc $rc)" test $rc -eq 0
check "2 ranks with checkpoints: 6 metrics lines" metrics_shape "$(metrics ck2)" 1 6 2
step3="$tmp/runs/ck2/checkpoints/step_00000003"
for f in manifest.json config.json shard-00000.bin shard-00001.bin; do
  check "checkpoint step_00000003 has $f" test -s "$step3/$f"
done
for w in 2 4 1; do
  train $w "resume$w" "$tmp/resume$w" --set training.steps=6 --resume-from "$step3"; rc=$?
  check "resume on $w rank(s) from the 2-rank checkpoint exits 0 (rc $rc)" test $rc -eq 0
  check "resume on $w rank(s) runs steps 4..6" metrics_shape "$(metrics resume$w)" 4 6 $w
done
check "resume on 2 ranks: losses of steps 4..6 bitwise equal the uninterrupted run's" \
  series_match "$(metrics ck2)" "$(metrics resume2)" loss 0
check "resume on 4 ranks: losses of steps 4..6 equal the uninterrupted run's (1e-5 relative)" \
  series_match "$(metrics ck2)" "$(metrics resume4)" loss 1e-5
check "resume on 1 rank: losses of steps 4..6 equal the uninterrupted run's (1e-5 relative)" \
  series_match "$(metrics ck2)" "$(metrics resume1)" loss 1e-5

# 3a. kill -9 in the middle of a save (MOEPEAK_FAULT, core/fault_injection.h): rank 1 half-way
# through its shard file, or rank 0 with the new
# manifest written but the directory not yet renamed. Either way the job dies, `latest` still
# names step 3, no step_00000006 exists, and --resume continues from step 3 to the uninterrupted
# run's losses, bitwise (the stale temporary directory is cleared by its save). With
# checkpoint.async the shard is written by the background thread: killing it there is the same.
for spec in 1:6:shard 0:6:manifest 1:6:shard:async; do
  point="${spec%:async}"
  mode=(); [ "$point" != "$spec" ] && mode=(--set checkpoint.async=true)
  name="kill_${spec//:/_}"
  IFS=: read -r rank step where <<<"$point"
  MOEPEAK_FAULT="kill@save_$where,rank=$rank,step=$step" MPIRUN_EXTRA="-x MOEPEAK_FAULT" \
    train 2 "$name" "$tmp/$name" --set training.steps=6 "${ckpt[@]}" "${mode[@]}"; rc=$?
  check "kill -9 at $spec: the job fails (rc $rc)" is_failure $rc
  folder="$tmp/runs/$name/checkpoints"
  check "kill -9 at $spec: latest still names step 3" grep -qx step_00000003 "$folder/latest"
  check "kill -9 at $spec: no step_00000006 appeared" test ! -e "$folder/step_00000006"
  check "kill -9 at $spec: step 3 is whole" test -s "$folder/step_00000003/manifest.json"
  train 2 "$name" "$tmp/${name}_resumed" --set training.steps=6 "${ckpt[@]}" "${mode[@]}" \
    --resume; rc=$?
  check "kill -9 at $spec: --resume exits 0 (rc $rc)" test $rc -eq 0
  check "kill -9 at $spec: it resumed after step 3" contains "$tmp/${name}_resumed.err" "after step 3"
  check "kill -9 at $spec: steps 4..6 bitwise equal the uninterrupted run's" \
    series_match "$(metrics ck2)" "$(metrics "$name")" loss 0
  check "kill -9 at $spec: the resumed save cleared the stale temporary directory" \
    test ! -e "$folder/.tmp_step_00000006"
done

# 3b. Ring-DTP (schedules.vocab = "ring_dtp"): the LM head stored by vocabulary rows, the same
# losses as the materialised logits on 1 rank; its checkpoint (whole tensors) resumes under the
# materialised schedule on 4 ranks.
ring=(--set schedules.vocab=ring_dtp)
train 4 ring4 "$tmp/ring4" --set training.steps=10 "${ring[@]}"; rc=$?
check "ring_dtp on 4 ranks exits 0 (rc $rc)" test $rc -eq 0
check "ring_dtp on 4 ranks: losses equal 1 rank's materialised (1e-5 relative)" \
  series_match "$(metrics w1)" "$(metrics ring4)" loss 1e-5
check "ring_dtp on 4 ranks: grad norms equal 1 rank's materialised (1e-5 relative)" \
  series_match "$(metrics w1)" "$(metrics ring4)" grad_norm 1e-5
train 2 ringck2 "$tmp/ringck2" --set training.steps=6 "${ckpt[@]}" "${ring[@]}"; rc=$?
check "ring_dtp on 2 ranks with checkpoints exits 0 (rc $rc)" test $rc -eq 0
train 4 ringresume4 "$tmp/ringresume4" --set training.steps=6 \
  --resume-from "$tmp/runs/ringck2/checkpoints/step_00000003"; rc=$?
check "a ring_dtp checkpoint resumes materialised on 4 ranks (rc $rc)" test $rc -eq 0
check "ring_dtp checkpoint resumed materialised: steps 4..6 equal the uninterrupted run (1e-5)" \
  series_match "$(metrics ringck2)" "$(metrics ringresume4)" loss 1e-5

# 3c. A layout with its own degrees (docs/parallelism.md): experts over pairs with their replicas,
# Ulysses over pairs (two sequence groups of 4 sequences), dense weights sharded over pairs and
# replicated (HSDP): the same losses and grad norms as one rank.
layout=(--set parallelism.expert_parallel=2 --set parallelism.sequence_parallel=2
        --set parallelism.data_shard=2)
train 4 layout4 "$tmp/layout4" --set training.steps=10 "${layout[@]}"; rc=$?
check "Ep 2, Sp 2, data_shard 2 on 4 ranks exits 0 (rc $rc)" test $rc -eq 0
check "Ep 2, Sp 2, data_shard 2 on 4 ranks: losses equal 1 rank's (1e-5 relative)" \
  series_match "$(metrics w1)" "$(metrics layout4)" loss 1e-5
check "Ep 2, Sp 2, data_shard 2 on 4 ranks: grad norms equal 1 rank's (1e-5 relative)" \
  series_match "$(metrics w1)" "$(metrics layout4)" grad_norm 1e-5
check "the log names the layout" grep -q "Ep 2, Sp 2, data_shard 2" "$tmp/layout4.err" "$tmp/layout4.out"

# 4. Layouts that cannot be split over W ranks: an error on every rank before any work. Each
# rank checks on its own (no collective), and the first to fail calls MPI_Abort, which may kill the
# others before they print: mpi_abort_delay (Open MPI) holds the abort back a second, so every
# rank's message reaches stderr.
export OMPI_MCA_mpi_abort_delay=1
train 2 heads "$tmp/heads" --set training.steps=10 \
  --set model.num_attention_heads=3 --set model.num_key_value_heads=1; rc=$?
check "3 query heads on 2 ranks fails (rc $rc)" is_failure $rc
check "3 query heads on 2 ranks: every rank says 3 heads cannot be split over 2 ranks" \
  every_rank "$tmp/heads" 2 "3 query heads cannot be split over 2 ranks"
check "3 query heads on 2 ranks: no run directory (rejected before any work)" test ! -e "$tmp/runs/heads"

train 2 world "$tmp/world" --set training.steps=10 --set parallelism.world_size=4; rc=$?
check "parallelism.world_size=4 on 2 ranks fails (rc $rc)" is_failure $rc
check "parallelism.world_size=4 on 2 ranks: every rank names 4 and 2" \
  every_rank "$tmp/world" 2 "parallelism\.world_size = 4 but the job was started with 2 ranks"
check "parallelism.world_size=4 on 2 ranks: no run directory" test ! -e "$tmp/runs/world"

train 4 experts "$tmp/experts" --set training.steps=10 \
  --set model.num_local_experts=6 --set model.num_experts_per_tok=2; rc=$?
check "6 experts on 4 ranks fails (rc $rc)" is_failure $rc
check "6 experts on 4 ranks: every rank names 6 and 4" \
  every_rank "$tmp/experts" 4 "over Ep = 4 ranks needs model\.num_local_experts \(6\) divisible by Ep"
check "6 experts on 4 ranks: no run directory" test ! -e "$tmp/runs/experts"
train 4 degree "$tmp/degree" --set training.steps=10 --set parallelism.sequence_parallel=3; rc=$?
check "sequence_parallel=3 on 4 ranks fails (rc $rc)" is_failure $rc
check "sequence_parallel=3 on 4 ranks: every rank names 3 and 4" \
  every_rank "$tmp/degree" 4 "parallelism\.sequence_parallel = 3 must divide the world size W = 4"
check "sequence_parallel=3 on 4 ranks: no run directory" test ! -e "$tmp/runs/degree"
unset OMPI_MCA_mpi_abort_delay

# 5. One rank's failure ends the job: only rank 0 creates the run directory (here under a regular
# file, so it fails) while rank 1 enters step 1's collectives; MPI_Abort must end both.
touch "$tmp/afile"
timeout -k 10 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" train \
  --config "$src/configs/tiny.toml" --set training.steps=10 --set metrics.progress=off \
  --set job.run_dir="$tmp/afile/runs" --set job.name=abort >"$tmp/abort.out" 2>"$tmp/abort.err"; rc=$?
check "rank 0 failing alone ends the 2-rank job with an error, not a hang (rc $rc)" is_failure $rc
rank0_error_names() { grep -F 'moepeak: error: ' "$1" | grep -F ' rank 0/2] ' | grep -qF -- "$2"; }
check "rank 0's error names the run directory" rank0_error_names "$tmp/abort.err" "$tmp/afile/runs"

# 6. bench overlap on 4 ranks with the link model on: both modes timed, every traffic class in
# the JSON; in the serial steps no compute task runs beside a communication task, so all their
# communication is exposed; the link model charged something.
timeout -k 10 180 "$mpirun" --allow-run-as-root --oversubscribe -np 4 "$bin" bench overlap \
  --config "$src/configs/tiny.toml" --set schedules.dispatch=pipelined_llep \
  --set schedules.chunk_tokens=64 --set schedules.vocab=ring_dtp \
  --set runtime.cpu_link_gb_per_s=1 --set runtime.cpu_link_latency_us=10 \
  --set runtime.cpu_comm_wait=poll --warmup 1 --iters 1 --json "$tmp/overlap.json" >"$tmp/overlap.out" 2>"$tmp/overlap.err"; rc=$?
check "bench overlap on 4 ranks exits 0 (rc $rc)" test $rc -eq 0
check "bench overlap prints both modes" grep -q '^  serial ' "$tmp/overlap.out"
check "bench overlap names the wait mode" grep -q 'per operation, poll waits' "$tmp/overlap.out"
check "bench overlap prints the exposed dispatch" grep -q '^  dispatch ' "$tmp/overlap.out"
check "bench overlap JSON: serial steps expose all their communication, the link charged it" \
  "$py" -c "
import json, sys
d = json.load(open('$tmp/overlap.json'))
rows = {r['schedule']: r for r in d['rows']}
s, o = rows['serial'], rows['overlap']
ok = d['bench'] == 'overlap' and s['comm_s'] > 0 and s['exposed_comm_s'] >= 0.999 * s['comm_s']
ok = ok and o['link_s'] > 0 and set(o['traffic']) >= {'zero gather', 'zero reduce-scatter', 'dispatch', 'vocab'}
ok = ok and o['traffic']['dispatch']['comm_s'] > 0 and o['traffic']['zero gather']['comm_s'] > 0
sys.exit(not ok)"

report
