"""The verdict of a row against the base, one rule in one place, for ``ltfm sweep --status``, the launcher's lines
(:mod:`.status`) and the report (:mod:`lightning_tfm.report.table3.verdict`, its back-test and Table 2's claims):
does the row's change *hold* at a longer budget, *may* it *flip*, is it *within noise*, or are there *too few
points* to say, judged from each run's learning curve extrapolated.

A short budget ranks how fast rows start to learn; a change beyond seed noise at the end of the budget can still
be a crossing in progress. Each run's dev log-PPL after the warmup is fitted with a curve (:mod:`.curves`: the
family, its fit, the bootstrap) and the gap to the base predicted at ``k`` times the budget. The rule
(:func:`curve_verdict`), with the settings of the sweep file's ``report:`` section (:data:`.settings.REPORT_DEFAULTS`:
``k`` 3, ``min_points`` 3, ``level`` 0.8, ``bootstraps`` 200, ``seed`` 0, ``family`` power):

- the budget of a side is its last validation ``T`` (the base's, and the row's own: big trains 3x the steps); ``k``
  x the budget is step ``k * (T + 1) - 1`` (Lightning counts steps from 0: the 600th update is step 599, and 3 x
  600 updates end at step 1799), each side at its own;
- the predicted gap is mean log PPL(row) - mean log PPL(base) over each side's seeds at ``k`` x the budget
  (:func:`.curves.predicted_gap`), with the central ``level`` interval of ``bootstraps`` draws widened by the
  extrapolation's own error: the gap's size; it reads as a relative change of PPL, ``exp(gap) - 1``;
- **within noise**: the row's change at the end, Δ = mean dev PPL(row) - mean dev PPL(base) over the seeds, is
  within seed noise (:func:`.noise.noise_verdict`: ``|Δ| <= NOISE_K`` x the base's seed sd);
- **too few points**: the seed noise is unknown (fewer than two completed base seeds), or a side has no run with
  ``min_points`` validations after the warmup (:func:`.curves.fit_points`);
- **holds**: beyond noise at the end, and the one-sided bound of the predicted gap (the gap moved toward zero by
  :func:`.curves.direction_margin`) stays on the side of today's change (:func:`.curves.keeps_side`). The call
  rests on that bound, not on the size's interval: a small gap beyond noise can hold with an interval that
  reaches zero, so each text of a verdict gives the bound (:func:`direction_bound`) beside the interval;
- **may flip**: beyond noise at the end, and the bound reaches zero or lies on the other side.

A row that may flip gets its settle budget (:func:`.curves.settle_budget`); a row within noise none (back-tested,
such predictions came true no more often than saying nothing: :data:`.curves.SETTLE_RECORD`). The texts of one
verdict: the report's ``why`` (:func:`gap_text`, its table's and pages') and ``--status``'s compact one
(:func:`verdict_text`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .noise import NOISE_K
from .settings import REPORT_DEFAULTS

if TYPE_CHECKING:  # the fits import numpy: only when a verdict is asked for
    from .curves import PredictedGap, SettleBudget

HOLDS, MAY_FLIP, WITHIN, TOO_FEW = "holds", "may flip", "within noise", "too few points"
VERDICTS = (HOLDS, MAY_FLIP, WITHIN, TOO_FEW)

# -------------------------------------------------------------------------------------------------- the gap
def settings_of(settings: dict | None) -> dict:
    """The sweep file's ``report:`` settings over the defaults."""
    return {**REPORT_DEFAULTS, **(settings or {})}


def sign(x: float) -> int:
    """1, -1 or 0: the direction of a change (the verdicts', the reports' "same sign" rules; the one home)."""
    return (x > 0) - (x < 0)


def later_step(last_step: int, k: float) -> int:
    """The step at ``k`` times the budget whose last step is ``last_step`` (the module docstring)."""
    return int(round(k * (last_step + 1))) - 1


def last_step(runs: list[dict[int, float]]) -> int | None:
    """A side's budget: the last step every one of its runs validated at."""
    ends = [max(r) for r in runs if r]
    return min(ends) if ends else None


def change(gap: float) -> float:
    """A log-PPL gap as a relative change of PPL, ``exp(gap) - 1``: ``inf`` for a gap beyond a float's range (over
    ~709.8 nats: a PPL ratio no float holds), never an OverflowError."""
    try:
        return math.expm1(gap)
    except OverflowError:
        return math.inf


def pct(gap: float, digits: int = 1) -> str:
    """A log-PPL gap as a relative change of PPL: ``-4.1%`` (``digits`` decimals)."""
    return f"{100 * change(gap):+.{digits}f}%"


def direction_bound(gap: PredictedGap) -> float | None:
    """The one-sided bound the *holds* test reads (:func:`.curves.keeps_side`): the predicted gap moved toward zero
    by its ``sign_margin``, on the side of today's gap (``gap.now``); None without a side today."""
    side = sign(gap.now) if math.isfinite(gap.now) else 0
    return gap.point - side * gap.sign_margin if side else None


