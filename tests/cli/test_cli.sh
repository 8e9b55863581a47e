#!/usr/bin/env bash
# The moepeak binary as a user meets it: exit codes, --version, config show round trip, and
# clear errors (file, line, key; non-zero exit; nothing on stdout) for bad input.
# Run: ctest -R test_cli   (or: bash tests/cli/test_cli.sh build/moepeak)
set -u
bin="$1"
tmp=$(mktemp -d)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report

# --version: exit 0, version line, CUDA line, runtime libraries.
"$bin" --version >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--version exits 0" test $rc -eq 0
check "--version names the version" grep -qE '^moepeak [0-9]+\.[0-9]+\.[0-9]+ \(git ' "$tmp/out"
check "--version says whether CUDA is compiled in" grep -qE '^CUDA backend: (compiled in|not compiled in)' "$tmp/out"
check "--version lists MPI" contains "$tmp/out" "MPI"
check "--version lists OpenBLAS" contains "$tmp/out" "OpenBLAS"

# No subcommand, unknown flag, bad log level: usage errors exit 2.
"$bin" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "no subcommand exits 2" test $rc -eq 2
"$bin" config show --no-such-flag >"$tmp/out" 2>"$tmp/err"; rc=$?
check "unknown flag exits 2" test $rc -eq 2
"$bin" --log-level loud config show >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bad --log-level exits 2" test $rc -eq 2

"$bin" config show --log-level warn >"$tmp/out" 2>"$tmp/err"; rc=$?
check "global options also work after the subcommand" test $rc -eq 0

# config show: the embedded default, as TOML that reads back to the same config.
"$bin" config show >"$tmp/a.toml" 2>"$tmp/err"; rc=$?
check "config show exits 0" test $rc -eq 0
check "config show prints [model]" contains "$tmp/a.toml" "[model]"
"$bin" config show -c "$tmp/a.toml" >"$tmp/b.toml" 2>"$tmp/err"; rc=$?
check "config show reads its own output" test $rc -eq 0
check "config show round trip is stable" cmp -s "$tmp/a.toml" "$tmp/b.toml"

# Layering: a second file and --set override, and --origins says where each came from.
printf '[training]\nseq_len = 64\n' >"$tmp/override.toml"
"$bin" config show -c "$tmp/a.toml" -c "$tmp/override.toml" --set training.steps=7 --origins \
  >"$tmp/c.toml" 2>"$tmp/err"; rc=$?
check "layered config exits 0" test $rc -eq 0
check "second file overrides" grep -qE '^seq_len = 64 .*override.toml:2' "$tmp/c.toml"
check "--set overrides" grep -qE '^steps = 7 .*--set' "$tmp/c.toml"

# Bad input: clear error naming file, line and key; exit 1; nothing on stdout.
printf '[model]\nhidden_size = 64\nhiden_size = 32\n' >"$tmp/typo.toml"
"$bin" config show -c "$tmp/typo.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "unknown key exits 1" test $rc -eq 1
check "unknown key names file:line" contains "$tmp/err" "typo.toml:3"
check "unknown key names the key" contains "$tmp/err" "model.hiden_size"
check "nothing on stdout after an error" test ! -s "$tmp/out"
# An input error speaks the user's terms: no C++ source location, no host/rank on one process.
check "unknown key: the message starts with the file" grep -qE "^moepeak: error: [^ ]*typo.toml:3: " "$tmp/err"
check "unknown key: no C++ location" not_matches "$tmp/err" '[a-z_]+\.(cpp|h|cu):[0-9]+'
"$bin" config show --log-level debug -c "$tmp/typo.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "unknown key at debug level exits 1" test $rc -eq 1
check "debug level names where it was raised" grep -qE 'raised at core/config/config\.cpp:[0-9]+' "$tmp/out" "$tmp/err"
"$bin" config show --set training.steps=0 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "out-of-range --set exits 1" test $rc -eq 1
check "out-of-range --set names the key" contains "$tmp/err" "training.steps"
"$bin" config show -c "$tmp/does-not-exist.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "missing config file is an error" test $rc -ne 0

