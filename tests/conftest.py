"""Shared fixtures: the corpus (Multi30k beside the checkout, else the toy corpus of tests/data), and one smoke
training reused by many tests.

Tests that train through real subprocesses (or use a fixture that does) are marked ``slow``: ``make test``
runs everything, ``make test-fast`` (``pytest -m "not slow"``) the rest, in a few minutes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Multi30k: ../shared/data/multi30k beside the checkout (LTFM_DATA=folder: another copy), as CI and the team have it.
MULTI30K = Path(os.environ.get("LTFM_DATA", ROOT.parent / "shared" / "data" / "multi30k"))
HAS_MULTI30K = (MULTI30K / "train.en.gz").is_file()
#: The toy corpus committed in tests/data (tests/data/make_corpus.py wrote it): Multi30k's file names and languages,
#: a thousand synthetic training pairs. Where Multi30k is absent (a fresh clone, LTFM_DATA=/nonexistent) the tests
#: run on it: ``make test-fast`` passes there, and the tests that need Multi30k itself (``multi30k``) are skipped.
TOY_DATA = ROOT / "tests" / "data"
#: The suite's corpus (``data_dir``): Multi30k where it is, else the toy corpus.
DATA = MULTI30K if HAS_MULTI30K else TOY_DATA
SMOKE = ROOT / "experiments" / "multi30k-smoke.yaml"
#: What commands write by default, relative to the folder they run in (run.results_dir, the data cache beside it,
#: the report's --out, W&B's folder, make's QUICK, gpu-check and soak outputs). No test reads or writes the
#: checkout's own: the session runs in a stand-in of the checkout (:func:`stand_in`), and :func:`checkout_untouched`
#: fails the session if any of these changed in the checkout.
OUTPUTS = ("results", "results-quick", "data-cache", "reports/build", "wandb", "soak-out", "results-gpu-check",
           "results-gpu-calibrate")
#: The session's working folder (:func:`stand_in`); ROOT until the session starts.
WORK = ROOT


def stand_in(folder: Path) -> Path:
    """``folder`` made a stand-in of the checkout for commands run from it: a link to each file and folder of the
    checkout (experiments/, sweeps/, reports/reference/, ...) except the OUTPUTS, which are its own, with a decoy in
    results/ (:func:`plant_decoy`): the run the README's first ``ltfm train`` leaves in a new user's checkout. A
    test that reads the default results folder meets it; a test that writes there writes here."""
    own = {o.split("/")[0] for o in OUTPUTS}
    for entry in ROOT.iterdir():
        if entry.name not in own | {".git", ".pytest_cache"}:
            (folder / entry.name).symlink_to(entry)
    for top in own & {o.split("/")[0] for o in OUTPUTS if "/" in o}:  # reports/: its committed part linked
        (folder / top).mkdir()
        for entry in (ROOT / top).iterdir() if (ROOT / top).is_dir() else ():
            if f"{top}/{entry.name}" not in OUTPUTS:
                (folder / top / entry.name).symlink_to(entry)
    plant_decoy(folder / "results")
    return folder


def plant_decoy(results: Path) -> Path:
    """A finished run as ``ltfm train experiments/multi30k-smoke.yaml data.path=<the suite's data>`` leaves it in
    ``results`` (its config.yaml and a completed summary.json: what a sweep, a dry run or a report finds a run
    by); returns its folder."""
    from lightning_tfm.training.config import config
    from lightning_tfm.training.config import run_id as run_ids

    cfg = config.load_config(SMOKE, {"data.path": str(DATA)}, checked=False)
    rid = run_ids.run_id(cfg)
    run = results / rid
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config.saved_yaml(cfg))
    (run / "summary.json").write_text(json.dumps({
        "run_id": rid, "status": "completed", "run_dir": str(run), "config": cfg.to_dict(),
        "steps": cfg.train.max_steps, "dev_loss": 9.0, "dev_ppl": 8103.1, "note": "a decoy: tests/conftest.py"}))
    return run


def snapshot(root: Path = ROOT) -> dict[str, int]:
    """Every path under ``root``'s OUTPUTS with its modification time (ns): what :func:`checkout_untouched`
    compares."""
    seen = {}
    for out in OUTPUTS:
        top = root / out
        if top.is_dir() or top.is_symlink():
            seen[out] = top.lstat().st_mtime_ns
            for folder, dirs, files in os.walk(top):
                for name in dirs + files:
                    path = Path(folder, name)
                    try:
                        seen[str(path.relative_to(root))] = path.lstat().st_mtime_ns
                    except FileNotFoundError:
                        pass
        elif top.exists():
            seen[out] = top.lstat().st_mtime_ns
    return seen


def changes(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """What differs between two snapshots (:func:`snapshot`), one line a path: new, gone, modified."""
    out = [f"new: {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"gone: {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"modified: {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out


@pytest.fixture(scope="session", autouse=True)
def checkout_untouched(tmp_path_factory):
    """The session runs in a stand-in of the checkout (:func:`stand_in`: the process's working folder, ``ltfm``'s
    and ``ltfm_here``'s); at its end the checkout's OUTPUTS must be as they were, else the session fails naming
    what changed (a test wrote a results, data-cache, reports/build or W&B folder of the checkout)."""
    global WORK
    before = snapshot()
    previous, WORK = Path.cwd(), stand_in(tmp_path_factory.mktemp("checkout"))
    os.chdir(WORK)
    yield WORK
    os.chdir(previous)
    WORK = ROOT
    changed = changes(before, snapshot())
    if changed:
        pytest.fail(f"a test changed the checkout's own output folders ({', '.join(OUTPUTS)}); tests write under "
                    f"tmp_path (run.results_dir=..., --out, WANDB_DIR): {'; '.join(changed[:20])}"
                    + (f" and {len(changed) - 20} more" if len(changed) > 20 else ""), pytrace=False)


def ltfm(*args, env=None, input=None, timeout=600, cwd=None):
    """Run the real CLI in a process of its own, as a user runs it (``python -m lightning_tfm ARGS``, a new
    interpreter); returns CompletedProcess (text). It runs in ``cwd``, by default the session's stand-in of the
    checkout (``WORK``). For a one-line error, a dry run or a status check, ``ltfm_here`` is faster."""
    e = dict(os.environ)
    e.setdefault("WANDB_MODE", "offline")
    e.setdefault("WANDB_SILENT", "true")
    e.update(env or {})
    return ltfm_in(e, *args, input=input, timeout=timeout, cwd=cwd)


def ltfm_in(e: dict, *args, input=None, timeout=600, cwd=None):
    """:func:`ltfm` in exactly the environment ``e`` (nothing added)."""
    return subprocess.run([sys.executable, "-m", "lightning_tfm", *map(str, args)], capture_output=True, text=True,
                          env=e, input=input, timeout=timeout, cwd=cwd or WORK)


def default_signals() -> None:
    """A child's ``preexec_fn``: SIGINT, SIGHUP and SIGTERM as a terminal delivers them (their default action), so a
    test that signals a command tests its handlers even when the suite itself runs with them ignored (``nohup``,
    a background job of a non-interactive shell: the command then keeps them ignored, as it should)."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.fixture
def ltfm_here(capfd, monkeypatch):
    """conftest's ``ltfm`` in this process (``cli.main``): the same CompletedProcess (exit code, stdout and stderr
    at the file descriptors) from the same folder (the session's stand-in of the checkout, or where the test went)
    unless ``cwd``, ``input`` as stdin, ``env`` added to the environment for that command. What a command may
    change in its process is put back: signal handlers, torch's threads, the environment, the folder, logging,
    datasets' progress bars."""
    import io
    import logging

    import torch

    from lightning_tfm import cli

    def bars_off():
        return "datasets.utils.tqdm" in sys.modules and sys.modules["datasets.utils.tqdm"].are_progress_bars_disabled()

    monkeypatch.chdir(WORK)
    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))
    monkeypatch.setenv("WANDB_SILENT", os.environ.get("WANDB_SILENT", "true"))
    sigs = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    kept = (torch.get_num_threads(), dict(os.environ), logging.raiseExceptions, logging.getLogger("optuna").level,
            bars_off())

    def run(*args, input="", env=None, cwd=None):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(input.encode())))
        before, here = dict(os.environ), os.getcwd()
        os.environ.update(env or {})  # this command's only, as a process's environment and folder are
        os.chdir(cwd or here)
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse's --help and usage errors: the exit code `python -m` gives
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            os.environ.clear()
            os.environ.update(before)
            os.chdir(here)
        return subprocess.CompletedProcess(args, code, *capfd.readouterr())

    yield run
    for s, handler in sigs.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    threads, env, logging.raiseExceptions, optuna_level, bars = kept
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(env)
    logging.getLogger("optuna").setLevel(optuna_level)
    if bars_off() and not bars:
        sys.modules["datasets.utils.tqdm"].enable_progress_bars()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The suite's corpus folder (``DATA``): Multi30k where it is beside the checkout, else the toy corpus."""
    return DATA


