#!/usr/bin/env bash
# `moepeak plan` and the launch check of `moepeak train` as a user meets them: the table (one row
# per live set, total, host, verdict), --json fields, --max-context, --svg, a bad config's error, and
# `moepeak train` refusing with exit 2 and the plan table when the plan does not fit (starting
# with --force). Run: ctest -R test_plan_cli   (or: bash tests/plan/test_plan_cli.sh build/moepeak)
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
small=(--set training.batch_size=2 --set training.seq_len=32 --set training.steps=1
       --set metrics.progress=off --set job.run_dir="$tmp/runs")

# The table of the embedded default: every live set, the total, host, a FITS verdict, exit 0.
"$bin" plan >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan exits 0 when it fits" test $rc -eq 0
for s in weights grads optimizer attention dispatch logits boundaries workspace; do
  check "plan table has a $s row" grep -qE "^  $s " "$tmp/out"
done
check "plan table has a total row" grep -qE '^  total ' "$tmp/out"
check "plan table has a host total row" grep -qE '^  host total ' "$tmp/out"
check "plan names the byte functions" contains "$tmp/out" "dispatch_standard_bytes("
check "plan says the total is the largest phase" contains "$tmp/out" "the step's largest phase"
check "plan table has a row per phase" \
  sh -c "grep -qE '^  forward_attention +[0-9]' '$tmp/out' && grep -qE '^  optimizer +[0-9]' '$tmp/out'"
check "plan marks the peak phase" grep -qE '<- peak$' "$tmp/out"
check "plan verdict FITS" grep -qE '^# verdict: FITS' "$tmp/out"
check "comment lines start with #" sh -c "! grep -vE '^(#|  )' '$tmp/out'"

# --json: docs/design.md#machine-readable-outputs fields; bounded schedules and SCO's host term; -n 2.
"$bin" plan -n 2 --set schedules.checkpoint=sco --set schedules.vocab=ring_dtp \
  --set optimizer.placement=offload_stream --json "$tmp/plan.json" --max-context \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --json exits 0" test $rc -eq 0
check "plan --json parses and has the fields" python3 - "$tmp/plan.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
sets = {"weights", "grads", "optimizer", "attention", "dispatch", "logits", "boundaries", "workspace"}
assert set(j["live_sets"]) == sets, j["live_sets"]
assert j["sum_of_terms_bytes"] == sum(j["live_sets"].values())
phases = j["phase_bytes"]
assert set(phases) == {"embedding", "forward_attention", "forward_experts", "head", "backward_experts",
                       "backward_attention", "optimizer"}, phases.keys()
for name, ph in phases.items():
    assert ph["total"] == sum(ph[s] for s in sets), name
    assert all(ph[s] <= j["live_sets"][s] for s in sets), name  # a set's term is its peak
peak = phases[j["peak_phase"]]["total"]
assert peak == max(ph["total"] for ph in phases.values())
assert j["total_bytes"] == peak + j["fragmentation_bytes"] <= j["sum_of_terms_bytes"]
assert j["world_size"] == 2 and j["fits"] is True
for k in ("capacity_bytes", "host_bytes", "host_budget_bytes", "functions", "overflow", "verdict"):
    assert k in j, k
assert "sco_boundaries" in j["host_terms"] and "optimizer_state" in j["host_terms"]
assert j["host_bytes"] == sum(j["host_terms"].values())
assert j["functions"]["logits"].startswith("ring_dtp_bytes(")
assert j["max_context"]["configured"] >= j["max_context"]["standard"] > 0
PY
check "plan --max-context prints both" contains "$tmp/out" "all standard"

