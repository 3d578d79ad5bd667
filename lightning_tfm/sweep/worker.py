"""The worker: one ``ltfm sweep`` process that joins the study, queues and claims trials, runs each as its own
``ltfm train`` process and records what came of it in the trial.

- The trial's process (its death with the worker, SIGTERM, how it ended): :mod:`.process`.
- Variants: the rows missing from the study are queued and claimed one at a time (:mod:`.queue`); a row
  enqueued twice is closed as a duplicate.
- Space: ``study.ask()`` with the sweep file's sampler until ``n_trials`` trials exist.
- ``--settle``: with nothing left to claim or wait for, a settle pass queues the trials the planner asks for
  (:class:`~.settle.Settler`), and the worker goes on with them.
- A run folder another sweep trained past this trial's budget (a continued sweep, two sweep files sharing a
  results folder: ``ltfm train`` finds it completed and returns its summary) is read at the trial's budget
  (:func:`~.budget.at_budget`): the value told to Optuna and the results recorded are of that budget; a folder that
  cannot say the metric there (no validation at the budget, BLEU measured at the end only) closes the trial as
  skipped (:data:`~.budget.PAST_BUDGET`) with the reason.
- The trial process gets the storage URL through :data:`~.storage.STORAGE_ENV`, dies with its worker
  (:mod:`~..base.lifeline`), and is stopped like Ctrl-C when the worker gets SIGTERM.
- Every write the worker makes for a trial it holds goes through :func:`.held.write`: a trial found finished
  by another worker (failed as stale while this worker could not reach the storage, or was stopped) raises
  :class:`~.held.TakenOver`, and the worker says so in one line, ends the trial's process if one runs, and goes on
  to the next trial. The heartbeat notices a take-over while the trial trains (:class:`~.storage.Heartbeat`).
- Ctrl-C (or SIGTERM, SIGUSR1) stops the trial at the end of its step (its checkpoint saved) and puts it back in
  the queue as *stopped*: the next run of the sweep claims it first and resumes its run from that step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..base.errors import UserError
from ..base.lifeline import tie
from ..base.redact import scrub_text
from ..training.config import config
from ..training.config.run_id import run_id
from ..training.runs import run_folder
from ..training.runs.results import ATTEMPT_ENV, RESULT_FIELDS, RUN_LOCKED, WANDB_FIELDS, read_summary
from . import held, process
from .budget import CONTINUED, NO_BLEU, PAST_BUDGET, folder_at_budget
from .plan import Plan, check_buildable
from .process import TERMINATED, killed_by, log_error_line, shielded, stop_process
from .queue import STOPPED, SamplerFailed, ask_new, claim_waiting, duplicate_of, enqueue_missing, sampling
from .settle import Settler
from .slurm import JOB_ATTR, job_attrs, srun_prefix
from .spec import Entry, Sweep, suggest
from .storage import RESUME_STEP, STORAGE_ENV, Heartbeat, RetryWhileProgressing, queue_lock, retry

#: How long a worker waits for a results folder that cannot be written (a full disk) before it stops
DISK_PATIENCE_S = 900.0
#: How long a trial waits for another process that trains its run (a stopped trial it retries) to end
LOCKED_PATIENCE_S = 1800.0
#: How long a stopped (Ctrl-C) or taken-over trial's process may take to save its checkpoint and end
STOP_PATIENCE_S = 120.0

GPU_ENV = "LTFM_WORKER_GPU"  # set by the launcher: the GPU this worker's trials train on (recorded per trial)


# The run's results a trial records in its user attributes (what reports read when the run folder is elsewhere).
RESULT_ATTRS = RESULT_FIELDS + WANDB_FIELDS
# What one attempt records in its trial, left out of the attributes its retry inherits
ATTEMPT_ATTRS = {"error", "exit_code", "status", "reason", "skip", "trained_past", "stopped_at", RESUME_STEP, JOB_ATTR,
                 *RESULT_ATTRS}


def write_trial_config(cfg: config.Config, path: Path) -> Path:
    """Write a trial's resolved config to ``path`` (atomically, secrets masked): the file the trial process trains
    from, beside the trial's log. The run folder's own ``config.yaml`` is written by ``ltfm train`` when it trains,
    never here: a folder trained past this trial's budget keeps the budget it was trained to. Its run id is the
    trial's (``run_id`` of the loaded file equals that of ``cfg``)."""
    from ..base import atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, config.saved_yaml(cfg))
    return path


