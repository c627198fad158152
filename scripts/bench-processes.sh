#!/usr/bin/env bash
# Step time of the same run as 1 process x 8 devices, 2 x 4 and 8 x 1 (and
# any other process counts given), through mpirun.  Each round runs every
# layout once, in turn, so a noisy machine slows them alike; the table
# gives each layout's median over the rounds of its median ms/step, and
# its ratio to one process.
#   scripts/bench-processes.sh [BUILD_DIR] [ROUNDS] [-- spmd train flags]
# Defaults: build, 5 rounds, the default run (4x2 GPT) for 50 steps.
set -euo pipefail

build=${1:-build}
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
flags=("$@")
((${#flags[@]})) || flags=(--steps 50 --eval 0)
spmd="$build/spmd"
[ -x "$spmd" ] || { echo "bench-processes: no $spmd (make build first)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench-processes: no mpirun (apt-get install openmpi-bin)" >&2; exit 2; }
# mpirun as the tests start it (root allowed, oversubscribed, alike on
# Open MPI 4.1 and 5.0): scripts/mpirun.sh.
mpirun_sh="$(cd "$(dirname "$0")" && pwd)/mpirun.sh"
report=$(mktemp)
trap 'rm -f "$report"' EXIT

layouts=(1 2 4 8)
declare -A times
for ((r = 0; r < rounds; r++)); do
  for p in "${layouts[@]}"; do
    if [ "$p" = 1 ]; then
      "$spmd" train "${flags[@]}" --json "$report" >/dev/null
    else
      sh "$mpirun_sh" --timeout 600 -n "$p" "$spmd" train "${flags[@]}" --json "$report" >/dev/null
    fi
    ms=$(sed -n 's/^[[:space:]]*"ms_per_step":[[:space:]]*\([0-9.e+-]*\).*/\1/p' "$report")
    times[$p]="${times[$p]:-} $ms"
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
base=$(echo "${times[1]}" | median)
echo "spmd train ${flags[*]}: median ms/step over $rounds rounds ($(nproc) CPUs)"
printf "%-22s %12s %10s\n" "layout" "ms/step" "vs 1"
for p in "${layouts[@]}"; do
  m=$(echo "${times[$p]}" | median)
  printf "%-22s %12.1f %10.2f\n" "$p process(es)" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN {print a / b}')"
done