@pytest.fixture(scope="session")
def multi30k() -> Path:
    """Multi30k's folder, for a test that needs the real corpus (figures measured on it, its run ids); the test is
    skipped, saying so, where Multi30k is absent."""
    if not HAS_MULTI30K:
        pytest.skip(f"needs Multi30k itself, not found at {MULTI30K} (the toy corpus of tests/data stands in for "
                    f"the other tests): put it at ../shared/data/multi30k or set LTFM_DATA")
    return MULTI30K


def once_per_session(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)`` run once per test session, however many pytest-xdist workers ask: the first one builds
    in the session's shared temporary folder under a file lock, the others wait for it and reuse what it wrote.
    Without xdist, a folder of this process. Tests must not write into it (they copy what they change)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / name  # the session's folder, above popen-gw*
    with FileLock(str(shared) + ".lock"):
        if not (shared / ".done").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            build(shared)
            (shared / ".done").write_text(worker + "\n")
    return shared


def _smoke_training(folder: Path, data_dir: Path) -> None:
    results, wandb_dir = folder / "results", folder / "wandb"
    results.mkdir()
    wandb_dir.mkdir()
    p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", env={"WANDB_DIR": str(wandb_dir)})
    assert p.returncode == 0, p.stderr[-3000:]
    (folder / "train.stderr").write_text(p.stderr)  # what it said (tests/test_guidance.py)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, data_dir) -> Path:
    """One real smoke training (CLI, subprocess), once per test session (:func:`once_per_session`); returns its
    run folder, which tests read or copy (``copy_run``), never change."""
    folder = once_per_session(tmp_path_factory, "smoke-run", lambda f: _smoke_training(f, data_dir))
    (run_dir,) = [d for d in (folder / "results").iterdir() if d.is_dir()]
    return run_dir


