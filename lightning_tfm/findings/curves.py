"""Learning curves fitted and extrapolated: a run's dev log-perplexity against the step, and the predicted gap
between two rows at a later budget with its interval. Pure numerics (numpy, scipy's least squares); the verdict
(:mod:`.verdict`: the report's and ``--status``'s) and its back-test (:mod:`.backtest`) read them.

**The fit** (:func:`fit_curve`): the points are a run's validations, ``y`` = dev log-PPL (the dev loss in nats)
at ``t`` = updates done (Lightning's step + 1). Before the learning-rate warmup ends the curve is in another regime,
so the fit reads the validations at steps >= the warmup; when those are fewer than the fit needs, every point
but the first. A family of ``p`` parameters needs at least ``max(min_points, p + 1)`` points (one residual at
least, for the bootstrap); with fewer, no fit (None). The families (:data:`FAMILIES`):

- ``power``: a power law without the asymptote, ``y = A * t^-alpha``: a straight line ``log y = log A - alpha *
  log t`` in log-log, fitted by linear least squares (2 parameters);
- ``saturating``: ``y = L_inf + A * t^-alpha`` (``0 <= L_inf <= min y``, ``A > 0``, ``0 < alpha <= 5``), fitted
  by :func:`scipy.optimize.least_squares` from the best start of a grid over ``alpha`` (3 parameters);
- ``exponential``: ``y = L_inf + A * exp(-t / tau)``, the same way over a grid of ``tau`` (3 parameters).

**Why power** (:data:`FAMILY`, the verdict's default; the sweep file's ``report.family`` chooses another): it
back-tests best on the committed CPU reference (``reports/reference/backtest/README.md``: each family's error, calls
and coverage). Three parameters need four points after the warmup, which the 600-step export's curves cut to step
399 do not have, so only the power law (``min_points`` 3) predicts there; at 600 steps predicting 1,800 the
saturating fits put ``L_inf`` at its bound 0 and reduce to the power law with wider intervals, and the exponential
saturates too early. A longer curve may identify ``L_inf``: ``report.family: saturating`` is then worth a back-test
of its own.

**The bootstrap** (:meth:`CurveFit.bootstrap`): residual bootstrap in the fitted space (log-log for ``power``):
the residuals, centred and inflated by ``sqrt(n / (n - p))``, resampled onto the fitted values and the fit
repeated, with a seeded :class:`numpy.random.Generator`: the same seed gives the same draws.

**The gap** (:func:`predicted_gap`): mean log PPL(row) - mean log PPL(base) over each side's seeds at a later step
(each side at its own step: a row trained ``b`` times the base's budget is compared at ``b`` times the base's
step, as the table compares it). Two answers are read from it, each calibrated on its own question on the
committed back-tests at k = 3, each export left out in turn (``reports/reference/backtest/calibration.md``;
:mod:`.calibrate` computes the constants below from them into ``calibration.json``):

- **the direction** (:func:`keeps_side`, the verdict's *holds*): a one-sided bound, the predicted gap moved toward
  zero by :func:`direction_margin` (``SIGN_QUANTILE`` x the base's seed noise and today's gap in quadrature, in
  proportion to ``log k / log 3``), stays on today's side: a gap the fitted curves show closing fails it;
- **the size**: the central ``level`` share of draws that take each run's bootstrap prediction and, on a side with
  two seeds or more, resample its seeds (the fit's noise and the seeds'), widened in quadrature on each side
  (:func:`widen`) by the extrapolation's own error (:func:`extrapolation_margin`: ``EXTRAPOLATION_ERROR`` x
  ``log k / log 3``, scaled to ``level`` by the normal quantiles), at 80% (:data:`EXTRAPOLATION_LEVEL`).

The families with an asymptote did not help there: four points after the warmup do not identify ``L_inf`` (the
fits put it at its bound 0), so the point stays the power law's and the interval carries its misfit.

**The settle budget** (:func:`settle_budget`): for a row that may flip, the least multiple of the budget, up to
:data:`SETTLE_MOST`, at which the curves put it beyond noise with a verdict then that holds, on which side (its
own: *holds*; the other: *flips*).

The pruner that reads the same fits is :class:`lightning_tfm.sweep.curve_pruner.CurvePruner`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Sequence

import numpy as np

from ..base.errors import UserError
from .settings import CURVE_FAMILIES, REPORT_DEFAULTS

#: The curve families a fit can take (the module docstring), and their parameter counts.
FAMILIES = dict(zip(CURVE_FAMILIES, (2, 3, 3)))
#: The family the verdict fits unless the sweep file's ``report.family`` says otherwise (the module docstring).
FAMILY = REPORT_DEFAULTS["family"]

# The method's choices: the budget multiple and level the size is calibrated at (the report's default ``level``),
# the direction's levels and its target, how far a settle budget is looked for.
#: The size of the gap at 3x: its interval's level (:func:`extrapolation_margin`). 80%, not 90%: each export left
#: out, both hold their level on the committed back-tests, and the 80% interval is the one narrow enough to say
#: something (reports/reference/backtest/calibration.md: the levels compared).
EXTRAPOLATION_K, EXTRAPOLATION_LEVEL = 3.0, 0.8
#: The direction's levels (:func:`keeps_side`): the lowest at which the rows called *holds*, each export left out,
#: kept their sign at least ``SIGN_TARGET`` of the time is ``SIGN_LEVEL`` (the level chosen on the sign, the
#: question *holds* answers).
SIGN_LEVELS = (0.8, 0.85, 0.9, 0.95)
SIGN_TARGET = 0.95
#: The furthest multiple of the budget a settle budget is looked for at (:func:`settle_budget`).
SETTLE_MOST = 10.0

#: The verdict's calibrated constants and records, computed from the committed back-tests
#: (:func:`lightning_tfm.findings.calibrate.calibration`) and written here by
#: ``python -m lightning_tfm.report.calibration reports/reference/backtest --page`` (make rerender);
#: ``tests/test_calibration.py`` checks that the file is what the command computes.
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
_CALIBRATION = json.loads(CALIBRATION_FILE.read_text(encoding="utf-8"))
#: The extrapolation's own error at 3x and :data:`EXTRAPOLATION_LEVEL` (:func:`extrapolation_margin`), in nats of
#: the log-PPL gap: the split-conformal quantile of every committed 3x back-test's
#: :func:`~lightning_tfm.findings.backtest.extrapolation_score`.
EXTRAPOLATION_ERROR: float = _CALIBRATION["EXTRAPOLATION_ERROR"]
#: The direction at 3x (:func:`keeps_side`): the one-sided bound ``sign * point - SIGN_QUANTILE * hypot(noise_sd,
#: |now|)`` (:func:`direction_margin`) must stay on today's side of zero. ``SIGN_QUANTILE``: the one-sided
#: split-conformal ``SIGN_LEVEL`` quantile of the rows' :func:`~lightning_tfm.findings.backtest.sign_score` in the
#: back-tests it was chosen on before the held-out exports.
SIGN_LEVEL: float = _CALIBRATION["SIGN_LEVEL"]
SIGN_QUANTILE: float = _CALIBRATION["SIGN_QUANTILE"]
#: What the headline quotes, each export left out, on the back-tests each constant is calibrated on: the direction,
#: (rows beyond noise at the cut, called *holds*, of those kept their sign at 3x); the size, (measured gaps inside
#: their interval, rows predicted). ``HELDOUT_RECORD``: the same, reported once, of the constants as first chosen,
#: on the three exports trained after that choice (sweeps/table3-cpu-heldout-{fr,s3,s4}.yaml).
DIRECTION_RECORD: tuple[int, int, int] = tuple(_CALIBRATION["DIRECTION_RECORD"])
SIZE_RECORD: tuple[int, int] = tuple(_CALIBRATION["SIZE_RECORD"])
HELDOUT_RECORD: dict[str, tuple] = {k: tuple(v) for k, v in _CALIBRATION["HELDOUT_RECORD"].items()}
#: The settle budgets' record (:func:`settle_budget`, rows that may flip): of each kind predicted by 3x in the
#: committed back-tests, (came true: beyond noise at 3x on the side it named, predicted). Rows within noise get
#: none: predicted the same way they came true 1 of 5 times in these back-tests, no better than saying nothing.
SETTLE_RECORD: dict[str, tuple] = {k: tuple(v) for k, v in _CALIBRATION["SETTLE_RECORD"].items()}

_ALPHAS = np.geomspace(0.02, 5.0, 40)   # the saturating family's start grid
_TAUS = np.geomspace(0.05, 50.0, 40)     # the exponential family's, in units of the last fitted t


def _t(steps) -> np.ndarray:
    """Updates done at a Lightning step (step 599 ends the 600th update)."""
    return np.asarray(steps, dtype=float) + 1.0


# ------------------------------------------------------------------------------------------------ the families
def _power_design(t: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(t), np.log(t)], axis=-1)


def _power_fit(t: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(log A, -alpha) of the log-log line; ``y`` may be a batch (draws x points)."""
    x = _power_design(t)
    return np.linalg.lstsq(x, np.log(y).T, rcond=None)[0].T


