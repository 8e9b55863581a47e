# shellcheck shell=bash
# Checks on the metrics a run writes (metrics.jsonl) that the shell tests share. Source it; it
# defines
#   py                             a python3 with numpy (the first on PATH may lack it; Debian's
#                                  python3-numpy is /usr/bin's)
#   series_match REF RUN KEY RTOL  RUN's KEY at each of its steps equals REF's at the same step,
#                                  within RTOL relative (RTOL = 0: the same float exactly); RUN
#                                  must have at least one step
py=python3
"$py" -c 'import numpy' 2>/dev/null || py=/usr/bin/python3

series_match() {
  "$py" - "$@" <<'PY'
import json, sys
ref_path, run_path, key, rtol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def load(p):
    try:
        return {r["step"]: r[key] for r in (json.loads(l) for l in open(p) if l.strip())}
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"  {p}: {e}")
ref, run = load(ref_path), load(run_path)
if not run:
    sys.exit(f"  {run_path}: no steps")
bad = 0
for step, b in sorted(run.items()):
    if step not in ref:
        sys.exit(f"  step {step} of {run_path} is not in {ref_path}")
    a = ref[step]
    ok = a == b if rtol == 0 else abs(a - b) <= rtol * max(abs(a), abs(b))
    if not ok:
        print(f"  step {step} {key}: {b!r} vs {a!r} (relative {abs(a - b) / max(abs(a), 1e-300):.3g})")
        bad += 1
sys.exit(1 if bad else 0)
PY
}

