#!/usr/bin/env bash
# `moepeak bench reach -c configs/reach.toml` on one rank (no launcher), where by the plan no
# seq_len fits the standard stack: the search starts at the smallest seq_len a job can be made at
# (2: training.seq_len >= 2, at the layout's granularity, Sp = 1), says why it does not start
# lower, and never probes 1 (which stopped the bench: "the standard probe at 1 failed").
#   1. The issue's command as given (32 MiB, every stack): it exits 0 and reports every stack,
#      each starting at 2, where each runs out of memory (the plan's limit is 0 for all).
#   2. At 48 MiB with the standard stack and offload_stream (search step 1): the standard stack
#      again from 2; offload_stream's limit bracketed to one step by real 1-step runs and its
#      reach numbers (measured, planned, binding live set, tokens/s) in the table and the JSON.
# Run: ctest -R test_bench_reach_one_rank   (or: bash tests/cli/test_bench_reach_one_rank.sh build/moepeak)
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stacks="standard standard_worst_case pipelined_llep ring_dtp sco offload_stream bounded"

"$bin" bench reach -c "$root/configs/reach.toml" --json "$tmp/reach.json" >"$tmp/out" 2>&1
rc=$?
check "bench reach -c configs/reach.toml on one rank exits 0" test $rc -eq 0 || cat "$tmp/out"
check "no probe stops the bench" not_matches "$tmp/out" "failed without running out of device memory"
check "it says why it starts at 2" contains "$tmp/out" \
  "standard        from 2: no job can be made at 1: --set training.seq_len=1: training.seq_len must be >= 2, got 1"
for stack in $stacks; do
  check "the table has the $stack row" grep -qE "^  $stack +context +[0-9]+ +[0-9]+ " "$tmp/out"
done
check "every stack starts at seq_len 2 and probes nothing below" python3 - "$tmp/reach.json" \
  "$stacks" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["world_size"] == 1 and d["shape"]["step"] == 1, d["shape"]
rows = {r["stack"]: r for r in d["rows"]}
assert sorted(rows) == sorted(sys.argv[2].split()), rows.keys()
for name, r in rows.items():
    # The case of the issue: nothing fits by the plan, so the search starts at its lowest value.
    assert r["planned_limit"] == 0, f"{name}: planned {r['planned_limit']}"
    values = [p["value"] for p in r["probes"]]
    assert values and values[0] == 2 and min(values) == 2, f"{name}: probes {values}"
    # The bracket: one step above what trained, or the lowest value when nothing did; what did
    # not train named the live set it ran out in.
    limit, failed = r["measured_limit"], r["first_failed"]
    assert failed == (limit + 1 if limit else 2) or (limit and failed == 0), f"{name}: {r}"
    for p in r["probes"]:
        assert p["trained"] or p["binding_live_set"], f"{name}: {p}"
PY

"$bin" bench reach -c "$root/configs/reach.toml" --set runtime.device_memory=48MiB \
  --stacks standard,offload_stream --steps 1 --json "$tmp/r48.json" >"$tmp/out48" 2>&1
rc=$?
check "bench reach at 48 MiB on one rank exits 0" test $rc -eq 0 || cat "$tmp/out48"
check "offload_stream's row has its reach" grep -qE '^  offload_stream +context +[1-9][0-9]* +[1-9][0-9]* +[0-9.]+ +[a-z_]+ +[1-9][0-9]* ' "$tmp/out48"
check "the standard stack from 2, offload_stream bracketed to one step" python3 - "$tmp/r48.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
step = d["shape"]["step"]
assert step == 1, d["shape"]
rows = {r["stack"]: r for r in d["rows"]}
s, o = rows["standard"], rows["offload_stream"]
assert s["planned_limit"] == 0 and s["probes"][0]["value"] == 2, s
assert all(p["value"] >= 2 for p in s["probes"] + o["probes"])
limit, failed = o["measured_limit"], o["first_failed"]
assert o["planned_limit"] > 0 and limit > 0 and failed == limit + step, o
probes = {p["value"]: p for p in o["probes"]}
assert probes[limit]["trained"] and not probes[failed]["trained"], o
assert o["binding_live_set"] and o["binding_live_set"] == probes[failed]["binding_live_set"], o
assert o["tokens_per_s"] > 0 and o["loss_step1_at_standard_limit"] > 0, o
for v, p in probes.items():
    assert p["trained"] == (v <= limit), f"{v} {p}"
print(f"offload_stream: measured {limit} (planned {o['planned_limit']}), fails at {failed} in "
      f"{o['binding_live_set']}, {len(probes)} probes, {o['tokens_per_s']:.0f} tokens/s")
PY
cat "$tmp/check.out"

report test_bench_reach_one_rank
