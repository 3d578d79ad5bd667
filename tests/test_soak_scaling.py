"""What a sweep survives, on any machine (issue 37): the soak's chaos and limits in units of the work
(tests/soak/scale.py, check.py: pure functions, no sweep run), and the product's progress when kills come
faster than a trial finishes: ``last.ckpt`` every ``train.checkpoint_every_seconds`` between the step
checkpoints (a clock the test drives, no wall-clock race), and retries that do not run out while each attempt
keeps work (:class:`lightning_tfm.sweep.storage.RetryWhileProgressing`)."""
from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
import torch

from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import ROOT, SMOKE, TINY

sys.path.insert(0, str(ROOT / "tests" / "soak"))
import check as soak_check  # noqa: E402
import scale as soak_scale  # noqa: E402


# ------------------------------------------------------------------------------- the soak, in units of T
def _trial(number, state="COMPLETE", seconds=60.0, end=0, retried=False, key=None, run_dir=None, value=None):
    t0 = datetime(2026, 1, 1) + timedelta(seconds=end)
    return SimpleNamespace(number=number, state=SimpleNamespace(name=state), value=value,
                           system_attrs={"retry_history": [0]} if retried else {},
                           user_attrs={"grid_key": key, "run_dir": run_dir},
                           datetime_start=t0 - timedelta(seconds=seconds),
                           datetime_complete=t0 if state == "COMPLETE" else None)


def test_the_chaos_and_the_cap_scale_with_the_measured_trial_time():
    """A machine 3x slower gets kills 3x further apart and a cap 3x longer (the holds, set against the sweep's
    own grace, stay in seconds): one seed, the same chaos per trial."""
    holds = 120
    (lo, hi), cap = soak_scale.chaos_scale(30.0, 40, 4, holds)
    (lo3, hi3), cap3 = soak_scale.chaos_scale(90.0, 40, 4, holds)
    assert (lo3 / lo, hi3 / hi) == pytest.approx((3, 3)) and (cap3 - holds) == pytest.approx(3 * (cap - holds))
    assert (lo, hi) == pytest.approx((0.7 * 30, 1.4 * 30)) and cap == pytest.approx(3 * 10 * 30 + holds)
    # and a sweep that keeps a trial per worker per T works at rate 1, one that keeps nothing at 0
    assert soak_scale.work_rate(40 * 100, 100, 10 * 30, 4, 30) == pytest.approx(1.0)
    assert soak_scale.work_rate(0, 100, 600, 4, 30) == 0


def test_the_trial_time_is_measured_on_trials_completed_in_one_attempt():
    trials = [_trial(0, seconds=50, end=50), _trial(1, "FAIL", end=10), _trial(2, seconds=5, end=20, retried=True),
              _trial(3, seconds=70, end=70), _trial(4, seconds=500, end=900)]
    assert soak_scale.trial_time(trials, 2) == pytest.approx(60.0)  # trials 0 and 3: the first two clean ones
    assert soak_scale.trial_time(trials[:2], 2) is None  # not yet: the chaos has not started


def test_work_kept_counts_finished_budgets_and_checkpoint_steps(tmp_path):
    done, half, fresh = (tmp_path / n for n in ("done", "half", "fresh"))
    for d in (done / "checkpoints", half / "checkpoints", fresh, tmp_path / "sweep-logs"):
        d.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"status": "completed", "steps": 100}))
    (half / "summary.json").write_text(json.dumps({"status": "failed", "steps": 60}))  # killed: its checkpoints count
    for name in ("step=000025.ckpt", "step=000050.ckpt", "last.ckpt"):
        (half / "checkpoints" / name).write_bytes(b"")
    (tmp_path / "table3-soak.db").write_bytes(b"")
    assert soak_scale.work_kept(tmp_path) == 150