# --svg: a well-formed picture, one live-set group per panel, the capacity line; a bad range exits 1.
"$bin" plan -n 2 --svg "$tmp/plan.svg" --svg-range 64:4096 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --svg exits 0" test $rc -eq 0
check "plan --svg writes well-formed SVG" python3 - "$tmp/plan.svg" <<'PY'
import sys, xml.dom.minidom as m
d = m.parse(sys.argv[1]); assert d.documentElement.tagName == "svg"
sets = [g.getAttribute("data-set") for g in d.getElementsByTagName("g") if g.getAttribute("class") == "set"]
assert sorted(set(sets)) == sorted(["weights", "grads", "optimizer", "attention", "dispatch", "logits", "boundaries", "workspace"]), sets
assert len(sets) == 16 and all(len(g.getElementsByTagName("rect")) == 7 for g in d.getElementsByTagName("g") if g.getAttribute("class") == "set")
assert len([l for l in d.getElementsByTagName("line") if l.getAttribute("class") == "capacity"]) == 2
PY
"$bin" plan --svg "$tmp/bad.svg" --svg-range 9:x >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --svg-range bad exits 1" test $rc -eq 1
check "plan --svg-range error names it" contains "$tmp/err" "--svg-range"

# Does not fit: exit 3, the verdict names the term and the amount.
"$bin" plan --set runtime.device_memory=1MiB >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan exits 3 when it does not fit" test $rc -eq 3
check "plan verdict DOES NOT FIT" grep -qE '^# verdict: DOES NOT FIT: device total .* > capacity 1.00 MiB by ' "$tmp/out"

# Bad configs: a clear error, exit 1, nothing on stdout.
"$bin" plan -n 3 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan on an impossible layout exits 1" test $rc -eq 1
check "plan layout error names W" contains "$tmp/err" "W = 3"
check "nothing on stdout after a plan error" test ! -s "$tmp/out"
"$bin" plan --set model.hiden_size=3 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan with an unknown key exits 1" test $rc -eq 1
check "plan unknown key is named" contains "$tmp/err" "model.hiden_size"
"$bin" plan -n 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan -n 0 is a usage error" test $rc -eq 2

# moepeak train refuses a run that does not fit: exit 2, the table, no run started.
"$bin" train "${small[@]}" --set runtime.device_memory=1MiB >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train refuses with exit 2" test $rc -eq 2
check "train prints the plan table" grep -qE '^# verdict: DOES NOT FIT' "$tmp/out"
check "train says why it did not start" contains "$tmp/err" "--force"
check "train did not run a step" test ! -e "$tmp/runs/moepeak/metrics.jsonl"
# --force starts it (and the 1 MiB arena then runs out of memory for real: exit 1, an OOM).
"$bin" train "${small[@]}" --set runtime.device_memory=1MiB --force >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train --force starts (and the arena is really too small)" test $rc -eq 1
check "train --force reached the allocation" contains "$tmp/err" "out of device memory"
# A run that fits starts normally.
"$bin" train "${small[@]}" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train that fits exits 0" test $rc -eq 0
check "train that fits wrote metrics" test -s "$tmp/runs/moepeak/metrics.jsonl"

# --search-layout on 8 ranks of the embedded default (4 experts, 4 heads), a global batch of 2:
# the layouts that can exist as rows, those that cannot folded into one line per reason with a
# count (the global batch over W/Sp = 8 or 4 groups, 4 heads over Sp = 8), the best named last as
# --set lines, --json with every row (a `defect` and `why` where it cannot exist); --all lists
# each as a row; a bad degree in a plain plan is named.
"$bin" plan -n 8 --set training.batch_size=2 --search-layout --max-context --json "$tmp/layouts.json" \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --search-layout exits 0" test $rc -eq 0
check "search-layout prints the column header" grep -qE '^#   Ep   Sp   Ds  batch  accum  verdict' "$tmp/out"
check "search-layout marks the best row" grep -qE '^\*' "$tmp/out"
check "search-layout names the best as --set lines, last" sh -c "tail -n 1 '$tmp/out' | grep -qE '^# best layout: --set parallelism.expert_parallel=[0-9]+ --set parallelism.sequence_parallel=[0-9]+ --set parallelism.data_shard=[0-9]+'"
check "search-layout lists no layout that cannot exist as a row" sh -c "! grep -q invalid '$tmp/out'"
check "search-layout folds the batch that does not split into one line" grep -qE '^# 24 layouts cannot exist: the global batch does not split over the W/Sp sequence groups \(e.g. Ep=1 Sp=1 Ds=1: the global batch 2 does not split over W/Sp = 8 sequence groups\)$' "$tmp/out"
check "search-layout folds Sp = 8 over 4 heads into one line" grep -qE '^# 12 layouts cannot exist: the query heads do not split over Sp \(e.g. Ep=1 Sp=8 Ds=1: .*4 query heads cannot be split over 8 ranks' "$tmp/out"
check "search-layout says --all lists them" contains "$tmp/out" "# (--all lists each layout that cannot exist)"
check "search-layout --json has every layout, why some cannot exist, and the best" python3 - "$tmp/layouts.json" "$tmp/out" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
rows = j["layouts"]
# Ep in {1, 2, 4} (4 experts), Sp and Ds in {1, 2, 4, 8}.
assert len(rows) == 3 * 4 * 4, len(rows)
b = j["best"]
best = [r for r in rows if r["valid"] and r["expert_parallel"] == b["expert_parallel"]
        and r["sequence_parallel"] == b["sequence_parallel"] and r["data_shard"] == b["data_shard"]]