# train: a few steps of the embedded default into a temporary run directory.
"$bin" train --set job.run_dir="$tmp/runs" --set training.steps=3 --set metrics.progress=off \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train exits 0" test $rc -eq 0
check "train writes one metrics line per step" test "$(wc -l <"$tmp/runs/moepeak/metrics.jsonl")" -eq 3
check "train prints the live-set table" grep -qE '^  dispatch ' "$tmp/out"
"$bin" train --set job.run_dir="$tmp/bad-runs" --set training.dataset=bin \
  --set training.dataset_path="$tmp/missing.bin" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train with a missing dataset exits 1" test $rc -eq 1
check "the error names the dataset file" contains "$tmp/err" "missing.bin"
check "a missing dataset: no C++ location" not_matches "$tmp/err" '[a-z_]+\.(cpp|h|cu):[0-9]+'
check "a failed start leaves no run directory" test ! -e "$tmp/bad-runs"

# train's dtype: bf16 trains on the CPU too (bf16 storage, fp32 math); the serial offload
# cannot update bf16 weights (refused before any work), and without a GPU the backend says so;
# neither of those leaves a run folder behind.
"$bin" train --set job.run_dir="$tmp/bf16-runs" --set runtime.backend=cpu \
  --set training.dtype=bfloat16 --set training.steps=3 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train in bfloat16 on the CPU exits 0 (rc $rc)" test $rc -eq 0
check "it trains 3 steps with finite losses" \
  python3 -c "import json,math,sys; r=[json.loads(l) for l in open('$tmp/bf16-runs/moepeak/metrics.jsonl') if '\"loss\"' in l]; sys.exit(not (len(r)==3 and all(math.isfinite(x['loss']) for x in r)))"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  for dtype in auto float32; do
    "$bin" train --set job.run_dir="$tmp/cuda-runs" --set runtime.backend=cuda \
      --set training.dtype=$dtype >"$tmp/out" 2>"$tmp/err"; rc=$?
    check "train on cuda ($dtype) without a GPU exits 1" test $rc -eq 1
    # (a build without the CUDA backend says that instead)
    check "it says no CUDA device is usable ($dtype)" \
      grep -qE "no CUDA device is usable|built without the CUDA backend" "$tmp/err"
  done
fi
check "no run folder was left behind" test ! -e "$tmp/cuda-runs"

# bench step: the table and the JSON object of docs/design.md#machine-readable-outputs.
"$bin" bench step --warmup 0 --iters 1 --gemm-size 128 --json "$tmp/bench.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench step exits 0" test $rc -eq 0
check "bench step prints a #-commented header" grep -q '^# moepeak bench step' "$tmp/out"
check "bench step JSON names the bench" grep -q '"bench": "step"' "$tmp/bench.json"
check "bench step JSON has tokens_per_s" grep -q '"tokens_per_s"' "$tmp/bench.json"
check "bench step JSON has step_s (what plan --time predicts)" grep -q '"step_s"' "$tmp/bench.json"
check "bench step JSON has the shape's seq_len" grep -q '"seq_len": 128' "$tmp/bench.json"

# bench gemm: every GEMM of a step, forward and backward, with its share of the ceiling.
"$bin" bench gemm --set runtime.backend=cpu --warmup 0 --iters 1 --ceiling-size 128 \
  --json "$tmp/gemm.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench gemm exits 0" test $rc -eq 0
check "bench gemm prints the ceiling" grep -q '^# ceiling: 128^3 GEMM' "$tmp/out"
check "bench gemm times the expert GEMMs both ways" \
  sh -c "grep -q 'expert_w2 .* forward' '$tmp/out' && grep -q 'expert_w2 .* backward' '$tmp/out'"
check "bench gemm times all experts as one grouped GEMM" \
  sh -c "grep -q 'experts_w1_w3 .* forward' '$tmp/out' && grep -q 'experts_w2 .* backward' '$tmp/out'"
check "bench gemm JSON has 18 rows with their share of the ceiling, the grouped ones over E experts" \
  python3 -c "import json,sys; d=json.load(open('$tmp/gemm.json')); r=d['rows']; sys.exit(not (d['bench']=='gemm' and len(r)==18 and all(x['percent_of_ceiling']>0 for x in r) and sum(x['groups']>1 for x in r)==4))"