# The report tests' sweep (tests/test_report.py, tests/test_dashboards.py): trainings of a few seconds, the
# report is what is tested (sweeps are tested in test_sweep.py).
TINY = {"wandb.mode": "offline", "train.threads": 1, "data.max_train_pairs": 300, "data.max_dev_pairs": 30,
        "data.vocab_size": 200, "data.test_split": None, "model.layers": 1, "model.d_model": 32, "model.d_ff": 64,
        "model.heads": 2, "model.d_k": 16, "model.d_v": 16, "train.batch_tokens": 512, "train.warmup": 10,
        "train.max_steps": 20, "train.val_every_steps": 10, "train.checkpoint_every_steps": 10,
        "train.log_every_steps": 5, "decode.beam_size": 1, "decode.max_len_b": 10}
VARIANTS = {
    "prenorm": {"family": "norm", "model.norm": "pre"},    # a row the paper does not have: after the paper's
    "A1": {"model.heads": 1, "model.d_k": 32, "model.d_v": 32},
    "base": {},
    "odd": {"model.d_model": 33},                          # cannot be built: skipped
    "crash": {"data.max_tokens_per_sentence": 1},          # its training fails (no pair fits)
}


def write_sweep(path: Path, name: str, variants: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": name, "experiment": str(SMOKE), "metric": "dev_loss", "pruner": {"type": "none"}, "seeds": [1],
        "heartbeat": {"interval": 2, "grace": 10, "max_retry": 1}, "overrides": TINY, "variants": variants},
        sort_keys=False))
    return path