def test_unfinished_at_the_cap_is_not_lost_and_a_row_the_sweep_ended_without_is_given_up():
    labels = {"a": "base seed 1", "b": "A1 seed 1", "c": "A2 seed 1"}
    trials = [_trial(0, key="a"), _trial(1, "RUNNING", key="b"), _trial(2, key="a"), _trial(3, "FAIL", key="c")]
    stopped = soak_check.row_outcomes(labels, trials, stopped=True)
    assert stopped == {"duplicated": [("base seed 1", 2)], "unfinished": ["A1 seed 1", "A2 seed 1"], "given up": []}
    ended = soak_check.row_outcomes(labels, trials, stopped=False)
    assert ended["unfinished"] == []
    assert ended["given up"] == ["A1 seed 1 (trials 1 RUNNING)", "A2 seed 1 (trials 3 FAIL)"]


def test_a_lost_result_is_one_that_was_finished_and_is_gone(tmp_path):
    def run(name, **summary):
        (tmp_path / name).mkdir()
        if summary:
            (tmp_path / name / "summary.json").write_text(json.dumps(summary))
        return str(tmp_path / name)

    finished = [_trial(0, run_dir=run("ok", status="completed", dev_loss=1.5), value=1.5),
                _trial(1, run_dir=run("gone"), value=1.5),
                _trial(2, run_dir=run("over", status="completed", dev_loss=2.5), value=1.5),
                _trial(3, run_dir=run("short", status="running"), value=1.5)]
    lost, false = soak_check.result_problems(finished, "dev_loss")
    assert [x.split()[1] for x in lost] == ["1", "2"] and "is gone" in lost[0] and "overwritten" in lost[1]
    assert [x.split()[1] for x in false] == ["3"]


def test_the_figures_say_the_trial_time_the_chaos_interval_and_a_cap_reached():
    fig = {"trial time": 71.4, "chaos interval": [50, 100], "cap": 2250, "hit the cap": True,
           "unfinished at the cap": 3, "lost results": 0, "work rate": 0.31, "wall time": 2250.0}
    table = soak_check.figures_table([SimpleNamespace(name="sqlite-variants", figures=fig)], 2300, 1)
    assert "| trial time | 71 s |" in table and "| chaos interval | 50–100 s |" in table
    assert "| unfinished at the cap | 3 |" in table and "| lost results | 0 |" in table
    assert table.splitlines()[-1] == ("sqlite-variants reached its cap of 2250 s with 3 row(s) unfinished (not lost; "
                                      "work rate 0.31).")


# ------------------------------------------------------------------------------------ the seconds cadence
class _StepClock:
    """Each optimizer step takes one 'second': the clock reads the trainer's step."""

    def __init__(self):
        self.trainer = None

    def __call__(self) -> float:
        return float(self.trainer.global_step) if self.trainer is not None else 0.0


def _fit(tmp_path, max_steps: int, **train):
    """A tiny Lightning fit with the run's checkpoint callbacks (not best.ckpt: no validation here); returns
    (every save as (step, resume only), the seconds callback or None, the checkpoint folder)."""
    import pytorch_lightning as pl

    from lightning_tfm.training.runs.checkpoint_io import atomic_checkpoint_io
    from lightning_tfm.training.runs.checkpoints import RESUME_ONLY
    from lightning_tfm.training.train import checkpoint_callbacks

    saves = []

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randn(400, 4), batch_size=2)

        def on_save_checkpoint(self, checkpoint):
            saves.append((checkpoint["global_step"], bool(checkpoint.get(RESUME_ONLY))))

    t = config.TrainConfig(**train)
    clock = _StepClock()
    ckpt_dir = tmp_path / "checkpoints"
    callbacks = [c for c in checkpoint_callbacks(t, ckpt_dir, clock=clock) if getattr(c, "monitor", None) != "dev/loss"]
    trainer = pl.Trainer(max_steps=max_steps, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", plugins=[atomic_checkpoint_io()],
                         accumulate_grad_batches=train.get("accumulate", 1))
    clock.trainer = trainer
    trainer.fit(Tiny())
    timed = [c for c in callbacks if type(c).__name__ == "CheckpointEverySeconds"]
    return saves, (timed[0] if timed else None), ckpt_dir


