#!/usr/bin/env bash
# make gpu-check: what a GPU user (or a maintainer with a lent GPU) runs first. Each step must pass before the
# next; one log ($OUT/gpu-check.log) and a summary of the figures ($OUT/gpu-check-summary.txt). Where torch sees
# no CUDA GPU it says so in one line and exits 0 (a skip, not a pass of anything).
#   1. the test suite's CUDA-marked tests (pytest -m cuda)
#   2. a smoke training in bf16 on cuda, then evaluate and translate from its checkpoint
#   3. a 1-GPU DDP run (the NCCL path)
#   4. ltfm bench --vs marian on the GPU (tokens/s, sentences/s, peak memory, MFU against the measured bf16 peak)
#   5. make ablation QUICK=1 (the GPU protocol's pipeline at 20 steps a row)
# Variables: PY (the environment's python), DATA (Multi30k folder), OUT (where logs and runs go);
# DEVICE=cpu runs every step on the CPU instead (no skip): a dry run of this script itself, with e.g.
# BENCH_ARGS="bench.batch=16 bench.reps=1" to keep the benchmark short there.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/multi30k}
OUT=${OUT:-results-gpu-check}
LTFM=("$PY" -m lightning_tfm)
DEVICE=${DEVICE:-cuda}
BENCH_ARGS=${BENCH_ARGS:-bench.batch=256}
if [ "$DEVICE" = cuda ]; then ACCEL=gpu; PRECISION=bf16-mixed; else ACCEL=cpu; PRECISION=auto; fi
if [ "$DEVICE" = cuda ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: skipped: torch sees no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with one"
  exit 0
fi
mkdir -p "$OUT"
log="$OUT/gpu-check.log"; summary="$OUT/gpu-check-summary.txt"
: > "$log"; : > "$summary"
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_SILENT=true PYTHONUNBUFFERED=1
say() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME COMMAND...: run it into the log; stop at the first failure
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*" >> "$log"
  if "$@" >> "$log" 2>&1; then
    say "ok    $name ($((SECONDS - t0)) s)"
  else
    say "FAIL  $name ($((SECONDS - t0)) s): see $log"; exit 1
  fi
}
say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$DEVICE" = cuda ]; then
  say "$("$PY" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} device(s); torch {torch.__version__}, CUDA {torch.version.cuda}")')"
  step "CUDA-marked tests" "$PY" -m pytest -q -m cuda tests
else
  say "DEVICE=$DEVICE: a dry run of the script on the CPU (no CUDA test, nothing measured for a GPU)"
fi
smoke=("experiments/multi30k-smoke.yaml" "data.path=$DATA" "run.results_dir=$OUT/results" "train.accelerator=$ACCEL"
       "train.precision=$PRECISION" "train.progress_bar=false")
step "smoke training, $PRECISION on $DEVICE" "${LTFM[@]}" train "${smoke[@]}"
run=$("$PY" -c 'import sys; from lightning_tfm.training.config import load_config, run_id; print(run_id(load_config(sys.argv[1], sys.argv[2:])))' "${smoke[@]}")
step "evaluate from its checkpoint" "${LTFM[@]}" evaluate "$OUT/results/$run" --split val
step "translate from its checkpoint" bash -c "echo 'A man rides a bike.' | ${LTFM[*]} translate $OUT/results/$run"
step "1-device DDP run on $DEVICE" "${LTFM[@]}" train "${smoke[@]}" train.strategy=ddp train.devices=1
step "ltfm bench --vs marian on $DEVICE" bash -c "${LTFM[*]} bench --vs marian --device $DEVICE --json $BENCH_ARGS > $OUT/bench.json"
step "make ablation QUICK=1" make ablation QUICK=1 DATA="$DATA"
# the figures
"$PY" - "$OUT" "$run" <<'PY' | tee -a "$summary"
import json, sys
out, run = sys.argv[1], sys.argv[2]
s = json.load(open(f"{out}/results/{run}/summary.json"))
print(f"smoke run: precision {s['precision']}, {s['steps']} steps, dev ppl {s['dev_ppl']:.2f}, dev BLEU {s.get('dev_bleu')}, "
      f"{s['tokens_per_s']:.0f} tokens/s, dev decoding {s.get('dev_decode_sentences_per_s')} sentences/s")
b = json.load(open(f"{out}/bench.json"))
print(f"bench ({b['device_name']}, batch {b['settings']['batch']}x{b['settings']['src_len']}): matmul peak "
      + ", ".join(f"{k} {v / 1000:.0f} TFLOP/s" if v >= 1000 else f"{k} {v:.0f} GFLOP/s"
                  for k, v in b["matmul_peak_gflops"].items()))
for kind in ("ours", "marian"):
    for dt, v in b[kind].items():
        print(f"  {kind:6s} {dt}: train {v['train_tokens_per_s']:.0f} tok/s, decode {v['decode_sentences_per_s']:.1f} "
              f"sent/s, peak {v['peak_memory_mb']:.0f} MB, MFU {v['mfu']:.1%}")
for dt, sp in b.get("speedup", {}).items():
    print(f"  ours / marian, {dt}: training {sp['train']:.2f}x, decoding {sp['decode']:.2f}x")
PY
say "gpu-check passed: log $log"
