#!/usr/bin/env bash
# What fixes the GPU protocol (sweeps/table3-gpu.yaml): run on a machine with one CUDA GPU.
#   1. throughput: K concurrent trainings of the protocol's base row on the one GPU (K = 1, 2, 4, 6), 1,000 steps
#      each: aggregate steps/s for each K (wall time, each training's start-up included), which sets
#      --workers-per-gpu;
#   2. learning curves: the base, C1 (N=1) and big trained at once to 3,000 steps (big 3x the base's rate is
#      not needed here: it is the slowest row) with dev PPL every 100 steps: where each flattens (improving
#      by less than 2% over the last 10% of steps) sets train.max_steps.
# Prints one table of each and leaves the runs in $RUNS (default results-gpu-calibrate/; not $OUT, which the lent GPU
# machines' device tool sets to the folder that comes back: at most 8 files). DATA: the Multi30k copy make gpu-prep
# leaves in .gpu-carry/multi30k where there is one (../shared does not travel), else ../shared/data/multi30k.
# ACCEL, KS, TPUT_STEPS, CURVE_STEPS, VAL shrink it for a dry run of the script itself on a CPU, e.g.
#   ACCEL=cpu KS="1 2" TPUT_STEPS=5 CURVE_STEPS=20 VAL=10 bash experiments/gpu-calibrate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -z "${DATA:-}" ]; then if [ -f .gpu-carry/multi30k/train.en.gz ]; then DATA=.gpu-carry/multi30k; else DATA=../shared/data/multi30k; fi; fi
RUNS=${RUNS:-results-gpu-calibrate}
ACCEL=${ACCEL:-gpu} KS=${KS:-1 2 4 6} TPUT_STEPS=${TPUT_STEPS:-1000} CURVE_STEPS=${CURVE_STEPS:-3000} VAL=${VAL:-100}
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p "$RUNS"
waitall() {  # wait for every background training; stop at one that failed, naming its log
  local failed=0
  for pid in "$@"; do wait "$pid" || failed=1; done
  if [ "$failed" = 1 ]; then echo "gpu-calibrate: a training failed: see the logs in $RUNS" >&2; exit 1; fi
}
base=(experiments/table3-gpu-base.yaml "data.path=$DATA" "run.results_dir=$RUNS" "train.accelerator=$ACCEL"
      train.progress_bar=false train.num_workers=2 train.threads=2)
"$PY" -m lightning_tfm prepare "${base[@]}" > /dev/null
echo "workers on one GPU | steps/s each | steps/s in all"
for k in $KS; do
  t0=$(date +%s.%N)
  pids=()
  for i in $(seq 1 "$k"); do
    "$PY" -m lightning_tfm train "${base[@]}" run.name="tput-k$k-$i" "train.max_steps=$TPUT_STEPS" train.val_every_steps=100000 \
      train.checkpoint_every_steps=100000 > "$RUNS/tput-k$k-$i.log" 2>&1 &
    pids+=($!)
  done
  waitall "${pids[@]}"
  t1=$(date +%s.%N)
  "$PY" -c "import sys; k, s = int(sys.argv[1]), float(sys.argv[3]) - float(sys.argv[2]); n = int(sys.argv[4]); print(f'{k:18d} | {n / s:12.2f} | {k * n / s:14.2f}')" "$k" "$t0" "$t1" "$TPUT_STEPS"
done
pids=()
for row in "base" "C1 model.layers=1" "big model.d_model=512 model.d_ff=2048 model.heads=8 model.dropout=0.3"; do
  set -- $row
  name=$1; shift
  "$PY" -m lightning_tfm train "${base[@]}" run.name="curve-$name" "train.max_steps=$CURVE_STEPS" "train.val_every_steps=$VAL" "$@" > "$RUNS/curve-$name.log" 2>&1 &
  pids+=($!)
done
waitall "${pids[@]}"
"$PY" - "$RUNS" <<'PY'
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
