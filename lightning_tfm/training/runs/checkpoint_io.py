"""Checkpoints written: the keys ours hold beside Lightning's (the run, its corpus and vocabulary, each rank's random
state, a resume point's mark; written by :class:`~..lit.Seq2SeqModule`), a vocabulary's hash and the run folder a
file sits in, and Lightning's checkpoint writer made atomic inside the run folder, one step's checkpoints one file
(hard links). What is read back, checked, averaged and resumed from: :mod:`.checkpoints`, :mod:`.resume`."""
from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from ...base import atomic

#: A key of a checkpoint written only as a resume point (``last.ckpt`` by ``train.checkpoint_every_seconds``,
#: :class:`~.lit.CheckpointEverySeconds`, or at a stop by a signal, :class:`~.lit.StopOnSignal`): averaging leaves it
#: out, so the averaged steps keep the step cadence (:func:`~.checkpoints.final_weights`).
RESUME_ONLY = "ltfm_resume_only"
#: The hyper-parameter naming the vocabulary a checkpoint was trained with (:func:`tokenizer_hash`): ids of another
#: vocabulary of the same size decode to garbage, so a checkpoint is only decoded or resumed with its own.
TOKENIZER = "tokenizer_sha256"
#: Keys of a checkpoint naming the run that wrote it (its folder's name) and the content identity of its corpus
#: (:func:`~.data.corpus_id.fingerprint`): a checkpoint copied into another run's folder is told by them.
RUN_ID, CORPUS = "ltfm_run_id", "ltfm_corpus"
#: The key of a checkpoint holding each rank's torch random state when it was written (:func:`~.lit.rng_state`): a
#: list, rank r's at r (:func:`~.resume.rank_rng`; an older version's: :func:`~.upgrade.checkpoint`).
RNG = "ltfm_rng"


def tokenizer_hash(path: Path) -> str:
    """A vocabulary's identity: the SHA-256 of its ``tokenizer.json`` (a run folder's copy is byte-identical to its
    prepared corpus's, :meth:`~.data.corpus.Corpus.use_in_run`), 16 hex digits."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def own_run(path: Path) -> Path | None:
    """The run folder a checkpoint file sits in (``<run>/checkpoints/x.ckpt``), None for a file elsewhere."""
    path = Path(path).absolute()
    return path.parent.parent if path.parent.name == "checkpoints" else None


def training_state(checkpoint: dict) -> tuple:
    """What tells two checkpoints of one fit apart: the step, and a sum of each tensor of the weights (one pass
    over them: two files of one step and one set of weights are the same checkpoint, whatever else they record)."""
    sums = tuple(float(t.detach().double().sum()) for t in checkpoint.get("state_dict", {}).values()
                 if isinstance(t, torch.Tensor))
    return checkpoint.get("global_step"), checkpoint.get("epoch"), sums


def atomic_checkpoint_io():
    """Lightning's checkpoint writer, made atomic inside the run folder (a plugin for the Trainer; built
    here, not at import, so that ``ltfm train`` reports config errors before importing Lightning).

    Lightning's own ``_atomic_save`` commits through an fsspec transaction whose temporary file is made
    in ``$TMPDIR`` and then *copied* into the run folder: a full disk or a kill during that copy leaves a
    truncated ``last.ckpt``. Here the serialized bytes are written to a temporary file beside the target,
    fsynced and renamed (:mod:`lightning_tfm.base.atomic`), so a checkpoint is either whole or absent.

    One step's checkpoints are one file: ``step=N.ckpt``, ``last.ckpt`` and ``best.ckpt`` written at one step with
    the same weights (:func:`training_state`) are hard links to the first of them written, not copies (a 20-step run
    kept three copies of its last step). A link is made under a temporary name and renamed over the target, as a
    write is, so a later write of one name (``last.ckpt`` at the next step) replaces that name alone and never
    changes the file the others name; pruning a step checkpoint removes its name only. Where the filesystem has no
    hard links the bytes are written.

    Training does not wait for the disk (its fsync waits: reports/timing.md): the checkpoint is serialized in the
    caller, at every call, so the bytes are that step's state and a write stays possible wherever a link is not; one
    writer thread then writes, fsyncs, links and removes in the order asked. Reading a checkpoint and the Trainer's
    teardown (the end of ``fit``, a stop by a signal, a failure) first wait for every write asked before; a write's
    error (a full disk) is raised in the training thread at the next checkpoint call or at teardown, once, and
    nothing after it is written. Not Lightning's ``AsyncCheckpointIO``: it clones the tensors where they are (GPU
    memory), serializes in its thread, and removes checkpoints at once, out of order with the writes still queued.
    """
    from concurrent.futures import ThreadPoolExecutor

    from pytorch_lightning.plugins.io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        def __init__(self):
            super().__init__()
            self.written: tuple | None = None  # (path, its inode, training_state) of the last file written
            self._writer: ThreadPoolExecutor | None = None  # one thread: the writes, links and removals in order
            self._error: BaseException | None = None  # the first error of a queued write (none written after it)
            self._error_raised = False  # that error raised in the training thread already

        def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
            if storage_options is not None:
                raise TypeError("AtomicCheckpointIO takes no storage_options")
            self._raise_queued_error()
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            state = training_state(checkpoint)
            buf = io.BytesIO()
            torch.save(checkpoint, buf)  # this step's state now; a write error is an OSError of the writer's
            self._queue(self._store, path, state, buf)

        def _store(self, path: Path, state: tuple, buf: io.BytesIO) -> None:
            if self.link(path, state):
                return
            atomic.write_bytes(path, buf.getbuffer())
            self.written = (path, path.stat().st_ino, state)

        def remove_checkpoint(self, path) -> None:
            self._raise_queued_error()
            self._queue(super().remove_checkpoint, path)

        def load_checkpoint(self, *args, **kwargs):
            self.wait()
            return super().load_checkpoint(*args, **kwargs)

        def teardown(self) -> None:
            try:
                self.wait()
            finally:
                if self._writer is not None:
                    self._writer.shutdown(wait=True)
                    self._writer = None
                if self._error_raised:  # told once; a later fit with this plugin writes again
                    self._error, self._error_raised = None, False
            super().teardown()

        def wait(self) -> None:
            """Return once every write, link and removal asked so far is done; raise the first error of them."""
            if self._writer is not None:
                self._writer.submit(lambda: None).result()
            self._raise_queued_error()

        def _queue(self, fn, *args) -> None:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltfm-checkpoint")

            def run():
                if self._error is None:  # after a failed write nothing more is written
                    try:
                        fn(*args)
                    except BaseException as e:  # noqa: BLE001 - raised in the training thread (_raise_queued_error)
                        self._error = e

            self._writer.submit(run)

        def _raise_queued_error(self) -> None:
            if self._error is not None and not self._error_raised:
                self._error_raised = True
                raise self._error

        def link(self, path: Path, state: tuple) -> bool:
            """``path`` made a hard link to the last file written, when that holds the same step and weights."""
            if self.written is None:
                return False
            source, inode, written = self.written
            if written != state or source.parent != path.parent:
                return False
            try:
                if source.stat().st_ino != inode:  # replaced since: not the file written then
                    return False
                if path.exists() and path.stat().st_ino == inode:
                    return True
                with atomic.atomic_path(path) as tmp:
                    tmp.unlink()
                    os.link(source, tmp)
            except OSError:  # no hard links here (or the file went): write the bytes
                return False
            return True

    return AtomicCheckpointIO()