"$bin" bench gemm --set runtime.backend=cpu --dtype bf16 --tokens 64 --ceiling-size 128 --warmup 0 --iters 1 \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench gemm --dtype bf16 runs on the CPU (rc $rc)" test $rc -eq 0

# bench attention: a layer's attention, forward and backward, the kernels named, against the
# ceiling; the FLOPs count the causal half (forward 4 B nh d T(T+1)/2, backward 2.5x).
"$bin" bench attention --set runtime.backend=cpu --batch 2 --seq 40 --warmup 0 --iters 1 \
  --ceiling-size 128 --json "$tmp/attention.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention exits 0" test $rc -eq 0
check "bench attention names the kernels" grep -q '^# kernels: cpu: OpenBLAS blocks' "$tmp/out"
check "bench attention times forward and backward" \
  sh -c "grep -q '^  forward ' '$tmp/out' && grep -q '^  backward ' '$tmp/out'"
check "bench attention JSON: 2 rows, the causal FLOPs of B 2, T 40 and the embedded model's heads" \
  python3 -c "import json,sys; d=json.load(open('$tmp/attention.json')); s=d['shape']; r=d['rows']; f=4*s['head_dim']*2*s['heads']*40*41/2/1e9; sys.exit(not (d['bench']=='attention' and s['batch']==2 and s['seq']==40 and len(r)==2 and abs(r[0]['gflop']-f)<1e-12 and abs(r[1]['gflop']-2.5*f)<1e-12 and all(x['percent_of_ceiling']>0 for x in r)))"
"$bin" bench attention --set runtime.backend=cpu --dtype bf16 --batch 2 --seq 40 --warmup 0 \
  --iters 1 --ceiling-size 128 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --dtype bf16 runs on the CPU (rc $rc)" test $rc -eq 0
# bench attention --window W --sinks: the variant timed beside full causal attention; its FLOPs
# count each query's keys in its window, 4 B nh d (W(W+1)/2 + (T-W) W), backward 2.5x.
"$bin" bench attention --set runtime.backend=cpu --batch 2 --seq 40 --window 8 --sinks --warmup 0 \
  --iters 1 --ceiling-size 128 --json "$tmp/attention_variant.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --window 8 --sinks exits 0 (rc $rc)" test $rc -eq 0
check "bench attention --window --sinks times causal and the variant, and compares them" \
  sh -c "grep -q '^  causal  *forward ' '$tmp/out' && grep -q '^  window 8 + sinks  *backward ' '$tmp/out' && grep -q '^# window 8 + sinks: forward + backward .* of causal' '$tmp/out'"
check "bench attention --window JSON: 4 rows, causal's FLOPs and the window's" \
  python3 -c "import json,sys; d=json.load(open('$tmp/attention_variant.json')); s=d['shape']; r=d['rows']; u=4*s['head_dim']*2*s['heads']/1e9; c=u*40*41/2; w=u*(8*9/2+32*8); sys.exit(not (s['window']==8 and s['sinks'] is True and len(r)==4 and [x['variant'] for x in r]==['causal','causal','window 8 + sinks','window 8 + sinks'] and abs(r[0]['gflop']-c)<1e-12 and abs(r[1]['gflop']-2.5*c)<1e-12 and abs(r[2]['gflop']-w)<1e-12 and abs(r[3]['gflop']-2.5*w)<1e-12))"
"$bin" bench attention --set runtime.backend=cpu --dtype bf16 --batch 2 --seq 40 --sinks --warmup 0 \
  --iters 1 --ceiling-size 128 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --dtype bf16 --sinks runs on the CPU (rc $rc)" test $rc -eq 0
# bench attention --documents L: packed documents of mean length L (a query sees its document's
# keys) beside full causal; a document of at least T (L >= 2T: lengths from [L - L/2, L + L/2])
# is the whole sequence, so its FLOPs are causal's; short ones count fewer.
"$bin" bench attention --set runtime.backend=cpu --batch 2 --seq 40 --documents 8 --warmup 0 \
  --iters 1 --ceiling-size 128 --json "$tmp/attention_docs.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --documents 8 exits 0 (rc $rc)" test $rc -eq 0
check "bench attention --documents times causal and the documents, and compares them" \
  sh -c "grep -q '^# documents: [0-9]* in 2 sequences, lengths uniform in \[4, 12\]' '$tmp/out' && grep -q '^  documents 8  *backward ' '$tmp/out' && grep -q '^# documents 8: forward + backward .* of causal' '$tmp/out'"
