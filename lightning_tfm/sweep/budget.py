"""A run folder read at a sweep's budget (its trial's ``train.max_steps``), when the folder holds more training.

Run ids do not depend on ``train.max_steps``, and a row trains on in a run folder of its config under another
name: a sweep that trains rows of another on to a larger budget (``sweeps/table3-cpu-continued.yaml`` continues rows
of ``sweeps/table3-cpu.yaml``), or two sweep files of different budgets sharing a results folder, leave a folder whose
``summary.json`` and ``metrics.csv`` hold the later budget. Whatever reads a run for a sweep reads it at that sweep's
own budget through :func:`at_budget` (one rule): the worker (the value it tells Optuna and the results it records in
the trial, :mod:`.worker`), ``ltfm sweep --status`` and its verdicts, the launcher's lines (:mod:`.status`,
:mod:`.launch`) and the reports (:mod:`lightning_tfm.report.inputs.budget`):

- the run's completed attempt at exactly the budget (``summary.json`` keeps every earlier attempt) gives every
  result of the run's end: dev loss, PPL and BLEU, test BLEU, the BLEU signature, wall time, tokens trained;
- without one, the curve's validation at the budget gives the dev loss and PPL, and nothing measured at the end of
  training only is known at the budget: dev and test BLEU (beam search on the whole set, after the last step), the
  wall time, the tokens. They are None, never the later budget's;
- the curve is cut at the budget (validations up to it);
- with neither, the run is :data:`CONTINUED` at the budget: no numbers, and a note that says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..training.runs.results import DEV_LOSS, DEV_PPL, read_metrics, read_summary

DONE = "completed"
#: A run trained past a sweep's budget whose folder cannot say where it stood at the budget
CONTINUED = "continued"

# The summary.json keys that hold the state of a run at the end of its training: of the later budget in a folder
# trained on past a sweep's (the rest, the run's config, size and corpus, do not depend on the budget).
AT_END = ("status", "error", "steps", "epochs", "train_tokens", "dev_loss", "dev_ppl", "dev_bleu", "test_bleu",
          "dev_bleu_ratio", "test_bleu_ratio", "dev_bleu_tok_compound_split", "test_bleu_tok_compound_split",
          "bleu_signature", "bleu_checkpoint", "decode", "dev_bleu_history", "wall_time_s", "train_time_s",
          "tokens_per_s", "finished_at", "attempts")
#: The ``skip`` of a trial closed untrained because its run folder, trained past the trial's budget by another sweep,
#: cannot say the sweep's metric at that budget (:mod:`.worker`); such a row is not queued again (:mod:`.queue`)
PAST_BUDGET = "past_budget"
#: Why a run read from its curve has no BLEU at the budget
NO_BLEU = "BLEU is measured at the end of training only"


@dataclass
class AtBudget:
    """A run at a sweep's budget: ``summary`` as it was then (the module docstring; ``steps`` = the budget, status
    completed or :data:`CONTINUED`, None for what is not known then), its metric ``history`` cut at the budget,
    what its folder holds beyond it (``later``: ``"completed at step 40"``), and whether the numbers are of the
    run's completed attempt at the budget (``from_attempt``) or of its curve."""
    summary: dict
    history: list[dict]
    later: str
    from_attempt: bool

    @property
    def note(self) -> str:
        """One line for a table: where the run was read, and what is not known there."""
        s = self.summary
        if s.get("status") == CONTINUED:
            return s["error"]
        return (f"read at step {s['steps']}, its folder trained on ({self.later})"
                + ("" if self.from_attempt else f"; no BLEU there ({NO_BLEU})"))


def _int(x) -> int | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return int(x)


def cut_history(history: list[dict], budget: int, end: dict | None = None) -> tuple[list[dict], dict | None]:
    """(the metric history up to ``budget`` steps, its validation at the budget or None). Lightning logs the
    validation after the ``budget``-th update at step ``budget - 1``, except the one that ends a training off the
    validation interval, at its last step: a row at step ``budget`` is that of a training that ended at the budget
    or the validation after ``budget + 1`` updates of a longer one (the attempts' metrics merged keep the later),
    so it is never read as the budget's. ``end``: the dev values of an attempt that ended at exactly the budget
    (its summary's), the validation at the budget when there is none at step ``budget - 1``."""
    kept = [h for h in history if h["step"] < budget]
    at = next((h for h in history if h.get(DEV_PPL) is not None and h["step"] == budget - 1), None)
    if at is None and end is not None:
        at = {"step": budget, **end}
        kept.append(at)
    return kept, at


def is_budget(budget) -> bool:
    return isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1


def at_budget(summary: dict | None, history: list[dict], budget) -> AtBudget | None:
    """``summary`` (a run folder's latest, with its ``attempts``) and ``history`` (its metric rows) at ``budget``
    steps (the module docstring); None when the run holds nothing past the budget: read it as it is."""
    if not isinstance(summary, dict) or not is_budget(budget):
        return None
    status, steps = summary.get("status"), _int(summary.get("steps"))
    if status == DONE and steps == budget:
        return None
    attempts = [a for a in summary.get("attempts") or [] if isinstance(a, dict) and a.get("status") == DONE
                and _int(a.get("steps")) == budget]
    beyond = steps is not None and steps > budget or any(h["step"] > budget for h in history)
    if not attempts and not beyond:
        return None  # not trained past the budget (still short of it, failed before it, ...): as it is
    later = str(status) if steps is None else f"{status} at step {steps}"
    end = {k: float(v) for k, v in ((DEV_LOSS, attempts[-1].get("dev_loss")), (DEV_PPL, attempts[-1].get("dev_ppl")))
           if _int(v) is not None} if attempts else {}
    kept, at = cut_history(history, budget, end if DEV_PPL in end else None)
    then = {k: v for k, v in summary.items() if k not in AT_END}
    if attempts:
        then.update({k: v for k, v in attempts[-1].items() if k not in ("config", "attempts")})
    elif at is not None:  # it went through the budget: its validation there is the run's result
        then.update(status=DONE, dev_loss=at.get(DEV_LOSS), dev_ppl=at.get(DEV_PPL))
    else:  # the run went beyond the budget, but its curve cannot say where it stood there
        then.update(status=CONTINUED, error=f"its run folder was trained on ({later}) and holds no validation at "
                                            f"step {budget}, this sweep's budget")
    then["steps"] = budget
    return AtBudget(then, kept, later, bool(attempts))


def folder_at_budget(run_dir, budget, summary: dict | None = None) -> AtBudget | None:
    """:func:`at_budget` of a run folder (its ``summary.json``, or ``summary`` when read already, and its metric
    history, read only when needed); None for a folder that cannot be read or holds nothing past the budget."""
    summary = read_summary(run_dir) if summary is None else summary
    if not isinstance(summary, dict) or not is_budget(budget):
        return None
    steps = _int(summary.get("steps"))
    if summary.get("status") == DONE and steps is not None and steps <= budget:
        return None  # completed within the budget: nothing past it (the usual case, without reading the curve)
    try:
        history = read_metrics(Path(run_dir))
    except (OSError, ValueError):
        history = []
    return at_budget(summary, history, budget)
