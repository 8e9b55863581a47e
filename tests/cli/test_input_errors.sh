#!/usr/bin/env bash
# Bad input in the user's terms: each kind of damaged file, config or command-line value is run
# through the moepeak binary on one process, and
#   - it exits non-zero (1 for an error, 2 for CLI11's usage mistakes),
#   - stderr names the file (or the key, or the flag) and what is wrong,
#   - stderr shows no C++ source location (".cpp:") and no "[host rank r/W]" prefix;
# and at --log-level debug the location is there (where the error was raised).
# The inputs: a checkpoint shard with a flipped bit, a manifest with a damaged field, a truncated
# safetensors file and a config.json without a field (an exported model for --init-from), a token
# file with an id past the vocabulary, a Megatron index with a bad magic, a probe file with a
# wrong type, an hwloc XML that is not one, a tokenizer.json that is not JSON, a tuned.toml (from
# a real `moepeak tune`) with a damaged value, a config with an unknown key, a metrics file in a
# folder that does not exist, and bad --split, --max-shard-size and --dtype values.
# Run: ctest -R test_input_errors   (or: bash tests/cli/test_input_errors.sh build/moepeak .)
set -u
bin="$1"
src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
# shellcheck source=tests/metrics_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../metrics_checks.sh"  # py

# train NAME [ARGS...]: 2 steps of configs/tiny.toml as job NAME; output in $tmp/NAME.out/.err.
train() {
  local name="$1"; shift
  timeout -k 10 120 "$bin" train --config "$src/configs/tiny.toml" --set training.steps=2 \
    --set metrics.progress=off --set job.run_dir="$tmp/runs" --set job.name="$name" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
}
# one_line NAME: the error line alone (the last line of stderr), for the checks and the log.
one_line() { grep '^moepeak: error: ' "$tmp/$1.err" | tail -n 1; }
# user_error NAME RC WHAT PATTERN: the run NAME exited 1 and its error line names WHAT (a fixed
# string: the file, key or flag) and matches PATTERN (ERE: what is wrong), with no C++ location
# and no rank prefix.
user_error() {
  local name="$1" rc="$2" what="$3" pattern="$4"
  echo "  $name: $(one_line "$name")"
  check "$name: exits 1 (rc $rc)" test "$rc" -eq 1
  check "$name: the error names $what" contains "$tmp/$name.err" "$what"
  check "$name: the error says what is wrong" grep -qE -- "$pattern" "$tmp/$name.err"
  check "$name: no C++ source location" not_matches "$tmp/$name.err" '\.(cpp|h|cu):[0-9]'
  check "$name: no rank prefix on one rank" not_matches "$tmp/$name.err" '^moepeak: error: \['
}

# ---- Checkpoints ---------------------------------------------------------------------------
train ck --set checkpoint.enable=true --set checkpoint.interval=2; rc=$?
check "a checkpoint to damage: train exits 0 (rc $rc)" test $rc -eq 0
step=step_00000002
# damaged NAME: a copy of the run `ck` as job NAME, its checkpoint folder's path printed.
damaged() {
  cp -r "$tmp/runs/ck" "$tmp/runs/$1"
  echo "$tmp/runs/$1/checkpoints/$step"
}

# A flipped bit in a shard: the block's checksum fails.
dir=$(damaged flip)
"$py" - "$dir/shard-00000.bin" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[5000] ^= 0x10
open(path, "wb").write(data)
PY
train flip --set checkpoint.enable=true --resume; rc=$?
user_error flip $rc "$dir/shard-00000.bin" 'fail their checksum'
# The same at --log-level debug: the location is logged, the error line itself unchanged.
train flip --set checkpoint.enable=true --resume --log-level debug; rc=$?
check "flip at debug level: exits 1 (rc $rc)" test $rc -eq 1
check "flip at debug level: names where it was raised" \
  grep -qE 'raised at core/checkpoint/shard_io\.cpp:[0-9]+' "$tmp/flip.err"
check "flip at debug level: the error line has no location" \
  grep -qE "^moepeak: error: [^ ]*shard-00000\.bin: bytes" "$tmp/flip.err"

# A manifest field of the wrong type.
dir=$(damaged manifest)
sed -i 's/"block_bytes": [0-9]*/"block_bytes": "big"/' "$dir/manifest.json"
train manifest --set checkpoint.enable=true --resume; rc=$?
user_error manifest $rc "$dir/manifest.json" 'block_bytes.* must be an integer'

# ---- A Hugging Face model directory (the checkpoint exported) -------------------------------
timeout -k 10 120 "$bin" export "$tmp/runs/ck/checkpoints/$step" "$tmp/hf" \
  >"$tmp/export.out" 2>"$tmp/export.err"; rc=$?
check "export of the checkpoint exits 0 (rc $rc)" test $rc -eq 0
cp -r "$tmp/hf" "$tmp/hf_truncated"
weights=$(ls "$tmp/hf_truncated"/model-*.safetensors)
truncate -s "$(($(stat -c %s "$weights") - 1000))" "$weights"
train truncated --init-from "$tmp/hf_truncated"; rc=$?
user_error truncated $rc "$weights" 'out of range'

cp -r "$tmp/hf" "$tmp/hf_config"
"$py" - "$tmp/hf_config/config.json" <<'PY'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
del config["num_local_experts"]
json.dump(config, open(path, "w"), indent=2)
PY
train hf_config --init-from "$tmp/hf_config"; rc=$?
user_error hf_config $rc "$tmp/hf_config/config.json" '"num_local_experts" is missing'