check "bench attention --documents JSON: 4 rows, the documents' FLOPs below causal's" \
  python3 -c "import json,sys; d=json.load(open('$tmp/attention_docs.json')); s=d['shape']; r=d['rows']; sys.exit(not (s['documents']==8 and len(r)==4 and r[2]['variant']=='documents 8' and 0<r[2]['gflop']<r[0]['gflop']/2 and abs(r[3]['gflop']-2.5*r[2]['gflop'])<1e-12))"
"$bin" bench attention --set runtime.backend=cpu --batch 2 --seq 40 --documents 80 --warmup 0 \
  --iters 1 --ceiling-size 128 --json "$tmp/attention_doc.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --documents 80 at T 40: one document per sequence, causal's FLOPs (rc $rc)" \
  python3 -c "import json,sys; r=json.load(open('$tmp/attention_doc.json'))['rows']; sys.exit(not (len(r)==4 and abs(r[2]['gflop']-r[0]['gflop'])<1e-12 and abs(r[3]['gflop']-r[1]['gflop'])<1e-12))"
"$bin" bench attention --set runtime.backend=cpu --dtype bf16 --batch 2 --seq 40 --documents 8 \
  --window 6 --sinks --warmup 0 --iters 1 --ceiling-size 128 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --dtype bf16 --documents --window --sinks runs on the CPU (rc $rc)" \
  sh -c "test $rc -eq 0 && grep -q '^  documents 8 + window 6 + sinks  *forward ' '$tmp/out'"
# bench attention --v-head-dim DV: v and out get a head dim of their own (MLA); Q K^T, dQ, dK run
# over the model's head_dim, P V, dP, dV over DV: forward 2 (d + DV), backward 2 (3 d + 2 DV) per
# visible pair.
"$bin" bench attention --set runtime.backend=cpu --batch 2 --seq 40 --v-head-dim 24 --warmup 0 \
  --iters 1 --ceiling-size 128 --json "$tmp/attention_dv.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench attention --v-head-dim 24 exits 0 (rc $rc)" test $rc -eq 0
check "bench attention --v-head-dim names both head dims" grep -q 'dqk [0-9]*, dv 24, dtype' "$tmp/out"
check "bench attention --v-head-dim JSON: dv 24 and the FLOPs of both head dims" \
  python3 -c "import json,sys; d=json.load(open('$tmp/attention_dv.json')); s=d['shape']; r=d['rows']; p=2*s['heads']*40*41/2; h=s['head_dim']; sys.exit(not (s['v_head_dim']==24 and len(r)==2 and abs(r[0]['gflop']-2*(h+24)*p/1e9)<1e-12 and abs(r[1]['gflop']-2*(3*h+48)*p/1e9)<1e-12))"
"$bin" bench vocab --set runtime.backend=cpu --dtype bf16 --tokens 8 --hidden 8 --vocab 16 \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench vocab --dtype bf16 runs on the CPU (rc $rc)" test $rc -eq 0
"$bin" bench dispatch --set runtime.backend=cpu --dtype bf16 --tokens 16 --hidden 8 --ffn 8 \
  --experts 4 --top-k 2 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench dispatch --dtype bf16 runs on the CPU (rc $rc)" test $rc -eq 0

# bench data: a generated token file (both formats) opened, first batch, one full pass; the file
# is removed afterwards.
for fmt in bin megatron; do
  "$bin" bench data --bytes 1MB --iters 2 --format $fmt --dir "$tmp/bench-data" \
    --json "$tmp/data-$fmt.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
  check "bench data --format $fmt exits 0 (rc $rc)" test $rc -eq 0
  check "bench data --format $fmt: create, open, first_batch, full_pass rows of 1MB" \
    python3 -c "import json,sys; d=json.load(open('$tmp/data-$fmt.json')); r=[x['schedule'] for x in d['rows']]; sys.exit(not (r==['create','open','first_batch','full_pass'] and d['shape']['bytes']==1000000 and all(x['time_s']>=0 for x in d['rows'])))"
  check "bench data --format $fmt removes its file" test ! -e "$tmp/bench-data/bench-tokens.bin"
