#!/usr/bin/env bash
# `moepeak bench vocab` on 2 real rank processes, a small shape (V odd: uneven shards): exit 0,
# rank 0 prints the table once, and the JSON (docs/design.md#machine-readable-outputs) has the materialised row and a
# Ring-DTP row per payload, strip width and kept-strip count, each Ring-DTP `logits` peak equal to
# its bound (below the materialised one with no strips kept), and every max_rel_err under 1e-5
# (f32).
# Every run is under `timeout 120`: a hang is a failure, not a blocked test.
# Run: ctest -R bench_vocab   (or: bash tests/parallel/test_bench_vocab.sh build/moepeak "$(which mpirun)")
set -u
bin="$1"
mpirun="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" bench vocab \
  --tokens 64 --hidden 16 --vocab 203 --strips 0,16,5 --kept 0,2 --warmup 1 --iters 2 \
  --json "$tmp/vocab.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
cat "$tmp/out"
if [ $rc -ne 0 ]; then echo "FAIL: exit $rc"; cat "$tmp/err"; exit 1; fi
if [ "$(grep -c '^# moepeak bench vocab' "$tmp/out")" -ne 1 ]; then
  echo "FAIL: the header is not printed exactly once (rank 0 only)"; exit 1
fi
python3 - "$tmp/vocab.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fail = []
def check(cond, what):
    if not cond: fail.append(what)
check(d["bench"] == "vocab" and d["world_size"] == 2, "bench name / world size")
check(d["shape"] == {"tokens_per_rank": 64, "hidden_size": 16, "vocab_size": 203, "dtype": "f32"}, "shape")
rows = d["rows"]
check(len(rows) == 1 + 2 * 3 * 2, "rows: materialized + 2 payloads x 3 strips x 2 kept, got %d" % len(rows))
ref = rows[0]
check(ref["schedule"] == "materialized" and ref["max_rel_err"] == 0, "first row is the reference")
check(ref["peak_bytes"]["logits"] == ref["bound_bytes"], "materialized logits peak = its formula")
seen = set()
for r in rows[1:]:
    what = "%s %s strip %s kept %s" % (r["schedule"], r.get("payload"), r.get("strip"), r.get("kept_strips"))
    seen.add((r["payload"], r["strip"], r["kept_strips"]))
    check(r["schedule"] == "ring_dtp", what + ": schedule name")
    check(r["peak_bytes"]["logits"] == r["bound_bytes"], what + ": logits peak = ring_dtp_bytes")
    if r["kept_strips"] == 0:
        check(r["peak_bytes"]["logits"] < ref["peak_bytes"]["logits"], what + ": below materialized")
    check(r["max_rel_err"] is not None and r["max_rel_err"] < 1e-5, what + ": max_rel_err %s" % r["max_rel_err"])
    check(r["time_s"] > 0 and set(r["peak_bytes"]) >= {"total", "logits", "weights", "workspace"}, what + ": fields")
# kept 2: every rank forms at least 2 strips in a pass (2 rounds), so 2 are kept on each.
check(seen == {(p, s, k) for p in ("activations", "weights") for s in (0, 16, 5) for k in (0, 2)},
      "payload x strip x kept rows: %s" % sorted(seen))
for f in fail: print("FAIL:", f)
sys.exit(1 if fail else 0)
PY
