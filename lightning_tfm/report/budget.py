"""A run read at its own sweep's budget, when its run folder was trained on after it.

Run ids do not depend on ``train.max_steps``: a sweep that trains some rows of another on to a larger budget
(``sweeps/table3-cpu-continued.yaml`` continues rows of ``sweeps/table3-cpu.yaml``) continues their run folders,
whose ``summary.json`` then holds the later budget. The report of the first sweep reads each of its rows at that
sweep's budget (its trial's ``train.max_steps``), never at the later one (:func:`read_at_budget`):

- the run's completed attempt at exactly the budget (``summary.json`` keeps every earlier attempt) gives the dev
  loss, PPL and BLEU, the BLEU signature, the wall time and the tokens trained;
- without one (a W&B run, an export written before, a folder whose summary was rewritten), the curve's validation
  at the budget gives the dev loss and PPL, and the dev BLEU is unknown (it is measured at the end of training
  only): the record keeps no BLEU rather than the later one;
- the curve is cut at the budget; the dev hypotheses are dropped (the file is of the last decode, at the later
  budget): the paired bootstrap leaves the row out;
- with neither, the record is :data:`CONTINUED` (not completed) with a note: the table shows why it has no numbers.

Every record read so carries what its folder holds beyond the budget in ``later_attempt``; :func:`budget_note` says
it in the report's notes.
"""
from __future__ import annotations

from ..training.results import DEV_LOSS, DEV_PPL
from .records import DIVERGED, DONE, RunRecord, _int, _nonfinite, _num

CONTINUED = "continued"

# What the completed attempt at the budget gives (summary.json keys = RunRecord fields)
_ATTEMPT_NUMBERS = ("dev_loss", "dev_ppl", "dev_bleu", "wall_time_s", "train_tokens")
_ATTEMPT_TEXTS = ("bleu_signature", "started_at", "finished_at", "host", "precision")


def _later(rec: RunRecord) -> str:
    if rec.steps is None:
        return rec.status
    return f"{rec.status} at step {rec.steps}"


def _cut(history: list[dict], budget: int) -> tuple[list[dict], dict | None]:
    """(the curve up to the budget, its validation at the budget or None). Lightning logs the validation after
    the ``budget``-th update at step ``budget - 1`` (or ``budget`` when training ends off the validation interval)."""
    kept = [h for h in history if h["step"] < budget]
    dev = {h["step"]: h for h in history if h.get(DEV_PPL) is not None and h["step"] in (budget - 1, budget)}
    at = dev.get(budget - 1)
    if at is None and budget in dev:
        at = dev[budget]
        kept.append({k: v for k, v in at.items() if k == "step" or k.startswith("dev/")})
    return kept, at


def read_at_budget(rec: RunRecord, budget: int | None, study: str, attempts: list | None = None) -> bool:
    """Read ``rec`` (a run folder's latest state) at ``budget`` steps when its folder was trained on after it (the
    module docstring); ``attempts``: the summary's earlier attempts, oldest first; ``study``: the sweep's name.
    Returns whether the record was changed."""
    if not isinstance(budget, int) or budget < 1:
        return False
    if rec.status == DONE and rec.steps == budget:
        return False
    at_budget = [a for a in attempts or [] if isinstance(a, dict) and a.get("status") == DONE
                 and _int(a.get("steps")) == budget]
    if not at_budget and (rec.steps is None or rec.steps <= budget):
        return False  # not trained beyond the budget (still running, failed before it, ...): as it is
    later = _later(rec)
    rec.history, at = _cut(rec.history, budget)
    rec.hyps = None
    rec.later_attempt = later
    rec.config = {**rec.config, "train.max_steps": budget, "run.study": study}
    if at_budget:
        a = at_budget[-1]
        for key in _ATTEMPT_NUMBERS:
            setattr(rec, key, _num(a.get(key)))
        for key in _ATTEMPT_TEXTS:
            setattr(rec, key, a.get(key) if isinstance(a.get(key), str) else getattr(rec, key))
        rec.steps, rec.status, rec.note = budget, DONE, None
        if any(_nonfinite(a.get(k)) for k in ("dev_loss", "dev_ppl")):
            rec.status, rec.note = DIVERGED, f"dev PPL {a.get('dev_ppl')} at step {budget}"
        return True
    rec.steps = budget
    rec.dev_bleu = rec.bleu_signature = rec.wall_time_s = rec.train_tokens = None
    if at is None:  # the run went beyond the budget, but its curve cannot say where it stood there
        rec.dev_loss = rec.dev_ppl = None
        rec.status, rec.note = CONTINUED, (f"its run folder was trained on ({later}) and holds no validation at "
                                           f"step {budget}, this sweep's budget")
    else:  # it went through the budget: its validation there is the row's result
        rec.dev_loss, rec.dev_ppl, rec.status, rec.note = at.get(DEV_LOSS), at.get(DEV_PPL), DONE, None
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
