"""base/memory.py: with ``keep_freed_memory()`` a training step's freed blocks stay with the process for the next
step, and the step computes the same numbers (a process each: glibc's thresholds are process-wide and cannot be
unset). The checks read glibc's own accounting (``mallinfo2``), not page faults: how many pages the kernel faults
in depends on the machine (transparent huge pages, other processes), what malloc holds does not. The faults a step
saves are measured in ``reports/timing.md``."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

STEP = """
import ctypes, json, sys, torch
from lightning_tfm.base.memory import keep_freed_memory
from lightning_tfm.bench.speed import DEFAULTS, build_ours, make_train_step

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33)
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def held():  # bytes of heap malloc holds from the OS; mmapped blocks (count, bytes)
    m = libc.mallinfo2()
    return {"heap": m.arena, "mmapped": m.hblks, "mmapped_bytes": m.hblkhd}

kept = keep_freed_memory() if sys.argv[1] == "keep" else None
# a 16 MiB block: from glibc's heap where the thresholds are fixed, from a fresh mmap (above the default threshold,
# which only rises to the largest block freed so far) where they are not
before = held()
probe = torch.ones(4 * 2**20)
during = held()
del probe
torch.set_num_threads(1)
# the protocol's model (experiments/table3-cpu-base.yaml) at the bench's batch of 128 x 20 tokens
s = dict(DEFAULTS, d_model=128, d_ff=512, heads=4, batch=128, src_len=20, tgt_len=20)
model = build_ours(s).train()
step = make_train_step("ours", model, s, "fp32")
after_step = []
for i in range(7):
    step()
    after_step.append(held())
print(json.dumps({"kept": kept, "probe_mmapped": during["mmapped_bytes"] - before["mmapped_bytes"],
                  "after_step": after_step[2:],  # the first steps allocate Adam's state and the loss's buffer
                  "weights": [float(p.double().sum()) for p in model.parameters()]}))
"""


def _steps(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEP, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or platform.libc_ver()[1] < "2.33",
                    reason="the C library is not glibc >= 2.33 (mallinfo2): nothing is set or readable")
def test_a_steps_freed_memory_is_kept_and_its_numbers_are_the_same():
    kept, plain = _steps("keep"), _steps("plain")
    assert kept["kept"] is True
    # the thresholds are what decides: a 16 MiB block is mmapped (and unmapped when freed) by default, heap when kept
    assert plain["probe_mmapped"] >= 16 * 2**20, plain["probe_mmapped"]
    assert kept["probe_mmapped"] == 0, kept["probe_mmapped"]
    # kept: from the third step on nothing goes back to the OS: the heap never shrinks (no trim) and no block is
    # mmapped or unmapped (the fused loss's kept buffer, above glibc's largest threshold, stays mapped throughout)
    heap = [h["heap"] for h in kept["after_step"]]
    assert heap == sorted(heap), heap
    assert len({(h["mmapped"], h["mmapped_bytes"]) for h in kept["after_step"]}) == 1, kept["after_step"]
    assert kept["weights"] == plain["weights"]  # where memory comes from changes no number: the same weights
