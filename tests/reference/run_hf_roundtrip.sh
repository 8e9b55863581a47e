#!/usr/bin/env bash
# test_hf_roundtrip: Hugging Face checkpoints (Mixtral, Qwen3-MoE, gpt-oss) in and out of moepeak, on real
# processes, against the float64 numpy reference (hf_roundtrip.py, hf_reference.py).
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
#     are errors that name them;
#   - Qwen3-MoE: Hub checkpoints (transformers 4 form with YaRN and a dense layer, BF16 in two
#     files; 5 form with a tied head) start a run with the reference's loss on 1 and 2 ranks; a
#     checkpoint whose tensors are not its config's is an error naming file and tensor; an export
#     of a YaRN, tied, partly dense model saved on 2 ranks restarts with its loss.
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

# ---- Qwen3-MoE in its Hub layout ------------------------------------------------------------
# Import: the transformers 4 form with YaRN and a dense first layer (BF16, two files), the 5 form
# with a tied head and unnormalised top-k weights (F32); on 1 rank, and the first on 2.
qwen3_cases=("4 BF16 2 mlp_only_layers=[0] rope_scaling={\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":64}"
             "5 F32 1 tie_word_embeddings=true norm_topk_prob=false")
for spec in "${qwen3_cases[@]}"; do
  read -r form dtype files set1 set2 <<<"$spec"
  name="qwen3_t${form}_${dtype}_${files}"
  check "make $name" "$py" "$here/hf_roundtrip.py" make "$tmp/$name" --form "$form" \
    --dtype "$dtype" --files "$files" --seed 7 --model-type qwen3_moe --set "$set1" --set "$set2"
  check "import $name on 1 rank" run 1 "import_$name" --set training.steps=1 \
    --init-from "$tmp/$name" --dump-step "$tmp/dump_$name"
  check "import $name: exact weights, reference loss" \
    "$py" "$here/hf_roundtrip.py" check "$tmp/$name" "$tmp/dump_$name"
done
check "import qwen3_t4_BF16_2 on 2 ranks" run 2 import_qwen3_w2 --set training.steps=1 \
  --init-from "$tmp/qwen3_t4_BF16_2" --dump-step "$tmp/dump_qwen3_w2"
check "import on 2 ranks: exact weights, reference loss" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/qwen3_t4_BF16_2" "$tmp/dump_qwen3_w2"
# A checkpoint whose tensors are not its config's family's: config.json says layer 0 is dense, the
# files hold its experts. An error naming the file and a tensor, and no run directory left.
check "make a checkpoint whose config.json and tensors disagree" "$py" "$here/hf_roundtrip.py" \
  make "$tmp/qwen3_mismatch" --form 5 --dtype F32 --files 1 --model-type qwen3_moe
"$py" -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); j["mlp_only_layers"]=[0]; json.dump(j, open(p,"w"))' \
  "$tmp/qwen3_mismatch/config.json"
check "a tensor missing for its family is an error naming the file and the tensor" \
  bash -c '! "$0" train --init-from "$1" --set training.steps=1 --set job.run_dir="$2/mismatch_runs" \
    >"$2/mismatch.log" 2>&1 && grep -q "model.layers.0.mlp.gate_proj.weight" "$2/mismatch.log" \
    && grep -q "qwen3_mismatch" "$2/mismatch.log" && ! test -e "$2/mismatch_runs/moepeak/checkpoints"' \
  "$bin" "$tmp/qwen3_mismatch" "$tmp"

# Export: a Qwen3-MoE with YaRN, a tied head and a dense layer saved on 2 ranks, exported and
# started from on 1 rank with the saving run's next loss; the reference reads the export's own
# config.json and files.
qwen3_model=(--set model.model_type=qwen3_moe --set model.vocab_size=48
             --set model.moe_intermediate_size=24 --set model.head_dim=8
             --set "model.mlp_only_layers=[1]" --set model.tie_word_embeddings=true
             --set model.rope_type=yarn --set model.rope_factor=4
             --set model.rope_original_max_position_embeddings=8 --set model.initializer_range=0.2)
check "save a Qwen3-MoE on 2 ranks" run 2 qwen3_source --set training.steps=3 \
  --set checkpoint.enable=true --set checkpoint.interval=2 "${qwen3_model[@]}"
