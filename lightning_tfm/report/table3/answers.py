"""The report's side of each row's answer: *better*, *worse*, *the same* within ±delta or *unsettled* against the
base, from the row's own seeds paired with the base's (the rule, its error rate over the settle loop's looks and
its settings: :mod:`lightning_tfm.findings.answers`, :func:`lightning_tfm.findings.settle.judge`, the sweep file's
``settle:`` section). Here: the table's columns (:func:`add_answers`: ``answer`` and what it took, the seeds and
the training FLOPs of the row's runs) and the headline's counts (the answers, the compute spent, beside what every
row at the cap would have cost).

The table reads each run at the sweep's budget (1 x), so a row is judged at 1 x here; a sweep whose ``settle:``
allows a longer budget has its rows' answers there in ``ltfm sweep FILE --status``. A row of one seed is
*unsettled (one seed)*, and its verdict (the 2 x base-sd rule and the curves, :mod:`.verdict`) stays beside it in
the table: the answer's cell says it is no controlled answer.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ...findings.answers import ANSWERS, FIRST_LOOK, look_level, looks, one_seed_false_rate
from ...findings.settings import SETTLE_DEFAULTS, SettleSpec
from ...findings.settle import RowRuns, judge
from ..inputs.records import RunRecord
from .compute import step_flops


@dataclass
class AnswerSummary:
    """The headline's numbers of the answers (:func:`add_answers`)."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANSWERS, 0))  # rows of each answer
    rows: int = 0                   # rows with an answer (every row but the base with a completed run)
    alpha: float = 0.1              # each row's false-answer rate at most (the settle: section's)
    delta: float = 0.05             # 'the same within ±delta'
    seeds: int = 3                  # a row's seeds at the cap
    spent: float | None = None      # training FLOPs of every completed run, the base's too (None: one unknown)
    at_cap: float | None = None     # every row and the base at the caps
    rule: str = ""                  # the rule in one paragraph (:func:`answer_rule`), for the notes


def settle_spec(sweep) -> SettleSpec:
    """The sweep file's ``settle:`` settings over the defaults (a sweep read before the section existed: the
    defaults)."""
    given = getattr(sweep, "settle", None)
    if dataclasses.is_dataclass(given):
        given = dataclasses.asdict(given)
    return SettleSpec(**{**SETTLE_DEFAULTS, **(given or {})})


def answer_rule(spec: SettleSpec) -> str:
    """The rule in one paragraph, with the settings used (the report's notes)."""
    k = len(looks(spec))
    return (f"Answer (dev PPL): each row against the base from its own seeds, each paired with the base's same seed "
            f"(the same data order): the t interval of the mean difference of dev log-PPL over the row's first n "
            f"seeds (n from {min(FIRST_LOOK, spec.seeds)} to {spec.seeds}), at {100 * look_level(spec):.3g}% = 1 − "
            f"alpha/K for the K = {k} look(s) the settle loop may take (Bonferroni): *better* or *worse* when it "
            f"excludes 0, *the same* when it lies inside ±log(1 + {spec.delta:g}), else *unsettled*. Each row's "
            f"chance of a false answer is at most alpha = {spec.alpha:g} over all its looks; of a table of R rows, "
            f"at most R × {spec.alpha:g} false answers expected. A row of one seed is unsettled: the 2σ rule on one "
            f"seed errs {100 * one_seed_false_rate(3):.1f}% of the time on no difference (3 base seeds). Settings: "
            "the sweep file's `settle:` section; lightning_tfm/findings/answers.py.")


def run_flops(rec: RunRecord) -> float | None:
    """The training FLOPs of one run: its FLOPs a step x the steps it trained (None where unknown)."""
    per_step, _ = step_flops(rec)
    return per_step * rec.steps if per_step and rec.steps else None


def row_runs(variant: str, recs: list[RunRecord]) -> RowRuns:
    """A row's completed runs as the planner reads them, at the sweep's budget: seed -> dev log-PPL."""
    values = {r.seed: float(r.dev_loss) for r in recs
              if r.completed and r.seed is not None and isinstance(r.dev_loss, (int, float)) and
              math.isfinite(r.dev_loss)}
    return RowRuns(variant, {1.0: values} if values else {})


def add_answers(rows: list, by_variant: dict[str, list[RunRecord]], sweep) -> AnswerSummary:
    """Each row's ``answer`` and its columns (the module docstring); returns the headline's numbers."""
    spec = settle_spec(sweep)
    base = row_runs("base", by_variant.get("base", []))
    counts = dict.fromkeys(ANSWERS, 0)
    spent, at_cap, known = 0.0, 0.0, True
    most = min(spec.seeds, spec.base_seeds)
    for row in rows:
        recs = [r for r in by_variant.get(row.variant, []) if r.completed]
        flops = [run_flops(r) for r in recs]
        known &= None not in flops
        spent += sum(f for f in flops if f)
        per_run = flops[0] if flops and flops[0] else None
        if per_run:
            at_cap += per_run * spec.budget * (max(len(recs), most) if row.variant == "base" else spec.seeds)
        if row.variant == "base" or not recs or not base.values:
            continue
        a = judge(row_runs(row.variant, recs), base, spec)
        row.answer, row.answer_why = a.answer, a.why
        row.answer_low = math.expm1(a.low) if a.low is not None else None
        row.answer_high = math.expm1(a.high) if a.high is not None else None
        row.answer_seeds = a.row_seeds
        row.answer_flops = sum(flops) if None not in flops else None
        counts[a.answer] += 1
    return AnswerSummary(counts, sum(counts.values()), spec.alpha, spec.delta, spec.seeds,
                         spent if known else None, at_cap if known else None, answer_rule(spec))
