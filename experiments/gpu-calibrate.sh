#!/usr/bin/env bash
# What fixes the GPU protocol (sweeps/table3-gpu.yaml): run on a machine with one CUDA GPU, ~10 minutes.
#   1. throughput: K concurrent trainings of the protocol's base row on the one GPU (K = 1, 2, 4, 6), 300 steps
#      each: aggregate steps/s for each K, which sets --workers-per-gpu;
#   2. learning curves: the base, C1 (N=1) and big trained at once to 3,000 steps (big 3x the base's rate is
#      not needed here: it is the slowest row) with dev PPL every 100 steps: where each flattens (improving
#      by less than 2% over the last 10% of steps) sets train.max_steps.
# Prints one table of each and leaves the runs in $OUT (default results-gpu-calibrate/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/multi30k}
OUT=${OUT:-results-gpu-calibrate}
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
base=(experiments/table3-gpu-base.yaml "data.path=$DATA" "run.results_dir=$OUT" train.accelerator=gpu
      train.progress_bar=false train.num_workers=2 train.threads=2)
"$PY" -m lightning_tfm prepare "${base[@]}" > /dev/null
echo "workers on one GPU | steps/s each | steps/s in all"
for k in 1 2 4 6; do
  t0=$(date +%s.%N)
  for i in $(seq 1 "$k"); do
    "$PY" -m lightning_tfm train "${base[@]}" run.name="tput-k$k-$i" train.max_steps=300 train.val_every_steps=1000 \
      train.checkpoint_every_steps=1000 > "$OUT/tput-k$k-$i.log" 2>&1 &
  done
  wait
  t1=$(date +%s.%N)
  "$PY" -c "import sys; k, s = int(sys.argv[1]), float(sys.argv[2]); print(f'{k:18d} | {300 / s:12.2f} | {k * 300 / s:14.2f}')" "$k" "$(echo "$t1 - $t0" | bc)"
done
for row in "base" "C1 model.layers=1" "big model.d_model=512 model.d_ff=2048 model.heads=8 model.dropout=0.3"; do
  set -- $row
  name=$1; shift
  "$PY" -m lightning_tfm train "${base[@]}" run.name="curve-$name" train.max_steps=3000 "$@" > "$OUT/curve-$name.log" 2>&1 &
done
wait
"$PY" - "$OUT" <<'PY'
import csv, glob, sys
out = sys.argv[1]
print("row  | dev PPL every 500 steps (100 ... 3000) | last-10% improvement")
for name in ("base", "C1", "big"):
    rows = []
    for f in sorted(glob.glob(f"{out}/curve-{name}-*/logs/version_*/metrics.csv")):
        rows += [r for r in csv.DictReader(open(f)) if r.get("dev/ppl")]
    curve = sorted({int(r["step"]): float(r["dev/ppl"]) for r in rows}.items())
    if not curve:
        print(f"{name:4s} | no curve (see {out}/curve-{name}.log)"); continue
    last = curve[-1]
    ref = min(curve, key=lambda sp: abs(sp[0] - 0.9 * last[0]))
    show = " ".join(f"{p:.1f}" for s, p in curve if (s + 1) % 500 == 0 or s == curve[0][0])
    print(f"{name:4s} | {show} | {100 * (ref[1] - last[1]) / ref[1]:.1f}% (steps {ref[0]} -> {last[0]})")
PY
