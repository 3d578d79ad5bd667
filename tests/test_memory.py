"""base/memory.py: with ``keep_freed_memory()`` a training step's freed blocks come back without page faults, and the
step computes the same numbers (a process each: glibc's thresholds are process-wide and cannot be unset)."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys

import pytest

STEP = """
import json, resource, sys, torch
from lightning_tfm.base.memory import keep_freed_memory
from lightning_tfm.bench.speed import DEFAULTS, build_ours, make_train_step
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)
# the protocol's model (experiments/table3-cpu-base.yaml) at the bench's batch of 128 x 20 tokens (at 64 x 15, since
# the fused loss allocates no logits per chunk, glibc's own thresholds faulted too few pages for a clear margin)
s = dict(DEFAULTS, d_model=128, d_ff=512, heads=4, batch=128, src_len=20, tgt_len=20)
model = build_ours(s).train()
step = make_train_step("ours", model, s, "fp32")
faults = []
for i in range(7):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults[2:],  # the first steps allocate Adam's state and the loss's buffer
                  "weights": [float(p.double().sum()) for p in model.parameters()]}))
"""


def _steps(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEP, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc: nothing is set")
def test_a_steps_freed_memory_is_kept_and_its_numbers_are_the_same():
    kept, plain = _steps("keep"), _steps("plain")
    assert kept["kept"] is True
    # a step at these shapes frees tens of MB; glibc's own thresholds hand thousands of its pages back to the OS and
    # fault them in again on the next step (reports/timing.md: 7,600 a step at the bench's 128 x 20 batch)
    assert statistics.median(plain["faults"]) > 3000, plain["faults"]
    # kept: a few a step alone, some hundreds beside other processes (the full suite's second worker)
    assert statistics.median(kept["faults"]) * 4 < statistics.median(plain["faults"]), (kept["faults"], plain["faults"])
    assert kept["weights"] == plain["weights"]  # where memory comes from changes no number: the same weights

