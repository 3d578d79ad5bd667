"""The verdict of a row: does its change against the base *hold* at a longer budget, *may* it *flip*, is it
*within noise*, or are there *too few points* to say, judged from each run's learning curve extrapolated.

A short budget ranks how fast rows start to learn; a change beyond seed noise at the end of the budget can still
be a crossing in progress. Each run's dev log-PPL after the warmup is fitted with a curve
(:mod:`lightning_tfm.sweep.curves`: the family, its fit, the bootstrap) and the gap to the base predicted at ``k``
times the budget. The rule (:func:`curve_verdict`, the one place it is written), with the settings of the sweep
file's ``report:`` section (:data:`lightning_tfm.sweep.REPORT_DEFAULTS`: ``k`` 3, ``min_points`` 3, ``level``
0.9, ``bootstraps`` 200, ``seed`` 0, ``family`` power):

- the budget of a side is its last validation ``T`` (the base's, and the row's own: big trains 3x the steps); ``k``
  x the budget is step ``k * (T + 1) - 1`` (Lightning counts steps from 0: the 600th update is step 599, and 3 x
  600 updates end at step 1799), each side at its own;
- the predicted gap is mean log PPL(row) - mean log PPL(base) over each side's seeds at ``k`` x the budget, with
  the central ``level`` interval of ``bootstraps`` draws (each run's residual bootstrap; a side of two seeds or
  more resampled); it reads as a relative change of PPL, ``exp(gap) - 1``;
- **within noise**: the row's change at the end (the table's Δ) is within seed noise
  (:func:`lightning_tfm.report.table3.stats.noise_verdict`);
- **too few points**: the seed noise is unknown (one base seed), or a side has no run with ``min_points``
  validations after the warmup (:func:`lightning_tfm.sweep.curves.fit_points`);
- **holds**: beyond noise at the end, and the interval of the predicted gap excludes zero on the side of today's
  change;
- **may flip**: beyond noise at the end, and the interval includes zero or lies on the other side.

A row that may flip or is within noise gets its **settle budget** (``ppl_settle``,
:func:`lightning_tfm.sweep.curves.settle_budget`): the least multiple of the budget, up to 10x, at which a verdict
taken then is predicted to hold, or at which its gap is predicted to cross the base, as steps, FLOPs and hours on
the machine that trained it (:func:`settle_text`); else "not within 10x". The headline counts them
(:func:`settle_summary`): how many of these rows a run m x as long would settle.

The base row and rows without a change (not completed) get no verdict. How often a *holds* kept its sign on the
committed CPU reference: ``reports/reference/backtest/README.md`` (``ltfm report ... --backtest``, :mod:`.backtest`).
"""
from __future__ import annotations

import math

from ...sweep import REPORT_DEFAULTS

HOLDS, MAY_FLIP, WITHIN, TOO_FEW = "holds", "may flip", "within noise", "too few points"
VERDICTS = (HOLDS, MAY_FLIP, WITHIN, TOO_FEW)


def settings_of(settings: dict | None) -> dict:
    """The sweep file's ``report:`` settings over the defaults."""
    return {**REPORT_DEFAULTS, **(settings or {})}


def verdict_rule(settings: dict | None = None) -> str:
    """The rule in one paragraph, with the settings used (the report's notes)."""
    from ...sweep.curves import EXTRAPOLATION_ERROR, SIGN_LEVEL, SIGN_QUANTILE

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


def _sign(x: float) -> int:
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


def pct(gap: float) -> str:
    """A log-PPL gap as a relative change of PPL: ``-4.1%``."""
    return f"{100 * change(gap):+.1f}%"


def gap_text(gap: dict) -> str:
    """``-4.1% [-6.0, -2.2] at 1800 steps`` (the base at its own step when it differs), then the direction's
    one-sided bound (:func:`lightning_tfm.sweep.curves.keeps_side`): ``; direction bound -1.0%``."""
    lo, hi = (f"{100 * change(gap[k]):+.1f}" for k in ("low", "high"))
    base = f" (base {gap['base_step'] + 1})" if gap["base_step"] != gap["at_step"] else ""
    sign = (gap["now"] > 0) - (gap["now"] < 0) if math.isfinite(gap.get("now", math.nan)) else 0
    bound = f"; direction bound {pct(gap['point'] - sign * gap['sign_margin'])}" if sign else ""
    return f"{pct(gap['point'])} [{lo}, {hi}] at {gap['at_step'] + 1} steps{base}{bound}"


