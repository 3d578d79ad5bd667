"""One training run, end to end: data and vocabulary, Lightning Trainer, checkpoints, summary.json.

``train(cfg)`` is what ``ltfm train`` and the sweep trials run. The run folder is
``<run.results_dir>/<run id>``; the run id is derived from the config, so re-running the same command
resumes from ``checkpoints/last.ckpt`` (and a completed run is not trained again).
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import yaml

from . import config as C
from .errors import UserError
from .precision import resolve_precision


def rank_zero() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0 and \
        int(os.environ.get("NODE_RANK", "0")) == 0


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


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
    except OSError:
        raise UserError(f"results folder {str(results_dir)!r} is not writable: set run.results_dir to a folder "
                        f"you can write") from None


from .corpus import Corpus  # noqa: E402  (the prepared corpus a run trains on; kept importable from here)


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


def train(cfg: dict) -> dict:
    """Train (or resume, or skip if completed) the run described by ``cfg``; returns its summary."""
    started = time.time()
    C.validate(cfg)
    rid = C.run_id(cfg)
    results_dir = Path(cfg["run"]["results_dir"])
    run_dir = results_dir / rid
    _check_writable(results_dir)
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        prev = json.loads(summary_path.read_text())
        if prev.get("status") == "completed" and (prev.get("steps") or 0) >= cfg["train"]["max_steps"]:
            print(f"ltfm: run {rid} is already completed: {summary_path}", file=sys.stderr)
            return prev
    if not cfg["train"]["progress_bar"]:
        import datasets
        datasets.disable_progress_bars()
    if cfg["train"]["threads"]:
        torch.set_num_threads(cfg["train"]["threads"])

    corpus = Corpus(cfg)  # every data error is raised here, before anything is written (builds the cache if needed)
    corpus.use_in_run(run_dir, write=False)  # resuming on another vocabulary stops here
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from .lit import TransformerModule, TranslationDataModule
    from .tracking import resolve_mode, scrub
    resolve_mode(cfg)  # a bad WANDB_MODE / wandb.mode stops here, before the run folder exists
    pl.seed_everything(cfg["run"]["seed"], workers=True, verbose=False)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    is_zero = rank_zero()
    if is_zero:
        corpus.use_in_run(run_dir, write=True)
        (run_dir / "config.yaml").write_text(C.dump_yaml(scrub(cfg)))
    module = TransformerModule(cfg, corpus.vocab_size)
    params = module.model.num_parameters()
    summary = {"run_id": rid, "status": "running", "run_dir": str(run_dir), "config": scrub(cfg), "params": params,
               "vocab_size": corpus.vocab_size, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "pid": os.getpid(), "host": socket.gethostname(), **corpus.summary()}
    prev_wall = 0.0
    if summary_path.is_file():
        prev_wall = float(json.loads(summary_path.read_text()).get("wall_time_s") or 0.0)
    if is_zero:
        write_json_atomic(summary_path, summary)

    ckpt_dir = run_dir / "checkpoints"
    t = cfg["train"]
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, filename="step={step:06d}", auto_insert_metric_name=False, save_last=True,
        monitor="step", mode="max", save_top_k=max(t["keep_checkpoints"], 1),
        every_n_train_steps=None if t["checkpoint_every_minutes"] else t["checkpoint_every_steps"],
        train_time_interval=timedelta(minutes=t["checkpoint_every_minutes"]) if t["checkpoint_every_minutes"] else None,
    )
    best = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="dev/loss", mode="min", save_top_k=1,
                           enable_version_counter=False, auto_insert_metric_name=False)
    from .tracking import make_wandb_logger
    from .lit import DevBleu

    wandb_logger = make_wandb_logger(cfg, rid, run_dir)
    loggers = [CSVLogger(save_dir=str(run_dir), name="logs")]  # logs/version_N: one per attempt
    if wandb_logger is not None:
        loggers.append(wandb_logger)
    dev_bleu = DevBleu(cfg, corpus.tokenizer, corpus.dev_raw["src"], corpus.dev_raw["tgt"], wandb_logger)
    callbacks = [checkpoint, best, dev_bleu]
    pruner = None
    if cfg["sweep"]["trial"] is not None:  # a sweep trial: report the dev metric to its Optuna study
        from .pruning import OptunaPruning
        pruner = OptunaPruning(cfg)
        callbacks.append(pruner)
    world = world_size(t)
    accumulate = accumulation(t, world)
    trainer_kwargs = _trainer_kwargs(cfg, accumulate)
    trainer = pl.Trainer(logger=loggers, callbacks=callbacks, default_root_dir=str(run_dir), **trainer_kwargs)
    if trainer.world_size != world:
        raise UserError(f"train.devices={t['devices']} x train.num_nodes={t['num_nodes']} gives {world} processes but "
                        f"Lightning sees {trainer.world_size}: make them agree with the launcher (torchrun/srun)")
    summary.update(precision=trainer_kwargs["precision"])  # what train.precision (e.g. auto) resolved to
    summary.update(world_size=world, accumulate=accumulate, effective_batch_tokens=t["batch_tokens"] * world * accumulate)
    if is_zero:
        print(f"ltfm: run {rid}: {world} process(es) x {t['batch_tokens']} tokens x accumulation {accumulate} = "
              f"{summary['effective_batch_tokens']} tokens per side per optimizer step", file=sys.stderr)
    module.run_id = rid
    datamodule = TranslationDataModule(cfg, corpus.train, corpus.dev)
    last = ckpt_dir / "last.ckpt"
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(last) if last.is_file() else None,
                    weights_only=True)
        if trainer.interrupted:
            raise KeyboardInterrupt
        if trainer.global_step % t["val_every_steps"] != 0 or "dev/loss" not in trainer.callback_metrics:
            trainer.validate(module, datamodule=datamodule, verbose=False)
    except BaseException as e:
        if is_zero:
            summary.update(status="failed", error=scrub(f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"),
                           steps=trainer.global_step, wall_time_s=prev_wall + time.time() - started)
            from .tracking import finish
            try:
                summary.update(finish(wandb_logger, summary))
            finally:
                write_json_atomic(summary_path, summary)
        raise
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    train_wall = prev_wall + time.time() - started
    pruned = pruner is not None and pruner.pruned
    if is_zero and not pruned:  # a pruned trial is not decoded: its dev loss already ranked it
        summary.update(final_evaluation(cfg, module.model, corpus, run_dir))
    wall = prev_wall + time.time() - started
    train_tokens = module.train_tokens * trainer.world_size
    summary.update(
        status="pruned" if pruned else "completed", steps=trainer.global_step, epochs=trainer.current_epoch,
        dev_loss=metrics.get("dev/loss"), dev_ppl=metrics.get("dev/ppl"),
        train_tokens=train_tokens, wall_time_s=round(wall, 1), train_time_s=round(train_wall, 1),
        tokens_per_s=round(train_tokens / max(train_wall, 1e-9), 1),
        dev_bleu_history=dev_bleu.history,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    if is_zero:
        from .tracking import finish
        summary.update(finish(wandb_logger, summary, summary.get("bleu_checkpoint_path")))
        write_json_atomic(summary_path, summary)
    return summary


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
        (hyp_dir / f"{name}.{d['tgt_lang']}.txt").write_text("\n".join(hyps) + "\n")
        out[f"{name}_bleu"] = round(result["score"], 2)
        out[f"{name}_bleu_ratio"] = round(result["ratio"], 4)
        out[f"{name}_decode_sentences_per_s"] = round(result["sentences_per_s"], 1)
        if "bleu_tok_compound_split" in result:
            out[f"{name}_bleu_tok_compound_split"] = round(result["bleu_tok_compound_split"], 2)
        out["bleu_signature"] = result["signature"]
    out["bleu_checkpoint"] = checkpoint
    out["decode"] = {k: cfg["decode"][k] for k in ("beam_size", "length_penalty", "max_len_a", "max_len_b")}
    return out
