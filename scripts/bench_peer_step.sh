#!/usr/bin/env bash
# moepeak's CPU step against Hugging Face transformers on the small preset's shape, side by side
# (docs/perf.md, "The CPU step against transformers"): ROUNDS rounds, each `moepeak bench step
# -c configs/small.toml` then scripts/bench_peer_step.py, back to back on the same threads, so
# both see the same machine; prints each round's tokens/s and moepeak / peer, then the medians.
#
#   PEER_PYTHON=/path/to/venv/bin/python scripts/bench_peer_step.sh [ROUNDS]   (default 3)
#
# The peer needs torch and transformers in a venv of your own (not part of the build or CI).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${MOEPEAK_BIN:-$root/build/moepeak}"
py="${PEER_PYTHON:?set PEER_PYTHON to a python with torch and transformers}"
rounds="${1:-3}"
threads="${THREADS:-2}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '# %5s %16s %16s %8s\n' round moepeak_tok_s peer_tok_s ratio
for r in $(seq 1 "$rounds"); do
  "$bin" bench step -c "$root/configs/small.toml" --set metrics.progress=off \
    --set runtime.threads="$threads" --set job.run_dir="$tmp/runs" --warmup 2 --iters 5 \
    --json "$tmp/m$r.json" >"$tmp/m$r.out" 2>&1
  "$py" "$root/scripts/bench_peer_step.py" --threads "$threads" --warmup 2 --iters 5 \
    --json "$tmp/p$r.json" >"$tmp/p$r.out" 2>&1
  /usr/bin/python3 - "$tmp/m$r.json" "$tmp/p$r.json" "$r" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["rows"][0]["tokens_per_s"]
p = json.load(open(sys.argv[2]))["tokens_per_s"]
print(f"  {sys.argv[3]:>5} {m:16.0f} {p:16.0f} {m / p:8.2f}")
PY
done | tee "$tmp/rounds.txt"
head -1 "$tmp/p1.out"
grep -m1 "backend\|cpu (" "$tmp/m1.out" || true
/usr/bin/python3 - "$tmp/rounds.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith("#")]
m = statistics.median(float(r[1]) for r in rows)
p = statistics.median(float(r[2]) for r in rows)
print(f"# median over {len(rows)} rounds: moepeak {m:.0f} tokens/s, peer {p:.0f} tokens/s, "
      f"ratio {m / p:.2f}")
PY
