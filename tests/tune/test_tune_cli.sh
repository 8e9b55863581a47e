#!/usr/bin/env bash
# `moepeak tune` end to end on configs/tiny.toml (docs/tune.md), as a user meets it:
#   - 1 rank: exit 0, the table and the chosen values on stdout, DIR/tuned.toml, curves.json and one
#     .svg per curve; every point has median/min/max and its measured peak equals the planner's
#     function; `moepeak plan --config tiny --config DIR/tuned.toml` exits 0 and a 2-step
#     `moepeak train` with the fragment exits 0;
#   - 2 ranks under mpirun: the same, plan -n 2 and a 2-rank train with the fragment;
#   - nothing fits (runtime.device_memory = 1MiB): exit 1, the error names the constraint, no
#     tuned.toml (nothing half-written); usage mistakes exit 2.
# --sco-tolerance 1: on a shared 2-core machine the SCO overhead is mostly noise, and the test
# checks the command, not this machine's numbers (the default rule is tested in test_tune_select).
# Every run is under `timeout`: a hang is a failure. Run: ctest -R test_tune_cli   (or: bash
#   tests/tune/test_tune_cli.sh build/moepeak "$(which mpirun)" with OMPI_ALLOW_RUN_AS_ROOT=1
#   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 set as root)
set -u
bin="$1"
mpirun="$2"
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tiny="$src/configs/tiny.toml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report

check_outputs() {  # check_outputs DIR W: the files, their fields, plan and a 2-step train
  local dir="$1" w="$2"
  for f in tuned.toml curves.json dispatch_time.svg dispatch_peak.svg optimizer.svg vocab.svg sco.svg; do
    check "W=$w wrote $f" test -s "$dir/$f"
  done
  check "W=$w no temporary files left" sh -c "! ls -A '$dir' | grep -q '^\\.'"
  check "W=$w curves.json has every point and the chosen ones" python3 - "$dir/curves.json" "$w" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); w = int(sys.argv[2])
assert j["world_size"] == w and j["plan"]["fits"] is True, j["plan"]
for sweep in ("dispatch", "optimizer", "vocab", "sco"):
    s = j[sweep]
    assert len(s["points"]) >= 2 and 0 <= s["chosen"] < len(s["points"]), sweep
    for p in s["points"]:
        t = p["time"]
        assert 0 < t["min_s"] <= t["median_s"] <= t["max_s"] and t["repeats"] == j["repeats"], (sweep, p)
    assert s["points"][s["chosen"]]["plan_fits"] is True, sweep
for p in j["dispatch"]["points"]:
    assert p["peak_bytes"] == p["bound_bytes"] > 0, p   # pipelined_llep_dispatch_bytes
for p in j["optimizer"]["points"]:
    assert p["staging_bytes"] == p["bound_bytes"] > 0, p  # adamw_offload_stream_bytes
assert j["optimizer"]["floor_s"] > 0
assert {p["payload"] for p in j["vocab"]["points"]} == {"activations", "weights"}
# every payload has its point with no strips kept, and some points keep strips (the tiny config's
# plan accepts them); the chosen one is the fewest kept within tolerance of its payload's fastest
v = j["vocab"]["points"]
assert {p["payload"] for p in v if p["kept_strips"] == 0} == {"activations", "weights"}, v
assert any(p["kept_strips"] > 0 for p in v), v
c = v[j["vocab"]["chosen"]]
same = [p for p in v if p["payload"] == c["payload"] and p["plan_fits"]]
fast = min(p["time"]["median_s"] for p in same)
assert c["kept_strips"] == min(p["kept_strips"] for p in same
                               if p["time"]["median_s"] <= fast * (1 + j["vocab"]["tolerance"])), (c, same)
for p in j["vocab"]["points"] + j["sco"]["points"]:
    assert p["peak_bytes"] == p["bound_bytes"] > 0, p   # ring_dtp_bytes, sco_boundaries_bytes
assert [p["label"] for p in j["sco"]["points"]] == ["none", "half", "all"]
# the rule, checked on the file's own numbers: the chosen c_eff is the smallest within 3% of the best
d = [p for p in j["dispatch"]["points"] if p["plan_fits"]]
best = min(p["time"]["median_s"] for p in d)
ok = [p["chunk_eff"] for p in d if p["time"]["median_s"] <= best * (1 + j["dispatch"]["tolerance"])]
assert j["dispatch"]["points"][j["dispatch"]["chosen"]]["chunk_eff"] == min(ok)
PY
  check "W=$w every plot is SVG with one chosen mark" python3 - "$dir" <<'PY'
import sys, glob, xml.dom.minidom as m
files = glob.glob(sys.argv[1] + "/*.svg")
assert len(files) == 5, files
for f in files:
    d = m.parse(f); assert d.documentElement.tagName == "svg", f
    chosen = [g for g in d.getElementsByTagName("g") if g.getAttribute("class") == "chosen"]
    assert len(chosen) == 1, f
    assert any(c.getAttribute("class").startswith("point") for c in d.getElementsByTagName("circle")), f
PY
  check "W=$w tuned.toml names the command" grep -qE "^#   .*moepeak train --config $tiny .*--config $dir/tuned.toml\$" "$dir/tuned.toml"
  for k in "chunk_tokens = " "max_chunks = " "bucket_params = " "staging_slots = " "ring_payload = " "vocab_kept_strips = " "sco_host_budget = "; do
    check "W=$w tuned.toml sets $k" grep -q "^$k" "$dir/tuned.toml"
  done
  check "W=$w tuned.toml says why" grep -q "^# dispatch: smallest chunk within 3.0%" "$dir/tuned.toml"
}

