"""One step's checkpoints are one file (issue 52, item 19).

``step=N.ckpt``, ``last.ckpt`` and ``best.ckpt`` written at one step are hard links to one file, not three copies
(the quick check's 20-step runs kept three copies each). A later write of one name replaces that name alone, never
the file the others still name; pruning (``train.keep_checkpoints``) removes a name only; ``average``, a resume and
``--checkpoint best`` read them as before.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from conftest import SMOKE, ltfm

TINY = ["data.max_train_pairs=200", "data.max_dev_pairs=10", "data.vocab_size=200", "data.test_split=null",
        "model.layers=1", "model.d_model=16", "model.d_ff=32", "model.heads=2", "model.d_k=8", "model.d_v=8",
        "decode.beam_size=1", "decode.max_len_b=5", "train.threads=1", "wandb.mode=disabled", "train.batch_tokens=512",
        "train.val_every_steps=10", "train.checkpoint_every_steps=10", "train.warmup=10", "train.keep_checkpoints=1"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_one_steps_checkpoints_are_one_file_and_a_later_write_leaves_the_others(data_dir, tmp_path):
    from lightning_tfm.training.runs.checkpoints import checkpoint_problem

    results = tmp_path / "results"
    args = ["train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", f"data.cache_dir={tmp_path / 'c'}",
            *TINY]
    p = ltfm(*args, "train.max_steps=20", env={"WANDB_MODE": "disabled"})
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = results.iterdir()
    ckpt = run / "checkpoints"
    files = {p.name: p.stat() for p in ckpt.iterdir()}
    assert sorted(files) == ["best.ckpt", "last.ckpt", "step=000020.ckpt"]  # step 10 pruned (keep_checkpoints=1)
    assert len({s.st_ino for s in files.values()}) == 1 and files["last.ckpt"].st_nlink == 3, files
    twenty = digest(ckpt / "step=000020.ckpt")
    assert torch.load(ckpt / "best.ckpt", weights_only=True)["global_step"] == 20

    p = ltfm(*args, "train.max_steps=30", env={"WANDB_MODE": "disabled"})  # last.ckpt, step 30, maybe best again
    assert p.returncode == 0 and "from step 20 to 30" in p.stderr, p.stderr[-3000:]
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["best.ckpt", "last.ckpt", "step=000030.ckpt"], names  # step 20's name pruned
    assert (ckpt / "last.ckpt").stat().st_ino == (ckpt / "step=000030.ckpt").stat().st_ino
    best = torch.load(ckpt / "best.ckpt", weights_only=True)
    if best["global_step"] == 20:  # still step 20's file, as it was: the writes of step 30 replaced other names
        assert digest(ckpt / "best.ckpt") == twenty
    else:
        assert best["global_step"] == 30 and (ckpt / "best.ckpt").stat().st_ino == (ckpt / "last.ckpt").stat().st_ino
    assert all(checkpoint_problem(ckpt / name) is None for name in names)
    avg = ltfm("average", run, "--last", "1")
    assert avg.returncode == 0 and "step=000030.ckpt" in avg.stdout, avg.stderr[-2000:]
    out = ltfm("translate", run, "--checkpoint", "best", input="A dog runs.\n")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr[-2000:]


def _checkpoint(step: int, value: float) -> dict:
    return {"state_dict": {"w": torch.full((4,), value)}, "global_step": step, "epoch": 0}


def test_training_goes_on_while_the_writer_thread_writes_the_steps_state_in_order(tmp_path, monkeypatch):
    """save_checkpoint returns before the file is on disk (the write held back here): the file then holds the state
    of the step it was asked at, not the weights changed since; the link and the removal asked after it come after
    it; reading a checkpoint and teardown wait for the writes."""
    import threading

    from lightning_tfm.base import atomic
    from lightning_tfm.training.runs.checkpoint_io import atomic_checkpoint_io

    gate, write_bytes = threading.Event(), atomic.write_bytes
    monkeypatch.setattr(atomic, "write_bytes", lambda *a: (gate.wait(60), write_bytes(*a))[1])
    old = tmp_path / "step=000010.ckpt"
    torch.save(_checkpoint(10, 0.0), old)
    plugin = atomic_checkpoint_io()
    state = _checkpoint(20, 1.0)
    plugin.save_checkpoint(state, tmp_path / "step=000020.ckpt")
    plugin.save_checkpoint(state, tmp_path / "last.ckpt")
    plugin.remove_checkpoint(old)
    state["state_dict"]["w"] += 1  # the next optimizer step, in place, while the write waits
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=000010.ckpt"]  # nothing written yet, nothing removed
    gate.set()
    assert plugin.load_checkpoint(tmp_path / "last.ckpt")["state_dict"]["w"].tolist() == [1.0] * 4
    plugin.teardown()
    names = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
    assert sorted(names) == ["last.ckpt", "step=000020.ckpt"] and len(set(names.values())) == 1


def test_a_failed_queued_write_is_raised_in_the_training_thread_and_nothing_after_it_is_written(tmp_path, monkeypatch):
    """A write that fails in the writer thread (a full disk) is raised in the training thread, at teardown or at the
    next checkpoint call, once; the writes asked after it are not made (no file, no temporary)."""
    import errno
    import threading

    from lightning_tfm.base import atomic
    from lightning_tfm.training.runs.checkpoint_io import atomic_checkpoint_io

    gate, write_bytes = threading.Event(), atomic.write_bytes

    def full_disk(path, data):
        gate.wait(60)
        if Path(path).name == "step=000020.ckpt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(path, data)

    monkeypatch.setattr(atomic, "write_bytes", full_disk)
    plugin = atomic_checkpoint_io()
    plugin.save_checkpoint(_checkpoint(20, 1.0), tmp_path / "step=000020.ckpt")
    plugin.save_checkpoint(_checkpoint(20, 1.0), tmp_path / "last.ckpt")  # asked before the failure is known
    gate.set()
    with pytest.raises(OSError) as failed:
        plugin.teardown()
    assert failed.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # neither the failed file, nor a temporary, nor the write after it
    plugin.save_checkpoint(_checkpoint(30, 2.0), tmp_path / "step=000030.ckpt")  # a later fit writes again
    plugin.teardown()
    plugin.save_checkpoint(_checkpoint(20, 1.0), tmp_path / "step=000020.ckpt")  # the next failure, at the next call
    with pytest.raises(OSError):
        plugin.wait()
    plugin.teardown()  # raised once, not again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=000030.ckpt"]
    assert torch.load(tmp_path / "step=000030.ckpt", weights_only=True)["global_step"] == 30