assert len(best) == 1 and best[0]["fits"], best
assert all(r["max_context"] <= best[0]["max_context"] for r in rows if r["valid"])
assert set(best[0]["bytes_per_step"]) == {"total", "zero_dense", "dense_replicas", "zero_experts",
                                          "ulysses", "dispatch", "vocab"}
# Sp 1 and 2 leave 8 and 4 groups for 2 sequences; Sp 8 cannot split 4 heads.
for r in rows:
    sp = r["sequence_parallel"]
    want = "batch" if sp < 4 else "query_heads" if sp == 8 else None
    assert r["valid"] == (want is None), r
    assert r.get("defect") == want and (want is None) == ("why" not in r), r
# The table: a row per valid layout, a folded line per reason whose count is the JSON's.
out = open(sys.argv[2]).read()
table = [l for l in out.splitlines() if re.match(r"^[ *] +\d+ +\d+ +\d+ ", l)]
assert len(table) == sum(r["valid"] for r in rows), len(table)
folded = [int(n) for n in re.findall(r"^# (\d+) layouts? cannot exist", out, re.M)]
assert folded == [sum(r.get("defect") == "batch" for r in rows),
                  sum(r.get("defect") == "query_heads" for r in rows)], folded
PY
"$bin" plan -n 8 --set training.batch_size=2 --search-layout --max-context --all \
  >"$tmp/all" 2>"$tmp/err"; rc=$?
check "plan --search-layout --all exits 0" test $rc -eq 0
check "--all lists each of the 36 layouts that cannot exist as a row" \
  test "$(grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ +- +- +invalid ' "$tmp/all")" -eq 36
check "--all says why Sp = 8 cannot split 4 heads" grep -qE '^ +[0-9]+ +8 +[0-9]+ .*invalid .*4 query heads cannot be split over 8 ranks' "$tmp/all"
check "--all folds nothing" sh -c "! grep -q 'cannot exist' '$tmp/all'"
check "--all keeps the rest of the table" bash -c "diff <(grep -v invalid '$tmp/all') <(grep -v 'cannot exist' '$tmp/out')"
"$bin" plan -n 8 --all >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--all without --search-layout is refused" test $rc -ne 0
"$bin" plan -n 8 --set parallelism.expert_parallel=3 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan with Ep = 3 on 8 ranks exits 1" test $rc -eq 1
check "plan names the degree that does not divide W" contains "$tmp/err" "parallelism.expert_parallel = 3 must divide the world size W = 8"

# The Mixtral preset on 64 ranks as written: its layout (Ep 8, Sp 8, data_shard 8) plans and fits.
configs="$(dirname "${BASH_SOURCE[0]}")/../../configs"
"$bin" plan -n 64 -c "$configs/mixtral-8x7b.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan -n 64 -c configs/mixtral-8x7b.toml exits 0" test $rc -eq 0
check "the Mixtral preset's layout on 64 ranks is Ep 8, Sp 8, data_shard 8" contains "$tmp/out" "W = 64 ranks (Ep 8, Sp 8, data_shard 8)"

