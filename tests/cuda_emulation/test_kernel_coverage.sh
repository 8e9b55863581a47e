#!/usr/bin/env bash
# Every CUDA kernel ran on the emulation: each __global__ function defined in ops/cuda/*.cu is
# named in the kernel log that test_backend_ops wrote (MOEPEAK_CUDA_EMULATION_KERNEL_LOG; ctest
# runs that test first, as this test's fixture), so the emulated suite in CI covers every kernel.
# Run: ctest -L cuda-emulated -R 'backend_ops$|kernel_coverage'
set -u
src="$1"
log="$2"
py=python3
"$py" -c 'import sys' 2>/dev/null || py=/usr/bin/python3
if [[ ! -s "$log" ]]; then
  echo "FAIL: no kernel log at $log (test_backend_ops did not run, or ran without the log)"
  exit 1
fi
"$py" - "$src" "$log" <<'PY'
import glob, re, sys
src, log = sys.argv[1], sys.argv[2]
defined = {}
for path in sorted(glob.glob(src + "/ops/cuda/*.cu")):
    text = open(path).read()
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(",
                         text):
        defined[m.group(1)] = path[len(src) + 1:]
ran = set(l.strip() for l in open(log) if l.strip())
missing = sorted(k for k in defined if k not in ran)
print(f"{len(defined)} kernels defined in ops/cuda, {len(defined) - len(missing)} ran")
for k in missing:
    print(f"FAIL: {k} ({defined[k]}) never ran in test_backend_ops")
if not defined:
    print("FAIL: no __global__ function found (the pattern no longer matches the sources)")
sys.exit(1 if missing or not defined else 0)
PY
