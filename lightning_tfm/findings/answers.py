"""Each row's answer against the base from its own seeds: *better*, *worse*, *the same* within ±delta, or
*unsettled*, with a false-answer rate that holds over every look the settle loop (:mod:`.settle`) may take.

**The interval: paired by seed.** A row and the base are compared at one budget multiple by their dev log-PPL
(``dev_loss``, nats) seed by seed: the same seed gives both the same initialisation stream and data order, so the
loop trains the base at every seed its rows have, and the answer reads the differences ``d_s = row_s - base_s``
over the row's seeds: ``diff`` = their mean, its interval the t interval of ``n - 1`` degrees of freedom
(:func:`paired`, scipy's t). Exact for normal differences whatever the two sides' variances and their correlation.
The other candidate was the unpaired difference of means with Welch's standard error over all the base's seeds
(:func:`welch`); measured (``ltfm report sweeps/table3-cpu.yaml --settle-replay ...``,
``reports/reference/settle-replay.md``, the committed en->de rows at seeds 1, 3, 4 and the base at 1-9):

- Welch-Satterthwaite's degrees of freedom err too often at the seeds a row has: with 2 or 3 row seeds against 6
  base seeds and a row seed sd 3 x the base's (A1's is 2.4 x), a nominal 2.5% interval misses zero 8.2% (2 seeds)
  and 4.3% (3 seeds) of the time (20,000 normal draws), so Welch's interval guarantees no rate; Hsu's ``min(n, m) -
  1`` degrees of freedom make it conservative for every variance ratio (Mickey & Brown 1966);
- against that guaranteed unpaired interval (over all 9 base seeds), the paired one is narrower for 12 of the 16
  (row, budget) cases, 5 of 8 at 1 x and 7 of 8 at 3 x, median width ratio 0.84: the shared data order
  correlates a row with the base (the replay prints both per row). And it needs no base seed beyond the rows' own.

**The four answers** (:func:`decide`), from the interval ``[low, high]`` at the level below:

- *better* (``high < 0``) or *worse* (``low > 0``): the interval excludes zero;
- *the same* within ±delta: the interval lies inside ``±log(1 + delta)`` (``delta`` a relative change of dev PPL);
- *unsettled*: neither (the loop goes on, or the row is at its cap).

**A row with one seed** has no noise of its own: it is *unsettled (one seed)*, its verdict (the 2 x base-sd rule,
:func:`.noise.noise_verdict`) stays beside it, and that rule is no controlled answer: under a true difference of
0 a single row seed ``x`` against ``m`` base seeds is called beyond noise when ``|x - mean| > 2 s``, and ``(x -
mean) / (s sqrt(1 + 1/m))`` is t with ``m - 1`` df, so the rule's false-answer rate is ``P(|t_{m-1}| > 2 /
sqrt(1 + 1/m))``: 22.5% with 3 base seeds (:func:`one_seed_false_rate`). A row of two seeds is not looked at
either (:data:`FIRST_LOOK`): a t of 1 degree of freedom needs an effect of 25 standard errors at 97.5%.

**The looks and the error rate.** Every pass of the settle loop looks at each unanswered row again (another seed,
a longer budget) and stops at the first answer: looking until an interval excludes zero would make a false
*better/worse* near certain. The rule: Bonferroni over the looks the caps allow, fixed in advance from the
:class:`.settings.SettleSpec` (:func:`looks`). An answer is given only at a designated state ``(n, L)``: the row's
first ``n`` seeds (``n`` from :data:`FIRST_LOOK` to ``seeds``, at most ``base_seeds``) paired with the base's same
seeds, both at budget multiple ``L`` (1, and ``budget`` when it is over 1); there are ``K`` of them, and each
interval is the central ``1 - alpha / K`` one. A false answer at any look means the interval of that look misses
the true difference at its budget (a false *better/worse*: the truth is 0 or on the other side; a false *same*:
the truth lies beyond ±log(1 + delta)). By the union bound over the ``K`` designated states (all of them, not only
the ones the loop visits, so the planner's choice of which to visit, which depends on the data, does not matter),
``P(any false answer of the row) <= K x alpha / K = alpha``. Why this rule: the loop takes few looks (a few seeds,
two budgets), where Bonferroni loses little, and its intervals are t intervals of 2 to 4 degrees of freedom, for
which an always-valid confidence sequence (a mixture martingale for a Gaussian mean of unknown variance) is wider at
every look; alpha spending with unequal weights would need the looks' order fixed, which the planner chooses by
the data. ``tests/test_answers.py`` measures the rate on the committed base seeds relabelled as a row and on
synthetic normal data.

**The whole table**: with ``R`` rows each at rate ``alpha``, the expected number of false answers is at most ``R
alpha`` (linearity of expectation, whatever the rows' dependence through the shared base: 20 rows at the default
0.1, at most 2), and the chance of any false answer at most ``min(1, R alpha)`` (the union bound: 100% at 20 rows,
so the table's guarantee is the expected count, :func:`table_rate`). A row with no difference is called *better*
or *worse* with chance at most ``alpha`` (each tail ``alpha / 2``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import stats

from .noise import NOISE_K, end_change, half_width, mean_std, t_quantile
from .settings import SettleSpec

BETTER, WORSE, SAME, UNSETTLED = "better", "worse", "the same", "unsettled"
ANSWERS = (BETTER, WORSE, SAME, UNSETTLED)
WELCH, PAIRED, ONE_SEED = "welch", "paired", "one seed"
FIRST_LOOK = 3  # the fewest seeds of a row its answer is looked at with (the module docstring)


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
    method: str                 # PAIRED, or ONE_SEED (no interval), "" when a side has no run
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
    loop reaches them (the module docstring): ``n`` from :data:`FIRST_LOOK` to ``seeds`` (at most ``base_seeds``:
    each row seed is paired with the base's), at each of :func:`levels`."""
    most = min(spec.seeds, spec.base_seeds)
    return [(n, level) for level in levels(spec) for n in range(min(FIRST_LOOK, most), most + 1)]


