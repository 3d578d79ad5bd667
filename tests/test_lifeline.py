"""A sweep's trial dies with its worker (:mod:`lightning_tfm.base.lifeline`): real processes and signals. A
child started with :func:`~lightning_tfm.base.lifeline.tie`'s environment is killed when its parent is
SIGKILLed; one whose parent died before it could ask is killed at once; its own children are not tied to it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

CHILD = ("import os, sys, time; from lightning_tfm.base.lifeline import PARENT_ENV, hold_on; hold_on(); "
         "print(os.getpid(), PARENT_ENV in os.environ, flush=True); time.sleep(600)")
PARENT = ("import os, subprocess, sys; from lightning_tfm.base.lifeline import tie; "
          f"c = subprocess.Popen([sys.executable, '-c', {CHILD!r}], env=tie(dict(os.environ))); "
          "c.wait()")


def gone(pid: int, patience: float = 60.0) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``patience`` seconds: it waits for the event, no race."""
    end = time.monotonic() + patience
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_tied_child_dies_when_its_parent_is_killed_and_does_not_tie_its_own_children():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env())
    try:
        pid, tied = parent.stdout.readline().split()
        assert tied == "False"  # the variable is removed: Lightning's ranks, started by this child, are not tied
        assert not gone(int(pid), patience=0.5)  # alive while its parent lives
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=60)
        assert gone(int(pid)), "the tied child outlived its killed parent"
    finally:
        parent.kill()


def test_a_child_whose_parent_died_before_it_asked_dies_at_once():
    from lightning_tfm.base.lifeline import PARENT_ENV

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**env(), PARENT_ENV: "1"})  # its parent is this test, not pid 1
    assert child.wait(timeout=60) == -signal.SIGKILL


def test_an_untied_child_is_left_alone():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env())
    try:
        pid, _ = child.stdout.readline().split()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