def test_last_ckpt_comes_every_n_seconds_between_the_step_checkpoints(tmp_path):
    """Steps every 4, seconds every 2.5 (a step takes 1 s on the test's clock), whichever first: last.ckpt at
    steps 3 and 7 (resume only), the step checkpoints at 4 and 8 untouched; no last-v1.ckpt."""
    from lightning_tfm.training.runs.checkpoint_io import RESUME_ONLY
    from lightning_tfm.training.runs.resume import newest_step

    saves, timed, ckpt_dir = _fit(tmp_path, 10, checkpoint_every_steps=4, checkpoint_every_seconds=2.5)
    assert timed.saved_steps == [3, 7]
    assert [s for s in saves if s[1]] == [(3, True), (7, True)]
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["last.ckpt", "step=000004.ckpt", "step=000008.ckpt"]
    last = torch.load(ckpt_dir / "last.ckpt", map_location="cpu", weights_only=True)  # loadable the safe way
    assert last["global_step"] == 8 and not last.get(RESUME_ONLY)  # step 8's save came after step 7's
    assert newest_step(tmp_path) == 8


def test_zero_seconds_means_after_every_step_and_null_means_the_steps_alone(tmp_path):
    saves, timed, ckpt_dir = _fit(tmp_path / "a", 7, checkpoint_every_steps=3, checkpoint_every_seconds=0)
    assert timed.saved_steps == [1, 2, 4, 5]  # not 3 and 6 (step checkpoints), not 7 (the end)
    assert not any(p.name.endswith("-v1.ckpt") for p in ckpt_dir.iterdir())
    saves, timed, ckpt_dir = _fit(tmp_path / "b", 7, checkpoint_every_steps=3, checkpoint_every_seconds=None)
    assert timed is None and not any(resume_only for _, resume_only in saves)


def test_gradient_accumulation_saves_at_optimizer_steps_only(tmp_path):
    saves, timed, ckpt_dir = _fit(tmp_path, 4, checkpoint_every_steps=100, checkpoint_every_seconds=0, accumulate=3)
    assert timed.saved_steps == [1, 2, 3] and [s for s, resume in saves if resume] == [1, 2, 3]
    # ModelCheckpoint's own last.ckpt at the end goes over the one it was told is its own, not beside it
    assert [p.name for p in ckpt_dir.iterdir()] == ["last.ckpt"] and saves[-1] == (4, False)


def test_the_seconds_cadence_is_left_out_where_step_checkpoints_come_by_time_as_often(tmp_path):
    from lightning_tfm.training.train import checkpoint_callbacks

    def kinds(**kw):
        return [type(c).__name__ for c in checkpoint_callbacks(config.TrainConfig(**kw), tmp_path)]

    assert kinds(checkpoint_every_minutes=10, checkpoint_every_seconds=600) == ["ModelCheckpoint"] * 2
    assert kinds(checkpoint_every_minutes=10, checkpoint_every_seconds=60)[-1] == "CheckpointEverySeconds"
    assert kinds()[-1] == "CheckpointEverySeconds"  # the default: every 600 s between step checkpoints


def test_the_new_key_leaves_run_ids_alone_and_is_checked():
    from lightning_tfm.base.errors import UserError

    base = config.load_config(SMOKE, ["data.path=/x"])
    assert base.train.checkpoint_every_seconds == 600.0
    assert run_ids.run_id(config.load_config(SMOKE, ["data.path=/x", "train.checkpoint_every_seconds=5"])) == \
        run_ids.run_id(base) == "multi30k-smoke-9e45a369"  # tests/test_config.py pins this id
    assert config.load_config(SMOKE, ["data.path=/x", "train.checkpoint_every_seconds=null"]).train \
        .checkpoint_every_seconds is None
    with pytest.raises(UserError, match="checkpoint_every_seconds=-1.0 must be 0"):
        config.load_config(SMOKE, ["data.path=/x", "train.checkpoint_every_seconds=-1"])


