#!/usr/bin/env bash
# The step-time model against measured steps (docs/perf.md#step-time): for each case, the
# prediction of `moepeak plan --time` (this CPU measured at the case's shapes) beside the median
# step of `moepeak bench step` on the same ranks, and their ratio.
#
#   scripts/bench_step_time.sh            (every case below; about 5 minutes on 2 cores)
#   MOEPEAK_BIN=build/moepeak scripts/bench_step_time.sh tiny_1
#   scripts/bench_step_time.sh search small|small_link|tiny|tiny_link
#       the layout search on 2 ranks: every layout that fits, predicted and measured, and how the
#       one the search names measures against the fastest measured
#
# Cases: the tiny (embedded default) and small presets on 1 and 2 ranks, standard schedules and
# all four bounded ones, and 2 ranks under the CPU link model (0.2 GB/s, 50 us).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${MOEPEAK_BIN:-$root/build/moepeak}"
[ -x "$bin" ] || { echo "bench_step_time: build moepeak first ($bin)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_btl=self,vader
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

bounded=(--set schedules.dispatch=pipelined_llep --set schedules.vocab=ring_dtp
         --set schedules.checkpoint=sco --set optimizer.placement=offload_stream)
link=(--set runtime.cpu_link_gb_per_s=0.2 --set runtime.cpu_link_latency_us=50)
small=(-c "$root/configs/small.toml")

# name ranks args...
cases=(
  "tiny_1|1|"
  "tiny_1_bounded|1|${bounded[*]}"
  "tiny_2|2|"
  "tiny_2_bounded|2|${bounded[*]}"
  "tiny_2_link|2|${link[*]}"
  "small_1|1|${small[*]}"
  "small_1_bounded|1|${small[*]} ${bounded[*]}"
  "small_2|2|${small[*]}"
  "small_2_link|2|${small[*]} ${link[*]}"
)
want="${1:-}"

if [ "$want" = search ]; then
  # shellcheck disable=SC2206
  case "${2:-small}" in
    small) args=("${small[@]}") ;;
    small_link) args=("${small[@]}" "${link[@]}") ;;
    tiny) args=() ;;
    tiny_link) args=("${link[@]}") ;;
    *) echo "bench_step_time: search small|small_link|tiny|tiny_link" >&2; exit 2 ;;
  esac
  "$bin" plan -n 2 "${args[@]}" --search-layout --time --json "$tmp/search.json" \
    >"$tmp/search.out" 2>&1 || true
  printf '# search %s on 2 ranks: every layout that fits, the named one first\n' "${2:-small}"
  printf '# %4s %4s %4s %6s %6s %12s %12s\n' Ep Sp Ds batch accum predicted_s measured_s
  /usr/bin/python3 - "$tmp/search.json" >"$tmp/layouts.txt" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["layouts"]:
    if r.get("step_s", 0) > 0:
        print(r["expert_parallel"], r["sequence_parallel"], r["data_shard"], r["batch"],
              r["grad_accum_steps"], r["step_s"])
PY
  i=0
  while read -r ep sp ds batch accum predicted; do
    i=$((i + 1))
    "${mpi[@]}" -np 2 "$bin" bench step "${args[@]}" --set metrics.progress=off \
      --set parallelism.expert_parallel="$ep" --set parallelism.sequence_parallel="$sp" \
      --set parallelism.data_shard="$ds" --set training.batch_size="$batch" \
      --set training.grad_accum_steps="$accum" --set job.run_dir="$tmp/runs" --warmup 2 \
      --iters 7 --json "$tmp/layout$i.json" >"$tmp/layout$i.out" 2>&1 </dev/null
    measured=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['rows'][0]['step_s'])" "$tmp/layout$i.json")
    printf '  %4s %4s %4s %6s %6s %12.4f %12.4f\n' "$ep" "$sp" "$ds" "$batch" "$accum" "$predicted" "$measured"
    echo "$measured" >>"$tmp/measured.txt"
  done <"$tmp/layouts.txt"
  /usr/bin/python3 - "$tmp/measured.txt" <<'PY'
import sys
m = [float(l) for l in open(sys.argv[1])]
print(f"# the named layout measures {m[0]:.4f} s, {m[0] / min(m):.3f}x the fastest measured "
      f"({min(m):.4f} s) of {len(m)} layouts")
PY
  exit 0
fi
printf '# %-18s %5s %12s %12s %8s\n' case ranks predicted_s measured_s ratio
for c in "${cases[@]}"; do
  IFS='|' read -r name ranks args <<<"$c"
  [ -n "$want" ] && [ "$want" != "$name" ] && continue
  # shellcheck disable=SC2086
  "$bin" plan -n "$ranks" $args --set metrics.progress=off --time --json "$tmp/$name.plan.json" \
    >"$tmp/$name.plan.out" 2>&1 || true
  # shellcheck disable=SC2086
  "${mpi[@]}" -np "$ranks" "$bin" bench step $args --set metrics.progress=off \
    --set job.run_dir="$tmp/runs" --warmup 2 --iters 7 --json "$tmp/$name.step.json" \
    >"$tmp/$name.step.out" 2>&1
  /usr/bin/python3 - "$tmp/$name.plan.json" "$tmp/$name.step.json" "$name" "$ranks" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["time"]
s = json.load(open(sys.argv[2]))["rows"][0]
p, m = t["step_s"], s["step_s"]
print(f"  {sys.argv[3]:<18} {sys.argv[4]:>5} {p:12.4f} {m:12.4f} {p / m:8.2f}")
PY
done
