"""The report's side of a row's verdict: the rule itself (*holds*, *may flip*, *within noise*, *too few points*,
judged from each run's learning curve extrapolated to ``k`` x the budget) is :mod:`lightning_tfm.findings.verdict`'s
(:func:`~lightning_tfm.findings.verdict.curve_verdict`, the one place it is written, which ``ltfm sweep --status`` and
the launcher's lines read too: one rule, one answer), with the settings of the sweep file's ``report:`` section
(:data:`lightning_tfm.sweep.REPORT_DEFAULTS`). Here: the rule in one paragraph for the report's notes
(:func:`verdict_rule`), the table's columns (:func:`add_table_verdicts`: the verdict from the table's Δ and its
seed-noise verdict, :func:`lightning_tfm.findings.noise.noise_verdict`), and the settle budgets as the table prints
them.

A row that may flip gets its **settle budget** (``ppl_settle``, :func:`lightning_tfm.findings.curves.settle_budget`):
the least multiple of the budget, up to 10x, at which a verdict taken then is predicted to hold, or at which its gap
is predicted to cross the base, as steps, FLOPs and hours on the machine that trained it (:func:`settle_text`); else
"not within 10x". A row within noise gets none: back-tested, such predictions came true no more often than saying
nothing (:data:`~lightning_tfm.findings.curves.SETTLE_RECORD`). The headline counts them (:func:`settle_summary`): how
many of these rows a run m x as long would settle.

The base row and rows without a change (not completed) get no verdict. How often a *holds* kept its sign on the
committed CPU reference: ``reports/reference/backtest/README.md`` (``ltfm report ... --backtest``, :mod:`.backtest`).
"""
from __future__ import annotations

from ...findings.verdict import (  # noqa: F401 - the report's names of the one rule (lightning_tfm.findings.verdict)
    HOLDS,
    MAY_FLIP,
    TOO_FEW,
    VERDICTS,
    WITHIN,
    Verdict,
    change,
    curve_verdict,
    gap_text,
    last_step,
    later_step,
    pct,
    predict,
    settings_of,
)


def verdict_rule(settings: dict | None = None) -> str:
    """The rule in one paragraph, with the settings used (the report's notes)."""
    from ...findings.curves import EXTRAPOLATION_ERROR, SIGN_LEVEL, SIGN_QUANTILE

    s = settings_of(settings)
    return (f"Verdict (dev PPL): each run's dev log-PPL after the warmup is fitted with a {s['family']} law "
            f"(at least {s['min_points']} validations) and the gap log PPL(row) − log PPL(base) predicted at "
            f"{s['k']:g} × the budget (each side at its own: step {s['k']:g} × (T + 1) − 1). Two answers, each "
            f"calibrated on its own question on the committed back-tests (each export left out in turn). *Holds*: "
            f"beyond seed noise at the end, and the {100 * SIGN_LEVEL:g}% one-sided bound on the gap at "
            f"{s['k']:g}x stays on the side of today's change: the predicted gap moved toward zero by "
            f"{SIGN_QUANTILE:.2f} × (the base's seed sd ⊕ today's gap), in log PPL (a gap the curves show closing "
            "fails it); its level was chosen on how often such calls kept their sign. *May flip*: beyond noise, "
            "and the bound reaches zero. *Within noise*: the change at the end is within seed noise. *Too few "
            "points*: seed noise unknown (one base seed) or fewer validations after the warmup than the fit needs. "
            f"The size: the predicted gap with its {100 * s['level']:g}% interval ({s['bootstraps']} draws, seed "
            f"{s['seed']}: each run's residual bootstrap, the base's seeds resampled, widened in quadrature by the "
            f"extrapolation's own error, {EXTRAPOLATION_ERROR:.2f} nats at 3x in proportion to log k). Settings: "
            "the sweep file's `report:` section (k, min_points, level, bootstraps, seed, family); back-tests in "
            "reports/reference/backtest/.")


def seconds_per_step(by_variant: dict) -> dict[str, float]:
    """Each row's training seconds per step on the machine that trained it: its completed runs' wall time over
    their steps, the mean over seeds (rows without a wall time left out)."""
    out = {}
    for v, recs in by_variant.items():
        each = [r.wall_time_s / r.steps for r in recs if r.completed and r.wall_time_s and r.steps]
        if each:
            out[v] = sum(each) / len(each)
    return out


#: What each kind of settle budget says (:func:`lightning_tfm.findings.curves.settle_budget`), of a row's side.
SETTLE_WORDS = {"holds": "holds, {side},", "flips": "flips to {side}"}