def test_averaging_leaves_a_resume_only_last_ckpt_out(tmp_path):
    """A run whose last.ckpt was written by the seconds cadence past its newest step checkpoint averages its
    step checkpoints alone (as it did before that cadence existed)."""
    from lightning_tfm.training.runs.checkpoints import RESUME_ONLY, averaged_checkpoint

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    for step in (2, 4):
        torch.save({"global_step": step, "state_dict": {"w": torch.full((2,), float(step))}},
                   ckpt / f"step={step:06d}.ckpt")
    torch.save({"global_step": 5, "state_dict": {"w": torch.full((2,), 100.0)}, RESUME_ONLY: True}, ckpt / "last.ckpt")
    ck, chosen = averaged_checkpoint(tmp_path, 5)
    assert [p.name for p in chosen] == ["step=000002.ckpt", "step=000004.ckpt"]
    assert ck["state_dict"]["w"].tolist() == [3.0, 3.0]


def test_an_older_versions_final_last_ckpt_marked_resume_only_is_averaged(tmp_path):
    """A version before issue 64 marked the budget's end resume-only too: a last.ckpt at the step the run's summary
    says it completed at is the weights it ended with, and the last steps averaged end with it."""
    import json

    from lightning_tfm.training.runs.checkpoints import RESUME_ONLY, averaged_checkpoint

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    for step in (2, 4):
        torch.save({"global_step": step, "state_dict": {"w": torch.full((2,), float(step))}},
                   ckpt / f"step={step:06d}.ckpt")
    torch.save({"global_step": 5, "state_dict": {"w": torch.full((2,), 6.0)}, RESUME_ONLY: True}, ckpt / "last.ckpt")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "steps": 5}))
    ck, chosen = averaged_checkpoint(tmp_path, 2)
    assert [p.name for p in chosen] == ["step=000004.ckpt", "last.ckpt"] and ck["state_dict"]["w"].tolist() == [5.0] * 2
    (tmp_path / "summary.json").write_text(json.dumps({"status": "stopped", "steps": 5}))  # a stop's resume point
    assert [p.name for p in averaged_checkpoint(tmp_path, 2)[1]] == ["step=000002.ckpt", "step=000004.ckpt"]


def test_a_run_killed_between_step_checkpoints_resumes_from_the_seconds_checkpoint(tmp_path, data_dir, monkeypatch):
    """A real (tiny) training dies at step 7 with step checkpoints every 5: last.ckpt written by the seconds
    cadence (0: every step) holds step 7, and the same run resumes there, not at step 5."""
    import pytorch_lightning as pl

    from lightning_tfm.training.runs.resume import newest_step
    from lightning_tfm.training.train import train

    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = {**TINY, "data.path": str(data_dir), "run.results_dir": str(tmp_path / "results"),
                 "train.max_steps": 9, "train.checkpoint_every_steps": 5, "train.val_every_steps": 5,
                 "train.checkpoint_every_seconds": 0, "train.progress_bar": False}
    cfg = config.load_config(SMOKE, overrides)
    run_dir = tmp_path / "results" / run_ids.run_id(cfg)

    class Killed(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 7:
                raise RuntimeError("killed at step 7")

    class StartedAt(pl.Callback):
        step = None

        def on_train_start(self, trainer, pl_module):
            StartedAt.step = trainer.global_step

    with pytest.raises(RuntimeError, match="killed at step 7"):
        train(cfg, callbacks=[Killed()])
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step=*.ckpt")) == ["step=000005.ckpt"]
    assert newest_step(run_dir) == 7
    summary = train(config.load_config(SMOKE, overrides), callbacks=[StartedAt()])
    assert StartedAt.step == 7 and summary["status"] == "completed" and summary["steps"] == 9
    import logging
    assert logging.raiseExceptions is False  # a log handler on a full disk prints no traceback into the trial log


# ------------------------------------------------------------------------------ retries while progressing
def _study(tmp_path, max_retry, grace=60):
    import optuna

    from lightning_tfm.sweep.storage import open_storage, quiet_optuna

    quiet_optuna()
    storage = open_storage(f"sqlite:///{tmp_path / 'r.db'}", {"interval": 1, "grace": grace, "max_retry": max_retry})
    return storage, optuna.create_study(storage=storage, study_name="r")


def _attempt(storage, study, run_dir, resume_step, reached, state="FAIL"):
    """One attempt of the row: the newest WAITING trial (or a new one) claimed, started at ``resume_step``,
    its run's checkpoints taken to ``reached``, then ended in ``state``; returns its frozen trial."""
    import optuna
    from optuna.trial import TrialState

    waiting = study.get_trials(states=(TrialState.WAITING,))
    if waiting:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, waiting[-1].number)
    else:
        trial_id = study.ask()._trial_id
    storage.set_trial_state_values(trial_id, state=TrialState.RUNNING)
    trial = optuna.trial.Trial(study, trial_id)
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("variant", "base")
    if resume_step is not None:
        trial.set_user_attr("resume_step", resume_step)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    if reached:
        (run_dir / "checkpoints" / f"step={reached:06d}.ckpt").write_bytes(b"")  # the name is what counts
    if state == "FAIL":
        storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
    return storage.get_trial(trial_id)