def gap_text(gap: PredictedGap) -> str:
    """``-4.1% [-6.0, -2.2] at 1800 steps`` (the base at its own step when it differs), then the direction's
    one-sided bound (:func:`direction_bound`): ``; direction bound -1.0%`` (the report's ``why``)."""
    lo, hi = (f"{100 * change(x):+.1f}" for x in (gap.low, gap.high))
    base = f" (base {gap.base_step + 1})" if gap.base_step != gap.at_step else ""
    bound = direction_bound(gap)
    return (f"{pct(gap.point)} [{lo}, {hi}] at {gap.at_step + 1} steps{base}"
            + (f"; direction bound {pct(bound)}" if bound is not None else ""))


def predict(row_runs: list[dict[int, float]], base_runs: list[dict[int, float]], settings: dict | None = None, *,
            at: tuple[int, int] | None = None, warmup: int = 0, base_warmup: int | None = None) -> PredictedGap | None:
    """The predicted gap of the row to the base (:func:`.curves.predicted_gap`) at ``at`` = (the row's step, the
    base's step), by default ``k`` x each side's budget; None when a side cannot be fitted."""
    from .curves import predicted_gap

    s = settings_of(settings)
    row_runs, base_runs = [r for r in row_runs if r], [r for r in base_runs if r]
    if not row_runs or not base_runs:
        return None
    if at is None:
        at = (later_step(last_step(row_runs), s["k"]), later_step(last_step(base_runs), s["k"]))
    return predicted_gap(row_runs, base_runs, at[0], s["bootstraps"], s["seed"], s["level"], base_step=at[1],
                         warmup=warmup, base_warmup=base_warmup, min_points=s["min_points"], family=s["family"])


def _too_few(row_runs, base_runs, settings: dict, warmup: int, base_warmup: int | None) -> str:
    from .curves import fit_points, points_needed

    need = points_needed(settings["min_points"], settings["family"])
    for side, runs, w in (("the row", row_runs, warmup), ("the base", base_runs,
                                                          warmup if base_warmup is None else base_warmup)):
        counts = [len(fit_points(r, w, need)) for r in runs if r]
        if not counts or max(counts) < need:
            n = max((sum(1 for st in r if st >= w) for r in runs if r), default=0)
            return (f"{side}: {n} validation(s) after the warmup (step {w}), the fit needs {need}")
    return "no fit"


# ----------------------------------------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class Verdict:
    """A row's verdict (:func:`curve_verdict`, the module docstring's rule)."""
    verdict: str                       # one of VERDICTS: holds, may flip, within noise, too few points
    why: str                           # the report's text of it: the predicted gap (:func:`gap_text`), or why none
    gap: PredictedGap | None = None    # the prediction (:func:`predict`); None without one
    settle: SettleBudget | None = None  # a row that may flip: when it settles (None: not by SETTLE_MOST x); else None


def curve_verdict(row_runs: list[dict[int, float]], base_runs: list[dict[int, float]], delta: float | None,
                  noise: str | None, settings: dict | None = None, *, at: tuple[int, int] | None = None,
                  warmup: int = 0, base_warmup: int | None = None) -> Verdict | None:
    """The verdict of one row (the module docstring's rule; a row that may flip gets its
    :func:`.curves.settle_budget` with :data:`NOISE_K`), or None for a row without a change. ``row_runs``,
    ``base_runs``: one ``{step: dev PPL}`` per completed seed; ``delta``, ``noise``: the row's change at the end and
    its seed-noise verdict (:func:`.noise.end_change`; Table 2 its own); ``at``, ``warmup``: as :func:`predict`."""
    s = settings_of(settings)
    if delta is None or noise is None:
        return None
    gap = predict(row_runs, base_runs, s, at=at, warmup=warmup, base_warmup=base_warmup)
    if noise == "within":
        return Verdict(WITHIN, f"predicted {gap_text(gap)}" if gap else "no prediction: "
                       + _too_few(row_runs, base_runs, s, warmup, base_warmup), gap)
    if noise != "beyond":
        return Verdict(TOO_FEW, "seed noise unknown: one base seed", gap)
    if gap is None:
        return Verdict(TOO_FEW, _too_few(row_runs, base_runs, s, warmup, base_warmup))
    from .curves import keeps_side, settle_budget

    if keeps_side(gap, sign(delta)):
        return Verdict(HOLDS, gap_text(gap), gap)
    return Verdict(MAY_FLIP, gap_text(gap), gap, settle_budget(gap, delta, noise_k=NOISE_K))


def verdict_text(verdict: Verdict, settings: dict | None = None) -> str:
    """A verdict of :func:`curve_verdict` in a few words, for ``--status`` and the launcher's lines: the predicted
    gap at ``k`` x the budget and the one-sided bound the call rests on, then the size's ``level`` interval, e.g.
    ``holds: -12% at 3x, bound -9% (80% [-15, -9])``; ``within noise: predicted +2% at 3x``; ``too few points:
    seed noise unknown: one base seed``."""
    s, kind, gap = settings_of(settings), verdict.verdict, verdict.gap
    if kind == TOO_FEW:
        return f"{kind}: {verdict.why}"
    if gap is None:
        return kind
    at = f"{pct(gap.point, 0)} at {s['k']:g}x"
    if kind == WITHIN:
        return f"{kind}: predicted {at}"
    bound = direction_bound(gap)
    lo, hi = (f"{100 * change(x):+.0f}" for x in (gap.low, gap.high))
    return (f"{kind}: {at}" + (f", bound {pct(bound, 0)}" if bound is not None else "")
            + f" ({100 * s['level']:g}% [{lo}, {hi}])")
