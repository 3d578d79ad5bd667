"""One training run, top to bottom: check the config, take the run folder, build, fit, summarise.

``train(cfg)`` is what ``ltfm train`` and the sweep trials run. The run folder is
``<run.results_dir>/<run id>``; the run id is derived from the config, so re-running the same command
resumes from ``checkpoints/last.ckpt`` (and a completed run is not trained again).

Nothing finished is lost: one process trains a run folder at a time (:mod:`.runs.run_folder`); checkpoints, the
summary, config and hypotheses are written atomically inside the run folder (:mod:`..base.atomic`,
:mod:`.runs.checkpoint_io`); an unreadable ``last.ckpt`` or ``summary.json`` is set aside with a warning and the
newest readable step checkpoint is used; earlier attempts stay in ``summary["attempts"]``; a full or
read-only disk and a diverging loss end as one line, exit 2, with the attempt recorded as ``failed``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch

from ..base import atomic
from ..base.errors import UserError
from ..base.memory import keep_freed_memory
from .config import config
from .config.sections import tokens_per_step
from .data.corpus import Corpus
from .precision import resolve_precision
from .runs import results, resume, run_folder
from .runs.checkpoint_io import atomic_checkpoint_io
from .runs.checkpoints import tokenizer_hash


def completed_summary(cfg: config.Config) -> dict | None:
    """The summary of ``cfg``'s run when it is already completed (said in one line), else None; the config checked,
    its folder's config compared and the results folder found writable first. A quick look (no lock): an unusable
    summary is dealt with under the lock by :func:`train`. Called before Lightning is imported, so that a sweep
    re-run over its finished rows answers each at once."""
    config.validate(cfg)
    rid = run_folder.existing_run_id(cfg, others=False)  # its id's folder, else that of its legacy id holding it
    results_dir = Path(cfg.run.results_dir)
    run_dir = results_dir / rid
    run_folder.check_reuse(cfg, run_dir)  # a folder of another config stops here, untouched, whatever its name
    run_folder.check_writable(results_dir)
    prev = results.read_summary(run_dir)
    if run_folder.already_done(prev, cfg):
        print(f"ltfm: run {rid} is already completed: {run_dir / 'summary.json'}", file=sys.stderr)
        return prev
    return None


def train(cfg: config.Config, callbacks: Sequence = ()) -> dict:
    """Train (or resume, or skip if completed) the run described by ``cfg``; returns its summary.

    ``callbacks``: more Lightning callbacks (a sweep trial's pruning, :mod:`lightning_tfm.sweep.pruning`);
    when one of them has a true ``pruned`` attribute after fitting, the run ends as ``pruned`` and is not
    decoded; when one has an ``abandoned`` reason, the attempt fails with it.
    """
    started = time.time()
    # A log handler that cannot write (W&B's own log files on a full disk) drops the record instead of printing
    # "--- Logging error ---" and a traceback for each one: the run's own writes report the disk, in one line.
    logging.raiseExceptions = False
    done = completed_summary(cfg)
    if done is not None:
        return done
    rid = run_folder.existing_run_id(cfg, others=False)  # its id's folder, else that of its legacy id holding it
    results_dir = Path(cfg.run.results_dir)
    run_dir = results_dir / rid
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    keep_freed_memory()  # a step's freed tensors kept for the next one, not faulted in again (base/memory.py)

    corpus = Corpus(cfg)  # every data error is raised here, before anything is written (builds the cache if needed)
    corpus.use_in_run(run_dir, write=False)  # resuming on another vocabulary stops here
    vocab = tokenizer_hash(corpus.folder / "tokenizer.json")
    resume.check(resume.pick(run_dir / "checkpoints"), run_dir, cfg, vocab)  # ... or from another's checkpoint
    from .tracking.tracking import resolve_mode
    resolve_mode(cfg)  # a bad WANDB_MODE / wandb.mode stops here, before the run folder exists
    is_zero = run_folder.rank_zero()
    try:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
        # Only global rank zero locks: the other ranks of a DDP run belong to the same training.
        with run_folder.RunLock(run_dir, rid) if is_zero else contextlib.nullcontext():
            return Run(cfg, rid, run_dir, corpus, is_zero, started, list(callbacks)).go()
    except UserError:
        raise
    except BaseException as e:
        err = run_folder.storage_error(e, run_dir)
        if err is None:
            raise
        raise err from None


class Run:
    """The run under its lock: :meth:`go` = build, fit, summarise; any failure is recorded by :meth:`fail`."""

    def __init__(self, cfg: config.Config, rid: str, run_dir: Path, corpus: Corpus, is_zero: bool, started: float,
                 extra: list):
        self.cfg, self.rid, self.run_dir, self.corpus = cfg, rid, run_dir, corpus
        self.is_zero, self.started, self.extra = is_zero, started, extra
        self.summary_path, self.ckpt_dir = run_dir / "summary.json", run_dir / "checkpoints"
        self.trainer = self.wandb_logger = None
        self.summary: dict = {}
        self.prev_wall = 0.0
        self.resume: Path | None = None

    def go(self) -> dict:
        prev = self.open_folder()
        if run_folder.already_done(prev, self.cfg):  # completed by the process that held the lock a moment ago
            print(f"ltfm: run {self.rid} is already completed: {self.summary_path}", file=sys.stderr)
            return prev
        self.resume = self.resume_from()
        module = self.build(prev)
        try:
            metrics, pruned = self.fit(module)
            abandoned = next((cb.abandoned for cb in self.extra if getattr(cb, "abandoned", None)), None)
            if abandoned:  # a callback stopped the run short of its budget: never recorded as completed
                raise Abandoned(abandoned)
            train_wall = self.prev_wall + time.time() - self.started
            if self.is_zero and not pruned:  # a pruned trial is not decoded: its dev loss already ranked it
                from .evaluate import final_evaluation
                self.summary.update(final_evaluation(self.cfg, module.model, self.corpus, self.run_dir))
        except BaseException as e:
            self.fail(e)
            raise
        return self.summarise(module, metrics, pruned, train_wall)

    # -------------------------------------------------------------------------------------------- build
    def resume_from(self) -> Path | None:
        """The checkpoint to resume from, checked to be this run's (the one Lightning loads, under the lock: one
        copied in since :func:`train`'s check is refused too), before anything is written. Rank zero sets unreadable
        ones aside; the other ranks pick the same file (:func:`~.runs.resume.pick`)."""
        chosen = resume.pick(self.ckpt_dir)
        if not self.is_zero:
            return chosen.path
        resume.check(chosen, self.run_dir, self.cfg, tokenizer_hash(self.corpus.folder / "tokenizer.json"))
        return resume.set_aside_unreadable(chosen)

    def open_folder(self) -> dict | None:
        """Rank zero: the folder still holds this config's run; remove what a killed process left mid-write, read the
        earlier summary."""
        if not self.is_zero:
            return None
        run_folder.check_reuse(self.cfg, self.run_dir)  # again: another config may have come in before the lock
        for folder in (self.run_dir, self.ckpt_dir, self.run_dir / "hyps"):
            atomic.remove_stale_temps(folder)
        return run_folder.previous_summary(self.summary_path)

    def build(self, prev: dict | None):
        """Seed, the run folder's config and tokenizer, the model, and the summary of a running attempt."""
        import pytorch_lightning as pl

        from ..base.redact import scrub
        from .lit import Seq2SeqModule

        cfg = self.cfg
        pl.seed_everything(cfg.run.seed, workers=True, verbose=False)
        if self.is_zero:
            self.corpus.use_in_run(self.run_dir, write=True)
            atomic.write_text(self.run_dir / "config.yaml", config.saved_yaml(cfg))
        module = Seq2SeqModule(cfg, self.corpus.vocab_size, tokenizer_hash(self.corpus.folder / "tokenizer.json"))
        module.run_id, module.corpus_identity = self.rid, self.corpus.identity  # recorded in its checkpoints
        self.summary = {"run_id": self.rid, "status": "running", "run_dir": str(self.run_dir),
                        "config": scrub(cfg.to_dict()),
                        "params": module.model.num_parameters(), "vocab_size": self.corpus.vocab_size,
                        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "pid": os.getpid(),
                        "host": socket.gethostname(), **self.corpus.summary()}
        if os.environ.get(results.ATTEMPT_ENV):  # started by a sweep worker: its token for this attempt
            self.summary["attempt"] = os.environ[results.ATTEMPT_ENV]
        attempts = run_folder.attempts(prev)
        if attempts:
            self.summary["attempts"] = attempts
        self.prev_wall = float((prev or {}).get("wall_time_s") or 0.0)
        return module

    # ---------------------------------------------------------------------------------------------- fit
    def fit(self, module) -> tuple[dict, bool]:
        """The Trainer with its loggers and callbacks; fit from the checkpoint to resume; (metrics, pruned)."""
        import pytorch_lightning as pl
        from pytorch_lightning.loggers import CSVLogger

        from .lit import DevBleu, StopOnSignal, TranslationDataModule
        from .tracking.progress import quiet_lightning
        from .tracking.tracking import make_wandb_logger

        cfg, t = self.cfg, self.cfg.train
        if self.is_zero:
            atomic.write_json(self.summary_path, self.summary)
        self.wandb_logger = make_wandb_logger(cfg, self.rid, self.run_dir)
        loggers = [CSVLogger(save_dir=str(self.run_dir), name="logs")]  # logs/version_N: one per attempt
        if self.wandb_logger is not None:
            loggers.append(self.wandb_logger)
        self.dev_bleu = DevBleu(cfg, self.corpus.tokenizer, self.corpus.dev_raw["src"], self.corpus.dev_raw["tgt"],
                                self.wandb_logger)
        world = world_size(t)
        accumulate = accumulation(t, world)
        trainer_kwargs = _trainer_kwargs(cfg, accumulate)
        checkpoints = checkpoint_callbacks(t, self.ckpt_dir)  # a signal stops at a step's end, with last.ckpt there
        quiet_lightning()
        stop = StopOnSignal(checkpoints[0], None if t.checkpoint_every_minutes else t.checkpoint_every_steps)
        self.trainer = trainer = pl.Trainer(
            logger=loggers, callbacks=[stop_on_nonfinite_loss(), *checkpoints, stop, self.dev_bleu, *self.extra],
            default_root_dir=str(self.run_dir), plugins=[atomic_checkpoint_io(), *job_plugins(world)], **trainer_kwargs)
        if trainer.world_size != world:
            raise UserError(f"train.devices={t.devices} x train.num_nodes={t.num_nodes} gives {world} processes "
                            f"but Lightning sees {trainer.world_size}: "
                            "make them agree with the launcher (torchrun/srun)")
        self.summary.update(precision=trainer_kwargs["precision"])  # what train.precision (e.g. auto) resolved to
        self.summary.update(world_size=world, accumulate=accumulate,
                            effective_batch_tokens=int(tokens_per_step(t.batch_tokens, world, accumulate)))
        if self.is_zero:
            print(f"ltfm: run {self.rid}: {world} process(es) x {t.batch_tokens} tokens x accumulation {accumulate} "
                  f"= {self.summary['effective_batch_tokens']} tokens per side per optimizer step", file=sys.stderr)
        datamodule = TranslationDataModule(cfg, self.corpus.train, self.corpus.dev)
        resume = self.resume
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume) if resume else None, weights_only=True)
        if trainer.interrupted:
            raise KeyboardInterrupt
        if trainer.global_step % t.val_every_steps != 0 or results.DEV_LOSS not in trainer.callback_metrics:
            trainer.validate(module, datamodule=datamodule, verbose=False)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        return metrics, any(getattr(cb, "pruned", False) for cb in self.extra)

    # ---------------------------------------------------------------------------------------- summarise
    def summarise(self, module, metrics: dict, pruned: bool, train_wall: float) -> dict:
        """The attempt's summary.json: status, steps, dev loss and perplexity, tokens, times, W&B run."""
        trainer = self.trainer
        wall = self.prev_wall + time.time() - self.started
        train_tokens = module.train_tokens * trainer.world_size
        self.summary.update(
            status="pruned" if pruned else "completed", steps=trainer.global_step, epochs=trainer.current_epoch,
            dev_loss=metrics.get(results.DEV_LOSS), dev_ppl=metrics.get(results.DEV_PPL),
            train_tokens=train_tokens, wall_time_s=round(wall, 1), train_time_s=round(train_wall, 1),
            tokens_per_s=round(train_tokens / max(train_wall, 1e-9), 1),
            dev_bleu_history=self.dev_bleu.history,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
        if self.is_zero:
            from .tracking.tracking import finish
            self.summary.update(finish(self.wandb_logger, self.summary, self.summary.get("bleu_checkpoint_path")))
            atomic.write_json(self.summary_path, self.summary)
        return self.summary

    def fail(self, e: BaseException) -> None:
        """Record the attempt as failed, or as stopped by a signal with the run's last validation (its step, dev loss
        and perplexity: a stopped run is not a failed one), if the folder still takes a small file, keeping the
        earlier attempts."""
        if not self.is_zero:
            return
        from ..base.redact import scrub
        from .tracking.tracking import finish

        err = e if isinstance(e, UserError) else run_folder.storage_error(e, self.run_dir) or e
        text = str(err).splitlines()[0] if str(err) else ""
        stopped = (stop_reason(e) or (None,))[0]
        why = stopped or (str(e) if isinstance(e, Abandoned) else None)
        steps = self.trainer.global_step if self.trainer is not None else 0
        self.summary.update(status="stopped" if stopped else "failed",
                            error=why or scrub(f"{err.__class__.__name__}: {text}"), steps=steps,
                            wall_time_s=self.prev_wall + time.time() - self.started)
        if stopped:
            try:
                validation = results.last_validation(self.run_dir, steps)
            except (OSError, ValueError):  # its logs unreadable: the stop is still recorded
                validation = None
            if validation is not None:
                self.summary["last_validation"] = validation
        try:
            self.summary.update(finish(self.wandb_logger, self.summary))
        except Exception:  # noqa: BLE001 - the run's own error is the one to report
            pass
        try:
            atomic.write_json(self.summary_path, self.summary)
        except OSError as write_error:
            print(f"ltfm: warning: could not record the failure in {self.summary_path} ({write_error.strerror})",
                  file=sys.stderr)


class Abandoned(Exception):
    """A callback stopped the run before its budget and said why (``abandoned``): the attempt fails with that."""


class SIGTERMException(SystemExit):
    """SIGTERM outside ``Trainer.fit`` (``ltfm train``'s handler: building the corpus and the model, the final
    evaluation). Lightning raises its own class of this name during fit (``pytorch_lightning.utilities.exceptions``);
    this one is declared here so that ``ltfm train`` checks its config, or finds its run completed, before it
    imports Lightning (~9 s of a run's start on the 2-core EPYC). :func:`stop_reason` reads both by their name."""


def stop_reason(e: BaseException) -> tuple[str, int] | None:
    """(what stopped the run, the exit code for it: 128 + the signal, as a shell reports a process it ended)
    when a signal did, else None. Lightning turns SIGTERM (a scheduler's preemption,
    ``kill``; ``ltfm train`` sends itself one on SIGUSR1 outside SLURM) into ``SIGTERMException`` and Ctrl-C
    (SIGINT) into ``SystemExit(1)`` raised while handling the KeyboardInterrupt: both are SystemExits, which
    must not read as success. Ctrl-C outside fit (the closing evaluation) is a KeyboardInterrupt itself."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (SIGINT): run the same command to resume from the last checkpoint", 130
    if not isinstance(e, SystemExit):
        return None
    if type(e).__name__ == "SIGTERMException":
        return ("stopped by SIGTERM (preempted or killed): run the same command to resume from the last checkpoint",
                143)
    if isinstance(e.__context__, KeyboardInterrupt):
        return "interrupted (SIGINT): run the same command to resume from the last checkpoint", 130
    return None


# ------------------------------------------------------------------------------------ the Trainer's parts
def checkpoint_callbacks(t: dict, ckpt_dir: Path, clock=None) -> list:
    """Step checkpoints (``step=NNNNNN.ckpt``, the last ``train.keep_checkpoints`` kept, and ``last.ckpt``),
    ``best.ckpt`` (lowest dev loss), and ``last.ckpt`` rewritten every ``train.checkpoint_every_seconds``
    between step checkpoints (:class:`~.lit.CheckpointEverySeconds`; not when the step checkpoints already
    come by time as often). ``clock``: that callback's time source (tests)."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from .lit import CheckpointEverySeconds

    minutes = t.checkpoint_every_minutes
    steps = ModelCheckpoint(
        dirpath=ckpt_dir, filename="step={step:06d}", auto_insert_metric_name=False, save_last=True,
        monitor="step", mode="max", save_top_k=max(t.keep_checkpoints, 1),
        every_n_train_steps=None if minutes else t.checkpoint_every_steps,
        train_time_interval=timedelta(minutes=minutes) if minutes else None,
    )
    best = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor=results.DEV_LOSS, mode="min", save_top_k=1,
                           enable_version_counter=False, auto_insert_metric_name=False)
    seconds = t.checkpoint_every_seconds
    if seconds is None or (minutes and seconds >= minutes * 60):
        return [steps, best]
    timed = CheckpointEverySeconds(seconds, None if minutes else t.checkpoint_every_steps, steps,
                                   **({"clock": clock} if clock else {}))
    return [steps, best, timed]


