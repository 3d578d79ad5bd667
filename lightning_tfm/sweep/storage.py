"""The Optuna storage and study of a sweep: URLs and drivers, SQLite made safe for many workers, the study
with its metric name and machines, the trial heartbeat, and a retry for transient storage errors.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import UserError
from ..base.redact import mask_url, scrub_text
from .spec import Sweep, build_pruner, build_sampler

#: The environment variable through which the sweep worker passes the full storage URL (with any
#: password) to the trial process; ``sweep.storage`` in the run's config holds the URL with the password
#: masked, so that no password is written to config.yaml, summary.json or W&B.
STORAGE_ENV = "LTFM_SWEEP_STORAGE"


def default_storage(sweep: Sweep, results_dir: Path) -> str:
    return f"sqlite:///{results_dir / (sweep.name + '.db')}"


def _sqlite_immediate(engine) -> None:
    """Make every SQLite transaction BEGIN IMMEDIATE: the write lock is taken before the first read, so
    Optuna's read-check-write of a trial state (claiming a WAITING trial, failing a stale one) is atomic
    across processes. (SQLite ignores SELECT ... FOR UPDATE, which is what protects it on PostgreSQL/MySQL.)
    This is SQLAlchemy's documented pysqlite recipe; connections are opened with isolation_level=None."""
    from sqlalchemy import event

    @event.listens_for(engine, "begin")
    def _begin(conn):  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _available_driver(parsed) -> str | None:
    """A URL without a driver (``postgresql://``, ``mysql://``) whose SQLAlchemy default DBAPI is not
    installed but another common one is: the drivername to use instead (else None)."""
    import importlib.util

    options = {"postgresql": [("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")],
               "mysql": [("MySQLdb", "mysql+mysqldb"), ("pymysql", "mysql+pymysql")]}.get(parsed.drivername)
    if not options:
        return None
    for module, drivername in options:
        if importlib.util.find_spec(module) is not None:
            return None if drivername == options[0][1] else drivername
    return None


def open_storage(url: str, heartbeat: dict | None = None, for_trial: bool = False, create: bool = True):
    """An Optuna ``RDBStorage`` for ``url``, or a one-line UserError (the password never shown)."""
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    shown = mask_url(url)
    if url.startswith("grpc://"):  # Optuna's storage proxy in front of the database (many workers)
        from .proxy import open_proxy
        beats = heartbeat if heartbeat and not for_trial else None
        return open_proxy(url, beats, RetryWhileProgressing(beats["max_retry"]) if beats else None)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        raise UserError(f"storage URL {shown!r} is malformed: use sqlite:///path.db, "
                        "postgresql://user@host:port/db, mysql+pymysql://user@host/db or grpc://host:port") from None
    backend = parsed.get_backend_name()
    default_driver = _available_driver(parsed)
    if default_driver:  # e.g. SQLAlchemy 2.1 reads postgresql:// as psycopg 3; psycopg2 may be what is installed
        url = parsed.set(drivername=default_driver).render_as_string(hide_password=False)
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise UserError(f"storage URL {shown!r} has no database file: use sqlite:///path/to/file.db")
        dbp = Path(db)
        if not create and not dbp.is_file():
            raise UserError(f"no sweep database at {dbp}: run the sweep first (or pass --storage)")
        if not dbp.parent.is_dir():
            raise UserError(f"storage folder {str(dbp.parent)!r} does not exist: create it or choose another path")
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120, "isolation_level": None}}
    elif backend in ("postgresql", "mysql", "mariadb"):
        kwargs["engine_kwargs"] = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    else:
        raise UserError(f"storage URL {shown!r}: {backend!r} is not supported: use sqlite, postgresql or mysql")
    if heartbeat and not for_trial:
        kwargs.update(heartbeat_interval=heartbeat["interval"], grace_period=heartbeat["grace"],
                      heartbeat_stale_trial_callback=RetryWhileProgressing(heartbeat["max_retry"]))
    last: Exception | None = None
    for attempt in range(3):  # two workers creating the tables at the same instant: one retries
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, **kwargs)
            if backend == "sqlite":
                _sqlite_immediate(storage.engine)
            return storage
        except ImportError:
            driver = "psycopg2-binary (pip install 'lightning_tfm[postgres]')" if backend == "postgresql" \
                else "a driver such as pymysql (and use mysql+pymysql://)"
            raise UserError(f"storage {shown!r} needs {driver}") from None
        except Exception as e:  # OperationalError (unreachable, refused, bad credentials), schema races
            last = e
            msg = str(e).lower()
            if any(s in msg for s in ("refused", "could not translate", "timeout", "authentication", "password",
                                      "does not exist", "unable to open", "access denied", "unknown database")):
                break
            time.sleep(0.5 + attempt)
    detail = scrub_text(str(getattr(last, "orig", None) or last).strip().splitlines()[0] if str(last).strip() else
                        last.__class__.__name__, url)
    raise UserError(f"cannot open storage {shown}: {detail[:300]}; check the URL, that the server is "
                    "running and reachable, and the credentials")


