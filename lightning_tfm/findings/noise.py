"""Seed noise: whether a change between two rows is more than retraining with another seed gives, and the intervals
a finding's numbers carry. Pure numerics (scipy's t and binomial); the verdict (:mod:`.verdict`), the report's
tables and Table 2's claims read them.

- **The noise rule** (:func:`noise_verdict`, :data:`NOISE_RULE`): a row's change is beyond seed noise when
  ``|Δ| > NOISE_K`` (2) x the sample standard deviation of the base row over its seeds; with one base seed the noise
  is "unknown", never guessed. :func:`end_change`: a row's change at the end of its budget and its noise verdict, as
  the report's table reads it.
- **Seeds to settle** (:func:`seeds_to_settle`): for two rows whose difference is within that noise, the seeds a row
  at which the central 90% Welch t interval of the difference of their means (:func:`half_width`) would
  exclude zero, were the measured difference and seed sds the truth (normal seed noise; a plug-in calculation, not
  back-tested).
- **A record's interval** (:func:`clopper_pearson`, :func:`share`): how often a back-tested call came true, with its
  exact 95% interval.
"""
from __future__ import annotations

import functools
import math

NOISE_K = 2.0

NOISE_RULE = (f"a row's change is beyond seed noise when |Δ| > {NOISE_K:g} × the sample standard deviation of "
              "the base row over its seeds (the spread that retraining the same configuration with another "
              "seed gives); with fewer than 2 completed base seeds the noise is unknown")

SEEDS_MOST = 30  # the most seeds a row :func:`seeds_to_settle` looks at
SEEDS_LEVEL = 0.9


def finite(x) -> bool:
    """A number that can be compared: not None, not a bool, not nan or ±inf."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """The mean and the sample standard deviation (None with one value); values near a float's range (a PPL of
    1e308) give their mean and spread, not an OverflowError or an infinite mean."""
    if not values:
        return None, None
    n = len(values)
    mean = sum(values) / n
    if math.isinf(mean) and all(map(math.isfinite, values)):  # the sum overflowed, not the values
        mean = sum(v / n for v in values)
    if n < 2:
        return mean, None
    try:
        return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    except OverflowError:  # a square beyond a float's range: the deviations scaled by the largest
        dev = [v - mean for v in values]
        top = max(map(abs, dev))
        return mean, top * math.sqrt(sum((d / top) ** 2 for d in dev) / (n - 1))


def relative(delta: float | None, base: float | None) -> float | None:
    """A change as a fraction of its base: the paper's and our absolute values are on different scales
    (corpus, model size, BLEU tokenization), their relative changes can be set side by side."""
    if not finite(delta) or not finite(base) or base == 0:
        return None
    return delta / abs(base)


def noise_verdict(delta: float | None, base_std: float | None, k: float = NOISE_K) -> str | None:
    """The one noise rule (:data:`NOISE_RULE`): ``"beyond"`` when ``|delta| > k * base_std``, ``"within"``
    otherwise, ``"unknown"`` when the base's seed spread is unknown (one seed); None without a change (or a change
    that is no number: nan is within nothing). A zero spread (every seed gave the same number) makes any nonzero
    change beyond noise; a spread that is no number is unknown."""
    if not finite(delta):
        return None
    if not finite(base_std):
        return "unknown"
    return "beyond" if abs(delta) > k * base_std else "within"


def end_change(row_ppls: list[float], base_ppls: list[float]) -> tuple[float | None, str | None]:
    """The row's change at the end as the report's table reads it, from each side's seeds' dev PPL at its budget:
    Δ = mean(row) - mean(base) and its :func:`noise_verdict` by the base's seed sd; (None, None) without a
    number on a side."""
    row, _ = mean_std([p for p in row_ppls if finite(p)])
    base, base_sd = mean_std([p for p in base_ppls if finite(p)])
    if row is None or base is None:
        return None, None
    return row - base, noise_verdict(row - base, base_sd)


@functools.lru_cache(maxsize=4096)
def t_quantile(level: float, df: float) -> float:
    """The central ``level`` interval's t quantile at ``df`` degrees of freedom (scipy's; cached: the planner asks
    for the same few many times)."""
    from scipy import stats

    return float(stats.t.ppf((1 + level) / 2, df))


def half_width(sd_row: float, n: int, sd_base: float, m: int, level: float, df: str = "hsu") -> tuple[float, float]:
    """``(half-width, df)`` of the central ``level`` t interval of the difference of the means of ``n`` row seeds
    and ``m`` base seeds of sample sds ``sd_row`` and ``sd_base``: Welch's standard error, and ``df`` degrees of
    freedom ``"hsu"``, ``min(n, m) - 1`` (the answers': conservative for every ratio of the sides' variances), or
    ``"welch"`` (Welch-Satterthwaite's, which errs too often at 2 or 3 seeds: :mod:`.answers`' docstring; Table 2's
    pairs and :func:`seeds_to_settle` take it). No spread on either side: 0."""
    vr, vb = sd_row ** 2 / n, sd_base ** 2 / m
    if vr + vb == 0:
        return 0.0, math.inf
    if df == "hsu":
        dof = float(min(n, m) - 1)
    else:
        dof = (vr + vb) ** 2 / (vr ** 2 / (n - 1) + vb ** 2 / (m - 1))
    return t_quantile(level, dof) * math.sqrt(vr + vb), dof


def seeds_to_settle(delta: float | None, sd_a: float | None, sd_b: float | None, level: float = SEEDS_LEVEL,
                    most: int = SEEDS_MOST) -> int | None:
    """The least seeds a row ``n`` (2 to ``most``) at which the central ``level`` Welch t interval of the
    difference of two rows' means (:func:`half_width`) excludes zero, the measured difference ``delta`` and
    seed sds taken as they are (the module docstring); None by ``most``, or without a difference or both sds."""
    if not (finite(delta) and finite(sd_a) and finite(sd_b)) or delta == 0:
        return None
    return next((n for n in range(2, most + 1) if abs(delta) > half_width(sd_a, n, sd_b, n, level, "welch")[0]), None)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a share ``k`` of ``n`` (scipy's)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)


def share(k: int, n: int) -> str:
    """A back-tested record with its confidence interval: ``26 of 30 (95% CI 70-96%)``."""
    if not n:
        return "0 of 0"
    lo, hi = clopper_pearson(k, n)
    return f"{k} of {n} (95% CI {100 * lo:.0f}-{100 * hi:.0f}%)"
