#!/usr/bin/env bash
# slurm/tune.sbatch on a private single-node Slurm (tests/slurm/local_slurm.sh): 2 tasks on the
# tiny config (the template's 8 GPUs / 8 tasks overridden on the sbatch line, as the local node has
# no GPU and 2 cores), a small run (--repeats 2); the job exits 0 and writes tuned.toml, curves.json
# and the plots into MOEPEAK_TUNE_DIR, with the srun command in tuned.toml's header.
# Needs root (SKIP, exit 77). Run: ctest -R test_tune_sbatch
#   (or, as root: bash tests/slurm/test_tune_sbatch.sh build/moepeak .)
set -u
bin="$1"
src="$2"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: test_tune_sbatch needs root (its private Slurm runs slurmctld/slurmd as root)"
  exit 77
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/slurm_test_setup.sh
source "$here/slurm_test_setup.sh"  # $tmp, check, report; stops the cluster on exit
local_slurm_start "$tmp/slurm" || { echo "FAIL: the private Slurm did not start"; exit 1; }

MOEPEAK="$bin" MOEPEAK_TUNE_DIR="$tmp/tune" \
  timeout -k 10 200 sbatch --wait --chdir "$tmp" -o "$tmp/job.out" --gpus-per-node=0 --cpus-per-task=1 \
  --ntasks-per-node=2 "$src/slurm/tune.sbatch" "$src/configs/tiny.toml" --repeats 2 --warmup 1 \
  --sco-tolerance 1 >/dev/null 2>"$tmp/err"
rc=$?
check "sbatch --wait exits 0 (rc $rc)" test $rc -eq 0 || cat "$tmp/err" "$tmp/job.out"
for f in tuned.toml curves.json dispatch_time.svg optimizer.svg vocab.svg sco.svg; do
  check "the job wrote $f" test -s "$tmp/tune/$f"
done
check "curves.json says world_size 2" grep -q '"world_size": 2' "$tmp/tune/curves.json"
check "tuned.toml's header has the srun command" grep -qF 'srun -n 2 moepeak train --config' "$tmp/tune/tuned.toml"
check "the job's summary line" grep -qF "wrote $tmp/tune/tuned.toml" "$tmp/job.out"
report
