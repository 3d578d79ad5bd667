"""Shared fixtures: the real Multi30k data beside the checkout, and one smoke training reused by many tests.

Tests that train through real subprocesses (or use a fixture that does) are marked ``slow``: ``make test``
runs everything, ``make test-fast`` (``pytest -m "not slow"``) the rest, in a few minutes.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LTFM_DATA", ROOT.parent / "shared" / "data" / "multi30k"))
SMOKE = ROOT / "experiments" / "multi30k-smoke.yaml"


def ltfm(*args, env=None, input=None, timeout=600, cwd=None):
    """Run the real CLI in a subprocess; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.setdefault("WANDB_MODE", "offline")
    e.setdefault("WANDB_SILENT", "true")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "lightning_tfm", *map(str, args)], capture_output=True, text=True,
                          env=e, input=input, timeout=timeout, cwd=cwd or ROOT)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "train.en.gz").is_file():
        pytest.fail(f"Multi30k not found at {DATA}: CI runs with ../shared beside the checkout (or set LTFM_DATA)")
    return DATA


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, data_dir) -> Path:
    """One real smoke training (CLI, subprocess); returns its run folder."""
    results = tmp_path_factory.mktemp("smoke-results")
    wandb_dir = tmp_path_factory.mktemp("smoke-wandb")
    p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", env={"WANDB_DIR": str(wandb_dir)})
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in results.iterdir() if d.is_dir()]
    return run_dir


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread, and the CPU is shared (tests of the model and decoding)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# Fixtures that train a model in a subprocess (or start a database server): a test using one is slow.
SLOW_FIXTURES = {"smoke_run", "swept", "ddp_and_single", "run_dir", "postgres", "pg_url"}


def pytest_collection_modifyitems(config, items):
    import torch

    no_cuda = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False); make gpu-check runs these")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