def look_level(spec: SettleSpec) -> float:
    """The level of each look's interval: ``1 - alpha / K`` (Bonferroni over the :func:`looks`)."""
    return 1.0 - spec.alpha / len(looks(spec))


def welch(row: list[float], base: list[float], level: float, df: str = "hsu") -> tuple[float, float, float, float]:
    """``(diff, low, high, df)``: :func:`half_width`'s interval around ``mean(row) - mean(base)`` (two seeds a side
    at least): the unpaired candidate the module docstring measured and did not choose."""
    mr, sr = mean_std(row)
    mb, sb = mean_std(base)
    half, dof = half_width(sr, len(row), sb, len(base), level, df)
    return mr - mb, mr - mb - half, mr - mb + half, dof


def paired_half_width(sd: float, n: int, level: float) -> float:
    """The half-width of the central ``level`` t interval of the mean of ``n`` paired differences of sample sd
    ``sd`` (``n - 1`` degrees of freedom)."""
    return t_quantile(level, n - 1) * sd / math.sqrt(n) if sd > 0 else 0.0


def paired(row: Mapping[int, float], base: Mapping[int, float], level: float) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: the central ``level`` t interval of the mean of ``row[s] - base[s]`` over the seeds
    both sides have (None with fewer than two): the answers' interval (the module docstring)."""
    shared = sorted(set(row) & set(base))
    if len(shared) < 2:
        return None
    m, sd = mean_std([row[s] - base[s] for s in shared])
    half = paired_half_width(sd, len(shared), level)
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


def table_rate(rows: int, alpha: float) -> tuple[float, float]:
    """The whole table's false answers (the module docstring): (at most this many expected, the chance of any at
    most)."""
    return rows * alpha, min(1.0, rows * alpha)


def _pct(x: float) -> str:
    return f"{100 * math.expm1(x):+.1f}%"


def answer_row(row: Mapping[int, float], base: Mapping[int, float], spec: SettleSpec, budget: float = 1.0) -> Answer:
    """A row's answer at one budget multiple (``budget``, for the text) from ``row`` and ``base``: seed -> dev
    log-PPL of each completed run at that budget. It reads the row's first ``min(seeds, base_seeds)`` seeds
    (smallest first), each paired with the base's same seed: a look is the state those make (:func:`looks`). A row
    of one seed (its verdict's rule beside), of fewer than :data:`FIRST_LOOK`, or whose seeds the base lacks, is
    unsettled and says why."""
    level = look_level(spec)
    rs = sorted(row)[:min(spec.seeds, spec.base_seeds)]
    at = f" at {budget:g}x" if budget != 1 else ""
    if not rs or not base:
        return Answer(UNSETTLED, None, None, None, level, len(rs), len(base), "", "no run" + at, budget)
    diff = mean_std([row[s] for s in rs])[0] - mean_std(list(base.values()))[0]
    if len(rs) == 1:
        _, noise = end_change([math.exp(row[rs[0]])], [math.exp(v) for v in base.values()])
        rate = f"{100 * one_seed_false_rate(len(base)):.0f}%" if len(base) >= 2 else "unknown"
        why = (f"unsettled (one seed){at}: the 2x base-sd rule says {noise or 'nothing'} ({_pct(diff)}), no "
               f"controlled answer (it errs {rate} of the time on no difference)")
        return Answer(UNSETTLED, diff, None, None, level, 1, len(base), ONE_SEED, why, budget)
    lacking = [s for s in rs if s not in base]
    if lacking:
        why = f"unsettled{at}: waits for the base's seed(s) {', '.join(map(str, lacking))} (pairs)"
        return Answer(UNSETTLED, diff, None, None, level, len(rs), len(base), PAIRED, why, budget)
    diff = mean_std([row[s] - base[s] for s in rs])[0]
    if len(rs) < min(FIRST_LOOK, spec.seeds):
        why = f"unsettled{at}: {len(rs)} seeds, the first look is at {FIRST_LOOK} ({_pct(diff)})"
        return Answer(UNSETTLED, diff, None, None, level, len(rs), len(rs), PAIRED, why, budget)
    diff, low, high = paired({s: row[s] for s in rs}, base, level)
    answer = decide(low, high, spec.delta)
    span = f"{_pct(diff)} [{_pct(low)}, {_pct(high)}] at {100 * level:.1f}%, {len(rs)} seed pairs{at}"
    head = {BETTER: "better", WORSE: "worse", SAME: f"the same within ±{100 * spec.delta:g}%",
            UNSETTLED: "unsettled"}[answer]
    return Answer(answer, diff, low, high, level, len(rs), len(rs), PAIRED, f"{head}: {span}", budget,
                  float(len(rs) - 1))