def _power_value(params: np.ndarray, t: np.ndarray) -> np.ndarray:
    params = np.atleast_2d(params)
    return np.exp(params[:, :1] + params[:, 1:2] * np.log(t)[None, :])


def _basis(family: str, t: np.ndarray, shape: float, t0: float) -> np.ndarray:
    return (t / t0) ** -shape if family == "saturating" else np.exp(-t / (shape * t0))


def _curve(family: str, params, t: np.ndarray, t0: float) -> np.ndarray:
    level, scale, shape = params
    return level + scale * _basis(family, t, shape, t0)


def _start(family: str, t: np.ndarray, y: np.ndarray, t0: float) -> np.ndarray:
    """A robust start: for each shape of a grid, the best (L_inf, A) by linear least squares within the bounds;
    the shape of the smallest residual."""
    best, start = math.inf, None
    for shape in (_ALPHAS if family == "saturating" else _TAUS):
        b = _basis(family, t, shape, t0)
        coef = np.linalg.lstsq(np.stack([np.ones_like(t), b], axis=1), y, rcond=None)[0]
        level = float(np.clip(coef[0], 0.0, y.min()))
        scale = max(float(np.dot(b, y - level) / np.dot(b, b)), 1e-9)
        sse = float(np.sum((level + scale * b - y) ** 2))
        if sse < best:
            best, start = sse, np.array([level, scale, shape])
    return start