class Worker:
    """One ``ltfm sweep`` process: joins the study, claims trials, runs them, records the results."""

    def __init__(self, sweep: Sweep, plan: Plan, storage_url: str, storage, study, out=None, settle: bool = False):
        self.sweep, self.plan, self.url, self.storage, self.study = sweep, plan, storage_url, storage, study
        self.study_id = storage.get_study_id_from_name(sweep.name)
        self.out = out if out is not None else sys.stdout  # the stream of when it runs, not of the import
        self.logs = plan.results_dir / "sweep-logs" / sweep.name
        self.counts = {"completed": 0, "pruned": 0, "failed": 0, "requeued": 0, "skipped": 0, "taken over": 0}
        self.keys = {plan.grid_key(e) for e in sweep.entries()} if sweep.mode == "variants" else None
        self._last_input_error: str | None = None
        self._waiting_on: list[int] = []
        self.settler = Settler(self) if settle else None  # --settle: its passes when nothing is left (.settle)
        callback = storage.get_heartbeat_stale_trial_callback()
        if isinstance(callback, RetryWhileProgressing):  # say what becomes of the trials this worker fails as stale
            callback.report = self._stale_decision

    def say(self, msg: str) -> None:
        with contextlib.suppress(OSError):  # a log on a full disk: the line is lost, the worker goes on
            print(f"[{self.sweep.name}] {msg}", file=self.out, flush=True)

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, n_trials: int | None) -> int:
        from .proxy import fail_stale_trials  # Optuna's, or the same steps through the gRPC proxy

        if self.sweep.mode == "variants":
            added = enqueue_missing(self.study, self.plan)
            if added:
                self.say(f"queued {added} trial(s)")
        trained = 0
        while n_trials is None or trained < n_trials:
            self._wait_for_disk()  # claim nothing while the results folder cannot be written
            with queue_lock(self.storage, self.sweep.name):  # no row is seen without a live trial meanwhile
                retry(fail_stale_trials, self.study)  # trials of dead workers -> FAIL + a WAITING retry
            try:
                if self.sweep.mode == "variants":
                    claimed = claim_waiting(self.study, self.storage, self.study_id, self.keys)
                    if claimed is None:
                        if self._wait_for_running() or self.settler is not None and self.settler.next_pass():
                            continue
                        break
                    trial, trial_id = claimed
                    entry = self._entry_of(trial)
                else:
                    # A killed worker's point first: its retry (WAITING, the same params as fixed params) is
                    # claimed like a row; only then a new point, while the space has room.
                    claimed = claim_waiting(self.study, self.storage, self.study_id)
                    if claimed is None and self._space_full():
                        if self._wait_for_running():
                            continue
                        break
                    trial, trial_id = claimed or ask_new(self.study, self.storage, self.study_id)
                    entry = self._sample(trial, trial_id)
                trained += self.run_trial(trial, trial_id, entry)
            except SamplerFailed as e:
                self._sampler_failed(e)
            except held.TakenOver as e:
                self.counts["taken over"] += 1
                self.say(str(e))
        self._final_message()
        return 1 if self.counts["failed"] else 0

    def _wait_for_running(self) -> bool:
        """Nothing to claim, but trials of this worker's rows still run elsewhere: wait one heartbeat interval
        (True) and look again, because if one of them stops beating (its worker killed or stopped) the study
        queues its retry, and this worker is the one left to run it. False when none runs: the sweep is done."""
        from optuna.trial import TrialState

        running = [t.number for t in retry(self.study.get_trials, deepcopy=False, states=(TrialState.RUNNING,))
                   if self.keys is None or t.user_attrs.get("grid_key") in self.keys]
        if not running:
            return False
        if running != self._waiting_on:
            self._waiting_on = running
            self.say(f"nothing left to claim; waiting while trial(s) {', '.join(map(str, running))} run in other "
                     "workers (a retry is run here if one of them stops beating)")
        time.sleep(self.sweep.heartbeat["interval"])
        return True

    def _wait_for_disk(self, patience: float = DISK_PATIENCE_S) -> None:
        """Wait while the results folder cannot take a write (a full disk, a quota): one line when it starts and
        one when it ends; a one-line error (exit 2) if it lasts ``patience`` seconds. Claiming trials meanwhile
        would fail every row in turn."""
        problem = run_folder.write_problem(self.plan.results_dir)
        if problem is None:
            return
        self.say(f"results folder {self.plan.results_dir} cannot be written ({problem}): waiting for it, up to "
                 f"{patience / 60:.0f} min")
        start = time.monotonic()
        while problem is not None:
            if time.monotonic() - start >= patience:
                raise UserError(f"results folder {self.plan.results_dir} could not be written for {patience / 60:.0f} "
                                f"min ({problem}): free space there, then run the same command again")
            time.sleep(self.sweep.heartbeat["interval"])
            problem = run_folder.write_problem(self.plan.results_dir)
        self.say(f"results folder writable again after {time.monotonic() - start:.0f} s")

    def _entry_of(self, trial) -> Entry:
        a = trial.user_attrs
        return Entry(a["variant"], a["family"], int(a["seed"]), dict(a.get("overrides") or {}),
                     float(a.get("budget", 1.0)), a.get("max_steps"))

    def _space_full(self) -> bool:
        """Whether the study holds ``n_trials`` search points. A point is a trial, less duplicates and less
        failed trials that were retried (their retry is the same point; a retry's ``retry_history`` names every
        earlier attempt)."""
        trials = retry(self.study.get_trials, deepcopy=False)
        retried = {n for t in trials for n in t.system_attrs.get("retry_history") or []}
        points = [t for t in trials if t.user_attrs.get("skip") != "duplicate" and t.number not in retried]
        return len(points) >= (self.sweep.n_trials or 0)

    def _sample(self, trial, trial_id: int) -> Entry:
        with sampling(trial_id):
            params = held.write(trial.number, suggest, trial, self.sweep.space)
        entry = Entry(f"search-{trial.number:04d}", "search", self.sweep.seeds[0], params)
        if "grid_key" not in trial.user_attrs:  # a retried trial keeps its original name and key
            held.set_attrs(trial, {k: v for k, v in self.plan.attrs(entry).items() if k != "grid_key"})
            held.set_attrs(trial, {"grid_key": self.plan.grid_key(dataclasses.replace(entry, name="search"))})
        else:
            entry.name = trial.user_attrs.get("variant", entry.name)
        return entry

    def _sampler_failed(self, failure: SamplerFailed) -> None:
        """The sampler raised on a trial: the trial is closed as failed with the error (it counts as a point of the
        space, so a failing sampler cannot loop); the same error twice in a row stops the worker with one line."""
        from optuna.trial import TrialState

        kind = (self.sweep.sampler or {}).get("type", "tpe")
        error = f"sampler {kind} failed while sampling: {failure}"
        number = retry(self.storage.get_trial, failure.trial_id).number
        try:
            held.write(number, self.storage.set_trial_user_attr, failure.trial_id, "error", error)
            held.write(number, self.storage.set_trial_state_values, failure.trial_id, state=TrialState.FAIL)
        except held.TakenOver as e:  # already finished by the study (its heartbeat lapsed): left as it is
            self.counts["taken over"] += 1
            self.say(str(e))
            return
        self.counts["failed"] += 1
        self.say(f"trial {number}: failed: {error}")
        if error == self._last_input_error:
            raise UserError(f"{error} (two trials in a row failed this way): change the sweep file's sampler "
                            "(its arguments, or another type: ltfm sweep --keys sampler.)")
        self._last_input_error = error

    # -- one trial -----------------------------------------------------------------------------------------
    def _close(self, trial, state, values=None, **attrs) -> None:
        held.close(self.study, self.storage, self.sweep.name, trial, state, values, attrs)

    def _disk_failure(self, trial, trial_id: int, label: str, error: str, **attrs) -> None:
        """A trial stopped by a results folder that cannot be written: recorded as failed with the reason,
        queued again (its run resumes from its checkpoint), and the worker waits for the disk."""
        from optuna.trial import TrialState

        self.say(f"{label}: failed: {error}")
        with queue_lock(self.storage, self.sweep.name):
            self._close(trial, TrialState.FAIL, error=error, **attrs)
            requeued = self._requeue(trial_id, label)
        self.counts["requeued" if requeued else "failed"] += 1
        self._wait_for_disk()

    def _requeue(self, trial_id: int, label: str) -> bool:
        """Queue a trial killed by a signal (the out-of-memory killer, a preemption past its grace, kill -9) or
        stopped by a full disk again, as the study queues one whose heartbeat lapsed: the study's retry callback
        (:class:`~.storage.RetryWhileProgressing`: ``max_retry`` counts the attempts that kept no work), with
        the retry history, and the row's attributes without this attempt's. The retry resumes the run from its
        last checkpoint. When the retries have run out the trial stays failed (the callback says what then)."""
        from optuna.trial import TrialState

        callback = self.storage.get_heartbeat_stale_trial_callback()
        frozen = retry(self.storage.get_trial, trial_id)
        if not isinstance(callback, RetryWhileProgressing) or frozen.state != TrialState.FAIL:
            return False
        decision = callback.decide(frozen)
        if not decision.queue:
            self.say(f"{label}: not queued again: {self._gave_up(decision)}")
            return False
        frozen.user_attrs = {k: v for k, v in frozen.user_attrs.items() if k not in ATTEMPT_ATTRS}
        retry(callback.queue, self.study, frozen, decision)
        self.say(f"{label}: queued again (retry {decision.attempts}; {decision.why()})")
        return True

    @staticmethod
    def _gave_up(decision) -> str:
        return (f"{decision.why()}; the row stays failed, and the same command queues it again, resuming its run "
                "from its checkpoint")

    def _stale_decision(self, trial, decision) -> None:
        """What became of a trial this worker found stale (its worker killed or stopped past the grace)."""
        what = f"queued again (retry {decision.attempts}; {decision.why()})" if decision.queue else \
            f"not queued again: {self._gave_up(decision)}"
        a = trial.user_attrs
        self.say(f"trial {trial.number} {a.get('variant', '')} seed {a.get('seed', '')} stopped beating: {what}")

    def run_trial(self, trial, trial_id: int, entry: Entry) -> int:
        """Run one claimed trial; returns 1 if a training process was started."""
        with Heartbeat(self.storage, trial_id, self.sweep.heartbeat["interval"]) as self._beat:
            try:
                return self._run_claimed(trial, trial_id, entry)
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the trial (its process stopped) goes back to the queue
                with shielded():
                    self._stopped(trial)
                raise

    def _run_claimed(self, trial, trial_id: int, entry: Entry) -> int:
        from optuna.trial import TrialState

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
        return self._train(trial, trial_id, entry, cfg, params, label)

    def _train(self, trial, trial_id: int, entry: Entry, cfg: config.Config, params: int, label: str) -> int:
        from optuna.trial import TrialState

        from ..training.runs.resume import newest_step

        # The run folder is named after the row (<sweep>-<variant>-s<seed>-<hash>); a run of this config under
        # another name (<run.name>-<hash>, another sweep's same row) is trained on in its folder: run.id names it.
        rid = run_folder.existing_run_id(cfg)
        if rid != run_id(cfg):
            cfg.run.id = rid
        run_dir = self.plan.results_dir / rid
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"trial-{trial.number:04d}-{entry.name}-s{entry.seed}.log"
        where = {"gpu": os.environ[GPU_ENV]} if os.environ.get(GPU_ENV) else {}  # launched on a GPU
        where.update(job_attrs(os.environ))  # a Slurm job's worker: the job (--status names it)
        held.set_attrs(trial, {"run_id": rid, "run_dir": str(run_dir), "host": socket.gethostname(), "log": str(log),
                               "planned_params": params, **where})
        if trial.user_attrs.get("status") == STOPPED:  # stopped by Ctrl-C earlier: running again now
            held.set_attrs(trial, {"status": "resumed", "reason": held.resume_note(trial.user_attrs.get("stopped_at"),
                                                                                 newest_step(run_dir), run_dir)})
        problem = run_folder.reuse_problem(cfg, run_dir)  # its folder holds another config: left as it is
        if problem is not None:
            self.say(f"{label}: failed: {problem}")
            self._close(trial, TrialState.FAIL, error=problem)
            self.counts["failed"] += 1
            return 0
        # The trial's config is made once, here: written beside its log, and the trial process trains from that
        # file (and keeps it as its run's config.yaml). The storage URL goes in the environment only.
        cfg.sweep.study, cfg.sweep.trial, cfg.sweep.metric = self.sweep.name, trial.number, self.sweep.metric
        cfg.sweep.storage = None
        try:
            trial_file = write_trial_config(cfg, log.with_suffix(".yaml"))
        except OSError as e:
            err = run_folder.storage_error(e, self.logs)
            if err is None:
                raise
            self._disk_failure(trial, trial_id, label, str(err))
            return 0
        srun = srun_prefix(cfg.train, os.environ)
        cmd = [*srun, sys.executable, "-m", "lightning_tfm", "train", str(trial_file)]
        env = {**os.environ, STORAGE_ENV: self.url, "PYTHONUNBUFFERED": "1"}
        if not srun:  # under srun the ranks are slurmstepd's children; the job's end ends them with the worker
            env = tie(env)
        self.say(f"{label}: training {rid} (log {log})")
        started = time.time()
        deadline = None
        # A run stopped past this trial's budget (a larger budget's sweep, Ctrl-C'd): `ltfm train` refuses to resume
        # it with a smaller one, and none is needed: it is read at this budget below, as a folder trained past it.
        prior = read_summary(run_dir) or {}
        rc, attempt = (0, None) if prior.get("status") not in (None, "completed") and \
            (newest_step(run_dir) or 0) > cfg.train.max_steps else (None, None)
        while rc is None:
            # where this attempt starts: the retry rule asks, when it ends, whether it kept work past that
            held.write(trial.number, trial.set_user_attr, RESUME_STEP, newest_step(run_dir))
            attempt = env[ATTEMPT_ENV] = secrets.token_hex(8)
            rc = self._run_process(cmd, env, log, trial)
            if not (rc == 2 and RUN_LOCKED in (log_error_line(log) or "")):
                break
            rc = None
            # Another process trains this very run: a stopped trial whose heartbeat lapsed (this trial is its
            # retry), a `ltfm train` by hand, a worker of another sweep. Not this trial's failure: it waits
            # (beating its heart) for the run's lock, then starts again, resuming the run or finding it completed.
            reason = scrub_text(log_error_line(log) or "", self.url)
            if deadline is None:
                deadline = time.monotonic() + LOCKED_PATIENCE_S
                self.say(f"{label}: already running elsewhere: {reason}; waiting for it to end (up to "
                         f"{LOCKED_PATIENCE_S / 60:.0f} min), then this trial resumes the run")
            if not self._wait_unlocked(run_dir, deadline):
                self.counts["skipped"] += 1
                self.say(f"{label}: still running elsewhere after {LOCKED_PATIENCE_S / 60:.0f} min: left to it")
                self._close(trial, TrialState.FAIL, skip="running", reason=reason)
                return 1
        summary = read_summary(run_dir) or {}
        if rc != 0 and summary.get("attempt") != attempt:
            summary = {}  # left by an earlier attempt: this process died before writing its own
        # (rc 0 with an older attempt: the run was already completed, and `ltfm train` returned its summary)
        past = folder_at_budget(run_dir, cfg.train.max_steps, summary) if summary else None
        if past is not None:  # trained past this trial's budget by another sweep: read at the budget
            summary = past.summary
        results = {k: summary.get(k) for k in RESULT_ATTRS}
        results = {k: v for k, v in results.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        status = summary.get("status")
        if status == "completed" and rc != 0:
            status = None
        value = summary.get(self.sweep.metric)
        took = f"{time.time() - started:.0f} s"
        known = isinstance(value, (int, float)) and math.isfinite(value)
        if status == "completed" and known:
            self.counts["completed"] += 1
            self._last_input_error = None
            read = f" ({past.note})" if past is not None else ""
            self.say(f"{label}: completed {self.sweep.metric}={value:.4g}{read} ({took})")
            self._close(trial, TrialState.COMPLETE, [float(value)], **results,
                        trained_past=past.later if past is not None else None)
        elif past is not None and (status == CONTINUED or status == "completed" and not past.from_attempt):
            # the folder cannot say this trial's metric at its budget: never the later budget's
            reason = summary.get("error") if status == CONTINUED else (
                f"its run folder was trained on ({past.later}) and holds no {self.sweep.metric} at step "
                f"{cfg.train.max_steps}, this sweep's budget"
                + (f" ({NO_BLEU})" if "bleu" in self.sweep.metric else ""))
            self.counts["skipped"] += 1
            self.say(f"{label}: skipped: {reason}")
            self._close(trial, TrialState.FAIL, skip=PAST_BUDGET, reason=reason, trained_past=past.later, **results)
        elif status == "pruned":
            self.counts["pruned"] += 1
            self._last_input_error = None
            self.say(f"{label}: pruned at step {summary.get('steps')} ({took})")
            self._close(trial, TrialState.PRUNED, **results)
        else:
            if status == "completed":
                error = f"summary.json has no finite {self.sweep.metric}"
            elif rc < 0:  # ended by a signal it could not handle: its log's last line says nothing of why
                error = killed_by(-rc)
            else:
                error = (log_error_line(log) if rc == 2 else None) or summary.get("error") or \
                    log_error_line(log) or f"exit code {rc}"
            error = scrub_text(error, self.url)
            problem = run_folder.write_problem(self.plan.results_dir)
            if rc > 0 and (problem is not None or run_folder.CANNOT_WRITE in error):
                # the results folder could not take the run's writes (its log may be empty): not the row's failure
                if run_folder.CANNOT_WRITE not in error:
                    error = f"{error}; the results folder cannot be written ({problem})"
                self._disk_failure(trial, trial_id, label, error, exit_code=rc, **results)
                return 1
            self.say(f"{label}: failed: {error} ({took}; log {log})")
            with queue_lock(self.storage, self.sweep.name):
                self._close(trial, TrialState.FAIL, error=error, exit_code=rc, **results)
                requeued = rc < 0 and self._requeue(trial_id, label)
            self.counts["requeued" if requeued else "failed"] += 1
            if rc == 2:  # an input error (data, results folder): if it repeats, every trial would fail
                if error == self._last_input_error:
                    raise UserError(f"{error} (two trials in a row failed this way; see {log})")
                self._last_input_error = error
        return 1

    def _run_process(self, cmd: list[str], env: dict, log: Path, trial) -> int:
        """Run the trial's ``ltfm train`` with its output appended to ``log``; its exit code. The heartbeat finding
        the trial taken over stops the process as Ctrl-C does (its checkpoint saved) and raises
        :class:`~.held.TakenOver`; Ctrl-C or SIGTERM stops it the same way (then :meth:`_stopped`)."""
        with open(log, "ab") as fh:
            proc = process.start(cmd, env, fh)
            try:
                while True:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        return proc.wait(timeout=self.sweep.heartbeat["interval"])
                    if self._beat.taken_over.is_set():
                        stop_process(proc, signal.SIGINT, STOP_PATIENCE_S)
                        raise held.TakenOver(trial.number)
            except KeyboardInterrupt:  # Ctrl-C: the trial process got SIGINT too; let it save its checkpoint
                with shielded():  # a second Ctrl-C or the launcher's SIGTERM meanwhile: the stop goes on
                    # SIGTERM reached this worker alone: stop the trial the same way
                    stop_process(proc, signal.SIGINT if TERMINATED.is_set() else None, STOP_PATIENCE_S)
                raise

    def _stopped(self, trial) -> None:
        """A trial stopped by Ctrl-C (or SIGTERM, SIGUSR1) goes back to the queue as *stopped* at its run's newest
        checkpoint step (:func:`~.held.put_back`)."""
        from ..training.runs.resume import newest_step

        run_dir = trial.user_attrs.get("run_dir")
        step = newest_step(run_dir) if run_dir else None
        try:
            held.put_back(self.storage, self.sweep.name, trial, step)
        except held.TakenOver:
            return  # its retry owns the row
        except Exception as e:  # noqa: BLE001 - the storage gone: the study's heartbeat check queues it instead
            self.say(f"trial {trial.number}: could not be put back in the queue ({e.__class__.__name__}): the next "
                     "run of the sweep re-runs it once its heartbeat has lapsed")
            return
        self.say(f"trial {trial.number} {trial.user_attrs.get('variant', '')} seed {trial.user_attrs.get('seed', '')}: "
                 + held.stop_note(step).replace(": ", "; ", 1))

    def _wait_unlocked(self, run_dir: Path, deadline: float) -> bool:
        """Wait until no process holds the run's lock (True), or until ``deadline`` (False)."""
        while not run_folder.lock_free(run_dir):
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.sweep.heartbeat["interval"])
        return True

    def _final_message(self) -> None:
        from optuna.trial import TrialState

        trials = retry(self.study.get_trials, deepcopy=False)
        running = [t.number for t in trials if t.state == TrialState.RUNNING]
        waiting = [t.number for t in trials if t.state == TrialState.WAITING]
        c = self.counts
        msg = (f"worker done: {c['completed']} completed, {c['pruned']} pruned, {c['failed']} failed, "
               f"{c['skipped']} skipped" + (f", {c['requeued']} stopped and queued again" if c["requeued"] else ""))
        if running:
            msg += (f"; trial(s) {', '.join(map(str, running))} still running in other workers (a trial whose "
                    f"worker died is re-run by the next `ltfm sweep` started {self.sweep.heartbeat['grace']} s "
                    "after its last heartbeat)")
        if waiting:
            msg += f"; {len(waiting)} waiting"
        self.say(msg)
