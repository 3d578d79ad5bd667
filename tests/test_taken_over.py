"""A worker whose trial another worker took over, at any write (issue #66): the study fails a trial as stale when
its heartbeat lapses (the storage unreachable past the grace, the worker stopped) and queues its retry; every write
the worker then makes for that trial finds it finished. Proven for every write, not for the ones known today: a
storage that is the real one but for one thing, the k-th write this worker makes for a trial it holds first finds
the trial failed as stale by another worker (Optuna's ``fail_stale_trials``, its retry queued by the study's
callback). For every k the worker says the one line, goes on to the retry, and the study ends with one COMPLETE
trial for the row, its run's result recorded. No sleeps, no timing: the k-th write is counted, not timed.

The row's run folder is trained once (the fixture); each case copies it, so its trial processes find the run
completed and return its summary: the worker makes the same writes as for a trial that trains."""
from __future__ import annotations

import copy
import io
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from lightning_tfm.sweep import Plan, load_sweep, open_storage, open_study
from lightning_tfm.sweep.storage import RESUME_STEP, RetryWhileProgressing
from lightning_tfm.sweep.worker import Worker

from pg import pg_url, postgres  # noqa: F401  (fixtures)
from test_sweep import TINY, write_sweep

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

TRIAL_WRITES = ("set_trial_param", "_set_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
                "set_trial_user_attr", "set_trial_system_attr")
HEARTBEAT = "heartbeat"  # the case in which the take-over comes while the trial's process runs


def take_over_at(storage: RDBStorage, k: int | str | None) -> RDBStorage:
    """``storage`` (the real RDBStorage) with its trial writes counted: the k-th write to a RUNNING trial first finds
    it failed as stale and retried, as another worker's ``fail_stale_trials`` would leave it. ``k`` =
    :data:`HEARTBEAT`: the first heartbeat after the trial's process was started (its ``resume_step`` written)."""
    real = {name: getattr(storage, name) for name in (*TRIAL_WRITES, "record_heartbeat")}
    storage.writes, storage.taken, storage.study = 0, [], None
    started = []

    def take_over(trial_id: int) -> None:
        if real["set_trial_state_values"](trial_id, state=TrialState.FAIL):
            frozen = copy.deepcopy(storage.get_trial(trial_id))
            RetryWhileProgressing(3)(storage.study, frozen)  # the other worker's callback: the retry queued
            storage.taken.append(frozen.number)

    def counted(name):
        def write(trial_id, *args, **kw):
            if storage.get_trial(trial_id).state == TrialState.RUNNING:
                storage.writes += 1
                if storage.writes == k or k == HEARTBEAT and trial_id in started and not storage.taken:
                    take_over(trial_id)  # (HEARTBEAT: the process ended before a beat came; the next write finds it)
                if name == "set_trial_user_attr" and (args[:1] == (RESUME_STEP,) or kw.get("key") == RESUME_STEP):
                    started.append(trial_id)
            return real[name](trial_id, *args, **kw)
        return write

    def heartbeat(trial_id):
        if k == HEARTBEAT and trial_id in started and not storage.taken:
            take_over(trial_id)
        return real["record_heartbeat"](trial_id)

    for name in TRIAL_WRITES:
        setattr(storage, name, counted(name))
    storage.record_heartbeat = heartbeat
    return storage


@pytest.fixture(scope="module")
def one_row(tmp_path_factory, data_dir):
    """A one-row sweep file and a results folder holding its run, trained to completion by a worker with no
    fault; and how many writes that worker made for its trial."""
    folder = tmp_path_factory.mktemp("taken-over")
    sweep = write_sweep(folder, "takeover", {"base": {}}, heartbeat={"interval": 1, "grace": 3600, "max_retry": 3})
    results = folder / "results"
    worker, storage = run_worker(sweep, results, data_dir, f"sqlite:///{folder / 'clean.db'}", None)
    assert worker.counts["completed"] == 1, worker.out.getvalue()
    return sweep, results, storage.writes