def stop_on_nonfinite_loss():
    """A callback that stops the run as failed the moment the training loss is nan/inf: nothing after it can be
    trusted, and a checkpoint of it must not become ``last.ckpt`` (Lightning runs checkpoint callbacks after
    this one)."""
    import pytorch_lightning as pl

    class StopOnNonFiniteLoss(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
                raise UserError(f"training loss became {float(loss.detach().float().mean())} at step "
                                f"{trainer.global_step}: the run diverged; lower train.lr_scale, raise train.warmup or "
                                f"set train.clip_norm, in a new run")

    return StopOnNonFiniteLoss()


def world_size(train_cfg: config.TrainConfig) -> int:
    """Processes the run will have: devices per node x nodes (before the Trainer exists)."""
    devices = train_cfg.devices.strip()
    if devices.lstrip("-").isdigit():
        n = int(devices)
        if n == -1:
            n = torch.cuda.device_count() if train_cfg.accelerator in ("gpu", "cuda", "auto") and \
                torch.cuda.is_available() else 1
    elif devices == "auto":
        n = torch.cuda.device_count() if train_cfg.accelerator in ("gpu", "cuda", "auto") and \
            torch.cuda.is_available() else 1
    else:
        n = len([d for d in devices.split(",") if d.strip()])
    return max(n, 1) * train_cfg.num_nodes


def accumulation(train_cfg: config.TrainConfig, world: int) -> int:
    """Gradient accumulation that brings batch_tokens x world x accumulation closest to batch_tokens_total,
    so that 1 CPU, 2 GPUs or 8 GPUs take the same optimizer steps (the paper: ~25,000 tokens per side on
    8 GPUs). fairseq sets the same product by hand (--update-freq)."""
    total = train_cfg.batch_tokens_total
    if total is None:
        return train_cfg.accumulate
    return max(1, round(total / (train_cfg.batch_tokens * world)))


#: Set by a launcher that requeues its Slurm job itself (a sweep's job: :mod:`lightning_tfm.sweep.slurm`): the run
#: takes SIGUSR1 as SIGTERM (a stop at the end of its step, ``last.ckpt`` there) and Lightning's SLURM environment,
#: which still gives the ranks, does not requeue the job (``auto_requeue=False``)
LAUNCHER_REQUEUES_ENV = "LTFM_LAUNCHER_REQUEUES"


def job_plugins(world: int) -> list:
    """Inside a job whose launcher requeues it: Lightning's SLURM environment without its requeue where Slurm runs
    the run's ``world`` processes as its tasks (the ranks from Slurm), else Lightning's own (a run of several devices
    in a one-task job: Lightning starts its ranks itself, as on a workstation; its SLURM environment, which it would
    pick there, expects one task a rank). Outside such a job: [] (Lightning chooses)."""
    if not os.environ.get(LAUNCHER_REQUEUES_ENV):
        return []
    from pytorch_lightning.plugins.environments import LightningEnvironment, SLURMEnvironment

    if SLURMEnvironment.detect() and os.environ.get("SLURM_NTASKS", "") == str(world):
        return [SLURMEnvironment(auto_requeue=False)]
    return [LightningEnvironment()]


def _trainer_kwargs(cfg: config.Config, accumulate: int) -> dict:
    t = cfg.train
    devices = t.devices
    devices = int(devices) if devices.lstrip("-").isdigit() else devices
    return dict(
        accelerator=t.accelerator, devices=devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=resolve_precision(t.precision, t.accelerator), max_steps=t.max_steps,
        max_time=timedelta(minutes=t.max_time_minutes) if t.max_time_minutes else None,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=t.clip_norm or None,
        val_check_interval=t.val_every_steps * accumulate, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, log_every_n_steps=results.log_every(t.log_every_steps, t.max_steps),
        use_distributed_sampler=False, enable_model_summary=False,
        enable_progress_bar=t.progress_bar, max_epochs=-1,
    )