def quiet_optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def machine_description() -> str:
    """This machine as a report names it: CPU model and the cores this process may use."""
    import platform

    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or platform.processor() or platform.machine() or 'unknown CPU'}, {cores} cores"


def open_study(sweep: Sweep, storage, create: bool = True):
    """The sweep's study. ``create``: a worker joining it, which names the metric for optuna-dashboard (instead
    of "Objective 0") and records its machine as the study attribute ``ltfm.machine.<host>`` (the report's
    headline)."""
    import optuna

    sampler, pruner = build_sampler(sweep.sampler), build_pruner(sweep.pruner)
    if create:
        study = optuna.create_study(storage=storage, study_name=sweep.name, direction=sweep.direction,
                                    sampler=sampler, pruner=pruner, load_if_exists=True)
        if study.metric_names != [sweep.metric]:
            with warnings.catch_warnings():  # experimental since Optuna 3.2, and what the dashboard reads
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                retry(study.set_metric_names, [sweep.metric])
        retry(study.set_user_attr, f"ltfm.machine.{socket.gethostname()}", machine_description())
    else:
        try:
            study = optuna.load_study(study_name=sweep.name, storage=storage, sampler=sampler, pruner=pruner)
        except KeyError:
            raise UserError(f"no study {sweep.name!r} in the storage: run `ltfm sweep {sweep.path}` first") from None
    if study.direction.name.lower() != sweep.direction:
        raise UserError(f"study {sweep.name!r} in this storage {study.direction.name.lower()}s, but the sweep file "
                        f"says {sweep.direction}: use another --storage or fix the sweep file")
    return study


#: How long a worker keeps trying its storage (a database restarting, SQLite on a disk full for a while)
#: before it gives up on a call
STORAGE_PATIENCE_S = 300.0