def settle_text(verdict: Verdict | None, flops_per_step: float | None = None,
                seconds: float | None = None) -> str | None:
    """A verdict's settle budget as the table prints it, naming the side: ``holds, worse than the base, at 4.2x:
    2520 steps, 3.1e+15 FLOPs, 1.3 h`` (FLOPs and hours where the row's cost is known), ``flips to better than the
    base at ...``, ``not within 10x`` (a row that may flip without one); None for a row that does not may flip."""
    from ...findings.curves import SETTLE_MOST

    if verdict is None or verdict.verdict != MAY_FLIP:
        return None
    settle = verdict.settle
    if settle is None:
        return f"not within {SETTLE_MOST:g}x"
    steps = settle.step + 1
    cost = [f"{steps} steps"] + ([f"{flops_per_step * steps:.2g} FLOPs"] if flops_per_step else []) + (
        [f"{seconds * steps / 3600:.2g} h"] if seconds else [])
    side = "worse than the base" if settle.sign > 0 else "better than the base"
    return f"{SETTLE_WORDS[settle.kind].format(side=side)} at {settle.k:.3g}x: {', '.join(cost)}"


#: The multiples of the budget the headline counts the settled rows at (:func:`settle_summary`), up to
#: :data:`lightning_tfm.findings.curves.SETTLE_MOST`.
SETTLE_AT = (1.5, 2.0, 3.0, 5.0, 10.0)


def settle_summary(outlook: dict[str, Verdict]) -> dict:
    """The settle budgets in all, from the verdicts :func:`add_table_verdicts` returns: ``unsettled``, the rows that may
    flip; ``settled``, ``[(m, rows whose settle budget is at most m x the budget)]`` for each ``m`` of
    :data:`SETTLE_AT`; ``kinds``, how many of them settle by each kind (``holds`` on today's side, ``flips`` to the
    other); ``not_within``, rows with no settle budget by :data:`~lightning_tfm.findings.curves.SETTLE_MOST` x;
    ``no_prediction``, rows without a predicted gap (no fit)."""
    unsettled = [v for v in outlook.values() if v.verdict == MAY_FLIP]
    found = [v.settle for v in unsettled if v.settle is not None]
    return {"unsettled": len(unsettled), "settled": [(m, sum(1 for s in found if s.k <= m)) for m in SETTLE_AT],
            "kinds": {kind: sum(1 for s in found if s.kind == kind) for kind in SETTLE_WORDS},
            "not_within": sum(1 for v in unsettled if v.settle is None and v.gap is not None),
            "no_prediction": sum(1 for v in unsettled if v.gap is None)}


def add_table_verdicts(rows: list, curves, settings: dict | None = None,
                       seconds: dict | None = None) -> dict[str, Verdict]:
    """Each row's ``ppl_verdict``, ``ppl_verdict_why`` and ``ppl_settle`` (:func:`settle_text`, with the row's
    ``flops_per_step`` and ``seconds`` per step: {variant: :func:`seconds_per_step`}) from the table's learning
    curves (:class:`~.table.LearningCurves`: its ``runs`` and ``warmup``), its ``delta_ppl`` and ``ppl_noise``.
    Returns {variant: its :class:`~lightning_tfm.findings.verdict.Verdict`} for the figures."""
    runs, warmups = curves.runs, curves.warmup
    base = runs.get("base", [])
    out = {}
    for row in rows:
        v = curve_verdict(runs.get(row.variant, []), base, row.delta_ppl, row.ppl_noise, settings,
                          warmup=warmups.get(row.variant) or 0, base_warmup=warmups.get("base") or 0)
        row.ppl_verdict = v.verdict if v else None
        row.ppl_verdict_why = v.why if v else None
        row.ppl_settle = settle_text(v, row.flops_per_step, (seconds or {}).get(row.variant))
        if v:
            out[row.variant] = v
    return out


def verdict_summary(rows: list) -> dict:
    """Counts of each verdict, the rows that may flip by name, and direction agreement with the paper over the
    findings, the rows that hold (``ppl_findings``: ``(agree, compared)``)."""
    counts = {v: sum(1 for r in rows if r.ppl_verdict == v) for v in VERDICTS}
    holds = [r for r in rows if r.ppl_verdict == HOLDS and r.ppl_agrees is not None]
    return {"verdicts": counts, "may_flip": [r.variant for r in rows if r.ppl_verdict == MAY_FLIP],
            "ppl_findings": (sum(1 for r in holds if r.ppl_agrees), len(holds))}