# ---- 1 rank ----
timeout -k 10 240 "$bin" tune --config "$tiny" --out "$tmp/t1" --repeats 3 --warmup 1 --sco-tolerance 1 \
  >"$tmp/t1.out" 2>"$tmp/t1.err"; rc=$?
check "tune (1 rank) exits 0" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/t1.err"
for s in "# dispatch: PipelinedLLEP" "# optimizer: one OffloadStreamAdamW step" "# vocab: Ring-DTP" "# sco: " \
         "# chosen dispatch: " "# chosen optimizer: " "# chosen vocab: " "# chosen sco: " "# plan with tuned.toml: FITS"; do
  check "tune prints '$s'" contains "$tmp/t1.out" "$s"
done
check "tune marks the chosen rows" test "$(grep -c '^ \* ' "$tmp/t1.out")" -eq 4
check "tune progress lines (not a TTY)" grep -qE '^# tune \[[0-9]+/[0-9]+\] dispatch c=' "$tmp/t1.out"
check_outputs "$tmp/t1" 1
check "1-rank command is exactly" contains "$tmp/t1/tuned.toml" "#   moepeak train --config $tiny --config $tmp/t1/tuned.toml"
"$bin" plan --config "$tiny" --config "$tmp/t1/tuned.toml" >"$tmp/plan1.out" 2>&1; rc=$?
check "plan with tuned.toml exits 0 (FITS)" test $rc -eq 0
check "plan with tuned.toml uses pipelined_llep" contains "$tmp/plan1.out" "pipelined_llep_dispatch_bytes("
timeout -k 10 120 "$bin" train --config "$tiny" --config "$tmp/t1/tuned.toml" --set training.steps=2 \
  --set metrics.progress=off --set job.run_dir="$tmp/runs" --set job.name=t1 >"$tmp/train1.out" 2>"$tmp/train1.err"; rc=$?
check "train with tuned.toml exits 0" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$tmp/train1.err"
check "train with tuned.toml ran 2 steps" test "$(wc -l <"$tmp/runs/t1/metrics.jsonl" 2>/dev/null)" = 2

# ---- 2 ranks under mpirun ----
# (mpirun hands rank 0 a pty: metrics.progress=off asks for the plain progress lines)
timeout -k 10 240 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" tune --config "$tiny" --out "$tmp/t2" \
  --repeats 3 --warmup 1 --sco-tolerance 1 --set metrics.progress=off >"$tmp/t2.out" 2>"$tmp/t2.err"; rc=$?
check "tune (2 ranks) exits 0" test $rc -eq 0
[ $rc -eq 0 ] || tail -20 "$tmp/t2.err"
check "tune (2 ranks) says W = 2" contains "$tmp/t2.out" "W = 2 ranks"
check "tune (2 ranks) plain progress lines" grep -qE '^# tune \[1/[0-9]+\] dispatch c=' "$tmp/t2.out"
check "tune (2 ranks) command keeps the --set" contains "$tmp/t2/tuned.toml" "--set metrics.progress=off --config $tmp/t2/tuned.toml"
check_outputs "$tmp/t2" 2
check "2-rank command is launched on 2 ranks" contains "$tmp/t2/tuned.toml" "mpirun -np 2 moepeak train --config $tiny"
"$bin" plan -n 2 --config "$tiny" --config "$tmp/t2/tuned.toml" >/dev/null 2>&1; rc=$?
check "plan -n 2 with tuned.toml exits 0" test $rc -eq 0
timeout -k 10 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" train --config "$tiny" \
  --config "$tmp/t2/tuned.toml" --set training.steps=2 --set metrics.progress=off --set job.run_dir="$tmp/runs" \
  --set job.name=t2 >"$tmp/train2.out" 2>"$tmp/train2.err"; rc=$?
check "2-rank train with tuned.toml exits 0" test $rc -eq 0
check "2-rank train ran 2 steps" test "$(wc -l <"$tmp/runs/t2/metrics.jsonl" 2>/dev/null)" = 2

# ---- nothing fits: a clear error naming the constraint, nothing written ----
timeout -k 10 120 "$bin" tune --config "$tiny" --set runtime.device_memory=1MiB --only dispatch --repeats 1 \
  --warmup 0 --out "$tmp/none" >"$tmp/none.out" 2>"$tmp/none.err"; rc=$?
check "nothing fits exits 1" test $rc -eq 1
check "nothing fits names the constraint" grep -qE "no chunk_tokens in \{[0-9, ]+\} fits the plan: the smallest dispatch peak .* capacity 1.00 MiB" "$tmp/none.err"
check "nothing fits writes no tuned.toml" test ! -e "$tmp/none/tuned.toml"
check "nothing fits writes no curves" test ! -e "$tmp/none/curves.json"

# ---- usage ----
"$bin" tune --config "$tiny" >/dev/null 2>&1; rc=$?
check "tune without --out is a usage error" test $rc -eq 2
"$bin" tune --config "$tiny" --out "$tmp/x" --only dispach >/dev/null 2>"$tmp/err"; rc=$?
check "tune --only with an unknown sweep is a usage error" test $rc -eq 2

report test_tune_cli