def retry(fn, *args, patience: float = STORAGE_PATIENCE_S, **kw):
    """Call ``fn``, trying again while the storage fails transiently (contention, a database server that
    restarts, SQLite on a full disk): pauses growing from 0.5 s to 10 s, for up to ``patience`` seconds, with
    one warning line once it has lasted a few seconds; then the error is raised."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from .proxy import transient_errors

    transient = (optuna.exceptions.StorageInternalError, SQLAlchemyError, *transient_errors())
    start, pause, warned = time.monotonic(), 0.5, False
    while True:
        try:
            result = fn(*args, **kw)
            if warned:
                print(f"ltfm: storage reachable again after {time.monotonic() - start:.0f} s", file=sys.stderr)
            return result
        except transient as e:
            waited = time.monotonic() - start
            if waited >= patience:
                raise
            if not warned and waited >= 2:
                cause = e.__cause__ or e
                print(f"ltfm: warning: the sweep storage is not answering ({cause.__class__.__name__}): trying "
                      f"again for up to {patience:.0f} s", file=sys.stderr)
                warned = True
            time.sleep(pause)
            pause = min(10.0, pause * 2)


#: The lock file beside a SQLite study's database that :func:`queue_lock` holds (flock: released when its process dies)
QUEUE_LOCK_SUFFIX = ".queue-lock"
#: How long a worker waits for the queue lock before it goes on without it (its holder stopped, SIGSTOP): a row
#: queued twice meanwhile is closed as a duplicate, untrained, so waiting longer buys nothing
QUEUE_LOCK_PATIENCE_S = 60.0
_QUEUE_HELD: dict[str, int] = {}  # study name -> how deep this process holds its queue lock (the main thread's)


@contextlib.contextmanager
def queue_lock(storage, name: str, patience: float = QUEUE_LOCK_PATIENCE_S):
    """Hold the study ``name``'s queue lock: every change that can leave a row without a live trial and then give
    it one (queueing the missing rows; failing a trial and queueing its retry; a stopped trial put back to wait)
    runs under it, so that no other worker reads the study in between and queues the row a second time.

    PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) on a connection of its own; MySQL: ``GET_LOCK``;
    SQLite: ``flock`` of a file beside the database (SQLite's own write lock cannot be held across Optuna's calls,
    which open their own connections). Each is released when its holder's process dies. A holder that does not let
    go within ``patience`` seconds (a stopped process), a storage of another kind or a lock file that cannot be made
    (a full disk): the block runs unlocked, and a row queued twice then is closed as a duplicate, untrained."""
    import zlib

    if _QUEUE_HELD.get(name):  # taken already by this worker (a close inside a failure's requeue): re-entered
        _QUEUE_HELD[name] += 1
        try:
            yield
        finally:
            _QUEUE_HELD[name] -= 1
        return
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    dialect = engine.dialect.name if engine is not None else None
    key = zlib.crc32(f"ltfm-queue:{name}".encode())  # the same for every worker of the study
    release = None
    if dialect == "sqlite" and engine.url.database:
        release = _flock(engine.url.database + QUEUE_LOCK_SUFFIX, patience)
    elif dialect in ("postgresql", "mysql", "mariadb"):
        release = _db_lock(engine, dialect, key, patience)
    _QUEUE_HELD[name] = 1
    try:
        yield
    finally:
        _QUEUE_HELD[name] = 0
        if release is not None:
            with contextlib.suppress(Exception):  # a server gone meanwhile has dropped the lock with the session
                release()


def _flock(path: str, patience: float):
    """Take an exclusive flock of ``path`` (made if missing); its release, or None when not had in ``patience``."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lambda: os.close(fd)  # closing releases the flock
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
        except OSError:
            os.close(fd)
            return None


def _db_lock(engine, dialect: str, key: int, patience: float):
    """Take the database's named lock ``key`` on a connection of its own; its release, or None when not had."""
    take, give = ((f"SELECT pg_try_advisory_lock({key})", f"SELECT pg_advisory_unlock({key})")
                  if dialect == "postgresql" else
                  (f"SELECT GET_LOCK('ltfm-queue-{key}', 0)", f"SELECT RELEASE_LOCK('ltfm-queue-{key}')"))
    deadline = time.monotonic() + patience
    while True:
        conn = retry(engine.connect)
        try:
            if retry(lambda: conn.exec_driver_sql(take).scalar()):  # noqa: B023 - called at once
                def release(conn=conn):
                    try:
                        conn.exec_driver_sql(give)
                    finally:
                        conn.close()
                return release
        except Exception:  # noqa: BLE001 - the storage's own calls say what is wrong with it; here: go on unlocked
            conn.close()
            return None
        conn.close()
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


class Heartbeat:
    """Record the Optuna heartbeat of a trial every ``interval`` seconds while its process runs, and notice when the
    study has finished the trial meanwhile (failed as stale while the beats could not reach the storage, or while
    this worker was stopped): ``taken_over`` is set, and the beats stop."""

    def __init__(self, storage, trial_id: int, interval: int):
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.taken_over = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from optuna.trial import TrialState

        while True:
            try:
                self.storage.record_heartbeat(self.trial_id)
                if self.storage.get_trial(self.trial_id).state != TrialState.RUNNING:
                    self.taken_over.set()
                    return
            except Exception as e:  # transient database trouble: try again at the next beat
                print(f"ltfm: warning: heartbeat of trial id {self.trial_id} failed ({e.__class__.__name__})",
                      file=sys.stderr)
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self.storage.record_heartbeat(self.trial_id)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------------------------ retries with progress
#: The user attribute a worker sets on a trial as it starts the trial's ``ltfm train``: the step the run resumes
#: from (:func:`~lightning_tfm.training.runs.resume.newest_step`). Every attempt sets its own; a retry does not
#: inherit it (an attempt killed before it started its training has none: it kept no work).
RESUME_STEP = "resume_step"
#: The system attribute of a retried trial: how many attempts of its row ended without keeping work
STALLED = "ltfm:attempts_without_progress"


