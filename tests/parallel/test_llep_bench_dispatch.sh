#!/usr/bin/env bash
# `moepeak bench dispatch` on 2 real rank processes, a small shape under adversarial routing
# (every token to rank 0's experts), timing forward + checkpoint recompute + backward: exit 0,
# rank 0 prints the table once, and the JSON (docs/design.md#machine-readable-outputs) has the pipeline's launch shape
# (slots, tile rows, F blocks) and the rows standard, llep, pipelined_llep strided and
# contiguous; each pipelined row's
# `dispatch` peak equals its bound and is below LLEP's, LLEP's is at or under its bound and below
# the standard's, and every max_rel_err is under 1e-5 (f32).
# Every run is under `timeout 120`: a hang is a failure, not a blocked test.
# Run: ctest -R llep_bench_dispatch   (or: bash tests/parallel/test_llep_bench_dispatch.sh build/moepeak "$(which mpirun)")
set -u
bin="$1"
mpirun="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" bench dispatch \
  --tokens 40 --hidden 16 --ffn 24 --experts 8 --top-k 2 --chunk-tokens 4 --routing adversarial \
  --min-tokens 2 --recompute --warmup 1 --iters 2 --json "$tmp/dispatch.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
cat "$tmp/out"
if [ $rc -ne 0 ]; then echo "FAIL: exit $rc"; cat "$tmp/err"; exit 1; fi
if [ "$(grep -c '^# moepeak bench dispatch' "$tmp/out")" -ne 1 ]; then
  echo "FAIL: the header is not printed exactly once (rank 0 only)"; exit 1
fi
python3 - "$tmp/dispatch.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fail = []
def check(cond, what):
    if not cond: fail.append(what)
check(d["bench"] == "dispatch" and d["world_size"] == 2, "bench name / world size")
s = d["shape"]
check(s["tokens_per_rank"] == 40 and s["top_k"] == 2 and s["chunks"] == 10 and
      s["chunk_tokens_effective"] == 4 and s["routing"] == "adversarial" and s["recompute"],
      "shape %s" % s)
# The launch shape of the pipeline: slots, tile rows, and F = 24 cut into equal blocks.
check(s["slots"] in (1, 2) and 1 <= s["tile_rows"] <= s["chunk_tokens_effective"] and
      s["ffn_blocks"] >= 1 and s["ffn_block"] * s["ffn_blocks"] >= 24 and
      (s["ffn_blocks"] - 1) * s["ffn_block"] < 24, "pipeline launch shape %s" % s)
rows = d["rows"]
check([(r["schedule"], r.get("membership")) for r in rows] ==
      [("standard", None), ("llep", None), ("pipelined_llep", "strided"),
       ("pipelined_llep", "contiguous")], "rows")
std, llep, strided, contiguous = rows
check(std["max_rel_err"] == 0, "the standard row is the reference")
check(std["peak_bytes"]["dispatch"] <= std["bound_bytes"], "standard under its worst case")
check(llep["peak_bytes"]["dispatch"] <= llep["bound_bytes"], "llep under llep_dispatch_bytes")
check(llep["peak_bytes"]["dispatch"] < std["peak_bytes"]["dispatch"], "llep below standard (skew)")
for r in (strided, contiguous):
    what = "pipelined_llep " + r["membership"]
    check(r["peak_bytes"]["dispatch"] == r["bound_bytes"], what + ": dispatch peak = its bound")
    check(r["peak_bytes"]["dispatch"] < llep["peak_bytes"]["dispatch"], what + ": below llep")
for r in rows:
    check(r["max_rel_err"] is not None and r["max_rel_err"] < 1e-5,
          "%s: max_rel_err %s" % (r["schedule"], r["max_rel_err"]))
    check(r["time_s"] > 0 and set(r["peak_bytes"]) >= {"total", "dispatch", "weights", "grads"},
          r["schedule"] + ": fields")
for f in fail: print("FAIL:", f)
sys.exit(1 if fail else 0)
PY