def _bounds(family: str, y: np.ndarray):
    hi_shape = 5.0 if family == "saturating" else 1e3
    return [0.0, 1e-12, 1e-3], [max(float(y.min()), 1e-9), np.inf, hi_shape]


def _least_squares(family: str, t: np.ndarray, y: np.ndarray, t0: float, x0=None) -> np.ndarray:
    try:
        from scipy.optimize import least_squares
    except ImportError:  # the power law needs numpy alone
        raise UserError(f"the {family} curve family is fitted by scipy, which is not installed: pip install scipy, "
                        "or use report.family: power") from None

    lo, hi = _bounds(family, y)
    x0 = _start(family, t, y, t0) if x0 is None else np.clip(x0, lo, np.nextafter(np.array(hi), -np.inf))
    return least_squares(lambda p: _curve(family, p, t, t0) - y, x0, bounds=(lo, hi)).x


# -------------------------------------------------------------------------------------------------- the fit
@dataclass(frozen=True)
class CurveFit:
    """One run's fitted curve: its family and parameters, the points it was fitted to (``steps``, ``values``:
    dev log-PPL) and the steps it left out (before the warmup)."""
    family: str
    params: tuple[float, ...]
    steps: tuple[int, ...]
    values: tuple[float, ...]
    left_out: tuple[int, ...] = ()

    @property
    def _t0(self) -> float:
        return float(_t(self.steps[0]))

    def named(self) -> dict[str, float]:
        """The parameters as the module docstring writes the family: ``A``, ``alpha`` (power); ``L_inf``, ``A``,
        ``alpha`` (saturating); ``L_inf``, ``A``, ``tau`` (exponential), with ``t`` = updates done."""
        if self.family == "power":
            return {"A": math.exp(self.params[0]) if self.params[0] <= 709.0 else math.inf,
                    "alpha": -self.params[1]}  # a log A beyond exp()'s range: inf, not an OverflowError
        level, scale, shape = self.params
        if self.family == "saturating":
            return {"L_inf": level, "A": scale * self._t0 ** shape, "alpha": shape}
        return {"L_inf": level, "A": scale, "tau": shape * self._t0}

    def predict(self, step):
        """The fitted dev log-PPL at ``step`` (a number, or an array for an array of steps)."""
        t = np.atleast_1d(_t(step))
        if self.family == "power":
            out = _power_value(np.array(self.params), t)[0]
        else:
            out = _curve(self.family, self.params, t, self._t0)
        return float(out[0]) if np.ndim(step) == 0 else out

    def residuals(self) -> np.ndarray:
        """The residuals in the fitted space (log-log for ``power``, else log-PPL)."""
        y = np.array(self.values)
        fitted = self.predict(np.array(self.steps))
        return np.log(y) - np.log(fitted) if self.family == "power" else y - fitted

    def bootstrap(self, at_steps, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` predictions of the dev log-PPL at each of ``at_steps`` (an array ``n x len(at_steps)``), each from
        the fit repeated on the fitted values plus resampled residuals (the module docstring)."""
        at = np.atleast_1d(np.asarray(at_steps, dtype=float))
        t = _t(self.steps)
        k = len(t)
        res = self.residuals()
        res = (res - res.mean()) * math.sqrt(k / (k - FAMILIES[self.family]))
        draws = res[rng.integers(k, size=(n, k))]
        if self.family == "power":
            base = np.log(self.predict(np.array(self.steps)))
            params = _power_fit(t, np.exp(base[None, :] + draws))
            return _power_value(params, _t(at))
        fitted = self.predict(np.array(self.steps))
        out = np.empty((n, len(at)))
        for i in range(n):
            p = _least_squares(self.family, t, np.maximum(fitted + draws[i], 1e-9), self._t0, x0=self.params)
            out[i] = _curve(self.family, p, _t(at), self._t0)
        return out


def fit_points(steps: Sequence[int], warmup: int = 0, need: int = 3) -> list[int]:
    """The steps a fit reads (the module docstring): those >= ``warmup``, or every one but the first when those
    are fewer than ``need``; [] when neither has ``need``."""
    steps = sorted(steps)
    after = [s for s in steps if s >= warmup]
    if len(after) >= need:
        return after
    return steps[1:] if len(steps) - 1 >= need else []


def points_needed(min_points: int = 3, family: str = FAMILY) -> int:
    """The validations a fit of ``family`` needs: ``min_points``, and one more than its parameters."""
    return max(int(min_points), FAMILIES[family] + 1)


def fit_curve(steps: Sequence[int], values: Sequence[float], *, warmup: int = 0, min_points: int = 3,
              family: str = FAMILY) -> CurveFit | None:
    """The curve of ``family`` through the dev log-PPL ``values`` at ``steps`` (the module docstring), or None
    with fewer points than :func:`points_needed` (after the warmup rule of :func:`fit_points`)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown curve family {family!r} (one of {', '.join(FAMILIES)})")
    pairs = {int(s): float(v) for s, v in zip(steps, values) if v is not None and math.isfinite(v) and v > 0}
    use = fit_points(pairs, warmup, points_needed(min_points, family))
    if not use:
        return None
    t, y = _t(use), np.array([pairs[s] for s in use])
    if family == "power":
        params = _power_fit(t, y)
    else:
        params = _least_squares(family, t, y, float(t[0]))
    return CurveFit(family, tuple(float(p) for p in params), tuple(use), tuple(float(v) for v in y),
                    tuple(s for s in sorted(pairs) if s not in use))


def fit_run(curve: dict[int, float], **kw) -> CurveFit | None:
    """:func:`fit_curve` of one run's ``{step: dev PPL}`` (its log taken)."""
    steps = sorted(s for s, p in curve.items() if p is not None and math.isfinite(p) and p > 1)
    return fit_curve(steps, [math.log(curve[s]) for s in steps], **kw)


# ------------------------------------------------------------------------------------------------- the gap
def side_draws(fits: list[CurveFit], at_steps, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` draws of a side's mean dev log-PPL at each of ``at_steps``: each run's bootstrap prediction and,
    with two runs (seeds) or more, the runs resampled (``n_boot x len(at_steps)``)."""
    per_run = np.stack([f.bootstrap(at_steps, n_boot, rng) for f in fits])       # runs x draws x steps
    m = len(fits)
    runs = rng.integers(m, size=(n_boot, m)) if m >= 2 else np.zeros((n_boot, 1), dtype=int)
    draws = rng.integers(n_boot, size=runs.shape)
    return per_run[runs, draws].mean(axis=1)


def interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` share of ``draws``."""
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def extrapolation_margin(k: float, level: float = EXTRAPOLATION_LEVEL) -> float:
    """The extrapolation's own error at ``k`` x the budget (nats of the log-PPL gap; the module docstring):
    :data:`EXTRAPOLATION_ERROR` at 3x and 90%, in proportion to ``log k`` and to the normal quantile of ``level``;
    0 at ``k <= 1`` (no extrapolation)."""
    if not k > 1:
        return 0.0
    z = NormalDist().inv_cdf
    return (EXTRAPOLATION_ERROR * math.log(k) / math.log(EXTRAPOLATION_K)
            * z((1 + level) / 2) / z((1 + EXTRAPOLATION_LEVEL) / 2))


def widen(point, low, high, margin):
    """The bootstrap interval (``low``, ``high`` about ``point``) with the extrapolation's ``margin`` added in
    quadrature on each side (numbers or arrays)."""
    return point - np.hypot(point - low, margin), point + np.hypot(high - point, margin)


def _budget_multiple(fits: list[CurveFit], at_step: int) -> float:
    """The multiple of a side's budget (its fits' last point) a step is: step 1799 of 600 updates is 3."""
    return (at_step + 1) / (min(f.steps[-1] for f in fits) + 1)


@dataclass(frozen=True)
class PredictedGap:
    """The predicted gap of a row to the base (:func:`predicted_gap`): log-PPL gaps in nats, mean log PPL(row) - mean
    log PPL(base) over each side's seeds; ``exp(gap) - 1`` is the relative change of PPL."""
    point: float                 # the gap of the fitted curves at at_step (the base at base_step)
    low: float                   # the size's interval: the bootstrap's widened by ``margin`` (:func:`widen`)
    high: float
    boot_low: float              # the central ``level`` share of the bootstrap draws, before widening
    boot_high: float
    margin: float                # the extrapolation's own error at ``k`` x the budget (:func:`extrapolation_margin`)
    k: float                     # the multiple of the budget ``at_step`` is (the larger of the two sides')
    at_step: int                 # the row's step the gap is predicted at (Lightning's, from 0)
    base_step: int               # the base's (a row trained b times the base's budget: b times its step)
    row: list[CurveFit]          # the row's fitted runs (seeds with enough points)
    base: list[CurveFit]         # the base's
    now: float                   # today's gap at each side's budget (:func:`today_gap`; nan without one)
    noise_sd: float              # the base's seed sd of log PPL at its budget (0 with one seed)
    sign_margin: float           # the direction's margin toward zero (:func:`direction_margin`, *holds*)


@dataclass(frozen=True)
class SettleBudget:
    """When a row that may flip is predicted to settle (:func:`settle_budget`)."""
    kind: str                    # "holds": on the side of today's change; "flips": on the other
    k: float                     # the multiple of each side's budget it settles at
    step: int                    # the row's step there
    base_step: int               # the base's step there
    sign: int                    # +1: the row settles worse than the base, -1: better


def predicted_gap(row_runs: list[dict[int, float]], base_runs: list[dict[int, float]], at_step: int,
                  n_boot: int = 200, seed: int = 0, level: float = EXTRAPOLATION_LEVEL, *, base_step: int | None = None,
                  warmup: int = 0, base_warmup: int | None = None, min_points: int = 3,
                  family: str = FAMILY) -> PredictedGap | None:
    """The predicted gap mean log PPL(row) - mean log PPL(base) at ``at_step`` (the base at ``base_step``,
    default the same), from each run's fitted curve (``runs``: one ``{step: dev PPL}`` a seed), with its ``level``
    interval (the module docstring): the central share of ``n_boot`` bootstrap draws widened by the extrapolation's
    error at ``k`` x the budget; None when a side has no run with enough points."""
    fit = dict(min_points=min_points, family=family)
    row = [f for f in (fit_run(r, warmup=warmup, **fit) for r in row_runs) if f is not None]
    base = [f for f in (fit_run(r, warmup=warmup if base_warmup is None else base_warmup, **fit)
                        for r in base_runs) if f is not None]
    if not row or not base:
        return None
    base_step = at_step if base_step is None else base_step
    point = (float(np.mean([f.predict(at_step) for f in row]))
             - float(np.mean([f.predict(base_step) for f in base])))
    rng = np.random.default_rng(seed)
    draws = side_draws(row, [at_step], n_boot, rng)[:, 0] - side_draws(base, [base_step], n_boot, rng)[:, 0]
    boot_low, boot_high = interval(draws, level)
    k = max(_budget_multiple(row, at_step), _budget_multiple(base, base_step))
    margin = extrapolation_margin(k, level)
    low, high = (float(x) for x in widen(point, boot_low, boot_high, margin))
    now, noise_sd = today_gap(row_runs, base_runs)
    return PredictedGap(point=point, low=low, high=high, boot_low=boot_low, boot_high=boot_high, margin=margin, k=k,
                        at_step=at_step, base_step=base_step, row=row, base=base, now=now, noise_sd=noise_sd,
                        sign_margin=direction_margin(now, noise_sd, k))


def _end_logs(runs: list[dict[int, float]]) -> list[float]:
    """Each run's dev log-PPL at the side's budget (the last step every run validated at)."""
    ends = [max(r) for r in runs if r]
    if not ends:
        return []
    end = min(ends)
    return [math.log(r[end]) for r in runs if end in r and r[end] is not None and math.isfinite(r[end])
            and r[end] > 0]


def today_gap(row_runs: list[dict[int, float]], base_runs: list[dict[int, float]]) -> tuple[float, float]:
    """Today's gap, mean log PPL(row) - mean log PPL(base) at each side's budget, and the base's seed noise there
    (the sample sd of its seeds' log PPL; 0 with one seed, where the verdict has no noise to judge by anyway)."""
    row, base = _end_logs(row_runs), _end_logs(base_runs)
    if not row or not base:
        return math.nan, math.nan
    sd = float(np.std(base, ddof=1)) if len(base) >= 2 else 0.0
    return float(np.mean(row) - np.mean(base)), sd


def direction_margin(now: float, noise_sd: float, k: float, quantile: float | None = None) -> float:
    """How far toward zero the one-sided bound of the direction lies from the predicted gap (the *holds* test,
    :func:`keeps_side`): ``quantile`` (default :data:`SIGN_QUANTILE`) times the base's seed noise and today's gap
    in quadrature, at ``k`` x the budget in proportion to ``log k / log 3`` as the size's margin is; 0 at
    ``k <= 1``."""
    if not k > 1 or not math.isfinite(now):
        return 0.0
    q = SIGN_QUANTILE if quantile is None else quantile
    return q * math.hypot(noise_sd if math.isfinite(noise_sd) else 0.0, now) * math.log(k) / math.log(
        EXTRAPOLATION_K)


def settle_budget(gap: PredictedGap, today: float, most: float = SETTLE_MOST, *,
                  noise_k: float = 2.0) -> SettleBudget | None:
    """When the verdict of a row that may flip is predicted to settle (the module docstring), from the gap
    :func:`predicted_gap` gave at ``k`` x the budget: the least multiple ``m`` of each side's budget, up to
    ``most``, at which the fitted curves put the row beyond seed noise (its predicted gap then more than
    ``noise_k`` times the base's seed noise of today, in log PPL) and a verdict taken then holds
    (:func:`keeps_side`'s bound at ``k`` x that budget, with the margin of that gap, on its side).
    ``kind`` ``"holds"`` on the side of today's change ``today``, ``"flips"`` on the other (the fitted curves cross,
    and the other side holds). None when none by ``most`` x. No draws: the same fits, the same answer."""
    row, base = gap.row, gap.base
    row_end, base_end = (min(f.steps[-1] for f in fits) for fits in (row, base))
    k = (gap.at_step + 1) / (row_end + 1)
    mults = np.unique(np.geomspace(1.0, most, 81).round(3))[1:]  # past today: m = 1 is the verdict now

    def at(m):  # the predicted gap at m x each side's budget
        rs, bs = np.round(m * (row_end + 1)).astype(int) - 1, np.round(m * (base_end + 1)).astype(int) - 1
        return (np.mean([f.predict(rs) for f in row], axis=0) - np.mean([f.predict(bs) for f in base], axis=0),
                rs, bs)

    then, row_steps, base_steps = at(mults)
    ahead, _, _ = at(mults * k)
    noise = gap.noise_sd if math.isfinite(gap.noise_sd) else 0.0
    sign_today = (today > 0) - (today < 0)
    for i, m in enumerate(mults):
        side = int(np.sign(then[i]))
        if not side or abs(then[i]) <= noise_k * noise:
            continue
        if side * ahead[i] - direction_margin(float(then[i]), noise, k) <= 0:
            continue
        kind = "holds" if side == sign_today else "flips"
        return SettleBudget(kind=kind, k=float(m), step=int(row_steps[i]), base_step=int(base_steps[i]), sign=side)
    return None


def band(fits: list[CurveFit], steps, n_boot: int = 200, seed: int = 0, level: float = 0.9,
         extrapolate: bool = True):
    """A side's fitted mean dev log-PPL at ``steps`` and its ``level`` band (three arrays), for figures: the
    bootstrap's band, past the side's budget widened by its share of the extrapolation's error (``extrapolate``:
    :func:`extrapolation_margin` of each step's multiple of the budget over sqrt 2, the gap's error split between
    its two sides)."""
    steps = np.asarray(steps, dtype=float)
    mean = np.mean([f.predict(steps) for f in fits], axis=0)
    draws = side_draws(fits, steps, n_boot, np.random.default_rng(seed))
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], axis=0)
    if extrapolate:
        end = min(f.steps[-1] for f in fits)
        margin = np.array([extrapolation_margin((s + 1) / (end + 1), level) for s in steps]) / math.sqrt(2)
        lo, hi = widen(mean, lo, hi, margin)
    return mean, lo, hi


def keeps_side(gap: PredictedGap, today: float) -> bool:
    """The verdict's *holds* test, in one place: the one-sided bound of the predicted gap at ``k`` x the budget,
    ``gap.point`` moved toward zero by ``gap.sign_margin`` (:func:`direction_margin`), lies on the side of today's
    change ``today`` (0: no side, never holds)."""
    sign = (today > 0) - (today < 0)
    return bool(sign) and sign * gap.point - gap.sign_margin > 0