check "export it in float32" timeout 60 "$bin" export \
  "$tmp/runs/qwen3_source/checkpoints/step_00000002" "$tmp/q32" --dtype float32
check "its config.json is Qwen3-MoE's, with the YaRN scaling in both forms" \
  bash -c 'grep -q "\"model_type\": \"qwen3_moe\"" "$0/config.json" \
    && grep -q "\"Qwen3MoeForCausalLM\"" "$0/config.json" \
    && grep -q "\"rope_scaling\"" "$0/config.json" && grep -q "\"rope_parameters\"" "$0/config.json" \
    && ! grep -q "lm_head.weight" "$0/model.safetensors.index.json"' "$tmp/q32"
check "--init-from the Qwen3-MoE export on 1 rank" run 1 qwen3_from_export \
  --set training.steps=1 --init-from "$tmp/q32" --dump-step "$tmp/dump_qwen3_export"
check "its first loss is the saving run's step 3 (1e-6)" \
  same_loss "$(loss_of qwen3_from_export 1)" "$(loss_of qwen3_source 3)" 1e-6
check "the reference reproduces that loss from the export's files" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/q32" "$tmp/dump_qwen3_export"

# Extending the context (docs/models.md#extending-the-context, scaled down): a Qwen3-MoE
# pretrained at 16 positions trained at 32 with YaRN factor 4 over its config.json's default RoPE;
# its step 1 is the reference's (transformers') in loss and every gradient; its export carries the
# scaling, and the reference reproduces a step from the export's own files.
check "make a Qwen3-MoE pretrained at 16 positions" "$py" "$here/hf_roundtrip.py" make \
  "$tmp/qwen3_short" --form 5 --dtype BF16 --files 1 --seed 11 --model-type qwen3_moe \
  --set max_position_embeddings=16
extend=(--init-from "$tmp/qwen3_short" --set training.batch_size=2 --set training.seq_len=32
        --set model.rope_type=yarn --set model.rope_factor=4
        --set model.rope_original_max_position_embeddings=16 --set model.max_position_embeddings=64)
check "train it at 32 positions with YaRN x4" run 1 qwen3_extend --set training.steps=2 \
  --set checkpoint.enable=true "${extend[@]}" --dump-step "$tmp/dump_extend"
check "its step 1 is the reference's loss and gradients" \
  "$py" "$here/check_step_dump.py" "$tmp/dump_extend"
check "export the extended model" timeout 60 "$bin" export \
  "$tmp/runs/qwen3_extend/checkpoints/step_00000002" "$tmp/qext" --dtype float32
check "the export's config.json has the new context and its YaRN scaling" \
  bash -c 'grep -q "\"max_position_embeddings\": 64" "$0/config.json" \
    && grep -q "\"rope_type\": \"yarn\"" "$0/config.json"' "$tmp/qext"
check "--init-from the export at 32 positions" run 1 qwen3_extended --set training.steps=1 \
  --set training.batch_size=2 --set training.seq_len=32 --init-from "$tmp/qext" \
  --dump-step "$tmp/dump_extended"
check "the reference reproduces its loss from the export's files" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/qext" "$tmp/dump_extended"

# gpt-oss: a Hub checkpoint (hf_roundtrip.py make: fused experts, sinks, sliding layers, biases,
# a clamp that binds; experts 32 wide, whole MXFP4 blocks) starts a run with exact weights and the reference's loss and gradients on 1
# rank and on 2 (Ep 2: each rank its experts' part of the fused tensors); its export as OpenAI
# released gpt-oss (--quantize mxfp4) starts a run from the MXFP4 experts, whose step the
# reference reproduces from the dump; a bf16 export's own files give the reference that run's loss.
check "make a gpt-oss checkpoint" "$py" "$here/hf_roundtrip.py" make "$tmp/oss" --form 5 \
  --dtype BF16 --files 2 --seed 5 --model-type gpt_oss --set intermediate_size=32
check "import gpt-oss on 1 rank" run 1 import_oss --set training.steps=1 \
  --init-from "$tmp/oss" --dump-step "$tmp/dump_oss"
check "import gpt-oss: exact weights, reference loss" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/oss" "$tmp/dump_oss"
check "its step is the reference's in every gradient (fused Hub names)" \
  "$py" "$here/check_step_dump.py" "$tmp/dump_oss"