def _sweep_for_reports(tmp: Path, data_dir: Path) -> dict:
    results = tmp / "results"
    sweep = write_sweep(tmp / "rep.yaml", "rep", VARIANTS)
    p = ltfm("sweep", sweep, f"data.path={data_dir}", f"run.results_dir={results}")
    assert p.returncode in (0, 1), p.stdout[-3000:] + p.stderr[-3000:]  # 1: a trial failed (crash)
    assert "3 completed, 0 pruned, 1 failed, 1 skipped" in p.stdout, p.stdout
    (tmp / "sweep.stderr").write_text(p.stderr)  # what it said (tests/test_guidance.py)
    write_sweep(sweep, "rep", {**VARIANTS, "D1": {"model.dropout": 0.0}})
    return {"tmp": tmp, "sweep": sweep, "results": results}


@pytest.fixture(scope="session")
def swept(tmp_path_factory, data_dir):
    """A real sweep of five rows (three trained, one unbuildable, one failing); then the sweep file gains a
    row that was never run (D1). Trained once per test session (:func:`once_per_session`). Tests that write into
    its results copy what they change."""
    shared = once_per_session(tmp_path_factory, "report-sweep", lambda f: _sweep_for_reports(f, data_dir))
    return {"tmp": shared, "sweep": shared / "rep.yaml", "results": shared / "results"}


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
# The longest test files, collected first (longest processing time first): `make test` hands whole files to its two
# pytest-xdist workers in collection order (--dist loadfile --no-loadscope-reorder), so a long file collected last
# leaves the other worker idle at the end. The order: each file's summed test times, measured with
# `make test PYTEST_ARGS=--durations=0` (reports/timing.md, "The test suite").
LONGEST_FIRST = ("test_sweep.py", "test_settle.py", "test_report.py", "test_slurm.py", "test_taken_over.py",
                 "test_faults.py", "test_dashboards.py", "test_report_safety.py", "test_tracking.py",
                 "test_distributed.py", "test_stop_resume.py", "test_compare.py", "test_figures.py",
                 "test_sweep_ctrl_c.py", "test_prepare.py", "test_budget_reads.py", "test_checkpoint_links.py")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


# The optional tests, by marker (pyproject.toml declares the markers): each is skipped, with the reason, where what
# it needs is missing. Long end-to-end tests are marked `long` on the tests themselves (make test leaves them out).
OPTIONAL = {
    "cuda": (_has_cuda, "needs a CUDA GPU (torch.cuda.is_available() is False); make gpu-check runs these"),
    "marian": (_has_transformers, "needs Hugging Face transformers, which the test environment leaves out: "
                                  "make bench runs these (or pip install -e '.[bench]')"),
}


def pytest_collection_modifyitems(config, items):
    for marker, (available, reason) in OPTIONAL.items():
        marked = [item for item in items if item.get_closest_marker(marker)]
        if marked and not available():
            for item in marked:
                item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:  # a long test is slow too (make test-fast leaves it out)
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("long"):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its tests' order


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size_kb) -> a fresh tmpfs folder of that size; unmounted at the end."""
    mounted = []

    def mount(size_kb: int, name: str = "small") -> Path:
        d = tmp_path / name
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(d)], capture_output=True,
                           text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {p.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)
