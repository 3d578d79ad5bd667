"""The verdict's back-test: how the verdict (:mod:`.verdict`) said at an earlier budget compares with what a later
budget measured, on curves whose later part is known, row by row; and the scores the calibration
(:mod:`.calibrate`) takes from each row. Pure numerics on ``{step: dev PPL}`` curves; ``ltfm report ... --backtest``
(:mod:`lightning_tfm.report.backtest`) reads the exports, picks the budgets and prints and draws the result.

For each row (:func:`backtest`): the verdict at the earlier budget (the change and its seed noise there, the
predicted gap with its interval), the measured gap (mean log PPL of the row's seeds minus the base's, at the later
steps), whether it kept the sign of the earlier change, whether it fell inside the interval, and whether the change
is beyond seed noise at the later budget too (``noise_later``). In all: ``beyond_noise`` (rows beyond seed noise at
the earlier budget), ``called_holds``, ``kept_sign`` (of the rows called holds) and ``interval_coverage`` (the share
of the predicted rows whose measured gap is inside the interval).

The scores (the calibration's input, each row's ``score`` and ``sign_score``): :func:`extrapolation_score`, the
margin the bootstrap interval needed to hold the measured gap; :func:`sign_score`, how much further toward zero the
measured gap went than predicted; :func:`conformal_quantile`, the split-conformal quantile of such scores.
"""
from __future__ import annotations

import math
from typing import Sequence

from .curves import EXTRAPOLATION_K, EXTRAPOLATION_LEVEL, SIGN_LEVEL, direction_margin
from .noise import mean_std, noise_verdict, relative
from .verdict import HOLDS, MAY_FLIP, TOO_FEW, Verdict, change, curve_verdict, last_step, settings_of

#: The keys of a back-test's result (:func:`backtest`).
KEYS = ("beyond_noise", "called_holds", "kept_sign", "interval_coverage", "level", "sign_level", "rows")


# ---------------------------------------------------------------------------------------------- the scores
def extrapolation_score(point: float, low: float, high: float, measured: float, k: float) -> float:
    """A back-test row's score: the margin the bootstrap interval (``low``, ``high``) needed, in quadrature, to hold
    the ``measured`` gap, scaled to 3x the budget (``* log 3 / log k``): a row inside it scores 0;
    :func:`.curves.widen` with a margin of at least the score (at that ``k``) holds it."""
    miss = measured - point
    half = high - point if miss > 0 else point - low
    return math.sqrt(max(miss * miss - half * half, 0.0)) * math.log(EXTRAPOLATION_K) / math.log(k)


def sign_score(now: float, noise_sd: float, point: float, measured: float, k: float) -> float:
    """A back-test row's direction score: how much further toward zero (or past it) the measured gap went than the
    predicted ``point``, on today's side of zero, in units of :func:`.curves.direction_margin`'s scale at that ``k``
    (a row whose gap grew more than predicted scores below 0). :func:`.curves.keeps_side` with a quantile of at
    least the score keeps its measured side."""
    sign = (now > 0) - (now < 0)
    unit = direction_margin(now, noise_sd, k, quantile=1.0)
    return sign * (point - measured) / unit if unit > 0 else math.nan


def conformal_quantile(scores: Sequence[float], level: float = EXTRAPOLATION_LEVEL) -> float:
    """The split-conformal quantile: the ``ceil((n + 1) * level)``-th smallest of ``n`` scores (inf when that is
    beyond ``n``): a new row's score is at most it with probability ``level`` when the rows are exchangeable."""
    ordered = sorted(scores)
    j = math.ceil((len(ordered) + 1) * level)
    return math.inf if j > len(ordered) else float(ordered[j - 1])


# ---------------------------------------------------------------------------------------------- the curves
def cut_runs(runs: list[dict[int, float]], fraction: float) -> list[dict[int, float]]:
    """The runs' validations in the first ``fraction`` of the side's budget ``T`` (its last validation): the steps
    ``<= fraction * (T + 1) - 1`` (2/3 of 600 updates keeps the steps up to 399)."""
    end = last_step(runs)
    if end is None:
        return []
    cut = fraction * (end + 1) - 1 + 1e-9 * (end + 1)  # a hair: 2/3 of 600 keeps step 399 whatever the rounding
    return [{s: p for s, p in r.items() if s <= cut} for r in runs]


def _at(runs: list[dict[int, float]], step: int | None) -> list[float]:
    """The runs' dev PPL at ``step``, those that are numbers a log takes."""
    return [r[step] for r in runs if step in r and math.isfinite(r[step]) and r[step] > 0]