def test_retries_do_not_run_out_while_each_attempt_keeps_work(tmp_path):
    """max_retry=1: six attempts in a row that each advance the run are all queued again; then one that keeps
    nothing is queued (the first without progress), and a second is not: the row stays failed."""
    from lightning_tfm.sweep.storage import STALLED

    storage, study = _study(tmp_path, max_retry=1)
    callback = storage.get_heartbeat_stale_trial_callback()
    run = tmp_path / "run"
    for i in range(6):
        frozen = _attempt(storage, study, run, 10 * i, 10 * (i + 1))
        decision = callback.decide(frozen)
        assert decision.queue and decision.progressed and decision.stalled == 0 and decision.attempts == i + 1
        callback(study, frozen)
    retry = study.get_trials()[-1]
    assert retry.state.name == "WAITING" and retry.system_attrs["retry_history"] == list(range(6))
    assert retry.system_attrs["failed_trial"] == 0 and retry.system_attrs[STALLED] == 0
    assert "resume_step" not in retry.user_attrs and retry.user_attrs["run_dir"] == str(run)  # per attempt
    frozen = _attempt(storage, study, run, 60, None)  # killed before it wrote a checkpoint
    assert callback.decide(frozen).queue and "1 of 1 attempts without progress, the run at step 60" in \
        callback.decide(frozen).why()
    callback(study, frozen)
    frozen = _attempt(storage, study, run, None, None)  # killed before it started training: no resume step
    decision = callback.decide(frozen)
    assert not decision.queue and decision.stalled == 2 and decision.steps is None
    n = len(study.get_trials())
    callback(study, frozen)
    assert len(study.get_trials()) == n  # not queued again


def test_max_retry_zero_queues_nothing_and_none_queues_always(tmp_path):
    (tmp_path / "a").mkdir()
    storage, study = _study(tmp_path / "a", max_retry=0)
    frozen = _attempt(storage, study, tmp_path / "a" / "run", 0, 10)
    assert not storage.get_heartbeat_stale_trial_callback().decide(frozen).queue
    (tmp_path / "b").mkdir()
    storage, study = _study(tmp_path / "b", max_retry=None)
    frozen = _attempt(storage, study, tmp_path / "b" / "run", None, None)
    assert storage.get_heartbeat_stale_trial_callback().decide(frozen).queue


