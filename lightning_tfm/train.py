"""One training run, end to end: data and vocabulary, Lightning Trainer, checkpoints, summary.json.

``train(cfg)`` is what ``ltfm train`` and the sweep trials run. The run folder is
``<run.results_dir>/<run id>``; the run id is derived from the config, so re-running the same command
resumes from ``checkpoints/last.ckpt`` (and a completed run is not trained again).

Faults (issue 15): one process trains a run folder at a time (``train.lock``); checkpoints, the summary,
config and hypotheses are written atomically inside the run folder (:mod:`lightning_tfm.atomic`); an
unreadable ``last.ckpt`` or ``summary.json`` is set aside with a warning and the newest readable step
checkpoint is used; earlier attempts stay in ``summary["attempts"]``; a full or read-only disk and a
diverging loss end as one line, exit 2, with the attempt recorded as ``failed``.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch
import yaml

from . import atomic
from . import config as C
from . import results as R
from .corpus import Corpus
from .errors import UserError

from .precision import resolve_precision


def rank_zero() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0 and \
        int(os.environ.get("NODE_RANK", "0")) == 0


def _free_space(path: Path) -> str:
    """Free space on the filesystem of ``path`` (or of its nearest existing ancestor), e.g. ``12.0 MB``."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return "unknown"
    for div, unit in ((2 ** 30, "GB"), (2 ** 20, "MB"), (2 ** 10, "kB")):
        if free >= div:
            return f"{free / div:.1f} {unit}"
    return f"{free} bytes"


def _check_writable(results_dir: Path) -> None:
    """Try to create (and remove) a folder in the nearest existing ancestor: os.access says yes to root."""
    import tempfile

    p = results_dir.absolute()
    while not p.exists():
        p = p.parent
    try:
        if not p.is_dir():
            raise NotADirectoryError(p)
        tempfile.TemporaryDirectory(dir=p).cleanup()
    except OSError as e:
        raise UserError(f"results folder {str(results_dir)!r} is not writable ({e.strerror or e.__class__.__name__}; "
                        f"{_free_space(p)} free): set run.results_dir to a folder you can write") from None


# Errors that mean "the results folder cannot take this write": the user's to fix (exit 2), not a crash.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
# ... as some libraries (tokenizers, torch's C++ writer) report them: as text, not an OSError
_STORAGE_TEXTS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "file write failed")


