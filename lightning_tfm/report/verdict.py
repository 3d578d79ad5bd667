"""The budget verdict of a row: is its change against the base a *finding*, *still moving*, or *within noise*,
judged from the row's and the base's learning curves (dev perplexity at every validation both logged).

A short budget ranks how fast rows start to learn; a change that is beyond seed noise at the end of the budget
can still be a crossing in progress. The rule (:func:`curve_verdict`, the one place it is written), with the
thresholds of the sweep file's ``report:`` section (:data:`lightning_tfm.sweep.REPORT_DEFAULTS`:
``last_fraction`` 1/3, ``horizon`` 2, ``min_points`` 2):

- the gap is the log-perplexity difference ``g(s) = log PPL_row(s) - log PPL_base(s)`` at the validation steps
  both curves have; the budget ``T`` is the last of them (a row with more steps, such as big, is compared up to
  the base's budget);
- the window is the validations in the last ``last_fraction`` of the budget's ``T + 1`` updates, steps
  ``s >= (T + 1) * (1 - last_fraction) - 1`` (Lightning counts steps from 0: the 600th update is step 599, and the
  last third of 600 updates starts at step 399; with steps counted from 1 the same bound keeps step 400), and at
  least the last ``min_points`` validations when the window holds fewer;
- **within noise**: the row's change at the end (the table's Δ) is within seed noise
  (:func:`lightning_tfm.report.stats.noise_verdict`);
- **still moving**: beyond noise at the end, but the gap has not kept the sign of the change over the whole
  window (the curves crossed recently), or it is closing: the least-squares line of ``g`` against the step over
  the window reaches 0 at a step ``s* <= horizon * T`` (linear extrapolation of the log-PPL gap);
- **finding**: beyond noise at the end, the same sign over the whole window, and the gap not closing fast enough
  to cross within ``horizon * T`` steps (its line widens, stays flat, or crosses later);
- **unknown**: the seed noise is unknown (one base seed), or fewer than ``min_points`` common validations.

The base row and rows without a change (not completed) get no verdict.
"""
from __future__ import annotations

import math

from ..sweep import REPORT_DEFAULTS

FINDING, MOVING, WITHIN, UNKNOWN = "finding", "still moving", "within noise", "unknown"
VERDICTS = (FINDING, MOVING, WITHIN, UNKNOWN)


def verdict_rule(settings: dict | None = None) -> str:
    """The rule in one paragraph, with the thresholds used (the report's notes)."""
    s = {**REPORT_DEFAULTS, **(settings or {})}
    return (f"Budget verdict (dev PPL): the gap is log PPL(row) − log PPL(base) at the validations both curves "
            f"have, up to the base's budget T; the window is the last {s['last_fraction']:.3g} of T (at least "
            f"{s['min_points']} validations). *Finding*: beyond seed noise at the end, the gap keeps the change's "
            f"sign over the whole window, and its least-squares line over the window does not reach 0 within "
            f"{s['horizon']:g} × T steps. *Still moving*: beyond noise at the end, but the sign changed within the "
            f"window (a recent crossing) or the line reaches 0 within {s['horizon']:g} × T (converging). *Within "
            "noise*: the change at the end is within seed noise. *Unknown*: seed noise unknown (one base seed) "
            f"or fewer than {s['min_points']} common validations. Thresholds: the sweep file's `report:` section "
            "(last_fraction, horizon, min_points).")


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def window_start(last_step: int, last_fraction: float) -> float:
    """The first step of the window: the last ``last_fraction`` of the ``last_step + 1`` updates (the module
    docstring), less a hair so that floating point keeps the boundary step in."""
    return (last_step + 1) * (1 - last_fraction) - 1 - 1e-9 * last_step


def window(steps: list[int], settings: dict) -> list[int]:
    """The validation steps the verdict reads (the module docstring): those from :func:`window_start` on, and at
    least the last ``min_points``."""
    inside = [st for st in steps if st >= window_start(steps[-1], settings["last_fraction"])]
    return inside if len(inside) >= settings["min_points"] else steps[-settings["min_points"]:]


