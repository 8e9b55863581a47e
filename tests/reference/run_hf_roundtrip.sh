#!/usr/bin/env bash
# test_hf_roundtrip: Hugging Face Mixtral checkpoints in and out of moepeak, on real processes,
# against the float64 numpy reference (hf_roundtrip.py, mixtral_reference.py).
#   - import: checkpoints written by hf_roundtrip.py in the transformers 4 and 5 config forms, as
#     one file or several with an index, in F32, BF16 and F16: `train --init-from` loads each
#     weight exactly (the step-1 dump holds it) and its first loss is the reference's (1e-5), on
#     1 rank and on 2 and 4 ranks (each reading only its slices);
#   - export: a checkpoint saved on 2 ranks, exported in float32 (several shards) and bfloat16:
#     the bfloat16 export is the nearest-even rounding of the float32 one; `--init-from` the
#     float32 export on 2 ranks starts with exactly the loss the saving run had at the next step
#     (every step trains on the same one-batch data file), on 1 and 4 ranks within 1e-6, and the
#     reference computes that loss from the export's files (1e-5);
#   - a [model] key that disagrees with config.json, and an export onto an existing directory,
#     are errors that name them.
# Every run is under `timeout 120`. Run: ctest -R test_hf_roundtrip
#   (or: OMPI_MCA_btl=self,vader OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
#    bash tests/reference/run_hf_roundtrip.sh build/moepeak "$(which mpirun)")
set -u
bin="$1"
mpirun="$2"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moepeak_hf_roundtrip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$here/../shell_checks.sh"  # check, contains, report
py=/usr/bin/python3
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "run_hf_roundtrip: $py cannot import numpy (install the Debian package python3-numpy)" >&2
  exit 1
fi

# One batch of data: B*T = 4*16 tokens, so every step trains on the same windows and a step's
# loss depends on the weights alone.
"$py" -c 'import numpy as np; np.random.default_rng(3).integers(0, 48, 64).astype("<u2").tofile("'"$tmp"'/one_batch.bin")'
common=(--set training.seq_len=16 --set training.batch_size=4 --set metrics.progress=off
        --set training.dataset=bin --set training.dataset_path="$tmp/one_batch.bin"
        --set training.shuffle=false
        --set job.run_dir="$tmp/runs")

# run W NAME [ARGS...]: `moepeak train` on W ranks (1: a plain process) as job NAME; output in
# $tmp/NAME.log.
run() {
  local w="$1" name="$2"; shift 2
  local launch=()
  if [ "$w" -gt 1 ]; then launch=("$mpirun" --allow-run-as-root --oversubscribe -np "$w"); fi
  timeout -k 10 120 "${launch[@]}" "$bin" train "${common[@]}" --set job.name="$name" "$@" \
    >"$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log"; return 1; }
}
# loss_of NAME STEP: the loss of step STEP in job NAME's metrics.
loss_of() {
  "$py" -c 'import json,sys; print(repr([json.loads(l)["loss"] for l in open(sys.argv[1]) if json.loads(l)["step"] == int(sys.argv[2])][0]))' \
    "$tmp/runs/$1/metrics.jsonl" "$2"
}
# same_loss A B TOL: |a - b| <= TOL * |b| (TOL 0: bitwise).
same_loss() {
  "$py" -c 'import sys; a, b, t = map(float, sys.argv[1:]); print(f"  {a!r} vs {b!r}"); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)' "$@"
}

# ---- import -------------------------------------------------------------------------------
for spec in "4 F32 1" "5 BF16 3" "4 F16 2" "5 F32 1"; do
  read -r form dtype files <<<"$spec"
  name="hf_t${form}_${dtype}_${files}"
  check "make $name" "$py" "$here/hf_roundtrip.py" make "$tmp/$name" --form "$form" --dtype "$dtype" \
    --files "$files" --seed "$files"
  check "import $name on 1 rank" run 1 "import_$name" --set training.steps=1 \
    --init-from "$tmp/$name" --dump-step "$tmp/dump_$name"
  check "import $name: exact weights, reference loss" \
    "$py" "$here/hf_roundtrip.py" check "$tmp/$name" "$tmp/dump_$name"
done
for w in 2 4; do
  check "import hf_t5_BF16_3 on $w ranks" run "$w" "import_w$w" --set training.steps=1 \
    --init-from "$tmp/hf_t5_BF16_3" --dump-step "$tmp/dump_w$w"
  check "import on $w ranks: exact weights, reference loss" \
    "$py" "$here/hf_roundtrip.py" check "$tmp/hf_t5_BF16_3" "$tmp/dump_w$w"
done
check "a [model] key that disagrees with config.json is an error naming both" \
  bash -c '! "$0" train --init-from "$1" --set model.hidden_size=64 --set training.steps=1 \
    >"$2/disagree.log" 2>&1 && grep -q "model.hidden_size = 64 (--set model.hidden_size=64) disagrees" "$2/disagree.log" \
    && grep -q "has hidden_size = 32" "$2/disagree.log"' "$bin" "$tmp/hf_t4_F32_1" "$tmp"

# ---- export -------------------------------------------------------------------------------
check "save on 2 ranks" run 2 source --set training.steps=3 --set checkpoint.enable=true \
  --set checkpoint.interval=2 --set model.vocab_size=48 --set model.initializer_range=0.2
ckpt="$tmp/runs/source/checkpoints/step_00000002"
check "export float32 in shards of at most 40KB" timeout 60 "$bin" export "$ckpt" "$tmp/e32" \
  --dtype float32 --max-shard-size 40KB
check "the float32 export has several shards and an index" \
  bash -c 'ls "$0"/model-00002-of-*.safetensors && test -f "$0/model.safetensors.index.json" \
    && test -f "$0/generation_config.json" && grep -q "\"torch_dtype\": \"float32\"" "$0/config.json"' "$tmp/e32"
check "export bfloat16 (the default)" timeout 60 "$bin" export "$ckpt" "$tmp/e16"
check "the bfloat16 export is the nearest-even rounding of the float32 one" \
  "$py" "$here/hf_roundtrip.py" bf16 "$tmp/e32" "$tmp/e16"
check "export onto an existing directory is refused" \
  bash -c '! "$0" export "$1" "$2" >"$3/exists.log" 2>&1 && grep -q "already exists" "$3/exists.log"' \
  "$bin" "$ckpt" "$tmp/e16" "$tmp"

step3=$(loss_of source 3)
for w in 2 1 4; do
  tol=1e-6
  [ "$w" -eq 2 ] && tol=0  # the saving run's layout: bitwise
  check "--init-from the export on $w ranks" run "$w" "from_export_w$w" --set training.steps=1 \
    --init-from "$tmp/e32" --dump-step "$tmp/dump_export_w$w"
  check "its first loss is the saving run's step 3 (tolerance $tol)" \
    same_loss "$(loss_of "from_export_w$w" 1)" "$step3" "$tol"
done
check "the reference reproduces that loss from the export's files" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/e32" "$tmp/dump_export_w1"
check "--init-from the bfloat16 export" run 1 from_export16 --set training.steps=1 \
  --init-from "$tmp/e16" --dump-step "$tmp/dump_export16"
check "the reference reproduces its loss from the bfloat16 files" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/e16" "$tmp/dump_export16"

report test_hf_roundtrip