# ---- Data files -----------------------------------------------------------------------------
"$py" - "$tmp" <<'PY'
import random, struct, sys
tmp = sys.argv[1]
rng = random.Random(0)
tokens = [rng.randrange(256) for _ in range(20000)]
tokens[7] = 60000  # past the tiny model's vocabulary of 256
raw = struct.pack("<%dH" % len(tokens), *tokens)
open(f"{tmp}/tokens.bin", "wb").write(raw)
open(f"{tmp}/mega.bin", "wb").write(raw)
open(f"{tmp}/mega.idx", "wb").write(b"NOTMAGIC" + bytes(40))
PY
train token --set training.dataset=bin --set training.dataset_path="$tmp/tokens.bin" \
  --set training.shuffle=false; rc=$?
user_error token $rc "$tmp/tokens.bin" 'token 60000 at offset 7 .*vocab_size'
train megatron --set training.dataset=megatron --set training.dataset_path="$tmp/mega"; rc=$?
user_error megatron $rc "$tmp/mega.idx" 'bad magic'

# ---- Machine descriptions: a probe file, an hwloc XML -----------------------------------------
printf '[probe]\nformat = 1\nhost = 3\n' >"$tmp/probe.toml"
train probe --set runtime.probe_file="$tmp/probe.toml"; rc=$?
user_error probe $rc "$tmp/probe.toml:3" 'must be a string'
printf '<topology><object type="Machine">\n' >"$tmp/topology.xml"
timeout -k 10 120 "$bin" probe --topology-xml "$tmp/topology.xml" --no-bench \
  --output "$tmp/p.toml" >"$tmp/hwloc.out" 2>"$tmp/hwloc.err"; rc=$?
user_error hwloc $rc "$tmp/topology.xml" 'not a valid hwloc XML'

# ---- A tokenizer for `data prepare` ---------------------------------------------------------
printf 'hello world\n' >"$tmp/input.txt"
printf '{"model": \n' >"$tmp/tokenizer.json"
timeout -k 10 120 "$bin" data prepare --tokenizer "$tmp/tokenizer.json" --input "$tmp/input.txt" \
  --output "$tmp/prepared" >"$tmp/tokenizer.out" 2>"$tmp/tokenizer.err"; rc=$?
user_error tokenizer $rc "$tmp/tokenizer.json" 'not a JSON tokenizer file'

# ---- tune's output read back ----------------------------------------------------------------
timeout -k 10 120 "$bin" tune --config "$src/configs/tiny.toml" --out "$tmp/tune" --only dispatch \
  --repeats 1 --warmup 0 --set metrics.progress=off >"$tmp/tune.out" 2>"$tmp/tune.err"; rc=$?
check "tune exits 0 (rc $rc)" test $rc -eq 0
check "tune wrote tuned.toml with chunk_tokens" grep -qE '^chunk_tokens = [0-9]+$' "$tmp/tune/tuned.toml"
sed 's/^chunk_tokens = [0-9]*$/chunk_tokens = "many"/' "$tmp/tune/tuned.toml" >"$tmp/tuned.toml"
line=$(grep -n '^chunk_tokens' "$tmp/tuned.toml" | cut -d: -f1)
train tuned --config "$tmp/tuned.toml"; rc=$?
user_error tuned $rc "$tmp/tuned.toml:$line" 'schedules.chunk_tokens: expected an integer'

# ---- Configs ----------------------------------------------------------------------------------
printf '[training]\nsteps = 2\nsetps = 3\n' >"$tmp/typo.toml"
train config --config "$tmp/typo.toml"; rc=$?
user_error config $rc "$tmp/typo.toml:3" "unknown key 'training.setps'"
train metrics_file --set metrics.file="$tmp/no-such-folder/metrics.jsonl"; rc=$?
user_error metrics_file $rc "$tmp/no-such-folder/metrics.jsonl" 'cannot open the metrics file'

# ---- Command-line values ----------------------------------------------------------------------
timeout -k 10 120 "$bin" data prepare --tokenizer "$tmp/tokenizer.json" --input "$tmp/input.txt" \
  --output "$tmp/prepared" --split 9x,1 >"$tmp/split.out" 2>"$tmp/split.err"; rc=$?
user_error split $rc "--split 9x,1" 'not a whole number'
timeout -k 10 120 "$bin" export "$tmp/runs/ck/checkpoints/$step" "$tmp/hf2" \
  --max-shard-size lots >"$tmp/shard_size.out" 2>"$tmp/shard_size.err"; rc=$?
user_error shard_size $rc "--max-shard-size lots" 'not a byte size'
# CLI11's own check: exit 2, its message names the flag.
timeout -k 10 120 "$bin" export "$tmp/runs/ck/checkpoints/$step" "$tmp/hf2" --dtype float8 \
  >"$tmp/dtype.out" 2>"$tmp/dtype.err"; rc=$?
check "--dtype float8: exits 2 (rc $rc)" test $rc -eq 2
check "--dtype float8: the message names the flag" grep -qE -- '--dtype: float8 not in' "$tmp/dtype.err"
check "--dtype float8: no C++ source location" not_matches "$tmp/dtype.err" '\.(cpp|h|cu):[0-9]'

report test_input_errors
