#!/usr/bin/env bash
# Context parallelism at the GPT-2 124M shape: trained 10 steps at seq
# 1024, batch 1, on one device and on 4 devices over 'cp' (--cp cp
# --fsdp cp), the parallel run's losses within 1e-4 of one device's; and
# the planned peak per device at seq 4096 (explain) on 4 'cp' devices
# against one device's, at most 0.35 of it.  Minutes on a small machine.
#   scripts/check-cp-124m.sh [BUILD_DIR] [STEPS]
set -euo pipefail

build=${1:-build}
steps=${2:-10}
spmd="$build/spmd"
[ -x "$spmd" ] || { echo "check-cp-124m: no $spmd (make build first)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

gpt2=(--layers 12 --dim 768 --heads 12 --vocab 50257 --batch 1 --seed 1)
cp=(--mesh 4 --axes cp --cp cp --fsdp cp)
train() { # name, flags...
  local name=$1
  shift
  echo "check-cp-124m: train $name" >&2
  "$spmd" train "${gpt2[@]}" --context 1024 --seq 1024 --steps "$steps" --eval 0 "$@" \
    --json "$dir/$name.json" >"$dir/$name.log"
}
plan() { # name, flags...
  local name=$1
  shift
  echo "check-cp-124m: explain $name at seq 4096" >&2
  "$spmd" explain "${gpt2[@]}" --context 4096 --seq 4096 "$@" --json "$dir/$name.json" >/dev/null
}
train one --devices 1
train cp "${cp[@]}"
plan one_4096 --devices 1
plan cp_4096 "${cp[@]}"

python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
r = {n: json.load(open(f"{d}/{n}.json")) for n in ("one", "cp", "one_4096", "cp_4096")}
mib = lambda run: max(run["peak_bytes_per_device"]) / 2**20
diff = max(abs(a - b) for a, b in zip(r["cp"]["loss"], r["one"]["loss"]))
ratio = mib(r["cp_4096"]) / mib(r["one_4096"])
print(f"seq 1024, {len(r['one']['loss'])} steps: max |loss(4 cp) - loss(one device)| = {diff:.2e}")
print(f"  peak per device: one device {mib(r['one']):.1f} MiB, 4 cp {mib(r['cp']):.1f} MiB")
print(f"seq 4096, planned peak per device: one device {mib(r['one_4096']):.1f} MiB, "
      f"4 cp {mib(r['cp_4096']):.1f} MiB ({ratio:.3f} of it)")
print("losses (one device):", " ".join(f"{x:.5f}" for x in r["one"]["loss"]))
sys.exit(0 if diff <= 1e-4 and ratio <= 0.35 else 1)
EOF
