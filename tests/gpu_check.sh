#!/usr/bin/env bash
# make gpu-check: what a GPU user (or a maintainer with a lent GPU machine) runs first. Every step is timed against a
# budget and logged, and a failing step does not stop the later ones; the whole fits BUDGET_S (480 s: 8 minutes).
# Two files come out in $OUT: gpu-check.log (every command and its output) and summary.md (every step's status, time
# and budget, why a step was skipped, and the figures), with the benches' and the Table 3 rows' JSON beside them.
#
# On a lent GPU machine (this workplace's device tool): first, here, in the checkout the device call sends,
#     make gpu-prep          # .gpu-carry/: the wheels its image lacks (tests/gpu/wheels.txt) and the Multi30k copy
# then the device tool's run, with
#     command:   PY=python3 bash tests/gpu_check.sh
#     carry:     [".gpu-carry"]
#     timeout_s: 560         (8 minutes of steps, the summary, and room before the call's limit)
# Nothing is installed there but the wheels, with --no-index --no-deps into a temporary target put first on
# PYTHONPATH; torch and the image's packages are used as they are, and the project runs from the tree (PYTHONPATH).
#
# With CUDA, in this order: install the wheels; check them against the machine's packages (depcheck); import every
# carried module and the project's commands; the CUDA-marked tests; a bf16 smoke training, evaluate and translate
# from its checkpoint; ltfm bench --vs marian at the paper's base shapes (experiments/wmt14-base.yaml) and at the CPU
# protocol's (experiments/table3-cpu-base.yaml): tokens/s, MFU against the measured matmul peak and the card's
# datasheet bf16 peak; a 1-GPU DDP run (Lightning's ddp strategy, NCCL); the GPU protocol's base row and two others
# (sweeps/table3-gpu.yaml, one seed, 300 steps, --workers auto as the protocol packs them) for a trial's time; make
# ablation QUICK=1 with the time left (cut at the deadline: not a failure). A step stopped at its budget still leaves what it
# measured: the Table 3 rows' status gives each trial's steps and time so far.
# Without CUDA, the rehearsal: the same script runs its CPU-side steps (the install from .gpu-carry/wheels into a
# temporary target for CPython 3.12, the depcheck against tests/gpu/device-packages.txt, the imports with a Python
# 3.12 if this machine has one, a 4-step smoke training on the CPU) and lists the GPU steps as skipped, with why.
# Exit 1 when a step failed or ran out of its time, else 0.
#
# Variables: PY (the python with torch; default .venv/bin/python, else python3), DATA (Multi30k; default
# .gpu-carry/multi30k, else ../shared/data/multi30k), OUT (results-gpu-check), WORK (runs; a new temporary folder),
# CARRY (.gpu-carry), BUDGET_S (480), PY312 (the rehearsal's Python 3.12; found when unset, none when empty).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$SECONDS
BUDGET_S=${BUDGET_S:-480}
DEADLINE=$((T0 + BUDGET_S - 10))   # 10 s kept for the summary
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
PY=$(command -v "$PY" || echo "$PY")
case $PY in /*) ;; *) PY=$ROOT/$PY ;; esac
CARRY=${CARRY:-.gpu-carry}
WHEELS=$CARRY/wheels
if [ -z "${DATA:-}" ]; then if [ -f "$CARRY/multi30k/train.en.gz" ]; then DATA=$CARRY/multi30k; else DATA=../shared/data/multi30k; fi; fi
DATA=$(cd "$DATA" 2>/dev/null && pwd || echo "$DATA")
OUT=${OUT:-results-gpu-check}
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/ltfm-gpu-check.XXXXXX")}
SITE=$WORK/site
mkdir -p "$OUT" "$WORK"
log=$OUT/gpu-check.log; summary=$OUT/summary.md; rows=$WORK/steps.tsv
: > "$log"; : > "$rows"
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_SILENT=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
LTFM=("$PY" -m lightning_tfm)

if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  MODE=gpu; NO_GPU=""
else
  MODE=rehearsal
  NO_GPU="no CUDA here: a GPU step"
fi
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "?")

note() { echo "$*" >> "$log"; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$rows"; }   # name status secs budget note
skip() { record "$1" skipped - - "$2"; note "--- $1: skipped: $2"; echo "skipped  $1: $2"; }
step() {  # step NAME BUDGET COMMAND...: at most BUDGET s (less when the deadline is nearer); never stops the script
  local name=$1 budget=$2; shift 2
  local left=$((DEADLINE - SECONDS)) t0=$SECONDS rc status
  local t=$((budget < left ? budget : left))
  if [ "$t" -lt 15 ]; then skip "$name" "no time left ($((left > 0 ? left : 0)) s of the $BUDGET_S s budget)"; return 0; fi
  note "=== $name (budget $t s): $*"
  local from=$(($(wc -l < "$log") + 1))
  timeout -k 10 "$t" "$@" >> "$log" 2>&1; rc=$?
  local secs=$((SECONDS - t0))
  if [ $rc = 0 ]; then status=ok
  elif [ $rc = 124 ] || [ $rc = 137 ]; then  # UNTIL_DEADLINE=1 step ...: a step given the time left may use it up
    if [ -n "${UNTIL_DEADLINE:-}" ]; then status="stopped at the deadline"; else status=timeout; fi
  else status="FAIL (exit $rc)"; fi
  record "$name" "$status" "$secs" "$t" "$( [ $rc = 0 ] || tail -n "+$from" "$log" | grep -v '^[[:space:]]*$' | tail -n 2 | tr '\t\n|' '  /' | cut -c1-200)"
  note "--- $name: $status in $secs s"
  echo "$status  $name ($secs s of $t)"
  return 0
}
INTO=(bash -c 'f=$1; shift; exec "$@" > "$f"' _)  # INTO FILE COMMAND...: COMMAND's stdout into FILE
gpu_step() { if [ -n "$NO_GPU" ]; then skip "$1" "$NO_GPU"; else step "$@"; fi; }

note "gpu-check $MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ); PY=$PY (Python $PYVER); DATA=$DATA; WORK=$WORK; OUT=$OUT"
machine=$("$PY" -c 'import torch
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} device(s); torch {torch.__version__}, CUDA {torch.version.cuda}")
else:
    print(f"no CUDA; torch {torch.__version__}")' 2>>"$log" || echo "torch does not import in $PY")
[ "$MODE" = gpu ] && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >> "$log" 2>&1

# --- the carried wheels: installed, checked, imported
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  for s in "install the carried wheels" "check them against the machine's packages" "import the carried modules"; do
    skip "$s" "no wheels in $WHEELS (make gpu-prep prepares them); PY's own packages are used"
  done
else
  if [ "$PYVER" = 3.12 ]; then target=(); else  # the rehearsal's python is not the target's: name the target
    target=(--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: --platform linux_x86_64)
    for n in $(seq 5 39); do target+=(--platform "manylinux_2_${n}_x86_64"); done
    target+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
  fi
  step "install the carried wheels" 60 "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --no-compile --no-cache-dir --target "$SITE" "${target[@]}" "$WHEELS"/*.whl
  if [ "$MODE" = gpu ]; then
    step "check them against the machine's packages" 30 "$PY" tests/gpu/tools.py depcheck "$WHEELS"
    export PYTHONPATH=$SITE:$PYTHONPATH   # the carried packages first, for every later step
    step "import the carried modules" 60 "$PY" tests/gpu/tools.py imports "$WHEELS"
  else
    step "check them against the machine's packages" 30 "$PY" tests/gpu/tools.py depcheck "$WHEELS" \
      --manifest tests/gpu/device-packages.txt
    if [ -z "${PY312+set}" ]; then
      PY312=""
      for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then PY312=$c; break; fi
      done
    fi
    if [ -n "$PY312" ]; then
      step "import the carried modules" 60 env PYTHONPATH="$SITE:$PYTHONPATH" "$PY312" tests/gpu/tools.py imports "$WHEELS" \
        --manifest tests/gpu/device-packages.txt
    else
      skip "import the carried modules" "no Python 3.12 here to import the cp312 wheels with (PY312=...)"
    fi
  fi
fi

# --- the GPU steps (the rehearsal: a tiny smoke training on the CPU instead)
smoke=("experiments/multi30k-smoke.yaml" "data.path=$DATA" "run.results_dir=$WORK/smoke" "train.progress_bar=false")
if [ -z "$NO_GPU" ]; then
  smoke+=(train.accelerator=gpu train.precision=bf16-mixed)
else
  step "tiny smoke training on the CPU" 120 "${LTFM[@]}" train "${smoke[@]}" train.accelerator=cpu train.max_steps=4 \
    train.warmup=4 train.val_every_steps=4 train.checkpoint_every_steps=4 data.max_dev_pairs=20 decode.max_len_b=5
fi
cuda_tests=$(grep -l 'mark\.cuda' tests/test_*.py | tr '\n' ' ')
gpu_step "CUDA-marked tests" 90 "$PY" -m pytest -q -p no:cacheprovider -m cuda $cuda_tests
gpu_step "smoke training, bf16 on cuda" 90 "${LTFM[@]}" train "${smoke[@]}"
run=$("$PY" -c 'import sys; from lightning_tfm.training.config.config import load_config; from lightning_tfm.training.runs.run_folder import existing_run_id; print(existing_run_id(load_config(sys.argv[1], sys.argv[2:]), others=False))' "${smoke[@]}" 2>>"$log")
gpu_step "evaluate from its checkpoint" 45 "${LTFM[@]}" evaluate "$WORK/smoke/$run" --split val
gpu_step "translate from its checkpoint" 30 bash -c 'echo "A man rides a bike." | "$@"' _ "${LTFM[@]}" translate "$WORK/smoke/$run"
gpu_step "bench vs Marian, the paper's base shapes" 75 "${INTO[@]}" "$WORK/bench-base.json" "${LTFM[@]}" bench --vs marian \
  --device cuda --json --config experiments/wmt14-base.yaml bench.batch=128
gpu_step "bench vs Marian, the CPU protocol's shapes" 45 "${INTO[@]}" "$WORK/bench-cpu-shapes.json" "${LTFM[@]}" bench \
  --vs marian --device cuda --json --config experiments/table3-cpu-base.yaml bench.batch=128
gpu_step "1-GPU DDP run (Lightning ddp strategy)" 90 "${LTFM[@]}" train "${smoke[@]}" "run.results_dir=$WORK/ddp" \
  train.strategy=ddp train.devices=1
# 300 steps a row, so that the rows end inside the step and give a trial's time: at the protocol's 2,000 none ended
# in 150 s on the H200 (reports/gpu.md)
t3=("$WORK/table3-timing.yaml" "data.path=$DATA" "run.results_dir=$WORK/table3" train.max_steps=300)
if [ -z "$NO_GPU" ] && "$PY" tests/gpu/tools.py rows sweeps/table3-gpu.yaml "$WORK/table3-timing.yaml" base C1 C5 >> "$log" 2>&1; then
  step "Table 3 GPU rows base, C1, C5 (one seed, --workers auto)" 150 "${LTFM[@]}" sweep "${t3[@]}" --workers auto --every 20
  step "their status" 30 "${INTO[@]}" "$WORK/table3-status.json" "${LTFM[@]}" sweep "${t3[@]}" --status --json
else
  gpu_step "Table 3 GPU rows base, C1, C5 (one seed, --workers auto)" 150 false
fi
if [ -z "$NO_GPU" ]; then  # make's venv: wrappers of PY (a venv made from PY would lose the image's torch)
  mkdir -p "$WORK/env/bin"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$WORK/env/bin/python"
  printf '#!/bin/sh\nexec "%s" -m lightning_tfm "$@"\n' "$PY" > "$WORK/env/bin/ltfm"
  chmod +x "$WORK/env/bin/python" "$WORK/env/bin/ltfm"; touch "$WORK/env/.installed"
fi
UNTIL_DEADLINE=1 gpu_step "make ablation QUICK=1 (the time left)" 100000 make --no-print-directory ablation QUICK=1 VENV="$WORK/env" DATA="$DATA"

# --- the summary page
wall=$((SECONDS - T0))
cp "$WORK"/bench-*.json "$WORK"/table3-status.json "$OUT"/ 2>/dev/null
{
  echo "# gpu-check: $MODE"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $machine;"
  echo "Python $PYVER ($PY); wall time $wall s of the $BUDGET_S s budget; log: gpu-check.log"
  [ -n "$NO_GPU" ] && echo && echo "A rehearsal: torch.cuda.is_available() is False in $PY, so only the CPU-side steps ran."
  echo
  echo "| step | status | time s | budget s | note |"
  echo "| --- | --- | --- | --- | --- |"
  awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}' "$rows"
  echo
  echo "## Figures"
  echo
  "$PY" tests/gpu/tools.py figures "$WORK" 2>>"$log" || echo "(no figures: see the log)"
} > "$summary"
cat "$summary"
rm -rf "$SITE"   # the installed wheels (~150 MB): the runs stay in $WORK
if cut -f2 "$rows" | grep -qE '^(FAIL|timeout)'; then exit 1; fi
exit 0
