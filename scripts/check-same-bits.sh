#!/usr/bin/env bash
# Records what a refactoring must not change, and compares two records:
# every step's loss, gradient norm and learning rate (as the exact decimal
# the log prints, which round-trips the float) for the default run and for
# meshes 1, 8, 4x2 and 2x2x2 with tensor parallelism, and 4x2 with the
# replicated update (--zero off; ZeRO is the default), bf16 matmuls, the
# MLP, and 4x2 over 2 and 4 Open MPI processes (where the build has MPI),
# plus the `spmd explain` output of each of those run in one process.
#   scripts/check-same-bits.sh record BUILD_DIR OUT_DIR     (minutes)
#   scripts/check-same-bits.sh compare OLD_DIR NEW_DIR      (exit 1 on a difference)
set -euo pipefail

usage() { echo "usage: $0 record BUILD_DIR OUT_DIR | compare OLD_DIR NEW_DIR" >&2; exit 2; }
[ $# -eq 3 ] || usage

case $1 in
record)
  spmd="$2/spmd"
  out=$3
  [ -x "$spmd" ] || { echo "check-same-bits: no $spmd (make build first)" >&2; exit 2; }
  mkdir -p "$out"
  short=(--steps 200 --eval 16)
  # name | flags
  runs=(
    "default|"
    "mesh1|--mesh 1 --axes data ${short[*]}"
    "mesh8|--mesh 8 --axes data ${short[*]}"
    "mesh4x2|--mesh 4x2 --axes replica,fsdp --zero on ${short[*]}"
    "mesh4x2off|--mesh 4x2 --axes replica,fsdp --zero off ${short[*]}"
    "tp2x2x2|--mesh 2x2x2 --axes data,fsdp,tensor --tp tensor --fsdp fsdp ${short[*]}"
    "tpsp2x2x2|--mesh 2x2x2 --axes data,fsdp,tensor --tp tensor --sp on --fsdp fsdp ${short[*]}"
    "mlp4x2|--model mlp --mesh 4x2 --axes replica,fsdp ${short[*]}"
    "bf16|--mesh 4x2 --axes replica,fsdp --precision bf16 ${short[*]}"
    "np2|mpi2|--mesh 4x2 --axes replica,fsdp ${short[*]}"
    "np4|mpi4|--mesh 4x2 --axes replica,fsdp ${short[*]}"
  )
  mpi_ok=false
  if grep -q '^SPMD_MPI:BOOL=ON' "$2/CMakeCache.txt" 2>/dev/null && command -v mpirun >/dev/null; then
    mpi_ok=true
  fi
  for r in "${runs[@]}"; do
    name=${r%%|*}
    rest=${r#*|}
    launch=()
    case $rest in
    mpi*\|*)
      $mpi_ok || { echo "check-same-bits: $name skipped (no MPI)" >&2; continue; }
      np=${rest%%|*}; np=${np#mpi}; rest=${rest#*|}
      launch=("$(dirname "$0")/mpirun.sh" --timeout 600 -n "$np") ;;
    esac
    read -r -a flags <<<"$rest"
    echo "check-same-bits: $name" >&2
    rm -f "$out/$name.jsonl"
    "${launch[@]}" "$spmd" train "${flags[@]}" --log "$out/$name.jsonl" >"$out/$name.out"
    # The bits: drop the timings, keep everything computed.
    jq -c 'del(.ms, .tokens_per_s)' "$out/$name.jsonl" >"$out/$name.bits"
    rm -f "$out/$name.jsonl"
    # Under mpirun explain prices the network it measures: not the same twice.
    if [ ${#launch[@]} -eq 0 ]; then "$spmd" explain "${flags[@]}" >"$out/$name.explain"; fi
  done
  ;;
compare)
  old=$2
  new=$3
  status=0
  for f in "$old"/*.bits "$old"/*.explain; do
    name=$(basename "$f")
    if ! cmp -s "$f" "$new/$name"; then
      echo "check-same-bits: $name differs:" >&2
      diff "$f" "$new/$name" | head -20 >&2 || true
      status=1
    fi
  done
  [ $status = 0 ] && echo "check-same-bits: the same bits and explain output ($(ls "$old"/*.bits | wc -l) runs)"
  exit $status
  ;;
*) usage ;;
esac