def predict(row_runs: list[dict[int, float]], base_runs: list[dict[int, float]], settings: dict | None = None, *,
            at: tuple[int, int] | None = None, warmup: int = 0, base_warmup: int | None = None) -> dict | None:
    """The predicted gap of the row to the base (:func:`lightning_tfm.sweep.curves.predicted_gap`) at ``at`` =
    (the row's step, the base's step), by default ``k`` x each side's budget; None when a side cannot be fitted."""
    from ...sweep.curves import predicted_gap

    s = settings_of(settings)
    row_runs, base_runs = [r for r in row_runs if r], [r for r in base_runs if r]
    if not row_runs or not base_runs:
        return None
    if at is None:
        at = (later_step(last_step(row_runs), s["k"]), later_step(last_step(base_runs), s["k"]))
    return predicted_gap(row_runs, base_runs, at[0], s["bootstraps"], s["seed"], s["level"], base_step=at[1],
                         warmup=warmup, base_warmup=base_warmup, min_points=s["min_points"], family=s["family"])


def _too_few(row_runs, base_runs, settings: dict, warmup: int, base_warmup: int | None) -> str:
    from ...sweep.curves import fit_points, points_needed

    need = points_needed(settings["min_points"], settings["family"])
    for side, runs, w in (("the row", row_runs, warmup), ("the base", base_runs,
                                                          warmup if base_warmup is None else base_warmup)):
        counts = [len(fit_points(r, w, need)) for r in runs if r]
        if not counts or max(counts) < need:
            n = max((sum(1 for st in r if st >= w) for r in runs if r), default=0)
            return (f"{side}: {n} validation(s) after the warmup (step {w}), the fit needs {need}")
    return "no fit"


def curve_verdict(row_runs: list[dict[int, float]], base_runs: list[dict[int, float]], delta: float | None,
                  noise: str | None, settings: dict | None = None, *, at: tuple[int, int] | None = None,
                  warmup: int = 0, base_warmup: int | None = None) -> dict | None:
    """The verdict of one row (the module docstring's rule): ``{"verdict", "why", "gap"}`` (``gap``: the
    prediction of :func:`predict`, None without one), or None for a row without a change. ``row_runs``,
    ``base_runs``: one ``{step: dev PPL}`` per completed seed; ``delta``, ``noise``: the row's change at the end
    and its seed-noise verdict; ``at``, ``warmup``: as :func:`predict`."""
    s = settings_of(settings)
    if delta is None or noise is None:
        return None
    gap = predict(row_runs, base_runs, s, at=at, warmup=warmup, base_warmup=base_warmup)
    if noise == "within":
        return {"verdict": WITHIN, "why": f"predicted {gap_text(gap)}" if gap else "no prediction: "
                + _too_few(row_runs, base_runs, s, warmup, base_warmup), "gap": gap,
                "settle": None}
    if noise != "beyond":
        return {"verdict": TOO_FEW, "why": "seed noise unknown: one base seed", "gap": gap}
    if gap is None:
        return {"verdict": TOO_FEW, "why": _too_few(row_runs, base_runs, s, warmup, base_warmup), "gap": None}
    from ...sweep.curves import keeps_side

    holds = keeps_side(gap, _sign(delta))
    return {"verdict": HOLDS if holds else MAY_FLIP, "why": gap_text(gap), "gap": gap,
            "settle": None if holds else _settle(gap, delta)}


def _settle(gap: dict, delta: float) -> dict:
    """The settle budget of a row that may flip (:func:`lightning_tfm.sweep.curves.settle_budget` from its
    predicted gap's fits, with the report's noise rule), ``"kind"`` None when none by
    :data:`~lightning_tfm.sweep.curves.SETTLE_MOST` x the budget. A row within noise gets none: back-tested, such
    predictions came true no more often than saying nothing (:data:`~lightning_tfm.sweep.curves.SETTLE_RECORD`)."""
    from ...sweep.curves import settle_budget
    from .stats import NOISE_K

    return settle_budget(gap, delta, noise_k=NOISE_K) or dict.fromkeys(("kind", "k", "step", "base_step", "sign"))


def seconds_per_step(by_variant: dict) -> dict[str, float]:
    """Each row's training seconds per step on the machine that trained it: its completed runs' wall time over
    their steps, the mean over seeds (rows without a wall time left out)."""
    out = {}
    for v, recs in by_variant.items():
        each = [r.wall_time_s / r.steps for r in recs if r.completed and r.wall_time_s and r.steps]
        if each:
            out[v] = sum(each) / len(each)
    return out


#: What each kind of settle budget says (:func:`lightning_tfm.sweep.curves.settle_budget`), of a row's side.
SETTLE_WORDS = {"holds": "holds, {side},", "flips": "flips to {side}"}


