#!/usr/bin/env bash
# `moepeak probe` as a user meets it: the `#` tables, --json, the probe file (reading it back is
# test_probe_file's), the step-time rates at a config's shapes (-c/--set), a synthetic topology, and clear errors for a bad --topology-xml (exit 1,
# the file named, nothing on stdout, no probe file); `moepeak train` taking runtime.pinned_memory =
# "auto" from the probe file (and naming a missing one).
# Run: ctest -R test_probe_cli   (or: bash tests/topology/test_probe_cli.sh build/moepeak tests/topology/data)
set -u
bin="$1"
data="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval('d'+sys.argv[2]))" "$1" "$2"; }

# This machine, no bench: tables, probe file, JSON.
"$bin" probe --no-bench --ranks-per-node 2 --cpu -o "$tmp/probe.toml" --json "$tmp/probe.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe --no-bench exits 0" test $rc -eq 0
check "header line" grep -qE '^# moepeak probe: host ' "$tmp/out"
check "NUMA table" grep -qE '^# node package +memory +cores +pus +cpus' "$tmp/out"
check "budget table has two ranks" test "$(grep -cE '^ +[01] +- +[0-9]+ ' "$tmp/out")" -ge 2
check "no bench said so" contains "$tmp/out" "# Host link: not measured (--no-bench)"
check "no rates said so" contains "$tmp/out" "# Step-time rates: not measured (--no-bench)"
check "no [rates] without the bench" test -z "$(grep -F '[rates]' "$tmp/probe.toml")"
check "every non-table line is a # comment" test -z "$(grep -vE '^(#|  )' "$tmp/out")"
check "probe file written" grep -q '^\[\[rank\]\]' "$tmp/probe.toml"
check "probe file has format 1" grep -q '^format = 1$' "$tmp/probe.toml"
check "json has two ranks" test "$(json_get "$tmp/probe.json" '["budget"]["ranks_per_node"]')" = 2
check "json host budget matches file" test "$(json_get "$tmp/probe.json" '["rank"][1]["host_budget_bytes"]')" = \
  "$(grep -A5 'local_rank = 1' "$tmp/probe.toml" | sed -n 's/^host_budget_bytes = //p')"
check "no temporary files left" test "$(ls -A "$tmp" | grep -c tmp)" -eq 0

# This machine with a small bench: rates in the table and the file; the step-time rates at the
# shapes of the embedded default with --set, one rank's share of two.
"$bin" probe --bench-bytes 4MiB --iters 2 --cpu -n 2 --set training.seq_len=32 \
  --set training.batch_size=2 -o "$tmp/bench.toml" --json "$tmp/bench.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe with bench exits 0" test $rc -eq 0
check "memcpy pinned row" grep -qE '^  memcpy +pinned ' "$tmp/out"
check "memcpy pageable row" grep -qE '^  memcpy +pageable ' "$tmp/out"
check "pinning line" grep -qE '^# pinning 4.00 MiB on node' "$tmp/out"
check "bench rows in the file" grep -q '^\[\[bench.row\]\]' "$tmp/bench.toml"
check "rates header: cpu, f32, a rank of 2" \
  grep -qE '^# Step-time rates \(docs/plan.md#step-time\): cpu, f32, one rank of 2 on the node' "$tmp/out"
check "rates shapes name the --set" \
  grep -qE '^# shapes: hidden [0-9]+, seq 32 x batch 2 on W = 1 .*embedded default --set training.seq_len=32 --set training.batch_size=2$' "$tmp/out"
for key in gemm_flops grouped_gemm_flops attention_flops memory_bytes_per_s elementwise_bytes_per_s \
           loss_bytes_per_s host_link_bytes_per_s host_memory_bytes_per_s op_latency_s peak_flops; do
  check "rates table row $key" grep -qE "^  [a-z_]+ +[0-9]+\.[0-9]{3} [A-Za-z/]+ +$key\$" "$tmp/out"
done
check "every non-table line is a # comment (bench)" test -z "$(grep -vE '^(#|  )' "$tmp/out")"
check "[rates] in the file and the JSON, the same numbers" python3 - "$tmp/bench.toml" "$tmp/bench.json" <<'PY'
import json, sys, tomllib
t = tomllib.load(open(sys.argv[1], "rb"))["rates"]
j = json.load(open(sys.argv[2]))["rates"]
assert t == j, (t, j)
assert t["backend"] == "cpu" and t["dtype"] == "f32" and t["ranks_sharing"] == 2, t
assert t["device"].startswith("cpu ("), t["device"]
for k in ("gemm_flops", "grouped_gemm_flops", "attention_flops", "memory_bytes_per_s",
          "elementwise_bytes_per_s", "loss_bytes_per_s", "host_link_bytes_per_s", "host_memory_bytes_per_s", "peak_flops"):
    assert t[k] > 0, (k, t[k])
