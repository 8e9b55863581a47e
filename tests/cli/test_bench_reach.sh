#!/usr/bin/env bash
# `moepeak bench reach` at a tiny capacity on 2 ranks, three stacks (standard with the model's
# router and with the worst-case routing the plan assumes, all four bounded):
# every probe is a real 1-step training job; the search brackets the out-of-memory point (the
# measured limit trained, one search step more did not, and the arena named the live set that
# overflowed there; no limit is below the plan's); the JSON has every field per stack; the worst-
# case router reaches no further than the model's; the bounded stack reaches further than
# the standard one; both train step 1 to the same loss at the standard's limit; bad flags are
# clear errors. Run: ctest -R test_bench_reach   (or: bash tests/cli/test_bench_reach.sh build/moepeak)
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The probes' mpirun as root on two cores (ctest sets these too).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_btl_vader_single_copy_mechanism=none

# The tiny preset at 24 MiB per rank, batch 4: the standard stack's plan stops near 1,000 tokens.
sets=(--set runtime.device_memory=24MiB --set training.batch_size=4 --set runtime.threads=1)
"$bin" bench reach -c "$root/configs/tiny.toml" "${sets[@]}" -n 2 --axis context --steps 1 \
  --stacks standard,standard_worst_case,bounded --launcher "mpirun --oversubscribe -np {W}" \
  --json "$tmp/reach.json" --svg "$tmp/reach.svg" >"$tmp/out" 2>&1
rc=$?
check "bench reach exits 0" test $rc -eq 0 || cat "$tmp/out"
check "the table has a row per stack" \
  sh -c "grep -qE '^  standard +context ' '$tmp/out' && grep -qE '^  bounded +context ' '$tmp/out'"
check "the svg is drawn" grep -q '<svg' "$tmp/reach.svg"
python3 - "$tmp/reach.json" >"$tmp/json.out" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["stack"]: r for r in d["rows"]}
step = d["shape"]["step"]
assert set(rows) == {"standard", "standard_worst_case", "bounded"}, rows.keys()
for name, r in rows.items():
    for key in ("stack", "axis", "measured_limit", "planned_limit", "binding_live_set",
                "tokens_per_s", "tokens_per_s_at_standard_limit", "loss_step1_at_standard_limit"):
        assert key in r, f"{name}: no {key}"
    assert r["axis"] == "context"
    limit, failed = r["measured_limit"], r["first_failed"]
    assert limit > 0 and failed == limit + step, f"{name}: limit {limit}, first failed {failed}"
    probes = {p["value"]: p for p in r["probes"]}
    assert probes[limit]["trained"], f"{name}: the limit {limit} did not train"
    assert not probes[failed]["trained"], f"{name}: {failed} trained"
    assert r["binding_live_set"] == probes[failed]["binding_live_set"] and r["binding_live_set"], \
        f"{name}: no live set named at {failed}"
    assert r["tokens_per_s"] > 0
    # A plan must never promise a length the run cannot train.
    assert limit >= r["planned_limit"], f"{name}: measured {limit} < planned {r['planned_limit']}"
    # Memory grows with the context: no probe above a failure trained.
    for v, p in probes.items():
        assert p["trained"] == (v <= limit), f"{name}: {v} {p}"
    print(f"{name}: measured {limit} (planned {r['planned_limit']}), fails at {failed} in "
          f"{r['binding_live_set']}, {len(probes)} probes, loss {r['loss_step1_at_standard_limit']}")
s, b, w = rows["standard"], rows["bounded"], rows["standard_worst_case"]
assert b["measured_limit"] > s["measured_limit"], (b["measured_limit"], s["measured_limit"])
# Every row to one rank needs more dispatch memory than the model's own router.
assert w["measured_limit"] <= s["measured_limit"], (w["measured_limit"], s["measured_limit"])
assert w["binding_live_set"] == "dispatch", w
rel = abs(b["loss_step1_at_standard_limit"] - s["loss_step1_at_standard_limit"]) / \
      s["loss_step1_at_standard_limit"]
# f32: the bounded schedules sum in another order (PipelinedLLEP's F blocks, Ring-DTP's strips).
assert rel < 1e-5, f"step-1 losses differ by {rel}"
PY
check "the JSON brackets the out-of-memory point for every stack" test $? -eq 0 ||
  cat "$tmp/json.out"
cat "$tmp/json.out"

# The batch axis, one stack: the global batch that trains at 128 tokens, bracketed the same way.
"$bin" bench reach -c "$root/configs/tiny.toml" "${sets[@]}" -n 2 --axis batch --steps 1 \
  --stacks standard --launcher "mpirun --oversubscribe -np {W}" --json "$tmp/batch.json" \
  >"$tmp/batch.out" 2>&1
check "the batch axis runs" test $? -eq 0 || cat "$tmp/batch.out"
check "the batch axis brackets its limit" python3 -c "
import json
r = json.load(open('$tmp/batch.json'))['rows'][0]
probes = {p['value']: p['trained'] for p in r['probes']}
assert r['axis'] == 'batch' and probes[r['measured_limit']] and not probes[r['first_failed']], r
assert r['first_failed'] == r['measured_limit'] + json.load(open('$tmp/batch.json'))['shape']['step']
"

"$bin" bench reach -c "$root/configs/tiny.toml" --axis depth >"$tmp/bad" 2>&1
check "an unknown axis is an error" test $? -ne 0
check "it names the flag" contains "$tmp/bad" "--axis depth"
"$bin" bench reach -c "$root/configs/tiny.toml" --stacks standard,fast >"$tmp/bad" 2>&1
check "an unknown stack is an error" test $? -ne 0
check "it names the stack" contains "$tmp/bad" "unknown stack 'fast'"

report test_bench_reach
