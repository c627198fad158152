#!/usr/bin/env bash
# The GPT-2 124M shape trained 10 steps on one device, on 2x2x2 (data,
# fsdp, tensor) with tensor parallelism over 'tensor' and FSDP over
# 'fsdp', with sequence parallelism too, and with FSDP alone: the
# parallel runs' losses must equal one device's within 1e-4, and the
# table gives each run's memory per device (parameters + gradients +
# optimizer state, and the planned peak).  Minutes on a small machine.
#   scripts/check-tp-124m.sh [BUILD_DIR] [STEPS]
set -euo pipefail

build=${1:-build}
steps=${2:-10}
spmd="$build/spmd"
[ -x "$spmd" ] || { echo "check-tp-124m: no $spmd (make build first)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

shape=(--layers 12 --dim 768 --heads 12 --vocab 50257 --context 1024 --seq 64 --batch 8
       --steps "$steps" --eval 0 --seed 1)
mesh=(--mesh 2x2x2 --axes data,fsdp,tensor)
run() { # name, flags...
  local name=$1
  shift
  echo "check-tp-124m: $name" >&2
  "$spmd" train "${shape[@]}" "$@" --json "$dir/$name.json" >"$dir/$name.log"
}
run one --devices 1
run tp "${mesh[@]}" --tp tensor --fsdp fsdp
run tp_sp "${mesh[@]}" --tp tensor --sp on --fsdp fsdp
run fsdp "${mesh[@]}" --fsdp fsdp

python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
runs = {n: json.load(open(f"{d}/{n}.json")) for n in ("one", "tp", "tp_sp", "fsdp")}
one = runs["one"]["loss"]
mib = lambda b: max(b) / 2**20
ok = True
print("run      max |loss - one device|   params+grads+state MiB/device   peak MiB/device")
for name, r in runs.items():
    diff = max(abs(a - b) for a, b in zip(r["loss"], one))
    ok &= diff <= 1e-4
    print(f"{name:8s} {diff:26.2e} {mib(r['param_bytes_per_device']):31.1f} {mib(r['peak_bytes_per_device']):17.1f}")
print("losses (one device):", " ".join(f"{x:.5f}" for x in one))
sys.exit(0 if ok else 1)
EOF