assert t["op_latency_s"] >= 0
PY
# `moepeak plan --time` prices with them as written (runtime.probe_file).
"$bin" plan --time --set training.seq_len=32 --set training.batch_size=2 \
  --set runtime.probe_file="$tmp/bench.toml" --json "$tmp/plan.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --time with the measured probe file exits 0 (rc $rc)" test $rc -eq 0
check "plan --time names the probe file" contains "$tmp/out" "# step time: this machine ($tmp/bench.toml) (cpu f32"
check "plan's rates are the probe file's" python3 - "$tmp/plan.json" "$tmp/bench.toml" <<'PY'
import json, sys, tomllib
r = json.load(open(sys.argv[1]))["time"]["rates"]
f = tomllib.load(open(sys.argv[2], "rb"))["rates"]
for k in ("gemm_flops", "grouped_gemm_flops", "attention_flops", "memory_bytes_per_s",
          "elementwise_bytes_per_s", "loss_bytes_per_s", "host_link_bytes_per_s", "host_memory_bytes_per_s", "op_latency_s", "peak_flops"):
    assert r[k] == f[k], (k, r[k], f[k])
assert r["ranks_per_node"] == 2, r
PY
"$bin" probe --no-bench -c "$tmp/missing-config.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe -c with a missing config is a usage error" test $rc -eq 2
"$bin" probe --bench-bytes 4MiB --iters 1 --cpu --set model.hidden_size=-3 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe with a bad --set exits 1 (rc $rc)" test $rc -eq 1
check "and names the key" contains "$tmp/err" "model.hidden_size"

# A synthetic 2 x 4 GPU topology: GPU ranks on their NUMA node, NICs on package 1.
"$bin" probe --topology-xml "$data/2pkg_4gpu.xml" --json "$tmp/x.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe --topology-xml exits 0" test $rc -eq 0
check "eight ranks by default" test "$(json_get "$tmp/x.json" '["budget"]["ranks_per_node"]')" = 8
check "rank 5 on node 1" test "$(json_get "$tmp/x.json" '["rank"][5]["numa_node"]')" = 1
check "mlx5 on node 1" grep -qE '^  nic +0000:9b:00.0 +0207 15b3:101b +1  mlx5_0,ib0' "$tmp/out"
check "GPU rows" test "$(grep -cE '^  gpu  ' "$tmp/out")" -eq 8
check "no rates from an XML topology" contains "$tmp/out" "# Step-time rates: not measured (--topology-xml)"
check "no rates in its JSON" python3 -c "import json,sys; assert 'rates' not in json.load(open(sys.argv[1]))" "$tmp/x.json"
"$bin" probe --topology-xml "$data/2pkg_4gpu.xml" --ranks-per-node 9 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "more ranks than GPUs exits 1" test $rc -eq 1
check "and says how many GPUs" contains "$tmp/err" "8 GPUs"

# Bad input: exit 1, the file named, nothing on stdout, no probe file.
for bad in "$data/garbage.xml" "$tmp/missing.xml"; do
  "$bin" probe --topology-xml "$bad" -o "$tmp/never.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
  check "bad topology $bad exits 1" test $rc -eq 1
  check "error names $bad" contains "$tmp/err" "$bad"
  check "nothing on stdout for $bad" test ! -s "$tmp/out"
  check "no probe file for $bad" test ! -e "$tmp/never.toml"
done
"$bin" probe --no-bench --bench-bytes 1MiB >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--no-bench with --bench-bytes is a usage error" test $rc -eq 2
"$bin" probe --bench-bytes lots >"$tmp/out" 2>"$tmp/err"; rc=$?
check "bad --bench-bytes exits 1" test $rc -eq 1
check "bad --bench-bytes is named" contains "$tmp/err" "--bench-bytes"

# `moepeak train` with runtime.pinned_memory = "auto" takes its pinned budget from the probe file.
"$bin" probe --no-bench --ranks-per-node 1 --cpu -o "$tmp/one.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe for one rank exits 0" test $rc -eq 0
budget=$(sed -n 's/^host_budget_bytes = //p' "$tmp/one.toml" | head -1)
want=$(python3 -c "import sys; print('%.2f GiB' % (int(sys.argv[1]) / 2**30))" "$budget")
train_with_probe() {
  "$bin" train --set training.steps=1 --set metrics.progress=off --set job.run_dir="$tmp/runs" \
    --set runtime.pinned_memory=auto --set runtime.probe_file="$1" >"$tmp/train.out" 2>"$tmp/train.err"
}
train_with_probe "$tmp/one.toml"; rc=$?
check "train with the probe file exits 0 (rc $rc)" test $rc -eq 0
check "train's pinned budget is the probe file's ($want)" grep -qF "pinned budget $want" "$tmp/train.out" "$tmp/train.err"
train_with_probe "$tmp/missing-probe.toml"; rc=$?
check "train with a missing probe file fails (rc $rc)" test $rc -eq 1
check "the error names the probe file" grep -qF "missing-probe.toml" "$tmp/train.err"

report test_probe_cli
