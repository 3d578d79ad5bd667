"""The worker: one ``ltfm sweep`` process that joins the study, queues and claims trials, runs each as its own
``ltfm train`` process and records what came of it in the trial.

- Variants: :func:`enqueue_missing` adds the (variant, seed) rows missing from the study as WAITING trials
  (with the row's Table 3 knobs as params, for optuna-dashboard); :func:`claim_waiting` takes one with the
  storage's atomic WAITING -> RUNNING transition; :func:`duplicate_of` closes a row enqueued twice.
- Space: ``study.ask()`` with the sweep file's sampler until ``n_trials`` trials exist.
- The trial process gets the storage URL through :data:`~.storage.STORAGE_ENV`, dies with its worker
  (``PR_SET_PDEATHSIG``), and is stopped like Ctrl-C when the worker gets SIGTERM.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..training import config
from ..training.errors import UserError
from ..training.redact import scrub_text
from ..training.results import RESULT_FIELDS, RUN_LOCKED, WANDB_FIELDS, read_summary
from .plan import Plan, check_buildable
from .spec import Entry, Sweep, suggest
from .storage import STORAGE_ENV, Heartbeat, retry

GPU_ENV = "LTFM_WORKER_GPU"  # set by the launcher: the GPU this worker's trials train on (recorded per trial)


def enqueue_missing(study, plan: Plan) -> int:
    """Enqueue every (variant, seed) row that has no live trial yet; returns how many were added."""
    from optuna.trial import TrialState, create_trial

    by_key: dict[str, list] = {}
    for t in study.get_trials(deepcopy=False):
        by_key.setdefault(t.user_attrs.get("grid_key"), []).append(t)
    added = 0
    space = dashboard_space(plan)
    # Longest rows first (stable, so the paper's order holds within a budget): with several workers a
    # row trained for 3x the steps overlaps the short ones instead of running alone at the end.
    for entry in sorted(plan.sweep.entries(), key=lambda e: -e.budget):
        trials = by_key.get(plan.grid_key(entry), [])
        if any(t.state != TrialState.FAIL for t in trials):
            continue  # waiting, running, complete or pruned somewhere
        if any(t.user_attrs.get("skip") == "unbuildable" for t in trials):
            continue  # will not build now either
        params, dists = dashboard_params(plan, entry, space)
        # study.enqueue_trial, with the row's knobs as the trial's params (enqueue_trial's own params are
        # only applied by suggest_* calls, which these trials never make)
        retry(study.add_trial, create_trial(state=TrialState.WAITING, params=params, distributions=dists,
                                             user_attrs=plan.attrs(entry)))
        added += 1
    return added


# The Table 3 knobs each variant trial carries as its Optuna params (flat config keys, as in W&B), so that
# optuna-dashboard's trials table, parallel coordinates and Hyperparameter Importance show them. Nothing
# samples them: they describe the row.
# The training budget (train.max_steps) is the trial's budget, not a knob of the row: left out.
DASHBOARD_KNOBS = tuple(key for _, key, _ in config.TABLE3_KNOBS if key != "train.max_steps")
# Categorical knobs get every allowed value as choices (the config field's Literal), the same in every study:
# Optuna refuses a parameter whose categorical choices differ between the trials of one study.
DASHBOARD_CHOICES = {key: config.choices(key) for key in DASHBOARD_KNOBS if config.choices(key)}


def _knob_value(plan: Plan, entry: Entry, key: str) -> Any:
    return plan.trial_overrides(entry).get(key, config.get_dotted(plan.base_cfg, key))


def dashboard_space(plan: Plan) -> dict:
    """One distribution per knob spanning the values of the plan's rows: identical for every trial the plan
    enqueues (Optuna's importance evaluators need one search space)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    for key in DASHBOARD_KNOBS:
        if key in DASHBOARD_CHOICES:
            space[key] = CategoricalDistribution(DASHBOARD_CHOICES[key])
            continue
        values = [_knob_value(plan, e, key) for e in plan.sweep.entries()]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            continue
        if all(isinstance(v, int) for v in values):
            space[key] = IntDistribution(min(values), max(values))
        else:
            space[key] = FloatDistribution(float(min(values)), float(max(values)))
    return space


def dashboard_params(plan: Plan, entry: Entry, space: dict) -> tuple[dict, dict]:
    params, dists = {}, {}
    for key, dist in space.items():
        value = _knob_value(plan, entry, key)
        if value is None or (key in DASHBOARD_CHOICES and value not in DASHBOARD_CHOICES[key]):
            continue
        params[key] = float(value) if dist.__class__.__name__ == "FloatDistribution" else value
        dists[key] = dist
    return params, dists


def claim_waiting(study, storage, study_id: int, keys: set[str] | None = None):
    """Atomically move one WAITING trial to RUNNING (as ``study.ask`` does), or None if none is left.

    With ``keys``, only trials of those grid keys: a worker runs its own plan's rows (its budget, its variant
    definitions), and leaves rows enqueued by workers with another plan to them."""
    import optuna
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if keys is not None and t.user_attrs.get("grid_key") not in keys:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        try:
            if retry(storage.set_trial_state_values, trial_id, state=TrialState.RUNNING):
                return optuna.trial.Trial(study, trial_id), trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def duplicate_of(study, number: int, key: str):
    """The lower-numbered live (waiting/running/complete/pruned) trial holding ``key``, if any."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False):
        if t.number < number and t.user_attrs.get("grid_key") == key and t.state != TrialState.FAIL:
            return t
    return None


def _death_signal():
    """A preexec_fn making the trial process get SIGKILL when its worker dies (Linux ``PR_SET_PDEATHSIG``),
    so that a killed worker leaves no orphan training that would race the retried trial. ``prctl`` is looked
    up here, in the parent: between fork and exec the child only calls it (no imports, no locks)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG


_TERMINATED = threading.Event()


def _on_sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM (``kill``, a batch system's preemption) ends a worker like Ctrl-C: its trial is stopped and
    recorded as interrupted, and the next ``ltfm sweep`` resumes it from its checkpoint."""
    _TERMINATED.set()
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Let SIGTERM end this worker as Ctrl-C does (signal handlers can only be set in the main thread)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _log_error_line(log: Path) -> str | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("ltfm: error:"):
            return line[len("ltfm: error:"):].strip()
    for line in reversed(lines):
        if line.strip() and not line.startswith(" "):
            return line.strip()[:300]
    return None


# The run's results a trial records in its user attributes (what reports read when the run folder is elsewhere).
RESULT_ATTRS = RESULT_FIELDS + WANDB_FIELDS


def killed_by(signum: int) -> str:
    """A trial process's end by signal, as its error: SIGKILL is what the kernel's out-of-memory killer and a
    scheduler past its grace period send."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    hint = " (the out-of-memory killer, a scheduler past its grace period, or kill -9)" if signum == 9 else ""
    return f"killed by {name}{hint}"


def write_trial_config(cfg: config.Config, run_dir: Path) -> Path:
    """Write a trial's resolved config to ``<run_dir>/config.yaml`` (atomically, secrets masked): the file the
    trial process trains from and the run keeps. Its run id is the trial's (``config.run_id`` of the loaded
    file equals that of ``cfg``)."""
    from ..training import atomic

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    atomic.write_text(path, config.saved_yaml(cfg))
    return path


class Worker:
    """One ``ltfm sweep`` process: joins the study, claims trials, runs them, records the results."""

    def __init__(self, sweep: Sweep, plan: Plan, storage_url: str, storage, study, out=sys.stdout):
        self.sweep, self.plan, self.url, self.storage, self.study = sweep, plan, storage_url, storage, study
        self.study_id = storage.get_study_id_from_name(sweep.name)
        self.out = out
        self.logs = plan.results_dir / "sweep-logs" / sweep.name
        self.counts = {"completed": 0, "pruned": 0, "failed": 0, "skipped": 0}
        self.keys = {plan.grid_key(e) for e in sweep.entries()} if sweep.mode == "variants" else None
        self._last_input_error: str | None = None

    def say(self, msg: str) -> None:
        print(f"[{self.sweep.name}] {msg}", file=self.out, flush=True)

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, n_trials: int | None) -> int:
        from optuna.storages import fail_stale_trials

        if self.sweep.mode == "variants":
            added = enqueue_missing(self.study, self.plan)
            if added:
                self.say(f"queued {added} trial(s)")
        trained = 0
        while n_trials is None or trained < n_trials:
            retry(fail_stale_trials, self.study)  # trials of dead workers -> FAIL + a WAITING retry
            if self.sweep.mode == "variants":
                claimed = claim_waiting(self.study, self.storage, self.study_id, self.keys)
                if claimed is None:
                    break
                trial, trial_id = claimed
                entry = self._entry_of(trial)
            else:
                # A killed worker's point first: its retry (WAITING, the same params as fixed params) is
                # claimed like a row; only then a new point, while the space has room.
                claimed = claim_waiting(self.study, self.storage, self.study_id)
                if claimed is not None:
                    trial, trial_id = claimed
                elif self._space_full():
                    break
                else:
                    trial = retry(self.study.ask)
                    trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
                entry = self._sample(trial)
            trained += self.run_trial(trial, trial_id, entry)
        self._final_message()
        return 1 if self.counts["failed"] else 0

    def _entry_of(self, trial) -> Entry:
        a = trial.user_attrs
        return Entry(a["variant"], a["family"], int(a["seed"]), dict(a.get("overrides") or {}),
                     float(a.get("budget", 1.0)), a.get("max_steps"))

    def _space_full(self) -> bool:
        """Whether the study holds ``n_trials`` search points. A point is a trial, less duplicates and less
        failed trials that were retried (their retry is the same point)."""
        trials = self.study.get_trials(deepcopy=False)
        retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
        points = [t for t in trials if t.user_attrs.get("skip") != "duplicate" and t.number not in retried]
        return len(points) >= (self.sweep.n_trials or 0)

    def _sample(self, trial) -> Entry:
        params = suggest(trial, self.sweep.space)
        entry = Entry(f"search-{trial.number:04d}", "search", self.sweep.seeds[0], params)
        if "grid_key" not in trial.user_attrs:  # a retried trial keeps its original name and key
            for k, v in self.plan.attrs(entry).items():
                if k != "grid_key":
                    trial.set_user_attr(k, v)
            trial.set_user_attr("grid_key", self.plan.grid_key(dataclasses.replace(entry, name="search")))
        else:
            entry.name = trial.user_attrs.get("variant", entry.name)
        return entry

    # -- one trial -----------------------------------------------------------------------------------------
    def _close(self, trial, state, values=None, **attrs) -> None:
        """Record the trial's end. A trial the study already finished (failed as stale while this worker was
        stopped, say) keeps what it has: its retry owns the row now, and this worker goes on to the next."""
        import optuna

        try:
            for k, v in attrs.items():
                if v is not None:
                    retry(trial.set_user_attr, k, v)
        except optuna.exceptions.UpdateFinishedTrialError:
            self.say(f"trial {trial.number} was already finished by the study (its heartbeat lapsed): left as it is")
            return
        retry(self.study.tell, trial.number, values, state=state, skip_if_finished=True)

    def run_trial(self, trial, trial_id: int, entry: Entry) -> int:
        """Run one claimed trial; returns 1 if a training process was started."""
        from optuna.trial import TrialState

        with Heartbeat(self.storage, trial_id, self.sweep.heartbeat["interval"]):
            label = f"trial {trial.number} {entry.name} seed {entry.seed}"
            key = trial.user_attrs.get("grid_key")
            dup = duplicate_of(self.study, trial.number, key)
            if dup is not None:
                self.say(f"{label}: duplicate of trial {dup.number}, not run")
                self._close(trial, TrialState.FAIL, skip="duplicate", reason=f"duplicate of trial {dup.number}")
                return 0
            cfg, params, reason = check_buildable(self.plan, entry)
            if reason is not None:
                self.counts["skipped"] += 1
                self.say(f"{label}: skipped: {reason}")
                self._close(trial, TrialState.FAIL, skip="unbuildable", reason=reason)
                return 0
            return self._train(trial, entry, cfg, params, label)

    def _train(self, trial, entry: Entry, cfg: config.Config, params: int, label: str) -> int:
        from optuna.trial import TrialState

        rid = config.run_id(cfg)
        run_dir = self.plan.results_dir / rid
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"trial-{trial.number:04d}-{entry.name}-s{entry.seed}.log"
        where = {"gpu": os.environ[GPU_ENV]} if os.environ.get(GPU_ENV) else {}  # launched on a GPU
        for k, v in {"run_id": rid, "run_dir": str(run_dir), "host": socket.gethostname(), "log": str(log),
                     "planned_params": params, **where}.items():
            retry(trial.set_user_attr, k, v)
        # The trial's config is made once, here: written to the run folder as the config.yaml the run keeps,
        # and the trial process trains from that file. The storage URL goes in the environment only.
        cfg.sweep.study, cfg.sweep.trial, cfg.sweep.metric = self.sweep.name, trial.number, self.sweep.metric
        cfg.sweep.storage = None
        trial_file = write_trial_config(cfg, run_dir)
        cmd = [sys.executable, "-m", "lightning_tfm", "train", str(trial_file)]
        env = {**os.environ, STORAGE_ENV: self.url, "PYTHONUNBUFFERED": "1"}
        self.say(f"{label}: training {rid} (log {log})")
        started = time.time()
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    preexec_fn=_death_signal())
            try:
                rc = proc.wait()
            except BaseException:  # Ctrl-C: the trial process got SIGINT too; let it save its summary
                if _TERMINATED.is_set() and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)  # SIGTERM reached this worker alone: stop the trial the same way
                with contextlib.suppress(Exception):
                    proc.wait(timeout=30)
                if proc.poll() is None:
                    proc.kill()
                self._close(trial, TrialState.FAIL, reason="interrupted", status="interrupted")
                raise
        if rc == 2 and RUN_LOCKED in (_log_error_line(log) or ""):
            # Another process (a `ltfm train` by hand, a worker of another sweep) trains this very run:
            # not this trial's failure, and not an input error that would stop the worker.
            self.counts["skipped"] += 1
            reason = scrub_text(_log_error_line(log) or "", self.url)
            self.say(f"{label}: already running elsewhere: {reason}")
            self._close(trial, TrialState.FAIL, skip="running", reason=reason)
            return 1
        summary = read_summary(run_dir) or {}
        if rc != 0 and summary.get("pid") not in (None, proc.pid):
            summary = {}  # left by an earlier attempt: this process died before writing its own
        # (rc 0 with an older pid: the run was already completed, and `ltfm train` returned its summary)
        results = {k: summary.get(k) for k in RESULT_ATTRS}
        results = {k: v for k, v in results.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        status = summary.get("status")
        if status == "completed" and rc != 0:
            status = None
        value = summary.get(self.sweep.metric)
        took = f"{time.time() - started:.0f} s"
        if status == "completed" and isinstance(value, (int, float)) and math.isfinite(value):
            self.counts["completed"] += 1
            self._last_input_error = None
            self.say(f"{label}: completed {self.sweep.metric}={value:.4g} ({took})")
            self._close(trial, TrialState.COMPLETE, [float(value)], **results)
        elif status == "pruned":
            self.counts["pruned"] += 1
            self._last_input_error = None
            self.say(f"{label}: pruned at step {summary.get('steps')} ({took})")
            self._close(trial, TrialState.PRUNED, **results)
        else:
            self.counts["failed"] += 1
            if status == "completed":
                error = f"summary.json has no finite {self.sweep.metric}"
            elif rc < 0:  # ended by a signal it could not handle: its log's last line says nothing of why
                error = killed_by(-rc)
            else:
                error = (_log_error_line(log) if rc == 2 else None) or summary.get("error") or \
                    _log_error_line(log) or f"exit code {rc}"
            error = scrub_text(error, self.url)
            self.say(f"{label}: failed: {error} ({took}; log {log})")
            self._close(trial, TrialState.FAIL, error=error, exit_code=rc, **results)
            if rc == 2:  # an input error (data, results folder): if it repeats, every trial would fail
                if error == self._last_input_error:
                    raise UserError(f"{error} (two trials in a row failed this way; see {log})")
                self._last_input_error = error
        return 1

    def _final_message(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        running = [t.number for t in trials if t.state == TrialState.RUNNING]
        waiting = [t.number for t in trials if t.state == TrialState.WAITING]
        c = self.counts
        msg = (f"worker done: {c['completed']} completed, {c['pruned']} pruned, {c['failed']} failed, "
               f"{c['skipped']} skipped")
        if running:
            msg += (f"; trial(s) {', '.join(map(str, running))} still running in other workers (a trial whose "
                    f"worker died is re-run by the next `ltfm sweep` started {self.sweep.heartbeat['grace']} s "
                    "after its last heartbeat)")
        if waiting:
            msg += f"; {len(waiting)} waiting"
        self.say(msg)
