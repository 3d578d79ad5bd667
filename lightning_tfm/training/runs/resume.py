"""A resume, one name per step: which checkpoint it loads (:func:`pick`), whether that one may be resumed
(:func:`check`), the unreadable ones set aside and the choice said (:func:`set_aside_unreadable`), the random
state each rank restores from it (:func:`rank_rng`); and the step a resume would start from (:func:`newest_step`),
which a sweep compares before and after an attempt.

``ltfm train`` (:mod:`..train`) checks the pick before anything is written, then again under the run's lock, where
rank zero sets the unreadable ones aside; every other rank picks the same file. Every step but
:func:`set_aside_unreadable` reads only. A checkpoint an older version wrote is read as today's
(:func:`.upgrade.checkpoint`).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

from ...base.errors import UserError
from ..config import config
from . import run_folder, upgrade
from .checkpoint_io import RNG
from .checkpoints import STEP_CKPT, checkpoint_problem, foreign_problem, own_names, step_checkpoints


@dataclasses.dataclass(frozen=True)
class Pick:
    """The checkpoint a resume loads and what was found on the way."""

    path: Path | None                    # the file a resume loads; None: none is readable (the run starts at step 0)
    unreadable: list[tuple[Path, str]]   # the unreadable checkpoints newer than it, with why (set aside when resumed)
    last_step: int | None                # last.ckpt's step, None when it is absent or unreadable


def pick(ckpt_dir: Path) -> Pick:
    """The checkpoint a resume of the run whose ``checkpoints/`` is ``ckpt_dir`` loads: the newest readable one of
    ``last.ckpt`` and the ``step=*.ckpt`` files (a process killed between writing a step checkpoint and ``last.ckpt``
    leaves ``last.ckpt`` older, or none: resuming from it would train those steps again and write
    ``step=N-v1.ckpt`` beside the old file). Reads only: every rank of a run and the check before it find the same
    file."""
    last = ckpt_dir / "last.ckpt"
    unreadable: list[tuple[Path, str]] = []
    last_step = None
    if last.is_file():
        why = checkpoint_problem(last)
        if why is None:
            last_step = int(torch.load(last, map_location="cpu", weights_only=True, mmap=True).get("global_step", -1))
        else:
            unreadable.append((last, why))
    for step, path in reversed(step_checkpoints(ckpt_dir.parent)):
        if last_step is not None and step <= last_step:
            break  # last.ckpt is as new as any step checkpoint left
        why = checkpoint_problem(path)
        if why is None:
            return Pick(path, unreadable, last_step)
        unreadable.append((path, why))
    return Pick(last if last_step is not None else None, unreadable, last_step)


def check(chosen: Pick, run_dir: Path, cfg: "config.Config", vocab: str) -> None:
    """The checkpoint ``chosen`` (:func:`pick`) a resume of ``run_dir`` loads must be of this run (the id it
    records), of ``cfg`` and of the vocabulary ``vocab`` (:func:`~.checkpoints.foreign_problem`): else one line naming
    it and the way out (a checkpoint copied in, a folder whose ``tokenizer.json`` was replaced or deleted). Nor may
    it be past ``cfg``'s budget (``train.max_steps``): an unfinished run (stopped, failed) resumed with a smaller
    budget would end at once and pass for completed at the budget asked, which it never trained to; one line naming
    the step it reached and the way out. (A completed run past the budget is not resumed: ``ltfm train`` finds it
    completed.) Nothing to check when there is no checkpoint. Reads only."""
    path = chosen.path
    if path is None:
        return
    ck = upgrade.checkpoint(torch.load(path, map_location="cpu", weights_only=True, mmap=True), path)
    why = foreign_problem(ck, path, cfg, vocab, f"run {run_dir.name}", corpus=run_folder.recorded_corpus(run_dir),
                          run=own_names(run_dir, cfg))
    if why is not None:
        raise UserError(f"{why}: cannot resume {run_dir} from it; move {path.name} out of {path.parent} if it was "
                        f"copied in, else give another run.id (or run.results_dir), or delete the folder to train "
                        f"there anew")
    step, budget = int(ck.get("global_step", 0)), cfg.train.max_steps
    if step > budget:
        saved = run_folder.saved_config(run_dir)[0]
        own = f" (its own: {saved.train.max_steps})" if saved is not None and saved.train.max_steps > step else ""
        raise UserError(f"run {run_dir} has trained to step {step} ({path.name}), past train.max_steps={budget}: "
                        f"give train.max_steps={step} or more to train it on{own}, or another run.id (or "
                        f"run.results_dir) to train {budget} steps anew")


def set_aside_unreadable(chosen: Pick) -> Path | None:
    """After :func:`check`, on rank zero: rename each unreadable checkpoint newer than the pick out of the way
    (``<name>.corrupt-<time>``, kept for inspection, never read again), say so, and say which checkpoint the run
    resumes from when it is not ``last.ckpt``, or that it starts over from step 0 when none is left. Returns the
    file to resume from (None: step 0)."""
    path = chosen.path
    for bad, why in chosen.unreadable:
        dest = bad.with_name(f"{bad.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(bad, dest)
        print(f"ltfm: warning: {bad} is unreadable ({why}); moved to {dest.name}", file=sys.stderr)
    if path is not None and path.name != "last.ckpt":
        step = int(STEP_CKPT.match(path.name).group(1))
        print(f"ltfm: resuming from {path.name} (step {step}) " +
              ("instead" if chosen.unreadable else "(no last.ckpt: the run was stopped before writing it)"
               if chosen.last_step is None else f"(newer than last.ckpt, step {chosen.last_step}: the run was "
               "stopped between writing the two)"), file=sys.stderr)
    if path is None and chosen.unreadable:
        print("ltfm: warning: no readable checkpoint left: the run starts over from step 0", file=sys.stderr)
    return path


def rank_rng(ck: dict, rank: int) -> dict | None:
    """The random state rank ``rank`` restores when it resumes from checkpoint ``ck`` (:data:`~.checkpoint_io.RNG`, a
    list, read as today's: :func:`.upgrade.checkpoint`): its own; from a run of fewer processes, rank zero's for a
    rank it did not have (as every rank of a new run starts from the one seed). None when the checkpoint records
    none."""
    states = ck.get(RNG)
    if isinstance(states, list) and states:
        return states[rank] if rank < len(states) else states[0]
    return None


def newest_step(run_dir: str | Path) -> int:
    """The step a resume of the run would start from: the newest of its ``step=N.ckpt`` names and
    ``last.ckpt``'s ``global_step`` (an unreadable ``last.ckpt`` counts as absent); 0 when it has none.
    What a sweep compares before and after an attempt to tell whether the attempt kept work (its retry rule)."""
    newest = max((step for step, _ in step_checkpoints(run_dir)), default=0)
    last = Path(run_dir) / "checkpoints" / "last.ckpt"
    try:
        ck = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        newest = max(newest, int(ck.get("global_step", 0)))
    except Exception:  # noqa: BLE001 - absent, or unreadable: a resume would set it aside
        pass
    return newest