def today(row_runs, base_runs) -> dict:
    """The change at the earlier budget, as the table reads it: each side's mean dev PPL at its last validation,
    the row's minus the base's, and its seed noise (the base's seeds' spread there); ``delta`` and ``noise`` None
    when a side has no validation (a curve cut before its first)."""
    row_end, base_end = last_step(row_runs), last_step(base_runs)
    row_mean, _ = mean_std(_at(row_runs, row_end))
    base_mean, base_sd = mean_std(_at(base_runs, base_end))
    if row_mean is None or base_mean is None:
        return {"step": row_end, "base_step": base_end, "delta": None, "delta_rel": None, "noise": None}
    delta = row_mean - base_mean
    return {"step": row_end, "base_step": base_end, "delta": delta, "delta_rel": relative(delta, base_mean),
            "noise": noise_verdict(delta, base_sd)}


def measured_gap(row_runs, base_runs, step: int, base_step: int) -> float | None:
    """Mean log PPL of the row's runs at ``step`` minus the base's at ``base_step`` (None where a side lacks it)."""
    row, base = _at(row_runs, step), _at(base_runs, base_step)
    if not row or not base:
        return None
    return sum(map(math.log, row)) / len(row) - sum(map(math.log, base)) / len(base)


def _r(x: float | None) -> float | None:
    """Rounded to 4 decimals; None where there is no number (a relative change beyond a float's range included)."""
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


# -------------------------------------------------------------------------------------------- the back-test
def backtest(runs: dict[str, list[dict[int, float]]], warmup: dict[str, int],
             later_runs: dict[str, list[dict[int, float]]], settings: dict | None = None
             ) -> tuple[dict, dict[str, Verdict]]:
    """The back-test of the earlier curves ``runs`` (variant -> one ``{step: dev PPL}`` a seed; ``warmup``: variant
    -> its train.warmup) against the later ones ``later_runs``: each row the later curves have (the base among
    them), predicted at the later budget of each side. Returns (the result: :data:`KEYS`, as its JSON keeps it; the
    rows' verdicts, by variant)."""
    base, later_base = runs.get("base") or [], later_runs.get("base") or []
    rows, outlook = [], {}
    for v in runs:
        if v == "base" or not later_runs.get(v):
            continue
        now = today(runs[v], base)
        at = (last_step(later_runs[v]), last_step(later_base))
        verdict = curve_verdict(runs[v], base, now["delta"], now["noise"], settings, at=at,
                                warmup=warmup.get(v) or 0, base_warmup=warmup.get("base") or 0) or Verdict(
            TOO_FEW, "no validation in the earlier budget")  # a curve cut to none
        outlook[v] = verdict
        gap, settle = verdict.gap, verdict.settle
        measured = measured_gap(later_runs[v], later_base, *at)
        then = today(later_runs[v], later_base)  # the change at the later budget, as that table reads it
        sign = None if now["delta"] is None else (now["delta"] > 0) - (now["delta"] < 0)
        rows.append({"variant": v, "step": now["step"], "base_step": now["base_step"],
                     "change": _r(now["delta_rel"]), "noise": now["noise"], "verdict": verdict.verdict,
                     "at_step": at[0], "at_base_step": at[1],
                     "predicted": _r(gap and change(gap.point)), "low": _r(gap and change(gap.low)),
                     "high": _r(gap and change(gap.high)),
                     "measured": _r(None if measured is None else change(measured)),
                     "noise_later": then["noise"],
                     "sign_kept": None if measured is None or sign is None else (measured > 0) - (measured < 0) == sign,
                     "inside": None if gap is None or measured is None else gap.low <= measured <= gap.high,
                     "width": _r(gap and change(gap.high) - change(gap.low)),
                     "score": None if gap is None or measured is None or gap.k <= 1 else _r(extrapolation_score(
                         gap.point, gap.boot_low, gap.boot_high, measured, gap.k)),
                     "settle": None if verdict.verdict != MAY_FLIP else {  # kind None: none by SETTLE_MOST x
                         "kind": settle and settle.kind, "k": _r(settle and settle.k), "step": settle and settle.step,
                         "sign": settle and settle.sign},
                     "bound": _r(gap and sign and change(gap.point - sign * gap.sign_margin)),
                     "sign_score": None if gap is None or measured is None or not sign or gap.k <= 1 else _r(
                         sign_score(gap.now, gap.noise_sd, gap.point, measured, gap.k)),
                     "log": gap and {"now": _r(gap.now), "noise_sd": _r(gap.noise_sd), "point": _r(gap.point),
                                     "boot_low": _r(gap.boot_low), "boot_high": _r(gap.boot_high),
                                     "k": _r(gap.k), "measured": _r(measured)}})
    holds = [r for r in rows if r["verdict"] == HOLDS]
    predicted = [r for r in rows if r["inside"] is not None]
    result = {"beyond_noise": sum(1 for r in rows if r["noise"] == "beyond"), "called_holds": len(holds),
              "kept_sign": sum(1 for r in holds if r["sign_kept"]),
              "interval_coverage": _r(sum(r["inside"] for r in predicted) / len(predicted)) if predicted else None,
              "level": settings_of(settings)["level"], "sign_level": SIGN_LEVEL, "rows": rows}
    return result, outlook