# --time: the step-time table (a row per phase, the step, tokens/s, MFU), with an H200's defaults
# on 64 ranks of the gpt-oss-120b preset and measured on this CPU for the embedded default.
"$bin" plan -n 64 -c "$configs/gpt-oss-120b.toml" --set runtime.device_memory=141GB \
  --set runtime.pinned_memory=250GB --time --device h200 --json "$tmp/time.json" \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --time --device h200 exits 0" test $rc -eq 0
check "plan --time names the rates" contains "$tmp/out" "# step time: H200 SXM (public ceilings) (defaults, docs/plan.md#step-time); W = 64 ranks, 8 per node"
check "plan --time has a row per phase" \
  sh -c "grep -qE '^  backward_experts +[0-9.]+ ' '$tmp/out' && grep -qE '^  optimizer +[0-9.]+ ' '$tmp/out'"
check "plan --time predicts the step" grep -qE '^# predicted step [0-9.]+ s, [0-9]+ tokens/s, MFU [0-9.]+%' "$tmp/out"
check "plan --time --json has the time" python3 - "$tmp/time.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["time"]
assert t["step_s"] > 0 and t["tokens_per_s"] > 0 and 0 < t["mfu"] < 1, t
assert [p["phase"] for p in t["phases"]] == ["embedding", "forward_attention", "forward_experts",
    "head", "backward_experts", "backward_attention", "optimizer"]
assert abs(sum(p["time_s"] for p in t["phases"]) - t["step_s"]) < 1e-9 * t["step_s"]
assert t["rates"]["name"].startswith("H200")
PY
"$bin" plan --time "${small[@]}" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --time on this CPU exits 0" test $rc -eq 0
check "plan --time measures this CPU" contains "$tmp/out" "# step time: this CPU (measured at the config's shapes)"
"$bin" plan --device h100 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --device without --time is refused" test $rc -ne 0
"$bin" plan -n 8 --set training.batch_size=8 --search-layout --time --device h100 \
  --json "$tmp/timed.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "plan --search-layout --time exits 0" test $rc -eq 0
check "search-layout --time orders by the predicted step" contains "$tmp/out" "best: the shortest predicted step that fits (--time)"
check "search-layout --time: the fastest first and best" python3 - "$tmp/timed.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
timed = [r["step_s"] for r in j["layouts"] if "step_s" in r]
assert timed and timed == sorted(timed), timed
b = j["best"]
first = j["layouts"][0]
assert (first["expert_parallel"], first["sequence_parallel"], first["data_shard"]) == \
    (b["expert_parallel"], b["sequence_parallel"], b["data_shard"])
PY

# --time with the rates of runtime.probe_file (`moepeak probe`): a probe file without [rates] is
# said and this CPU measured; [rates] written by hand are priced with exactly as written; another
# dtype's or backend's are not used; on CUDA they stand in for --device, and without them the
# error names both ways out.
"$bin" probe --no-bench --cpu -n 1 -o "$tmp/probe.toml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "probe --no-bench for the plan exits 0" test $rc -eq 0
plan_with_probe() {  # PROBE_FILE JSON [more args]: plan --time of the small shape
  local probe=$1 json=$2
  shift 2
  "$bin" plan --time "${small[@]}" --set runtime.probe_file="$probe" --json "$json" "$@" \
    >"$tmp/out" 2>"$tmp/err"
}
plan_with_probe "$tmp/probe.toml" "$tmp/none.json"; rc=$?
check "plan --time with a probe file without rates exits 0" test $rc -eq 0
check "it says the probe file has no rates" contains "$tmp/out" \
  "# step time: $tmp/probe.toml has no rates for f32 on cpu (it has none: written with --no-bench"
check "and how to measure them" contains "$tmp/out" \
  "re-run \`moepeak probe --cpu -n 1 --set training.dtype=float32 -o $tmp/probe.toml\`"