@dataclass
class RetryDecision:
    """Whether an ended attempt's row is queued again, and why (:class:`RetryWhileProgressing`)."""

    queue: bool
    attempts: int  # the retry this would be: the row's attempts so far, the one that ended included
    stalled: int  # the row's attempts that kept no work, that one included
    steps: tuple[int, int] | None  # (the step it resumed from, the run's newest checkpoint step now); None: unknown
    max_retry: int | None

    @property
    def progressed(self) -> bool:
        return self.steps is not None and self.steps[1] > self.steps[0]

    def why(self) -> str:
        limit = "unlimited" if self.max_retry is None else str(self.max_retry)
        kept = f", the run at step {self.steps[1]}" if self.steps is not None else ""
        if not self.queue:
            return (f"{self.stalled} attempt(s) without progress{kept}; heartbeat.max_retry is {limit}" +
                    (" (no retries)" if self.max_retry == 0 else ""))
        if self.progressed:
            return (f"the attempt took the run from step {self.steps[0]} to step {self.steps[1]}: not counted against "
                    f"heartbeat.max_retry ({self.stalled} of {limit} attempts without progress)")
        return f"{self.stalled} of {limit} attempts without progress{kept}"


class RetryWhileProgressing:
    """The study's retry of a failed attempt (a worker that stopped beating, a trial killed by a signal or by a
    full disk): Optuna's ``RetryHeartbeatStaleTrialCallback`` (the same ``failed_trial`` and ``retry_history``
    system attributes, the intermediate values inherited), except that ``max_retry`` counts only the attempts
    that kept no work. An attempt kept work when the run's newest checkpoint step is past the step it resumed
    from (:data:`RESUME_STEP`, read from the run folder now): a row whose trials are killed faster than they
    finish still advances a checkpoint at a time, and is queued again for as long as it does (it ends, since
    every such attempt takes at least one step of a finite budget). ``max_retry=0`` queues nothing again.

    When the retries run out (``max_retry`` attempts in a row's history kept no work), the trial stays FAIL with
    its error and is not queued again: the workers go on with the other rows, end saying how many failed and
    exit 1; the run folder keeps its checkpoints, and the same ``ltfm sweep`` command queues the row again as
    a new trial (a new count) that resumes from them. A search point stays failed (it counts toward n_trials).

    ``report(trial, decision)``, when set, is told every decision (a worker logs the ones of trials it fails as
    stale, which Optuna's ``fail_stale_trials`` makes silently)."""

    def __init__(self, max_retry: int | None, report=None):
        self.max_retry, self.report = max_retry, report

    def decide(self, trial) -> RetryDecision:
        history = list(trial.system_attrs.get("retry_history") or [])
        steps = attempt_steps(trial)
        progressed = steps is not None and steps[1] > steps[0]
        stalled = int(trial.system_attrs.get(STALLED, 0)) + (0 if progressed else 1)
        m = self.max_retry
        return RetryDecision(m is None or (m > 0 and stalled <= m), len(history) + 1, stalled, steps, m)

    def queue(self, study, trial, decision: RetryDecision) -> None:
        """Add the WAITING retry of ``trial`` (as Optuna's callback does), with the row's count of stalled attempts."""
        import optuna

        system_attrs = {"failed_trial": trial.number, **trial.system_attrs}
        system_attrs["retry_history"] = [*(trial.system_attrs.get("retry_history") or []), trial.number]
        system_attrs[STALLED] = decision.stalled
        study.add_trial(optuna.create_trial(
            state=optuna.trial.TrialState.WAITING, params=trial.params, distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k != RESUME_STEP},
            system_attrs=system_attrs, intermediate_values=trial.intermediate_values))

    def __call__(self, study, trial) -> None:
        decision = self.decide(trial)
        if self.report is not None:
            with contextlib.suppress(Exception):
                self.report(trial, decision)
        if decision.queue:
            self.queue(study, trial, decision)


def attempt_steps(trial) -> tuple[int, int] | None:
    """(the step the trial's attempt resumed from, the run's newest checkpoint step now), or None when the
    attempt never started its training (no :data:`RESUME_STEP`) or has no run folder."""
    start, run_dir = trial.user_attrs.get(RESUME_STEP), trial.user_attrs.get("run_dir")
    if start is None or not run_dir:
        return None
    from ..training.runs.resume import newest_step

    return int(start), newest_step(run_dir)