check "import gpt-oss on 2 ranks (Ep 2)" run 2 import_oss_w2 --set training.steps=1 \
  --set parallelism.expert_parallel=2 --init-from "$tmp/oss" --dump-step "$tmp/dump_oss_w2"
check "on 2 ranks: exact weights, reference loss" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/oss" "$tmp/dump_oss_w2"
check "train and save gpt-oss" run 1 oss_source --set training.steps=3 \
  --set checkpoint.enable=true --set checkpoint.interval=2 --init-from "$tmp/oss"
oss_ckpt="$tmp/runs/oss_source/checkpoints/step_00000002"
check "export gpt-oss as released (--quantize mxfp4)" timeout 60 "$bin" export "$oss_ckpt" \
  "$tmp/oss_mxfp4" --quantize mxfp4
check "the export holds MXFP4 experts and OpenAI's quantization_config" \
  bash -c 'grep -q "\"quant_method\": \"mxfp4\"" "$0/config.json" \
    && grep -q "gate_up_proj_blocks" "$0/model.safetensors.index.json" \
    && grep -q "down_proj_scales" "$0/model.safetensors.index.json" \
    && ! grep -q "mlp.experts.gate_up_proj\"" "$0/model.safetensors.index.json"' "$tmp/oss_mxfp4"
check "--init-from the MXFP4 export" run 1 oss_from_mxfp4 --set training.steps=1 \
  --init-from "$tmp/oss_mxfp4" --dump-step "$tmp/dump_oss_mxfp4"
check "a step from the dequantised experts is the reference's" \
  "$py" "$here/check_step_dump.py" "$tmp/dump_oss_mxfp4"
check "export gpt-oss in float32" timeout 60 "$bin" export "$oss_ckpt" "$tmp/oss32" --dtype float32
check "--init-from the float32 export" run 1 oss_from_export --set training.steps=1 \
  --init-from "$tmp/oss32" --dump-step "$tmp/dump_oss_export"
check "its first loss is the saving run's step 3 (1e-6)" \
  same_loss "$(loss_of oss_from_export 1)" "$(loss_of oss_source 3)" 1e-6
check "the reference reproduces that loss from the export's files" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/oss32" "$tmp/dump_oss_export"

# DeepSeek-V3 as released: its config.json, FP8 projections in blocks of 9 (every edge block
# partial), non-zero correction biases and one multi-token-prediction layer. The import reads the
# dequantised weights and its step is the reference's; trained, saved and exported in bf16, the
# export carries the MTP tensors byte for byte and no quantization_config.
check "make a DeepSeek-V3 FP8 checkpoint with an MTP layer" "$py" "$here/hf_roundtrip.py" make \
  "$tmp/dsv3" --form 4 --dtype BF16 --files 2 --seed 7 --model-type deepseek_v3 --fp8 9 --mtp 1
check "import DeepSeek-V3 (FP8) on 1 rank" run 1 import_dsv3 --set training.steps=1 \
  --init-from "$tmp/dsv3" --dump-step "$tmp/dump_dsv3"
check "import DeepSeek-V3: dequantised weights, reference loss" \
  "$py" "$here/hf_roundtrip.py" check "$tmp/dsv3" "$tmp/dump_dsv3"
check "its step is the reference's in every gradient" \
  "$py" "$here/check_step_dump.py" "$tmp/dump_dsv3"
check "train and save DeepSeek-V3 (biases balanced)" run 1 dsv3_source --set training.steps=3 \
  --set checkpoint.enable=true --set checkpoint.interval=2 \
  --set model.router_bias_update_rate=0.001 --init-from "$tmp/dsv3"
check "export DeepSeek-V3 in bf16" timeout 60 "$bin" export \
  "$tmp/runs/dsv3_source/checkpoints/step_00000002" "$tmp/dsv3_out" --dtype bfloat16
check "the export's MTP tensors are the release's, byte for byte" \
  "$py" "$here/hf_roundtrip.py" mtp "$tmp/dsv3" "$tmp/dsv3_out"
check "the bf16 export has no quantization_config" \
  bash -c '! grep -q quantization_config "$0/config.json"' "$tmp/dsv3_out"

report test_hf_roundtrip