check "and measures this CPU instead" grep -qE '; measuring this machine$' "$tmp/out"
check "the measured rates are priced" contains "$tmp/out" "# step time: this CPU (measured at the config's shapes)"
rates_table() {  # BACKEND DTYPE DEVICE: a [rates] table of round numbers
  printf '\n[rates]\nbackend = "%s"\ndevice = "%s"\ndtype = "%s"\nranks_sharing = 1\n' "$1" "$3" "$2"
  printf 'shapes = "hidden 64, by hand"\ngemm_flops = 1.25e10\ngrouped_gemm_flops = 2.5e10\n'
  printf 'attention_flops = 3.75e9\nmemory_bytes_per_s = 4.5e10\nhost_link_bytes_per_s = 5.5e9\n'
  printf 'elementwise_bytes_per_s = 2.25e10\nloss_bytes_per_s = 1.125e10\n'
  printf 'host_memory_bytes_per_s = 6.5e9\nop_latency_s = 7.5e-7\npeak_flops = 8.5e10\n'
}
{ cat "$tmp/probe.toml"; rates_table cpu f32 "cpu (by hand)"; } >"$tmp/f32.toml"
{ cat "$tmp/probe.toml"; rates_table cpu bf16 "cpu (by hand)"; } >"$tmp/bf16.toml"
{ cat "$tmp/probe.toml"; rates_table cuda bf16 "NVIDIA H200"; } >"$tmp/cuda.toml"
plan_with_probe "$tmp/f32.toml" "$tmp/f32.json"; rc=$?
check "plan --time with the probe's rates exits 0" test $rc -eq 0
check "the step time names the probe file" \
  grep -qF "# step time: this machine ($tmp/f32.toml) (cpu f32, measured by \`moepeak probe\` on " "$tmp/out"
check "and nothing was measured" test -z "$(grep -F 'measuring this machine' "$tmp/out")"
check "plan --time --json: the rates are the file's" python3 - "$tmp/f32.json" "$tmp/f32.toml" <<'PY'
import json, sys, tomllib
r = json.load(open(sys.argv[1]))["time"]["rates"]
f = tomllib.load(open(sys.argv[2], "rb"))["rates"]
for k in ("gemm_flops", "grouped_gemm_flops", "attention_flops", "memory_bytes_per_s",
          "elementwise_bytes_per_s", "loss_bytes_per_s", "host_link_bytes_per_s", "host_memory_bytes_per_s", "op_latency_s", "peak_flops"):
    assert r[k] == f[k], (k, r[k], f[k])  # exact: the file's numbers are used as written
assert r["name"] == "this machine (%s)" % sys.argv[2], r["name"]
assert "hidden 64, by hand" in r["source"], r["source"]
assert r["ranks_per_node"] == 1
assert r["node_link_bytes_per_s"] == f["host_memory_bytes_per_s"] / 2  # the CPU's shared memory
PY
plan_with_probe "$tmp/bf16.toml" "$tmp/bf16.json"; rc=$?
check "plan --time with another dtype's rates exits 0" test $rc -eq 0
check "it says they are another dtype's" contains "$tmp/out" \
  "# step time: $tmp/bf16.toml has no rates for f32 on cpu (it has bf16 on cpu; re-run"
check "and measures this CPU instead (another dtype)" python3 - "$tmp/bf16.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["time"]["rates"]
assert r["name"] == "this CPU (measured at the config's shapes)" and r["gemm_flops"] != 1.25e10, r
PY
plan_with_probe "$tmp/cuda.toml" "$tmp/cuda.json" -n 2 --set runtime.backend=cuda \
  --set runtime.device_memory=141GB; rc=$?
check "plan --time on CUDA with a GPU's probe rates exits 0 (rc $rc)" test $rc -eq 0
check "CUDA: the probe's rates, the H200's links" python3 - "$tmp/cuda.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["time"]["rates"]
assert r["gemm_flops"] == 1.25e10 and r["ranks_per_node"] == 1, r
assert r["node_link_bytes_per_s"] > 0 and "links: H200 SXM (public ceilings) defaults" in r["source"], r
PY
plan_with_probe "$tmp/f32.toml" "$tmp/never.json" --set runtime.backend=cuda \
  --set runtime.device_memory=141GB; rc=$?
check "plan --time on CUDA with a CPU probe exits 1 (rc $rc)" test $rc -eq 1
check "the error names --device" contains "$tmp/err" "--device h100 or --device h200"
check "and the probe file" contains "$tmp/err" "$tmp/f32.toml has no rates for bf16 on cuda (it has f32 on cpu"

report test_plan_cli
