"""Optuna's gRPC storage proxy in front of a real PostgreSQL (issue #63, item 4), started as a user starts it
(``ltfm sweep --serve-storage URL --port N``): a sweep's workers on ``--storage grpc://`` complete every row once,
``--status`` reads the study through it, and the heartbeat that the proxy's API lacks (kept in a system attribute:
:mod:`lightning_tfm.sweep.proxy`) fails a trial whose worker stopped beating and queues its retry."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import WORK, ltfm, write_sweep
from pg import free_port, pg_url, postgres  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


@pytest.fixture
def proxy(pg_url):  # noqa: F811
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "lightning_tfm", "sweep", "--serve-storage", pg_url, "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=WORK)
    first = p.stdout.readline()  # said once it serves
    assert f"grpc://localhost:{port}" in first and "pw" not in first.split("proxy for", 1)[1].split(" on ")[0], first
    try:
        yield f"grpc://localhost:{port}"
    finally:
        p.terminate()
        p.wait(timeout=60)


@pytest.mark.long  # make test-long (two trainings); the proxy's heartbeat below is in make test
def test_a_sweep_through_the_proxy_completes_every_row_once(proxy, data_dir, tmp_path):
    import json

    sweep = write_sweep(tmp_path / "px.yaml", "px", {"base": {}, "A1": {"model.heads": 1, "model.d_k": 32,
                                                                        "model.d_v": 32}})
    results = tmp_path / "results"
    p = ltfm("sweep", sweep, "--storage", proxy, "--workers", "2", f"data.path={data_dir}",
             f"run.results_dir={results}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = ltfm("sweep", sweep, "--status", "--json", "--storage", proxy, f"run.results_dir={results}")
    rows = json.loads(s.stdout)
    assert sorted(r["variant"] for r in rows if r["state"] == "complete") == ["A1", "base"], rows
    assert all(r["state"] in ("complete", "duplicate") for r in rows), [(r["state"], r["note"]) for r in rows]


def test_a_trial_that_stopped_beating_through_the_proxy_is_failed_and_retried(proxy):
    import optuna
    from optuna.trial import TrialState

    from lightning_tfm.sweep.proxy import BEAT, fail_stale_trials
    from lightning_tfm.sweep.storage import open_storage

    storage = open_storage(proxy, heartbeat={"interval": 1, "grace": 5, "max_retry": 1})
    study = optuna.create_study(storage=storage, study_name="beats")
    alive, dead = study.ask(), study.ask()
    storage.record_heartbeat(alive._trial_id)  # beating now
    storage.set_trial_system_attr(dead._trial_id, BEAT, 1.0)  # its worker's last beat, long ago
    fail_stale_trials(study)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[alive.number] == TrialState.RUNNING
    assert states[dead.number] == TrialState.FAIL
    (retry,) = [t for t in study.get_trials(deepcopy=False) if t.number not in (alive.number, dead.number)]
    assert retry.state == TrialState.WAITING and retry.system_attrs["failed_trial"] == dead.number


def test_a_worker_on_the_proxy_starts_its_trials_while_its_grpc_threads_are_busy(proxy, tmp_path):
    """A worker on ``grpc://`` holds grpcio's threads (its heartbeat's calls) when it starts a trial. It starts
    the trial's process as :func:`lightning_tfm.sweep.process.start` does; a ``preexec_fn`` there made Python fork
    those threads, and 7 children in 100 aborted in grpcio's fork handling (``epoll_wait error: Bad file
    descriptor``) before their exec. Here 100 starts beside a thread calling the proxy without pause all exit 0."""
    import threading

    import optuna

    from lightning_tfm.base.lifeline import tie
    from lightning_tfm.sweep import process
    from lightning_tfm.sweep.storage import open_storage

    storage = open_storage(proxy, heartbeat={"interval": 1, "grace": 5, "max_retry": 1})
    study = optuna.create_study(storage=storage, study_name="busy")
    done = threading.Event()

    def calls():
        while not done.is_set():
            study.tell(study.ask(), 1.0)

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    try:
        codes = []
        for i in range(100):
            with open(tmp_path / f"{i}.log", "wb") as out:
                codes.append(process.start([sys.executable, "-c", "pass"], tie(dict(os.environ)),
                                           out).wait())
    finally:
        done.set()
        caller.join(timeout=60)
    assert len(study.trials) > 10  # the calls went on meanwhile
    bad = {i: (tmp_path / f"{i}.log").read_text()[-300:] for i, rc in enumerate(codes) if rc != 0}
    assert not bad, bad
