"""Report a training run's dev metric to its Optuna trial at every validation, and stop it when pruned.

``ltfm sweep`` starts each trial as its own ``ltfm train`` process with ``sweep.storage``, ``sweep.study``,
``sweep.trial`` (the trial *number*) and ``sweep.metric``; the command line (``ltfm train`` in
:mod:`lightning_tfm.cli`) then hands :class:`OptunaPruning` to :func:`lightning_tfm.training.train.train` as an
extra Lightning callback: training knows nothing of sweeps, and ends a run as ``pruned`` when a callback
says so (its ``pruned`` attribute). The callback reports to the already RUNNING trial that the sweep
worker claimed, through Optuna's public API: ``optuna.load_study`` plus ``optuna.trial.Trial(study,
trial_id)`` (the same object ``study.optimize`` hands to an objective), so ``trial.report`` /
``trial.should_prune`` run the study's own pruner.

- The pruner is the sweep file's, read from the study's user attribute ``ltfm.pruner`` (written by the
  worker), so the trial process needs nothing but the storage, the study and the trial number. The curve
  pruner (``pruner: {type: curve}``, :class:`~.curve_pruner.CurvePruner`) gets this trial's ``train.warmup`` and
  ``train.max_steps`` where the file leaves its ``warmup`` and ``final_step`` unset.
- Steps are optimizer steps (``trainer.global_step``); Hyperband's resources are therefore steps too.
- Resume: the values reported so far are kept in the callback's state, which Lightning saves in every
  checkpoint. A resumed run (a retried trial after a killed worker, or a longer budget under a new trial)
  first reports the history the new trial does not have yet, then continues; a step already reported is
  never reported twice (Optuna would warn and ignore it).
- Rank zero alone talks to the storage; the prune decision is broadcast so every DDP rank stops together.
- The last step is never pruned: a run that reached its budget completed.
- If the trial was finished by someone else (another worker judged it dead because its heartbeat
  stopped), training stops rather than race the retried trial on the same run folder, and says so
  (``abandoned``), so that the run is recorded as stopped short, never as completed.
- A resumed run tells its trial every dev value it logged before: the saved history, and the run folder's
  metrics for the resumed step itself (its checkpoint was written before that step's validation).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

import pytorch_lightning as pl

from ..training.config.config import Config
from ..training.config.run_id import run_id
from ..training.runs.results import history_key
from .curve_pruner import CurvePruner
from .spec import build_pruner
from .storage import STORAGE_ENV, open_storage


class OptunaPruning(pl.Callback):
    """Lightning callback: ``trial.report(dev metric, global_step)`` at each validation; prune -> stop."""

    def __init__(self, cfg: Config):
        super().__init__()
        s = cfg.sweep
        self.storage_url = os.environ.get(STORAGE_ENV) or s.storage
        self.study_name, self.trial_number = s.study, int(s.trial)
        self.metric = s.metric
        self.key = history_key(self.metric)  # the logged key: dev_loss -> dev/loss
        self.pruned = False
        self.abandoned: str | None = None  # why training stopped short of its budget, when the trial was lost
        self.history: dict[int, float] = {}  # step -> value reported (saved in checkpoints)
        self.run_dir = Path(cfg.run.results_dir) / run_id(cfg)
        self.warmup, self.max_steps = cfg.train.warmup, cfg.train.max_steps  # the curve pruner's defaults
        self._trial = None
        self._reported: set[int] = set()  # steps the trial already holds (e.g. inherited by a retry)
        self._broken = False

    # -- Lightning state: the history survives a resume --------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": {int(k): float(v) for k, v in self.history.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = {int(k): float(v) for k, v in (state_dict.get("history") or {}).items()}

    # -- Optuna --------------------------------------------------------------------------------------------
    def _connect(self):
        if self._trial is None and not self._broken:
            import optuna

            storage = open_storage(self.storage_url, for_trial=True)
            study_id = storage.get_study_id_from_name(self.study_name)
            pruner = build_pruner(storage.get_study_user_attrs(study_id).get("ltfm.pruner"))
            if isinstance(pruner, CurvePruner):  # its warmup and final step default to this trial's
                pruner = pruner.for_trial(self.warmup, self.max_steps)
            study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=pruner)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.trial_number)
            self._trial = optuna.trial.Trial(study, trial_id)
            self._reported = set(storage.get_trial(trial_id).intermediate_values)
        return self._trial

    def _warn(self, what: str, e: BaseException) -> None:
        print(f"ltfm: warning: optuna {what} failed for trial {self.trial_number} of study "
              f"{self.study_name!r} ({e.__class__.__name__}); training continues without pruning", file=sys.stderr)
        self._broken = True

    def _report(self, step: int, value: float) -> bool:
        """Report once per step; returns False if the trial is already finished (someone else owns it)."""
        import optuna

        trial = self._connect()
        if trial is None:
            return True
        if step in self._reported:  # reported before this resume
            return True
        try:
            trial.report(value, step)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        self._reported.add(step)
        return True

    def _owner_lost(self, trainer: pl.Trainer) -> None:
        """The study finished this trial while this process could not beat its heart (stopped, paused): stop,
        and say why (``abandoned``), so that the run is recorded as stopped short, never as completed."""
        self.abandoned = (f"trial {self.trial_number} of study {self.study_name!r} was finished by the study "
                          f"while this process was stopped (its heartbeat lapsed): stopped at step "
                          f"{trainer.global_step}; the trial's retry resumes the run")
        print(f"ltfm: {self.abandoned}", file=sys.stderr)
        trainer.should_stop = True

    def _logged_history(self, upto: int) -> None:
        """Dev values the run folder's metrics hold up to the resumed step (``upto``): a step checkpoint is
        written before that step's validation, so its saved history lacks the value at its own step. Lightning
        logs a validation at ``global_step - 1``; the trial is told at ``global_step``, as in training."""
        from ..training.runs.results import read_metrics

        with contextlib.suppress(OSError, ValueError):
            for row in read_metrics(self.run_dir):
                step = row["step"] + 1
                if 0 < step <= upto and self.key in row and step not in self.history \
                        and math.isfinite(row[self.key]):
                    self.history[step] = float(row[self.key])

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a resume: give the (possibly new) trial the history it lacks."""
        if trainer.is_global_zero and trainer.global_step > 0:
            self._logged_history(int(trainer.global_step))
        if not trainer.is_global_zero or not self.history:
            return
        try:
            for step in sorted(self.history):
                if not self._report(step, self.history[step]):
                    return self._owner_lost(trainer)
        except Exception as e:  # the database is down: never lose the training for it
            self._warn("report", e)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        from pytorch_lightning.trainer.states import TrainerFn

        fitting = trainer.state.fn == TrainerFn.FITTING
        stop = False
        if trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.key)
            step = int(trainer.global_step)
            if value is not None and math.isfinite(float(value)) and step > 0:
                self.history[step] = float(value)
                try:
                    if not self._report(step, float(value)):
                        self._owner_lost(trainer)
                    elif fitting and step < trainer.max_steps and self._trial is not None:
                        stop = bool(self._trial.should_prune())
                except Exception as e:
                    self._warn("report", e)
        if fitting and trainer.world_size > 1:
            stop = bool(trainer.strategy.broadcast(stop, src=0))
        if stop:
            self.pruned = True
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"ltfm: trial {self.trial_number} pruned at step {trainer.global_step} "
                      f"({self.metric}={self.history.get(int(trainer.global_step))})", file=sys.stderr)