done
"$bin" bench data --bytes 1KB >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench data --bytes 1KB is refused (rc $rc)" sh -c "test $rc -ne 0 && grep -q 'at least 4KB' '$tmp/err'"

# bench adamw and bench sco on the configured backend (here the CPU): every row exact, no GPU
# target stated, the JSON names the backend.
"$bin" bench adamw --set runtime.backend=cpu --params 4096 --buckets 512 --slots 2 --warmup 0 \
  --iters 1 --json "$tmp/adamw.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench adamw exits 0" test $rc -eq 0
check "bench adamw: every row bitwise resident" \
  contains "$tmp/out" "every row bitwise resident and its staging peak equal to its bound: yes"
check "bench adamw states no target on the CPU" contains "$tmp/out" "target: none on the CPU backend"
check "bench adamw JSON names the backend and has no target" \
  python3 -c "import json,sys; s=json.load(open('$tmp/adamw.json'))['shape']; sys.exit(not (s['backend']=='cpu' and 'target' not in s))"
# bf16 working weights (fp32 gradients and master): the serial offload's host AdamW rounds to
# bf16 and copies half the bytes up; every row still bitwise resident's, the host bytes the
# planner's (the serial row adds the pinned bf16 weight copy: 4096 + padding elements x 2 B in
# one 2 MiB pinned block).
"$bin" bench adamw --set runtime.backend=cpu --params 4096 --buckets 512 --slots 2 --warmup 0 \
  --iters 2 --dtype bf16 --json "$tmp/adamw-bf16.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench adamw --dtype bf16 exits 0" test $rc -eq 0
check "bench adamw --dtype bf16: every row bitwise resident" \
  contains "$tmp/out" "every row bitwise resident and its staging peak equal to its bound: yes"
check "bench adamw --dtype bf16 says what it holds" contains "$tmp/out" "bf16 working weights, fp32 gradients"
check "bench adamw --dtype bf16 JSON: the serial offload's host bytes hold the bf16 copy" \
  python3 -c "import json,sys; d=json.load(open('$tmp/adamw-bf16.json')); r={x['schedule']:x for x in d['rows']}; sys.exit(not (d['shape']['dtype']=='bf16' and r['offload_serial']['host_bytes']==5*2**21 and r['offload_stream']['host_bytes']==3*2**21 and all(x['max_rel_err']==0 for x in d['rows'])))"
"$bin" bench adamw --dtype f16 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench adamw --dtype f16 is refused (rc $rc)" sh -c "test $rc -ne 0 && grep -q 'dtype' '$tmp/err'"
"$bin" bench sco -c "$root/configs/tiny.toml" --set runtime.backend=cpu --warmup 0 --iters 1 \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench sco exits 0" test $rc -eq 0
check "bench sco: four rows bitwise equal to standard" \
  test "$(grep -c 'bitwise equal$' "$tmp/out")" -eq 4

# bench checkpoint: the three modes, the last sync and async saves byte-identical, its
# checkpoints removed afterwards (--keep keeps them).
"$bin" bench checkpoint --set runtime.backend=cpu --set job.run_dir="$tmp/bench-runs" \
  --warmup 0 --iters 2 --json "$tmp/ckpt.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench checkpoint exits 0" test $rc -eq 0
check "bench checkpoint: sync and async wrote the same bytes" \
  contains "$tmp/out" "1 shard file(s), byte-identical"
check "bench checkpoint JSON: none, sync, async; a save's bytes" \
  python3 -c "import json,sys; r=json.load(open('$tmp/ckpt.json'))['rows']; sys.exit(not ([x['schedule'] for x in r]==['none','sync','async'] and r[1]['bytes_per_save']==r[2]['bytes_per_save']>0))"
check "bench checkpoint removes its checkpoints" \
  test ! -e "$tmp/bench-runs/bench-checkpoint-sync"
"$bin" bench checkpoint --set runtime.backend=cpu --set job.run_dir="$tmp/bench-runs" \
  --warmup 0 --iters 1 --every 2 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bench checkpoint: --iters below --every is refused (rc $rc)" test $rc -ne 0
check "it says why" contains "$tmp/err" "--iters must be at least --every"

report