def settle_text(settle: dict | None, flops_per_step: float | None = None, seconds: float | None = None) -> str | None:
    """A settle budget as the table prints it, naming the side: ``holds, worse than the base, at 4.2x: 2520 steps,
    3.1e+15 FLOPs, 1.3 h`` (FLOPs and hours where the row's cost is known), ``flips to better than the base at
    ...``, ``not within 10x``; None without one (a row that holds or is within noise, or without a prediction)."""
    from ...sweep.curves import SETTLE_MOST

    if not settle:
        return None
    if settle["kind"] is None:
        return f"not within {SETTLE_MOST:g}x"
    steps = settle["step"] + 1
    cost = [f"{steps} steps"] + ([f"{flops_per_step * steps:.2g} FLOPs"] if flops_per_step else []) + (
        [f"{seconds * steps / 3600:.2g} h"] if seconds else [])
    side = "worse than the base" if settle["sign"] > 0 else "better than the base"
    return f"{SETTLE_WORDS[settle['kind']].format(side=side)} at {settle['k']:.3g}x: {', '.join(cost)}"


#: The multiples of the budget the headline counts the settled rows at (:func:`settle_summary`), up to
#: :data:`lightning_tfm.sweep.curves.SETTLE_MOST`.
SETTLE_AT = (1.5, 2.0, 3.0, 5.0, 10.0)


def settle_summary(outlook: dict) -> dict:
    """The settle budgets in all, from the verdicts :func:`add_verdicts` returns: ``unsettled``, the rows that may
    flip; ``settled``, ``[(m, rows whose settle budget is at most m x the budget)]`` for each ``m`` of
    :data:`SETTLE_AT`; ``kinds``, how many of them settle by each kind (``holds`` on today's side, ``flips`` to the
    other); ``not_within``, rows with no settle budget by :data:`~lightning_tfm.sweep.curves.SETTLE_MOST` x;
    ``no_prediction``, rows without a predicted gap (no fit)."""
    unsettled = [v for v in outlook.values() if v["verdict"] == MAY_FLIP]
    found = [v["settle"] for v in unsettled if v.get("settle") and v["settle"]["kind"]]
    return {"unsettled": len(unsettled), "settled": [(m, sum(1 for s in found if s["k"] <= m)) for m in SETTLE_AT],
            "kinds": {kind: sum(1 for s in found if s["kind"] == kind) for kind in SETTLE_WORDS},
            "not_within": sum(1 for v in unsettled if v.get("settle") and not v["settle"]["kind"]),
            "no_prediction": sum(1 for v in unsettled if not v.get("settle"))}


def add_verdicts(rows: list, curves: dict, settings: dict | None = None, seconds: dict | None = None) -> dict:
    """Each row's ``ppl_verdict``, ``ppl_verdict_why`` and ``ppl_settle`` (:func:`settle_text`, with the row's
    ``flops_per_step`` and ``seconds`` per step: {variant: :func:`seconds_per_step`}) from the table's learning
    curves (``curves["runs"]``: {variant: [{step: dev PPL} a seed]}, ``curves["warmup"]``: {variant:
    train.warmup}), its ``delta_ppl`` and ``ppl_noise``. Returns {variant: the verdict (with its ``gap``)} for the
    figures."""
    runs, warmups = curves.get("runs") or {}, curves.get("warmup") or {}
    base = runs.get("base", [])
    out = {}
    for row in rows:
        v = curve_verdict(runs.get(row["variant"], []), base, row["delta_ppl"], row["ppl_noise"], settings,
                          warmup=warmups.get(row["variant"]) or 0, base_warmup=warmups.get("base") or 0)
        row["ppl_verdict"] = v["verdict"] if v else None
        row["ppl_verdict_why"] = v["why"] if v else None
        row["ppl_settle"] = settle_text(v.get("settle") if v else None, row.get("flops_per_step"),
                                        (seconds or {}).get(row["variant"]))
        if v:
            out[row["variant"]] = v
    return out


def verdict_summary(rows: list) -> dict:
    """Counts of each verdict, the rows that may flip by name, and direction agreement with the paper over the
    findings, the rows that hold (``ppl_findings``: ``(agree, compared)``); rows read from a CSV may lack the
    columns."""
    counts = {v: sum(1 for r in rows if r.get("ppl_verdict") == v) for v in VERDICTS}
    holds = [r for r in rows if r.get("ppl_verdict") == HOLDS and r.get("ppl_agrees") is not None]
    return {"verdicts": counts, "may_flip": [r["variant"] for r in rows if r.get("ppl_verdict") == MAY_FLIP],
            "ppl_findings": (sum(1 for r in holds if r["ppl_agrees"]), len(holds))}