def run_worker(sweep_file: Path, results: Path, data_dir: Path, url: str, k):
    sweep = load_sweep(sweep_file)
    plan = Plan(sweep, [*TINY, f"data.path={data_dir}", f"run.results_dir={results}"])
    (results / "sweep-logs").mkdir(parents=True, exist_ok=True)  # as `ltfm sweep` makes it before its worker runs
    storage = take_over_at(open_storage(url, heartbeat=sweep.heartbeat), k)
    study = open_study(sweep, storage)
    storage.study = study
    worker = Worker(sweep, plan, url, storage, study, out=io.StringIO())
    assert worker.run(None) == 0, worker.out.getvalue()
    return worker, storage


def check_case(one_row, data_dir, tmp_path, url: str, k) -> None:
    sweep_file, trained, clean_writes = one_row
    results = tmp_path / "results"
    shutil.copytree(trained, results, symlinks=True, ignore=shutil.ignore_patterns("sweep-logs", "*.db*"))
    worker, storage = run_worker(sweep_file, results, data_dir, url, k)
    out = worker.out.getvalue()
    assert "Traceback" not in out
    assert len(storage.taken) == 1, (k, clean_writes, out)  # the fault came
    taken = storage.taken[0]
    line = f"trial {taken} was taken over by another worker"
    assert out.count(line) == 1, (k, out)
    trials = optuna.load_study(study_name="takeover", storage=open_storage(url)).get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 1, (k, [(t.number, t.state) for t in trials], out)  # never COMPLETE twice
    assert [t.state for t in trials if t.number != complete[0].number] == [TrialState.FAIL], (k, out)
    # nothing lost: the completed trial holds its run's result, read from the run folder trained once
    assert complete[0].user_attrs["run_dir"] == str(next(results.glob("takeover-base-s1-*")))
    assert complete[0].value == pytest.approx(complete[0].user_attrs["dev_loss"])


def test_a_clean_worker_makes_enough_trial_writes_for_the_cases_to_mean_something(one_row):
    _, _, writes = one_row
    assert writes >= 8  # its run's attributes, where it resumes, its results, its state


def test_every_write_of_a_worker_can_find_its_trial_taken_over_and_the_worker_goes_on(one_row, data_dir, tmp_path):
    """For each k in 1..(the writes a clean worker makes) and for a take-over while the trial's process runs."""
    _, _, writes = one_row
    for k in [*range(1, writes + 1), HEARTBEAT]:
        case = tmp_path / f"k{k}"
        case.mkdir()
        check_case(one_row, data_dir, case, f"sqlite:///{case / 'study.db'}", k)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 6, -1, HEARTBEAT])  # the first write, where it resumes, the state, the heartbeat
def test_a_taken_over_trial_on_postgresql(k, one_row, data_dir, tmp_path, pg_url):  # noqa: F811
    _, _, writes = one_row
    check_case(one_row, data_dir, tmp_path, pg_url, writes if k == -1 else k)


# ------------------------------------------------------------------------------------------- the queue lock
def _other_process_gets(url: str) -> bool:
    """Whether another process takes the study's queue lock at once (patience 0) while this one may hold it."""
    import subprocess
    import sys

    code = ("import sys; from lightning_tfm.sweep.storage import open_storage, queue_lock, _flock, _db_lock\n"
            "s = open_storage(sys.argv[1]); e = s.engine\n"
            "import zlib; key = zlib.crc32(b'ltfm-queue:takeover')\n"
            "r = _flock(e.url.database + '.queue-lock', 0) if e.dialect.name == 'sqlite' else "
            "_db_lock(e, e.dialect.name, key, 0)\n"
            "print('got' if r else 'refused')\n")
    p = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip() == "got"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_queue_lock_keeps_every_other_worker_out_until_it_is_released(backend, tmp_path, request):
    """Queueing the missing rows, a failure and its retry, a stop put back: each runs under the study's queue lock,
    which another worker cannot take meanwhile (SQLite: flock beside the database; PostgreSQL: an advisory lock)
    and which one worker takes again inside itself."""
    from lightning_tfm.sweep.storage import queue_lock

    url = (f"sqlite:///{tmp_path / 'study.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url"))
    storage = open_storage(url)
    assert _other_process_gets(url)
    with queue_lock(storage, "takeover"):
        with queue_lock(storage, "takeover"):  # re-entered (a close inside a failure's requeue): no deadlock
            pass
        assert not _other_process_gets(url)  # still held after the inner block
    assert _other_process_gets(url)
