"""Each row's answer against the base from its own seeds: *better*, *worse*, *the same* within ±delta, or
*unsettled*, with a false-answer rate that holds over every look the settle loop (:mod:`.settle`) may take.

**The interval.** A row and the base are compared at one budget multiple by their mean dev log-PPL (``dev_loss``,
nats) over their seeds: ``diff = mean(row) - mean(base)``, and its interval is Welch's t interval (unequal
variances, Welch-Satterthwaite's degrees of freedom; scipy's t), as Table 2 compares rows. Not paired by seed,
although a seed gives the row and the base the same data order: on the committed en->de exports (8 rows at seeds
1, 3, 4; the base at 1-9), pairing narrowed the interval of some rows and widened others' (the per-row correlation
of row and base over three shared seeds ranges from -0.8 to +1.0: with three pairs it is noise), and it throws the
base's other seeds away (``ltfm report ... --settle-replay`` prints both widths:
``reports/reference/settle-replay.md``).
:func:`paired` stays for that measurement.

**The four answers** (:func:`decide`), from the interval ``[low, high]`` at the level below:

- *better* (``high < 0``) or *worse* (``low > 0``): the interval excludes zero;
- *the same* within ±delta: the interval lies inside ``±log(1 + delta)`` (``delta`` a relative change of dev PPL);
- *unsettled*: neither (the loop goes on, or the row is at its cap).

**A row with one seed** has no noise of its own: it is *unsettled (one seed)*, its verdict (the 2 x base-sd rule,
:func:`.verdict.noise_verdict`) stays beside it, and that rule is no controlled answer: under a true difference of
0 a single row seed ``x`` against ``m`` base seeds is called beyond noise when ``|x - mean| > 2 s``, and ``(x -
mean) / (s sqrt(1 + 1/m))`` is t with ``m - 1`` df, so the rule's false-answer rate is ``P(|t_{m-1}| > 2 /
sqrt(1 + 1/m))``: 22.5% with 3 base seeds (:func:`one_seed_false_rate`).

**The looks and the error rate.** Every pass of the settle loop looks at each unanswered row again (another seed,
the base's seeds, a longer budget), and stops at the first answer: looking until an interval excludes zero would
make a false *better/worse* near certain. The rule: Bonferroni over the looks the caps allow, fixed in advance from
the :class:`.settings.SettleSpec` (:func:`looks`). An answer is given only at a designated state ``(n, L)``: the
row's first ``n`` seeds (``n`` from 2 to ``seeds``), the base's first ``base_seeds`` seeds, both at budget multiple
``L`` (1, and ``budget`` when it is over 1); there are ``K = (seeds - 1) x len(levels)`` of them, and each interval
is the central ``1 - alpha / K`` one. A false answer at any look means the interval of that look misses the true
difference at its budget (a false *better/worse*: the truth is 0 or on the other side; a false *same*: the truth
lies beyond ±log(1 + delta)). By the union bound over the ``K`` designated states (all of them, not only the ones
the loop visits, so the planner's choice of which to visit, which depends on the data, does not matter),
``P(any false answer of the row) <= K x alpha / K = alpha``. Why this rule: the loop takes few looks (a few seeds,
two budgets), where Bonferroni is close to exact, and the intervals are t intervals of few degrees of freedom, for
which the always-valid confidence sequences (mixture martingales of a Gaussian with unknown variance) are wider at
every look up to about ten; alpha spending with unequal weights would need the looks' order fixed, which the
planner chooses by the data. The base counts at ``base_seeds`` only: the planner brings the base to that count
before any answer at a budget (its seeds serve every row), so the base's growth adds no looks. Welch's interval
is an approximation (the Behrens-Fisher problem has no exact t); ``tests/test_answers.py`` measures the rate on
resampled base seeds and on synthetic normal data.

**The whole table**: with ``R`` rows each at rate ``alpha``, the expected number of false answers is at most ``R
alpha`` (20 rows at the default 0.1: at most 2; under the null the error is one-sided for better/worse, ``alpha /
2`` each), and the chance of any false answer at most ``min(1, R alpha)``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import stats

from .settings import SettleSpec
from .verdict import NOISE_K, end_change, mean_std

BETTER, WORSE, SAME, UNSETTLED = "better", "worse", "the same", "unsettled"
ANSWERS = (BETTER, WORSE, SAME, UNSETTLED)
WELCH, PAIRED, ONE_SEED = "welch", "paired", "one seed"


@dataclass(frozen=True)
class Answer:
    """A row's answer against the base at one budget multiple (the module docstring)."""
    answer: str                 # one of ANSWERS
    diff: float | None          # mean dev log-PPL(row) - mean dev log-PPL(base), nats
    low: float | None           # the interval of diff at `level`
    high: float | None
    level: float                # the interval's level after the correction for the looks (1 - alpha / K)
    row_seeds: int              # the seeds of each side the answer used
    base_seeds: int
    method: str                 # WELCH, or ONE_SEED (no interval), "" when a side has no run
    why: str                    # one line a table cell or --status shows
    budget: float = 1.0         # the budget multiple the answer is at
    df: float | None = None     # the interval's degrees of freedom

    @property
    def answered(self) -> bool:
        return self.answer != UNSETTLED


def levels(spec: SettleSpec) -> tuple[float, ...]:
    """The budget multiples a row is judged at: 1, and the cap ``spec.budget`` when it is over 1."""
    return (1.0,) if spec.budget <= 1 else (1.0, float(spec.budget))