def base_trend(curve: dict[int, float], settings: dict | None = None) -> dict | None:
    """How much the base's dev PPL still fell over the verdicts' window: ``{"from_step", "to_step", "from",
    "to", "drop"}`` (drop: the relative fall, 0.18 = 18%), None with fewer than two validations. A base still
    falling fast at the end is a budget whose findings may yet move."""
    s = {**REPORT_DEFAULTS, **(settings or {})}
    steps = sorted(st for st, p in curve.items() if p and p > 0)
    if len(steps) < 2:
        return None
    a, b = window(steps, s)[0], steps[-1]  # min_points >= 2 (the sweep file's check): a != b
    return {"from_step": a, "to_step": b, "from": curve[a], "to": curve[b], "drop": 1 - curve[b] / curve[a]}


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def curve_verdict(row: dict[int, float], base: dict[int, float], delta: float | None, noise: str | None,
                  settings: dict | None = None) -> dict | None:
    """The verdict of one row (the module docstring's rule): ``{"verdict", "why", "crossing"}`` where
    ``crossing`` is the step at which the extrapolated gap reaches 0 (None when it does not close), or None for
    a row without a change. ``row``, ``base``: {step: dev PPL} (mean over seeds); ``delta``, ``noise``: the
    row's change at the end and its seed-noise verdict."""
    s = {**REPORT_DEFAULTS, **(settings or {})}
    if delta is None or noise is None:
        return None
    if noise == "within":
        return {"verdict": WITHIN, "why": "the change at the end is within seed noise", "crossing": None}
    if noise != "beyond":
        return {"verdict": UNKNOWN, "why": "seed noise unknown: one base seed", "crossing": None}
    steps = sorted(st for st in set(row) & set(base) if row[st] > 0 and base[st] > 0)
    if len(steps) < s["min_points"]:
        return {"verdict": UNKNOWN, "why": f"{len(steps)} common validation(s), fewer than {s['min_points']}",
                "crossing": None}
    budget = steps[-1]
    window_steps = window(steps, s)
    gaps = [math.log(row[st]) - math.log(base[st]) for st in window_steps]
    sign = _sign(delta)
    against = [st for st, g in zip(window_steps, gaps) if _sign(g) != sign]
    if against:
        return {"verdict": MOVING, "why": f"crossed: the gap had the other sign at step {against[-1]}",
                "crossing": None}
    intercept, slope = _line([float(st) for st in window_steps], gaps)
    if abs(slope) * budget <= 1e-9 * max(abs(g) for g in gaps):  # a flat gap, up to rounding
        slope = 0.0
    if _sign(slope) == -sign:  # closing toward 0
        crossing = -intercept / slope
        if crossing <= s["horizon"] * budget:
            return {"verdict": MOVING, "why": f"converging: the gap's line reaches 0 near step {crossing:.0f} "
                                              f"(≤ {s['horizon']:g} × {budget})", "crossing": crossing}
        return {"verdict": FINDING, "why": f"closing slowly: its line reaches 0 near step {crossing:.0f} "
                                           f"(> {s['horizon']:g} × {budget})", "crossing": crossing}
    return {"verdict": FINDING, "why": "the gap holds or widens over the window", "crossing": None}


def add_verdicts(rows: list[dict], curves: dict, settings: dict | None = None) -> None:
    """Each row's ``ppl_verdict`` and ``ppl_verdict_why`` from the table's learning curves (``curves["rows"]``:
    {variant: {step: dev PPL}}), its ``delta_ppl`` and ``ppl_noise``."""
    base = curves["rows"].get("base", {})
    for row in rows:
        v = curve_verdict(curves["rows"].get(row["variant"], {}), base, row["delta_ppl"], row["ppl_noise"], settings)
        row["ppl_verdict"] = v["verdict"] if v else None
        row["ppl_verdict_why"] = v["why"] if v else None


def verdict_summary(rows: list[dict]) -> dict:
    """Counts of each verdict, the still-moving rows by name, and direction agreement with the paper over the
    findings (``(agree, compared)``); rows read from a CSV may lack the columns."""
    counts = {v: sum(1 for r in rows if r.get("ppl_verdict") == v) for v in VERDICTS}
    findings = [r for r in rows if r.get("ppl_verdict") == FINDING and r.get("ppl_agrees") is not None]
    return {"verdicts": counts, "still_moving": [r["variant"] for r in rows if r.get("ppl_verdict") == MOVING],
            "ppl_findings": (sum(1 for r in findings if r["ppl_agrees"]), len(findings))}