def storage_error(exc: BaseException, run_dir: Path) -> UserError | None:
    """A one-line UserError naming the folder and its free space when ``exc`` (or its cause) is a failed
    write into the results folder (disk full, quota, read-only, permission), else None."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            what = e.strerror or os.strerror(e.errno)
            break
        if any(t in str(e) for t in _STORAGE_TEXTS):
            what = next(t for t in _STORAGE_TEXTS if t in str(e))
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    return UserError(f"cannot write in {run_dir} ({what}; {_free_space(run_dir)} free there): free space, or set "
                     f"run.results_dir to a writable folder, then run the same command again to resume")


def lightning_parts() -> tuple:
    """(checkpoint IO plugin, non-finite-loss callback) for the Trainer. Defined here, not at module level,
    so that ``ltfm train`` reports config errors before importing Lightning."""
    import pytorch_lightning as pl
    from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        """Lightning's checkpoint writer, made atomic inside the run folder.

        Lightning's own ``_atomic_save`` commits through an fsspec transaction whose temporary file is made
        in ``$TMPDIR`` and then *copied* into the run folder: a full disk or a kill during that copy leaves a
        truncated ``last.ckpt``. Here the serialized bytes are written to a temporary file beside the target,
        fsynced and renamed (:mod:`lightning_tfm.atomic`), so a checkpoint is either whole or absent.
        """

        def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
            if storage_options is not None:
                raise TypeError("AtomicCheckpointIO takes no storage_options")
            buf = io.BytesIO()
            torch.save(checkpoint, buf)  # in memory first, as Lightning does: a write error is an OSError here
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_bytes(path, buf.getbuffer())

    class StopOnNonFiniteLoss(pl.Callback):
        """Stop the run as failed the moment the training loss is nan/inf: nothing after it can be trusted, and
        a checkpoint of it must not become ``last.ckpt`` (Lightning runs checkpoint callbacks after this one)."""

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
                raise UserError(f"training loss became {float(loss.detach().float().mean())} at step "
                                f"{trainer.global_step}: the run diverged; lower train.lr_scale, raise train.warmup or "
                                f"set train.clip_norm, in a new run")

    return AtomicCheckpointIO(), StopOnNonFiniteLoss()


LOCK_FILE = "train.lock"


class RunLock:
    """One training per run folder: an exclusive ``flock`` on ``<run>/train.lock``, held while the
    process trains. The kernel releases it when the process ends in any way (exit, crash, SIGKILL), so
    there is no stale lock to clean up. The file records the holder's host and pid for the message
    the second process prints. (flock works across NFS clients on Linux >= 2.6.12, as POSIX locks.)"""

    def __init__(self, run_dir: Path, rid: str):
        self.path, self.rid, self.fd = run_dir / LOCK_FILE, rid, None

    def __enter__(self) -> "RunLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            finally:
                os.close(fd)
            who = (f"pid {holder.get('pid')} on host {holder.get('host')}" if isinstance(holder, dict) and
                   holder.get("pid") else "another process")
            raise UserError(f"run {self.rid} {R.RUN_LOCKED} {who} (lock {self.path}): wait for it to finish or stop "
                            f"it; running the same command afterwards resumes the run") from None
        self.fd = fd
        with contextlib.suppress(OSError):  # a full disk must not stop the holder itself
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode() + b"\n", 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None


def checkpoint_problem(path: Path) -> str | None:
    from .evaluate import checkpoint_problem as problem
    return problem(path)


def _set_aside(path: Path, why: str) -> Path:
    """Rename an unreadable file out of the way (kept for inspection, never read again by us)."""
    dest = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, dest)
    print(f"ltfm: warning: {path} is unreadable ({why}); moved to {dest.name}", file=sys.stderr)
    return dest


def resume_checkpoint(ckpt_dir: Path) -> Path | None:
    """The checkpoint to resume from: ``last.ckpt`` when it reads, else the newest readable
    ``step=*.ckpt``; unreadable ones (truncated by a full disk or a kill) are set aside with a warning.
    None (start from step 0) when there is none, which is said too if checkpoints were set aside."""
    from .evaluate import step_checkpoints

    last = ckpt_dir / "last.ckpt"
    if last.is_file():
        why = checkpoint_problem(last)
        if why is None:
            return last
        _set_aside(last, why)
        for step, path in reversed(step_checkpoints(ckpt_dir.parent)):
            why = checkpoint_problem(path)
            if why is None:
                print(f"ltfm: resuming from {path.name} (step {step}) instead", file=sys.stderr)
                return path
            _set_aside(path, why)
        print("ltfm: warning: no readable checkpoint left: the run starts over from step 0", file=sys.stderr)
    return None


def _previous_summary(summary_path: Path) -> dict | None:
    """The run's earlier summary, or None. An unusable one (truncated, hand-edited) is set aside with a
    warning; a fresh summary is written and the checkpoints are kept."""
    prev, problem = R.load_summary(summary_path.parent)
    if problem is not None:
        dest = summary_path.with_name(f"summary.json.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(summary_path, dest)
            kept = f"moved to {dest.name}"
        except OSError:
            kept = "left as it is"
        print(f"ltfm: warning: {summary_path} {problem}; {kept}; writing a fresh summary (checkpoints are kept)",
              file=sys.stderr)
    return prev


def _attempts(prev: dict | None) -> list[dict]:
    """Every earlier attempt of the run, newest last: a continuation that fails never erases results."""
    if not prev:
        return []
    earlier = [a for a in prev.get("attempts") or [] if isinstance(a, dict)]
    return earlier + [{k: v for k, v in prev.items() if k not in ("attempts", "config")}]


def world_size(train_cfg: dict) -> int:
    """Processes the run will have: devices per node x nodes (before the Trainer exists)."""
    devices = train_cfg["devices"].strip()
    if devices.lstrip("-").isdigit():
        n = int(devices)
        if n == -1:
            n = torch.cuda.device_count() if train_cfg["accelerator"] in ("gpu", "cuda", "auto") and \
                torch.cuda.is_available() else 1
    elif devices == "auto":
        n = torch.cuda.device_count() if train_cfg["accelerator"] in ("gpu", "cuda", "auto") and \
            torch.cuda.is_available() else 1
    else:
        n = len([d for d in devices.split(",") if d.strip()])
    return max(n, 1) * train_cfg["num_nodes"]


def accumulation(train_cfg: dict, world: int) -> int:
    """Gradient accumulation that brings batch_tokens x world x accumulation closest to batch_tokens_total,
    so that 1 CPU, 2 GPUs or 8 GPUs take the same optimizer steps (the paper: ~25,000 tokens per side on
    8 GPUs). fairseq sets the same product by hand (--update-freq)."""
    total = train_cfg["batch_tokens_total"]
    if total is None:
        return train_cfg["accumulate"]
    return max(1, round(total / (train_cfg["batch_tokens"] * world)))


def _trainer_kwargs(cfg: dict, accumulate: int) -> dict:
    t = cfg["train"]
    devices = t["devices"]
    devices = int(devices) if devices.lstrip("-").isdigit() else devices
    return dict(
        accelerator=t["accelerator"], devices=devices, num_nodes=t["num_nodes"], strategy=t["strategy"],
        precision=resolve_precision(t["precision"], t["accelerator"]), max_steps=t["max_steps"],
        max_time=timedelta(minutes=t["max_time_minutes"]) if t["max_time_minutes"] else None,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=t["clip_norm"] or None,
        val_check_interval=t["val_every_steps"] * accumulate, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, log_every_n_steps=t["log_every_steps"],
        use_distributed_sampler=False, enable_model_summary=False,
        enable_progress_bar=t["progress_bar"], max_epochs=-1,
    )


def train(cfg: dict, callbacks: Sequence = ()) -> dict:
    """Train (or resume, or skip if completed) the run described by ``cfg``; returns its summary.

    ``callbacks``: more Lightning callbacks (a sweep trial's pruning, :mod:`lightning_tfm.sweep.pruning`);
    when one of them has a true ``pruned`` attribute after fitting, the run ends as ``pruned`` and is not
    decoded.

    Whatever happens, nothing finished is lost: one process trains a run folder at a time (:class:`RunLock`),
    every file is written atomically inside it, an unreadable checkpoint or summary is set aside (never
    read, never deleted), and a failed continuation keeps the earlier attempts in ``summary["attempts"]``.
    """
    started = time.time()
    C.validate(cfg)
    rid = C.run_id(cfg)
    results_dir = Path(cfg["run"]["results_dir"])
    run_dir = results_dir / rid
    _check_writable(results_dir)
    summary_path = run_dir / "summary.json"
    prev = R.read_summary(run_dir)  # a quick look (no lock yet); an unusable one is dealt with under the lock
    if _already_done(prev, cfg):
        print(f"ltfm: run {rid} is already completed: {summary_path}", file=sys.stderr)
        return prev
    if not cfg["train"]["progress_bar"]:
        import datasets
        datasets.disable_progress_bars()
    if cfg["train"]["threads"]:
        torch.set_num_threads(cfg["train"]["threads"])

    corpus = Corpus(cfg)  # every data error is raised here, before anything is written (builds the cache if needed)
    corpus.use_in_run(run_dir, write=False)  # resuming on another vocabulary stops here
    from .tracking import resolve_mode
    resolve_mode(cfg)  # a bad WANDB_MODE / wandb.mode stops here, before the run folder exists
    is_zero = rank_zero()
    try:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
        # Only global rank zero locks: the other ranks of a DDP run belong to the same training.
        lock = RunLock(run_dir, rid) if is_zero else contextlib.nullcontext()
        with lock:
            return _train_locked(cfg, rid, run_dir, corpus, is_zero, started, list(callbacks))
    except UserError:
        raise
    except BaseException as e:
        err = storage_error(e, run_dir)
        if err is None:
            raise
        raise err from None


def _already_done(prev: dict | None, cfg: dict) -> bool:
    return bool(prev) and prev.get("status") == "completed" and (prev.get("steps") or 0) >= cfg["train"]["max_steps"]


def _train_locked(cfg: dict, rid: str, run_dir: Path, corpus: "Corpus", is_zero: bool, started: float,
                  extra: list) -> dict:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from .lit import TransformerModule, TranslationDataModule
    from .tracking import scrub

    summary_path = run_dir / "summary.json"
    ckpt_dir = run_dir / "checkpoints"
    prev = None
    if is_zero:
        for folder in (run_dir, ckpt_dir, run_dir / "hyps"):  # left by a process killed mid-write
            atomic.remove_stale_temps(folder)
        prev = _previous_summary(summary_path)
        if _already_done(prev, cfg):  # completed by the process that held the lock a moment ago
            print(f"ltfm: run {rid} is already completed: {summary_path}", file=sys.stderr)
            return prev
    pl.seed_everything(cfg["run"]["seed"], workers=True, verbose=False)
    if is_zero:
        corpus.use_in_run(run_dir, write=True)
        atomic.write_text(run_dir / "config.yaml", C.dump_yaml(scrub(cfg)))
    module = TransformerModule(cfg, corpus.vocab_size)
    params = module.model.num_parameters()
    summary = {"run_id": rid, "status": "running", "run_dir": str(run_dir), "config": scrub(cfg), "params": params,
               "vocab_size": corpus.vocab_size, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "pid": os.getpid(), "host": socket.gethostname(), **corpus.summary()}
    attempts = _attempts(prev)
    if attempts:
        summary["attempts"] = attempts
    prev_wall = float((prev or {}).get("wall_time_s") or 0.0)
    wandb_logger = None
    trainer = None

    def fail(e: BaseException) -> None:
        """Record the attempt as failed (if the folder still takes a small file), keeping the earlier ones."""
        if not is_zero:
            return
        err = e if isinstance(e, UserError) else storage_error(e, run_dir) or e
        text = str(err).splitlines()[0] if str(err) else ""
        summary.update(status="failed", error=scrub(f"{err.__class__.__name__}: {text}"),
                       steps=trainer.global_step if trainer is not None else 0,
                       wall_time_s=prev_wall + time.time() - started)
        from .tracking import finish
        try:
            summary.update(finish(wandb_logger, summary))
        except Exception:  # noqa: BLE001 - the run's own error is the one to report
            pass
        try:
            atomic.write_json(summary_path, summary)
        except OSError as write_error:
            print(f"ltfm: warning: could not record the failure in {summary_path} ({write_error.strerror})",
                  file=sys.stderr)

    try:
        if is_zero:
            atomic.write_json(summary_path, summary)
        t = cfg["train"]
        checkpoint = ModelCheckpoint(
            dirpath=ckpt_dir, filename="step={step:06d}", auto_insert_metric_name=False, save_last=True,
            monitor="step", mode="max", save_top_k=max(t["keep_checkpoints"], 1),
            every_n_train_steps=None if t["checkpoint_every_minutes"] else t["checkpoint_every_steps"],
            train_time_interval=timedelta(minutes=t["checkpoint_every_minutes"]) if t["checkpoint_every_minutes"] else None,
        )
        best = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor=R.DEV_LOSS, mode="min", save_top_k=1,
                               enable_version_counter=False, auto_insert_metric_name=False)
        from .tracking import make_wandb_logger
        from .lit import DevBleu

        wandb_logger = make_wandb_logger(cfg, rid, run_dir)
        loggers = [CSVLogger(save_dir=str(run_dir), name="logs")]  # logs/version_N: one per attempt
        if wandb_logger is not None:
            loggers.append(wandb_logger)
        dev_bleu = DevBleu(cfg, corpus.tokenizer, corpus.dev_raw["src"], corpus.dev_raw["tgt"], wandb_logger)
        checkpoint_io, finite_loss = lightning_parts()
        world = world_size(t)
        accumulate = accumulation(t, world)
        trainer_kwargs = _trainer_kwargs(cfg, accumulate)
        trainer = pl.Trainer(logger=loggers, callbacks=[finite_loss, checkpoint, best, dev_bleu, *extra],
                             default_root_dir=str(run_dir),
                             plugins=[checkpoint_io], **trainer_kwargs)
        if trainer.world_size != world:
            raise UserError(f"train.devices={t['devices']} x train.num_nodes={t['num_nodes']} gives {world} processes "
                            f"but Lightning sees {trainer.world_size}: make them agree with the launcher (torchrun/srun)")
        summary.update(precision=trainer_kwargs["precision"])  # what train.precision (e.g. auto) resolved to
        summary.update(world_size=world, accumulate=accumulate, effective_batch_tokens=t["batch_tokens"] * world * accumulate)
        if is_zero:
            print(f"ltfm: run {rid}: {world} process(es) x {t['batch_tokens']} tokens x accumulation {accumulate} = "
                  f"{summary['effective_batch_tokens']} tokens per side per optimizer step", file=sys.stderr)
        module.run_id = rid
        datamodule = TranslationDataModule(cfg, corpus.train, corpus.dev)
        # Rank zero picks the checkpoint (setting unreadable ones aside); the other ranks wait for the
        # same file name (a DDP run on one node shares the folder; Lightning broadcasts nothing here).
        resume = resume_checkpoint(ckpt_dir) if is_zero else _rank_resume(ckpt_dir)
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume) if resume else None, weights_only=True)
        if trainer.interrupted:
            raise KeyboardInterrupt
        if trainer.global_step % t["val_every_steps"] != 0 or R.DEV_LOSS not in trainer.callback_metrics:
            trainer.validate(module, datamodule=datamodule, verbose=False)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        train_wall = prev_wall + time.time() - started
        pruned = any(getattr(cb, "pruned", False) for cb in extra)
        if is_zero and not pruned:  # a pruned trial is not decoded: its dev loss already ranked it
            summary.update(final_evaluation(cfg, module.model, corpus, run_dir))
    except BaseException as e:
        fail(e)
        raise
    wall = prev_wall + time.time() - started
    train_tokens = module.train_tokens * trainer.world_size
    summary.update(
        status="pruned" if pruned else "completed", steps=trainer.global_step, epochs=trainer.current_epoch,
        dev_loss=metrics.get(R.DEV_LOSS), dev_ppl=metrics.get(R.DEV_PPL),
        train_tokens=train_tokens, wall_time_s=round(wall, 1), train_time_s=round(train_wall, 1),
        tokens_per_s=round(train_tokens / max(train_wall, 1e-9), 1),
        dev_bleu_history=dev_bleu.history,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    if is_zero:
        from .tracking import finish
        summary.update(finish(wandb_logger, summary, summary.get("bleu_checkpoint_path")))
        atomic.write_json(summary_path, summary)
    return summary


def _rank_resume(ckpt_dir: Path) -> Path | None:
    """A non-zero rank's checkpoint: rank zero has set unreadable ones aside before the ranks meet in
    ``fit``, so by then ``last.ckpt`` is readable or gone; the newest step checkpoint otherwise."""
    from .evaluate import step_checkpoints

    last = ckpt_dir / "last.ckpt"
    if last.is_file():
        return last
    steps = step_checkpoints(ckpt_dir.parent)
    return steps[-1][1] if steps else None


def final_evaluation(cfg: dict, model, corpus: Corpus, run_dir: Path) -> dict:
    """Dev and test BLEU at the end of training (Sec. 6.1-6.2: beam search, sacreBLEU), hypotheses files.

    With ``decode.average_last`` = N > 0 the average of the last N step checkpoints is evaluated (the
    paper's final models, Table 2); otherwise the final weights (the paper's Table 3 used no averaging).
    """
    from .evaluate import decode_dtype, evaluate_texts, load_model, step_checkpoints

    out: dict = {}
    n_avg = cfg["decode"]["average_last"]
    checkpoint = "last"
    if n_avg and len(step_checkpoints(run_dir)) >= 2:
        model, _, _ = load_model(run_dir, "average", average_last=n_avg)
        checkpoint = f"average of last {min(n_avg, len(step_checkpoints(run_dir)))}"
        out["bleu_checkpoint_path"] = str(run_dir / "checkpoints" / "average.ckpt")
    else:
        out["bleu_checkpoint_path"] = str(run_dir / "checkpoints" / "last.ckpt")
    model.eval()
    hyp_dir = run_dir / "hyps"
    hyp_dir.mkdir(exist_ok=True)
    d = cfg["data"]
    splits = [("dev", corpus.dev_raw)] + ([("test", corpus.test_raw)] if corpus.test_raw is not None else [])
    for name, ds in splits:
        hyps, result = evaluate_texts(model, corpus.tokenizer, list(ds["src"]), list(ds["tgt"]), cfg["decode"],
                                      d["tgt_lang"], decode_dtype(cfg))
        atomic.write_text(hyp_dir / f"{name}.{d['tgt_lang']}.txt", "\n".join(hyps) + "\n")
        out[f"{name}_bleu"] = round(result["score"], 2)
        out[f"{name}_bleu_ratio"] = round(result["ratio"], 4)
        out[f"{name}_decode_sentences_per_s"] = round(result["sentences_per_s"], 1)
        if "bleu_tok_compound_split" in result:
            out[f"{name}_bleu_tok_compound_split"] = round(result["bleu_tok_compound_split"], 2)
        out["bleu_signature"] = result["signature"]
    out["bleu_checkpoint"] = checkpoint
    out["decode"] = {k: cfg["decode"][k] for k in ("beam_size", "length_penalty", "max_len_a", "max_len_b")}
    return out
