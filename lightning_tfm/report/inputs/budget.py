"""A report's run read at its own sweep's budget, when its run folder was trained on after it.

Run ids do not depend on ``train.max_steps``: a sweep that trains some rows of another on to a larger budget
(``sweeps/table3-cpu-continued.yaml`` continues rows of ``sweeps/table3-cpu.yaml``) continues their run folders,
whose ``summary.json`` then holds the later budget. The report of the first sweep reads each of its rows at that
sweep's budget (its trial's ``train.max_steps``), never at the later one (:func:`read_at_budget`), by the one rule
the worker and ``ltfm sweep --status`` read a run at a budget by (:func:`lightning_tfm.sweep.budget.at_budget`):
the run's completed attempt at the budget, else its curve's validation there (no BLEU: measured at the end of
training only), else :data:`~lightning_tfm.sweep.budget.CONTINUED` (not completed) with a note; the curve is cut
at the budget, and the dev hypotheses are dropped (the file is of the last decode, at the later budget): the paired
bootstrap leaves the row out.

Every record read so carries what its folder holds beyond the budget in ``later_attempt``; :func:`budget_note` says
it in the report's notes.
"""
from __future__ import annotations

from ...sweep.budget import at_budget
from .records import DIVERGED, DONE, RunRecord, as_number, nonfinite

__all__ = ["budget_note", "of_other_studies", "planned_budgets", "read_at_budget"]

# What a record takes from the run's summary at the budget (summary.json keys = RunRecord fields)
_ATTEMPT_NUMBERS = ("dev_loss", "dev_ppl", "dev_bleu", "wall_time_s", "train_tokens")
_ATTEMPT_TEXTS = ("bleu_signature", "started_at", "finished_at", "host", "precision")


def read_at_budget(rec: RunRecord, budget: int | None, study: str, attempts: list | None = None) -> bool:
    """Read ``rec`` (a run folder's latest state) at ``budget`` steps when its folder was trained on after it (the
    module docstring); ``attempts``: the summary's earlier attempts, oldest first; ``study``: the sweep's name.
    Returns whether the record was changed."""
    read = at_budget({"status": rec.status, "steps": rec.steps, "attempts": attempts or []}, rec.history, budget)
    if read is None:
        return False
    s = read.summary
    rec.history, rec.hyps, rec.later_attempt = read.history, None, read.later
    rec.config = {**rec.config, "train.max_steps": budget, "run.study": study}
    for key in _ATTEMPT_NUMBERS:
        setattr(rec, key, as_number(s.get(key)))
    for key in _ATTEMPT_TEXTS:
        if isinstance(s.get(key), str):
            setattr(rec, key, s[key])
    if not read.from_attempt:
        rec.bleu_signature = None  # no BLEU at the budget
    rec.steps, rec.status, rec.note = budget, s["status"], s.get("error")
    if read.from_attempt and any(nonfinite(s.get(k)) for k in ("dev_loss", "dev_ppl")):
        rec.status, rec.note = DIVERGED, f"dev PPL {s.get('dev_ppl')} at step {budget}"
    elif rec.status == DONE:
        rec.note = None
    return True


def planned_budgets(sweep) -> dict[str, int]:
    """variant -> the train.max_steps the sweep file gives its row (its budget factor applied; command-line
    overrides given to ``ltfm sweep`` are not known here)."""
    from .records import planned_configs

    return {v: cfg["train.max_steps"] for v, cfg in planned_configs(sweep).items()
            if isinstance(cfg.get("train.max_steps"), int)}


def of_other_studies(sweep, records: list[RunRecord]) -> int:
    """Records without a trial (W&B runs, an export) whose run was last trained by another study (its config's
    ``run.study``), read at this sweep file's budget of their row; returns how many were changed."""
    budgets = None
    changed = 0
    for rec in records:
        study = rec.config.get("run.study")
        if not isinstance(study, str) or study == sweep.name or rec.steps is None:
            continue
        budgets = planned_budgets(sweep) if budgets is None else budgets
        changed += read_at_budget(rec, budgets.get(rec.variant), sweep.name)
    return changed


def budget_note(records: list[RunRecord]) -> str | None:
    """One note naming the records read at their sweep's budget (``later_attempt`` set), or None."""
    read = [r for r in records if r.later_attempt]
    if not read:
        return None
    names = ", ".join(f"{r.variant}{'' if r.seed is None else f' s{r.seed}'} at {r.steps} "
                      f"(folder: {r.later_attempt})" for r in read)
    no_bleu = [r for r in read if r.completed and r.dev_bleu is None]
    return (f"{len(read)} run(s) read at this sweep's budget, their run folders trained on after it (another sweep "
            f"sharing them, such as a continued one): {names}. Their numbers and curves are of this budget"
            + (f"; dev BLEU unknown at it for {len(no_bleu)} (measured at the end of training only)" if no_bleu else "")
            + "; their dev hypotheses are of the later training, so the paired bootstrap leaves them out.")
