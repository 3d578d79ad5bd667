"""Lightning glue: the LightningModule and LightningDataModule around a pure-PyTorch model (model/registry.py)."""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Checkpoint
from torch.utils.data import DataLoader

from ..model import PAD, build_model
from .config.config import Config
from .data.corpus import MappedPairs
from .data.data import Batch, TokenBatchSampler, collate
from .loss import fused_label_smoothed_nll_loss, label_smoothed_nll_loss
from .optim import make_optimizer
from .runs import results, upgrade
from .runs.checkpoint_io import CORPUS, RESUME_ONLY, RNG, RUN_ID, TOKENIZER
from .runs.resume import rank_rng


class Seq2SeqModule(pl.LightningModule):
    """Trains any registered architecture, the encoder-decoder ``config.model.arch`` names (the Transformer by
    default), with label-smoothed cross-entropy, Adam and its learning-rate schedule (``train.lr_schedule``: the
    paper's, or decay on a plateau). Its checkpoints hold its hyper-parameters (plain dicts), not its class name."""

    def __init__(self, config: Config, vocab_size: int, tokenizer: str | None = None):
        super().__init__()
        from ..base.redact import scrub

        # config (as a plain nested dict, secrets masked), vocab_size and the vocabulary's hash (tokenizer: its
        # checkpoints.tokenizer_hash) go into every checkpoint
        self.save_hyperparameters({"config": scrub(config.to_dict()), "vocab_size": vocab_size,
                                   **({TOKENIZER: tokenizer} if tokenizer else {})})
        self.config = config
        self.model = build_model(config.model, vocab_size)
        compile_ = config.train.compile
        self._forward = torch.compile(self.model) if compile_ else self.model
        self._features = torch.compile(self.model.features) if compile_ else self.model.features
        # The fused projection + loss reads the shared embedding outside the model's forward, which FSDP
        # and DeepSpeed shard after the forward: those strategies take the plain path.
        self.fused_loss = config.train.fused_loss and config.train.strategy not in ("fsdp", "deepspeed")
        self._tokens_since, self._time_since = 0, None
        self._dev_sums = None
        self._plateau, self._plateau_state = None, None  # train.lr_schedule=plateau: its scheduler, a resumed state
        self._rng_state = None  # this rank's random state in a resumed checkpoint, restored when training starts
        self.train_tokens = 0  # target tokens seen by this rank
        self.run_id = self.corpus_identity = None  # set by train(): recorded in every checkpoint

    def forward(self, src, tgt_in):
        return self._forward(src, tgt_in)

    def _loss(self, batch: Batch):
        eps = self.config.train.label_smoothing
        if self.fused_loss:
            states = self._features(batch.src, batch.tgt_in)
            return fused_label_smoothed_nll_loss(states, self.model.output_weight, batch.tgt_out, eps, PAD)
        logits = self(batch.src, batch.tgt_in)
        return label_smoothed_nll_loss(logits, batch.tgt_out, eps, PAD)

    def training_step(self, batch: Batch, batch_idx: int):
        if self.config.train.record_batches and batch.index is not None:
            self._record(batch)
        loss_sum, nll_sum, ntok = self._loss(batch)
        n = int(ntok)
        self.train_tokens += n
        self._tokens_since += n
        loss = loss_sum / ntok
        self.log(results.TRAIN_LOSS, loss, prog_bar=False, batch_size=n)
        self.log(results.TRAIN_NLL, nll_sum / ntok, batch_size=n)
        # written every log_every_steps
        self.log(results.TRAIN_LR, self.optimizers().param_groups[0]["lr"], batch_size=n)
        now = time.perf_counter()
        if self._time_since is None:
            self._time_since = now
        elif now - self._time_since > 2.0:  # tokens/s over the last few seconds, on the progress bar
            world = self.trainer.world_size
            self.log(results.TRAIN_TOKENS_PER_S, self._tokens_since * world / (now - self._time_since), prog_bar=True)
            self._tokens_since, self._time_since = 0, now
        return loss

    def _record(self, batch: Batch) -> None:
        """Append this rank's batch (dataset indices) to <run>/batches/rank<r>.jsonl."""
        import json
        from pathlib import Path

        folder = Path(self.config.run.results_dir) / self.run_id / "batches"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": self.global_step, "epoch": self.current_epoch,
                                "index": batch.index.tolist()}) + "\n")

    def on_validation_epoch_start(self):
        self._dev_sums = torch.zeros(3, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: Batch, batch_idx: int):
        loss_sum, nll_sum, ntok = self._loss(batch)
        self._dev_sums += torch.stack([loss_sum.double(), nll_sum.double(), ntok.double()])

    def on_validation_epoch_end(self):
        sums = self.trainer.strategy.reduce(self._dev_sums, reduce_op="sum")
        loss, nll = (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()
        # dev/loss is the per-wordpiece NLL, so dev/ppl = exp(dev/loss) (Table 3's perplexity).
        self.log(results.DEV_LOSS, nll, sync_dist=True)  # already reduced: identical on every rank
        self.log(results.DEV_PPL, math.exp(min(nll, 50.0)), prog_bar=True, sync_dist=True)
        self.log(results.DEV_SMOOTHED_LOSS, loss, sync_dist=True)
        if self._plateau is not None and self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self._step_plateau(nll)

    def _plateau_behind(self) -> bool:
        """Whether the plateau schedule has not yet seen the dev loss of every validation step so far."""
        return self._plateau.last_epoch < self.trainer.global_step // self.config.train.val_every_steps

    def _step_plateau(self, dev_loss: float) -> None:
        """One validation's dev loss to the plateau schedule, once per validation step, while fitting (not
        train()'s closing trainer.validate). The dev loss is the same on every rank, so is the rate."""
        if self._plateau_behind():
            self._plateau.step(dev_loss)

    def on_train_start(self):
        """A resumed run's random state (dropout; each rank's own) back as it was when its checkpoint was written: with
        the loader's position (:class:`ResumableLoader`) it trains as a run never stopped. A step checkpoint is written
        before its step's validation, and a run resumed from it does not run that validation again: its dev loss (the
        same weights and dev set) is computed here for the plateau schedule, which so sees every validation's dev loss,
        as in a run never stopped."""
        if self._rng_state is not None:
            set_rng_state(self._rng_state)
            self._rng_state = None
        if self._plateau is None or not self._plateau_behind():
            return
        self.on_validation_epoch_start()
        was_training = self.training
        self.eval()
        with torch.no_grad(), self.trainer.precision_plugin.val_step_context():
            for batch in self.trainer.datamodule.val_dataloader():
                self.validation_step(batch.to(self.device), 0)
        self.train(was_training)
        sums = self.trainer.strategy.reduce(self._dev_sums, reduce_op="sum")
        self._step_plateau((sums[1] / sums[2]).item())

    def configure_optimizers(self):
        opt, sched = make_optimizer(self.model.parameters(), self.config.train, self.model.d_model)
        if self.config.train.lr_schedule == "plateau":
            # Stepped with each validation's dev loss (on_validation_epoch_end), not by Lightning, whose "step"
            # interval would step it at every step; its state rides in the checkpoint (on_save_checkpoint).
            self._plateau = sched
            if self._plateau_state is not None:
                sched.load_state_dict(self._plateau_state)
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint):
        checkpoint["train_tokens"] = self.train_tokens * self.trainer.world_size
        checkpoint[RNG] = every_rank(rng_state(), self.trainer.world_size)
        checkpoint.update({k: v for k, v in ((RUN_ID, self.run_id), (CORPUS, self.corpus_identity)) if v})
        if self._plateau is not None:
            checkpoint["lr_plateau"] = self._plateau.state_dict()

    def on_load_checkpoint(self, checkpoint):
        self._plateau_state = checkpoint.get("lr_plateau")  # before configure_optimizers, which loads it
        self._rng_state = rank_rng(upgrade.checkpoint(checkpoint), self.global_rank)  # this rank's own
        self.train_tokens = (int(checkpoint.get("train_tokens", 0))
                             // max(1, self.trainer.world_size if self._trainer else 1))


def every_rank(state: dict, world: int) -> list[dict]:
    """``state`` of every rank, rank r's at r (a collective: every rank calls it, as every rank builds each checkpoint
    Lightning writes); ``[state]`` in a process of its own. Each rank draws its own dropout masks, so a resume restores
    each rank's (:data:`~.runs.checkpoint_io.RNG`)."""
    import torch.distributed as dist

    if world < 2 or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return [state]
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def rng_state() -> dict:
    """torch's random state (CPU, and each CUDA device's once CUDA is in use): tensors, loadable with
    ``weights_only=True``. Python's and numpy's generators draw nothing in training (the sampler has its own)."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """:func:`rng_state` back (the CUDA devices this process has, of those recorded)."""
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        for device, s in list(enumerate(cuda))[:torch.cuda.device_count()]:
            torch.cuda.set_rng_state(s, device)


class ResumableLoader(DataLoader):
    """The training loader, resumable mid-epoch: Lightning saves its :meth:`state_dict` in every checkpoint (the
    loops' state) and gives it back to :meth:`load_state_dict` before iterating, so a run resumed inside an epoch
    goes on with the batch after the last one trained, as a run never stopped does (without it Lightning starts the
    epoch over and warns that the dataloader is not resumable). ``trained``: the batches of the current epoch
    trained so far (Lightning's count, set by the data module)."""

    trained = staticmethod(lambda: 0)

    def state_dict(self) -> dict:
        return {"epoch": int(self.batch_sampler.epoch), "batches": int(self.trained())}

    def load_state_dict(self, state: dict) -> None:
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if batches >= len(self.batch_sampler):  # written at the epoch's last batch: Lightning goes on with the next
            epoch, batches = epoch + 1, 0
        self.batch_sampler.resume_at(epoch, batches)


class TranslationDataModule(pl.LightningDataModule):
    """Token-budget batches of a tokenized corpus; the train sampler is sharded across ranks itself
    (``use_distributed_sampler=False`` in the Trainer). The pairs are the memory-mapped
    :class:`lightning_tfm.training.data.corpus.MappedPairs` of a prepared corpus: the sampler reads only their width
    arrays."""

    def __init__(self, config: Config, train_pairs: MappedPairs, dev_pairs: MappedPairs):
        super().__init__()
        self.config, self.train_pairs, self.dev_pairs = config, train_pairs, dev_pairs

    def _loader(self, pairs: MappedPairs, shuffle: bool, shard: bool, cls=DataLoader) -> DataLoader:
        world = self.trainer.world_size if (shard and self.trainer) else 1
        rank = self.trainer.global_rank if (shard and self.trainer) else 0
        src_widths, tgt_widths = pairs.widths()
        sampler = TokenBatchSampler(src_widths, tgt_widths, self.config.train.batch_tokens,
                                    shuffle=shuffle, seed=self.config.run.seed, num_replicas=world, rank=rank)
        workers = self.config.train.num_workers
        cuda = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        # Its own generator: a new iterator (each epoch, a resume) draws its workers' base seed from it, not from
        # torch's global generator, whose state (dropout) a resume restores as the checkpoint recorded it.
        return cls(pairs, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                   persistent_workers=workers > 0, pin_memory=cuda,
                   generator=torch.Generator().manual_seed(self.config.run.seed))

    def train_dataloader(self):
        loader = self._loader(self.train_pairs, shuffle=True, shard=True, cls=ResumableLoader)
        trainer = self.trainer
        if trainer is not None:  # what a checkpoint written now records (a count of this epoch's batches)
            loader.trained = lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return loader

    def val_dataloader(self):
        return self._loader(self.dev_pairs, shuffle=False, shard=True)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device)


class DevBleu(pl.Callback):
    """Dev BLEU with beam search every ``decode.dev_bleu_every_steps`` steps, and at a validation on the budget's
    last step, on the first ``decode.dev_bleu_subset`` dev sentences (for speed), plus a W&B table of sample
    translations.

    Decoding runs on global rank zero only (the other ranks wait at their next collective), so the
    number does not depend on the world size.
    """

    def __init__(self, config: Config, tokenizer, src_lines: list[str], ref_lines: list[str], wandb_logger=None):
        self.config, self.tokenizer, self.wandb_logger = config, tokenizer, wandb_logger
        n = config.decode.dev_bleu_subset
        self.src, self.ref = list(src_lines[:n] if n else src_lines), list(ref_lines[:n] if n else ref_lines)
        self.history: list[tuple[int, float]] = []

    def on_validation_end(self, trainer, pl_module):
        every = self.config.decode.dev_bleu_every_steps
        step = trainer.global_step
        last = step == trainer.max_steps  # the budget's end too, when it is no multiple of ``every``
        if not every or step == 0 or (step % every and not last) or trainer.sanity_checking or trainer.global_rank:
            return
        from .evaluate import decode_dtype, evaluate_texts
        from .tracking.tracking import log_samples

        hyps, result = evaluate_texts(pl_module.model, self.tokenizer, self.src, self.ref, self.config.decode,
                                      self.config.data.tgt_lang, decode_dtype(self.config))
        pl_module.model.train()
        self.history.append((step, result["score"]))
        # Lightning logs the validation metrics at global_step - 1; dev BLEU goes on the same x value.
        for logger in trainer.loggers:
            logger.log_metrics({results.DEV_BLEU: result["score"], results.DEV_BLEU_RATIO: result["ratio"]},
                               step=step - 1)
        k = self.config.decode.samples
        log_samples(self.wandb_logger, step - 1, list(zip(self.src[:k], self.ref[:k], hyps[:k])))


class CheckpointEverySeconds(pl.Callback):
    """Rewrites ``last.ckpt`` (the resume point) once ``seconds`` passed since the last checkpoint, between the
    step checkpoints: with ``train.checkpoint_every_steps`` it gives "every N steps or every S seconds,
    whichever comes first", which Lightning's ModelCheckpoint cannot (its step and time triggers exclude each
    other). A run killed between two step checkpoints then resumes with at most ``seconds`` of work lost,
    however slow its steps. Only ``last.ckpt`` is written: the ``step=N.ckpt`` files (what averaging and
    ``keep_checkpoints`` count) stay on their step cadence, and the checkpoint carries ``RESUME_ONLY`` so that
    averaging leaves it out. It is written through the Trainer (the atomic writer, ``weights_only`` loadable).

    ``steps``: the step interval of ``step_checkpoint`` (a ModelCheckpoint with ``save_last``), whose saves
    restart the clock; None when that one saves by time. ``seconds=0`` writes after every optimizer step.
    ``clock``: the time source (tests pass their own). Rank zero decides, every rank saves (a collective).
    """

    def __init__(self, seconds: float, steps: int | None, step_checkpoint, clock=time.monotonic):
        super().__init__()
        self.seconds, self.steps, self.step_checkpoint, self.clock = float(seconds), steps, step_checkpoint, clock
        self._since = None  # the clock at the last checkpoint
        self._step = None  # the optimizer step seen at the last batch end
        self._saving = False
        self.saved_steps: list[int] = []  # the steps this callback wrote last.ckpt at (this process)

    def on_train_start(self, trainer, pl_module) -> None:
        self._since, self._step = self.clock(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._step:  # inside a gradient accumulation: no optimizer step since the last batch end
            return
        self._step = step
        if self.steps and step % self.steps == 0:  # the step checkpoint (and last.ckpt) is written right after this
            self._since = self.clock()
            return
        due = self.clock() - self._since >= self.seconds
        if trainer.world_size > 1:
            due = bool(trainer.strategy.broadcast(due, src=0))
        if not due or 0 < trainer.max_steps <= step:
            return  # the last step: the run ends here, with the checkpoints ModelCheckpoint writes at the end
        self._saving = True
        try:
            write_last(trainer, self.step_checkpoint)
        finally:
            self._saving = False
        self.saved_steps.append(step)
        self._since = self.clock()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self._saving:
            checkpoint[RESUME_ONLY] = True


def write_last(trainer, step_checkpoint, final: bool = False) -> None:
    """``last.ckpt`` written now through the Trainer (the atomic writer), as a resume point. ModelCheckpoint writes
    ``last-v1.ckpt`` beside a last.ckpt it did not write itself: ``step_checkpoint`` (the step checkpoints'
    ModelCheckpoint, with ``save_last``) is told the file is its own (as it records its own before saving, so the
    path is part of the saved state). ``final``: the fit's last one (:class:`StopOnSignal`), which ModelCheckpoint
    is told it wrote."""
    path = step_checkpoint.format_checkpoint_name({}, step_checkpoint.CHECKPOINT_NAME_LAST)
    step_checkpoint.last_model_path = path
    trainer.save_checkpoint(path, weights_only=False)  # the whole training state (Lightning's default, said so)
    # ... and that it wrote one in this fit: else its on_train_end writes last.ckpt again, in a state that, at an
    # epoch's end, resumes one batch into a phantom epoch (Lightning carries the batch count over)
    if final and hasattr(step_checkpoint, "_last_checkpoint_saved"):
        step_checkpoint._last_checkpoint_saved = path


class StopOnSignal(Checkpoint):
    """SIGTERM (a scheduler's preemption, ``kill``; SIGUSR1 outside SLURM) and SIGINT (Ctrl-C) while fitting stop the
    run at the end of the optimizer step under way, after its validation when one is due, with ``last.ckpt`` written
    at that step (a resume point, :data:`RESUME_ONLY`; not twice where the step checkpoint wrote it): the same command
    resumes it with no step lost, and mid-epoch on the batches a run never stopped trains on
    (:class:`ResumableLoader`, the random state in the checkpoint). The end of fitting (the budget, time) leaves
    ``last.ckpt`` at its last step too, not marked resume-only: the weights the run ended with, which averaging counts
    (a continuation resumes there). Its handlers stand in for Lightning's SIGTERM handler and Python's Ctrl-C
    while fitting (a second Ctrl-C stops at once; a signal the process ignores, as under ``nohup``, stays ignored); it
    then raises what Lightning raises for the signal (``SIGTERMException``; ``KeyboardInterrupt``, which Lightning
    ends as ``SystemExit(1)``), so the run records the stop and exits as before (:func:`~.train.stop_reason`). A
    :class:`Checkpoint`, so that Lightning runs it after the step checkpoints. ``steps``: their interval (None when
    they come by time). Every rank decides together."""

    def __init__(self, step_checkpoint, steps: int | None):
        super().__init__()
        self.step_checkpoint, self.steps = step_checkpoint, steps
        self.signal: int | None = None  # the first stopping signal received
        self._previous: dict = {}  # the handlers this one stands in for
        self._step = None  # the optimizer step seen at the last batch end
        self._saved_at = None  # the step last.ckpt holds, when written in this fit
        self._pending = False  # last.ckpt written for a stop; the stop waits for the step's validation
        self._saving = None  # while writing last.ckpt: "resume" (a stop's resume point) or "final" (the fit's end)

    # ------------------------------------------------------------------------------------------ the handlers
    def on_train_start(self, trainer, pl_module) -> None:
        self._step = trainer.global_step
        cb = self.step_checkpoint
        last = cb.format_checkpoint_name({}, cb.CHECKPOINT_NAME_LAST)
        if os.path.isfile(last):  # resumed from a step checkpoint's state (last.ckpt at a step checkpoint is one file
            cb.last_model_path = last  # with it), which predates ModelCheckpoint's last.ckpt: else it writes last-v1
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                self._previous[sig] = signal.signal(sig, self._received)

    def _received(self, signum, frame) -> None:  # noqa: ARG002
        if signum == signal.SIGINT and self.signal == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C again: at once
        if self.signal is None and signum == signal.SIGINT:
            print("ltfm: interrupted (SIGINT): stopping after this step, with a checkpoint to resume from (Ctrl-C "
                  "again stops at once)", file=sys.stderr, flush=True)
        self.signal = self.signal or signum

    def _restore(self) -> None:
        """The handlers stood in for, back (where this one's are still in place), once fitting ends."""
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._received:
                signal.signal(sig, handler)
        self._previous = {}

    def teardown(self, trainer, pl_module, stage) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()

    # ------------------------------------------------------------------------------------------ the stop
    def _stopping(self, trainer) -> bool:
        stop = self.signal is not None or self._pending
        return bool(trainer.strategy.reduce_boolean_decision(stop, all=False)) if trainer.world_size > 1 else stop

    def _save(self, trainer, resume_only: bool) -> None:
        """last.ckpt at this step, unless it is there already: a stop's resume point (``resume_only``), or the weights
        the fit ended with."""
        step = trainer.global_step
        if self._saved_at != step:
            self._saving = "resume" if resume_only else "final"
            try:
                write_last(trainer, self.step_checkpoint, final=True)
            finally:
                self._saving = None
        self._saved_at = step

    def _stop(self):
        sig = self.signal
        self._restore()
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        from pytorch_lightning.utilities.exceptions import SIGTERMException
        raise SIGTERMException

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._step:  # inside a gradient accumulation: no optimizer step since the last batch end
            return
        self._step = step
        if self.steps and step % self.steps == 0:  # the step checkpoint wrote last.ckpt before this hook
            self._saved_at = step
        if self._stopping(trainer):
            self._save(trainer, resume_only=True)
            self._pending = True  # the stop itself waits for this step's validation, if one is due
        elif 0 < trainer.max_steps <= step:  # the budget's last step: its final weights; a continuation resumes here
            self._save(trainer, resume_only=False)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self._stopping(trainer):
            self._save(trainer, resume_only=True)  # a signal during the validation: last.ckpt at this step, after it
            self._stop()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._pending:  # saved at the last step's end, and no validation came
            self._stop()

    def on_train_end(self, trainer, pl_module) -> None:
        """The end of fitting: last.ckpt at its last step (written at that step's end when the budget ended it; here
        when time, a pruner or nothing left to train did), so that a continuation to a larger budget resumes there and
        ``--checkpoint last`` is the weights the run ended with; a signal still stops the run, before its closing
        evaluation."""
        stopping = self._stopping(trainer)
        self._save(trainer, resume_only=stopping)
        if stopping:
            self._stop()
        self._restore()  # before Lightning puts back the handlers it found: a signal after fitting is theirs

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self._saving == "resume":
            checkpoint[RESUME_ONLY] = True