def looks(spec: SettleSpec) -> list[tuple[int, float]]:
    """The designated states ``(row seeds, budget multiple)`` at which an answer may be given, in the order the
    loop reaches them (the module docstring); the base at ``spec.base_seeds`` seeds in each."""
    return [(n, level) for level in levels(spec) for n in range(2, spec.seeds + 1)]


def look_level(spec: SettleSpec) -> float:
    """The level of each look's interval: ``1 - alpha / K`` (Bonferroni over the :func:`looks`)."""
    return 1.0 - spec.alpha / len(looks(spec))


def welch(row: list[float], base: list[float], level: float) -> tuple[float, float, float, float]:
    """``(diff, low, high, df)``: Welch's central ``level`` t interval of ``mean(row) - mean(base)`` (two seeds a
    side at least). Both sides without spread: the interval is the point."""
    mr, sr = mean_std(row)
    mb, sb = mean_std(base)
    vr, vb = sr ** 2 / len(row), sb ** 2 / len(base)
    diff = mr - mb
    if vr + vb == 0:
        return diff, diff, diff, math.inf
    df = (vr + vb) ** 2 / (vr ** 2 / (len(row) - 1) + vb ** 2 / (len(base) - 1))
    half = float(stats.t.ppf((1 + level) / 2, df)) * math.sqrt(vr + vb)
    return diff, diff - half, diff + half, df


def paired(row: Mapping[int, float], base: Mapping[int, float], level: float) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: the central ``level`` t interval of the mean of ``row[s] - base[s]`` over the seeds
    both sides have (None with fewer than two): the pairing the module docstring measured and did not choose."""
    shared = sorted(set(row) & set(base))
    if len(shared) < 2:
        return None
    d = [row[s] - base[s] for s in shared]
    m, sd = mean_std(d)
    half = float(stats.t.ppf((1 + level) / 2, len(d) - 1)) * sd / math.sqrt(len(d))
    return m, m - half, m + half


def same_bound(delta: float) -> float:
    """The half-width, in nats of log PPL, of 'the same within ±delta': ``log(1 + delta)``."""
    return math.log1p(delta)


def decide(low: float, high: float, delta: float) -> str:
    """The answer an interval gives (the module docstring)."""
    if high < 0:
        return BETTER
    if low > 0:
        return WORSE
    bound = same_bound(delta)
    if -bound < low and high < bound:
        return SAME
    return UNSETTLED


def one_seed_false_rate(base_seeds: int, k: float = NOISE_K) -> float:
    """The chance that today's noise rule (``|Δ| > k`` x the base's seed sd) calls a row of one seed beyond noise
    when its true difference is 0, ``m = base_seeds`` base seeds, normal seed noise of one sd: ``P(|t_{m-1}| > k /
    sqrt(1 + 1/m))`` (the module docstring); 22.5% at 3 base seeds."""
    m = base_seeds
    return float(2 * stats.t.sf(k / math.sqrt(1 + 1 / m), m - 1))


def _pct(x: float) -> str:
    return f"{100 * math.expm1(x):+.1f}%"


def answer_row(row: Mapping[int, float], base: Mapping[int, float], spec: SettleSpec, budget: float = 1.0) -> Answer:
    """A row's answer at one budget multiple (``budget``, for the text) from ``row`` and ``base``: seed -> dev
    log-PPL of each completed run at that budget. It uses the row's first ``spec.seeds`` seeds (smallest first)
    and the base's first ``spec.base_seeds``: a look is the state those make (:func:`looks`); the row with one
    seed, or the base short of ``spec.base_seeds``, is unsettled and says why."""
    level = look_level(spec)
    rs = sorted(row)[:spec.seeds]
    bs = sorted(base)[:spec.base_seeds]
    rv, bv = [row[s] for s in rs], [base[s] for s in bs]
    at = f" at {budget:g}x" if budget != 1 else ""
    if not rv or not bv:
        return Answer(UNSETTLED, None, None, None, level, len(rv), len(bv), "", "no run" + at, budget)
    diff = mean_std(rv)[0] - mean_std(bv)[0]
    if len(rv) == 1:
        _, noise = end_change([math.exp(v) for v in rv], [math.exp(v) for v in bv])
        rate = f"{100 * one_seed_false_rate(len(bv)):.0f}%" if len(bv) >= 2 else "unknown"
        why = (f"unsettled (one seed){at}: the 2x base-sd rule says {noise or 'nothing'} ({_pct(diff)}), no "
               f"controlled answer (it errs {rate} of the time on no difference)")
        return Answer(UNSETTLED, diff, None, None, level, 1, len(bv), ONE_SEED, why, budget)
    if len(bv) < spec.base_seeds:
        why = f"unsettled{at}: waits for the base's seeds ({len(bv)} of {spec.base_seeds})"
        return Answer(UNSETTLED, diff, None, None, level, len(rv), len(bv), WELCH, why, budget)
    diff, low, high, df = welch(rv, bv, level)
    answer = decide(low, high, spec.delta)
    span = f"{_pct(diff)} [{_pct(low)}, {_pct(high)}] at {100 * level:.1f}%, {len(rv)}+{len(bv)} seeds{at}"
    head = {BETTER: "better", WORSE: "worse", SAME: f"the same within ±{100 * spec.delta:g}%",
            UNSETTLED: "unsettled"}[answer]
    return Answer(answer, diff, low, high, level, len(rv), len(bv), WELCH, f"{head}: {span}", budget, df)