def test_a_killed_trial_that_kept_work_is_queued_again_by_its_worker(tmp_path):
    """The worker's requeue of a trial killed by a signal goes through the same rule and says why."""
    from lightning_tfm.sweep.worker import Worker

    storage, study = _study(tmp_path, max_retry=1)
    worker = Worker.__new__(Worker)  # its requeue only: no sweep, no plan
    lines = []
    worker.storage, worker.study, worker.say = storage, study, lines.append
    for i, reached in enumerate((25, None, None)):
        frozen = _attempt(storage, study, tmp_path / "run", 0 if i == 0 else 25, reached)
        queued = worker._requeue(frozen._trial_id, "trial x base seed 1")
        assert queued == (i < 2), lines
    assert lines[0] == ("trial x base seed 1: queued again (retry 1; the attempt took the run from step 0 to step 25: "
                        "not counted against heartbeat.max_retry (0 of 1 attempts without progress))")
    assert lines[1].startswith("trial x base seed 1: queued again (retry 2; 1 of 1 attempts without progress")
    assert lines[2].startswith("trial x base seed 1: not queued again: 2 attempt(s) without progress, the run at "
                               "step 25; heartbeat.max_retry is 1; the row stays failed, "
                               "and the same command queues it")


def test_a_stale_trial_that_kept_work_is_queued_again_by_the_study(tmp_path):
    """The heartbeat path (a killed or stopped worker): Optuna's fail_stale_trials calls the same rule."""
    import time

    from optuna.storages import fail_stale_trials

    from lightning_tfm.sweep.storage import STALLED

    storage, study = _study(tmp_path, max_retry=1, grace=1)
    frozen = _attempt(storage, study, tmp_path / "run", 0, 25, state="RUNNING")
    storage.record_heartbeat(frozen._trial_id)
    time.sleep(2.5)  # the heartbeat is now older than the grace, however slow the machine
    fail_stale_trials(study)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"]
    assert trials[1].system_attrs[STALLED] == 0 and trials[1].system_attrs["retry_history"] == [0]


def test_a_trial_the_study_already_queued_again_is_not_counted_failed_after_a_full_disk(tmp_path):
    """SQLite on the full disk: the study fails the trial as stale (and queues it) before its worker records the
    disk failure; the worker finds it taken over (its retry owns the row), never counts it as failed (which made
    the worker exit 1) nor queues it a second time."""
    import optuna

    from lightning_tfm.sweep.held import TakenOver
    from lightning_tfm.sweep.worker import Worker

    storage, study = _study(tmp_path, max_retry=3)
    worker = Worker.__new__(Worker)
    lines = []
    worker.storage, worker.study, worker.say = storage, study, lines.append
    worker.plan = SimpleNamespace(results_dir=tmp_path)  # writable again: no wait
    worker.sweep = SimpleNamespace(heartbeat={"interval": 1})
    worker.counts = {"failed": 0, "requeued": 0}
    worker.sweep.name = "soak"
    frozen = _attempt(storage, study, tmp_path / "run", 0, None)  # already FAIL: the study got there first
    before = len(study.get_trials())
    with pytest.raises(TakenOver):  # the worker's loop says the one line and goes on
        worker._disk_failure(optuna.trial.Trial(study, frozen._trial_id), frozen._trial_id, "trial 0 base seed 1",
                             "cannot write in /x (No space left on device)")
    assert worker.counts == {"failed": 0, "requeued": 0}, lines
    assert len(study.get_trials()) == before  # queued once, by the study


def test_the_reason_a_trial_failed_is_never_a_traceback_header(tmp_path):
    """A trial log cut short by a full disk ends inside the logging module's report of a failed handler: the
    worker's one-line reason is the error, not 'Traceback (most recent call last):' (which also read as a
    traceback in the worker's log)."""
    from lightning_tfm.sweep.process import log_error_line

    log = tmp_path / "trial.log"
    log.write_text("ltfm: run x: 1 process(es)\n--- Logging error ---\nTraceback (most recent call last):\n"
                   '  File "a.py", line 1, in emit\n    self.flush()\nOSError: [Errno 28] No space left on device\n'
                   "Call stack:\n  File \"b.py\", line 2\nMessage: 'Current SDK version'\nArguments: ()\n"
                   "--- Logging error ---\nTraceback (most recent call last):\n  File \"/root/.py")
    assert log_error_line(log) == "OSError: [Errno 28] No space left on device"
