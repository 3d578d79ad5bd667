"""The settle loop's planner: after each pass, each row's answer (:mod:`.answers`) and, for every row without one,
the trials that answer it at the least compute within the caps of the sweep file's ``settle:`` section
(:class:`.settings.SettleSpec`). Pure numerics: ``ltfm sweep FILE --settle`` enqueues the :class:`Action` list,
``--status`` shows :attr:`Plan.waiting`, the report and the replay (``ltfm report ... --settle-replay``) read the
answers.

**A row's answer** (:func:`judge`) is the first decisive one over the designated looks in their order (budget 1 x,
then the cap; the row's seeds from 3 up: :func:`.answers.looks`); without one, the answer at the highest budget
the row has runs at (unsettled). Once answered, a row gets no more trials.

**The options of an unanswered row** (:func:`options`): for each budget multiple ``L`` it may be judged at (not
below the highest it has runs at) and each seed count ``n`` of a look: bring the row to ``n`` seeds at ``L``
(continuing its runs that stopped at a lower multiple, then new seeds) and the base to the same seeds at ``L``
(each row seed is paired with the base's: :mod:`.answers`; likewise continued or new). Each option's compute: the
runs x their row's FLOPs per run (:attr:`RowRuns.cost`) x the budget multiples they train, the base's runs shared
by the rows that wait (their compute over the unanswered rows).

**The choice** is plug-in: the cheapest option whose look is more likely than not to decide
(:data:`DECIDE_CHANCE`; :func:`decide_chance`: the chance that its interval excludes zero or fits inside ±log(1 +
delta)) if today's numbers were the truth: the difference measured at ``L`` (or, before any run reached ``L``,
the mean of each side's fitted learning curves at ``L`` x its budget: :mod:`.curves`, so that a crossing the curves
predict to open up by ``L`` is answered by a longer budget rather than by seeds), the sd of a seed's difference
(:func:`pair_sd`: the row's own, else the median of the other rows', else the two sides' sds as if uncorrelated),
at the look's level (:func:`.answers.look_level`). The chance, not today's interval taken as the look's: a row
whose difference lies between the two answers (near ``log(1 + delta) / 2``) has today's interval decide neither
way, yet its look answers one way or the other in most draws (at a seed-difference sd of 0.06 nats and ±20%, 3
seeds decide 73% of the time or more at every true difference: ``tests/test_answers.py``). A row no option
answers is *at its cap* (no trial: more seeds would likely not answer it if today's numbers hold;
:func:`seeds_needed` says what would), but while no row has a seed difference measured, the cheapest unanswered
row gets its cheapest look (its pairs are what the other rows' plug-ins then read), and a row given up may be
taken up again when the other rows' pairs say it can be answered.
Ties go to the lower budget, then the fewer seeds. New seeds are the next integers the row has not used, from 1
up, and the base trains the same seeds, so that two workers computing the plan at once ask for the same trials.
Deterministic: the same inputs give the same :class:`Plan`.

**The caps**: ``seeds`` a row, ``base_seeds`` of the base, the budget multiple ``budget``, and ``hours``: once
``hours_spent`` reaches it, no more trials (every unanswered row at its cap).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special, stats

from .answers import FIRST_LOOK, Answer, answer_row, levels, look_level, paired_half_width, same_bound
from .curves import fit_curve
from .noise import mean_std
from .settings import SettleSpec
from .verdict import later_step


@dataclass(frozen=True)
class Action:
    """One trial the loop asks for: train ``variant`` at ``seed`` to ``budget`` x its budget (a run of that seed
    stopped at a lower multiple is continued)."""
    variant: str
    seed: int
    budget: float
    why: str


@dataclass
class RowRuns:
    """What a row's completed runs say, as the planner reads it."""
    variant: str
    values: dict[float, dict[int, float]]   # budget multiple -> seed -> dev log-PPL at that budget (completed runs;
                                            # a run trained to 3x has its value at 1x too)
    curves: dict[int, dict[int, float]] = field(default_factory=dict)  # seed -> {step: dev log-PPL}, its longest run
    cost: float = 1.0                       # compute of one run at budget 1 (training FLOPs)
    budget_step: int | None = None          # the last step of budget 1 (599 for 600 updates); None: no curves read
    warmup: int = 0                         # the steps before a curve fit reads the curve (train.warmup)

    def seeds_at(self, level: float) -> dict[int, float]:
        return self.values.get(level, {})

    def top(self) -> float:
        """The highest budget multiple the row has a run at (1 without runs)."""
        return max((lv for lv, v in self.values.items() if v), default=1.0)

    def reached(self, seed: int) -> float:
        """The highest budget multiple ``seed`` has a value at (0: none)."""
        return max((lv for lv, v in self.values.items() if seed in v), default=0.0)

    def used(self) -> set[int]:
        return {s for v in self.values.values() for s in v} | set(self.curves)


@dataclass
class Plan:
    """The planner's answer after a pass (the module docstring)."""
    answers: dict[str, Answer]              # every row but the base, at the budget multiple it is judged at
    actions: list[Action]                   # the trials to run next (the same inputs, the same list)
    waiting: dict[str, str]                 # an unanswered row -> what it waits for, one line
    done: bool                              # every row answered or at its cap
    needs: dict[str, list[Action]] = field(default_factory=dict)  # an unanswered row -> the trials its next look
                                            # needs (its own and the base's; the base's shared with other rows)


@dataclass(frozen=True)
class Option:
    """Bring a row to ``seeds`` seeds at ``level`` (and the base to its cap there): its runs and compute."""
    level: float
    seeds: int
    runs: tuple[tuple[int, float], ...]       # (seed, multiple) of the row's trials
    base_runs: tuple[tuple[int, float], ...]  # the base's
    cost: float                               # the row's runs' compute (FLOPs)
    base_cost: float                          # the base's runs' compute, before it is shared
    chance: float                             # the plug-in chance that the look decides (:func:`decide_chance`)

    @property
    def decides(self) -> bool:
        return self.chance >= DECIDE_CHANCE


def judge(row: RowRuns, base: RowRuns, spec: SettleSpec) -> Answer:
    """The row's answer (the module docstring): the first decisive look, else the one at its highest budget."""
    last = None
    for level in levels(spec):
        a = answer_row(row.seeds_at(level), base.seeds_at(level), spec, level)
        if a.answered:
            return a
        if row.seeds_at(level) or last is None:
            last = a
    return last


def _next_seeds(runs: RowRuns, n: int) -> list[int]:
    used, out, s = runs.used(), [], 1
    while len(out) < n:
        if s not in used:
            out.append(s)
        s += 1
    return out


def trials_to(runs: RowRuns, level: float, n: int) -> list[tuple[int, float]]:
    """The trials that give ``runs`` ``n`` seeds at ``level``: its seeds that stopped below ``level`` (the longest
    first, then the smallest seed), continued; then new seeds. Each with the compute multiple it trains: ``(seed,
    budget multiples trained)``."""
    have = runs.seeds_at(level)
    if len(have) >= n:
        return []
    below = sorted((s for s in runs.used() if s not in have and runs.reached(s) > 0),
                   key=lambda s: (-runs.reached(s), s))
    picks = [(s, level - runs.reached(s)) for s in below[:n - len(have)]]
    picks += [(s, level) for s in _next_seeds(runs, n - len(have) - len(picks))]
    return picks


def _pairs(row: RowRuns, base: RowRuns, level: float) -> list[float]:
    r, b = row.seeds_at(level), base.seeds_at(level)
    return [r[s] - b[s] for s in sorted(set(r) & set(b))]


def predicted_diff(row: RowRuns, base: RowRuns, level: float) -> float | None:
    """Today's difference at ``level``: the mean over the seeds both sides have there, else the difference of the
    sides' means there, else the fitted curves' at ``level`` x each side's budget, else the difference at the
    highest multiple both have; None without runs."""
    pairs = _pairs(row, base, level)
    if pairs:
        return mean_std(pairs)[0]
    r, b = row.seeds_at(level), base.seeds_at(level)
    if r and b:
        return mean_std(list(r.values()))[0] - mean_std(list(b.values()))[0]
    if row.budget_step is not None and base.budget_step is not None:
        sides = []
        for side in (row, base):
            step = later_step(side.budget_step, level)
            fits = [fit_curve(sorted(c), [c[s] for s in sorted(c)], warmup=side.warmup) for c in side.curves.values()]
            preds = [float(f.predict([step])[0]) for f in fits if f is not None]
            sides.append(sum(preds) / len(preds) if preds else None)
        if None not in sides:
            return sides[0] - sides[1]
    for lv in sorted({*row.values, *base.values}, reverse=True):
        r, b = row.seeds_at(lv), base.seeds_at(lv)
        if r and b:
            return mean_std(list(r.values()))[0] - mean_std(list(b.values()))[0]
    return None


def _sd(runs: RowRuns, level: float) -> float | None:
    """A side's seed sd at ``level``, else at the highest multiple with two seeds."""
    for lv in [level, *sorted(runs.values, reverse=True)]:
        v = list(runs.seeds_at(lv).values())
        if len(v) >= 2:
            return mean_std(v)[1]
    return None


def pair_sd(row: RowRuns, base: RowRuns, level: float, pooled: float | None = None) -> float | None:
    """The plug-in sd of a seed's difference row - base: measured over the row's pairs at ``level`` (else at the
    highest multiple with two pairs); without two pairs, ``pooled`` (the other rows' median, :func:`pooled_sd`);
    without it, the sides' sds as if uncorrelated (the row's, else the base's, for both: the pairs measured on the
    committed rows correlate positively, so this guess errs long)."""
    for lv in [level, *sorted(row.values, reverse=True)]:
        pairs = _pairs(row, base, lv)
        if len(pairs) >= 2:
            return mean_std(pairs)[1]
    if pooled is not None:
        return pooled
    sd_b = _sd(base, level)
    sd_r = _sd(row, level)
    if sd_b is None and sd_r is None:
        return None
    sd_r = sd_b if sd_r is None else sd_r
    sd_b = sd_r if sd_b is None else sd_b
    return (sd_r ** 2 + sd_b ** 2) ** 0.5


def pooled_sd(rows: dict[str, RowRuns], base: str, level: float) -> float | None:
    """The median over the rows with two pairs or more at ``level`` of their seed differences' sd: the plug-in of
    a row that has none yet (None without such a row)."""
    sds = [mean_std(p)[1] for name, r in rows.items() if name != base
           for p in [_pairs(r, rows[base], level)] if len(p) >= 2]
    return float(np.median(sds)) if sds else None


DECIDE_CHANCE = 0.5  # a look is chosen when it decides more likely than not (the module docstring)
_QUANTILES = 400     # the sd's distribution read at this many equal-probability points (decide_chance)


@functools.lru_cache(maxsize=4096)
def decide_chance(d: float, sd: float, n: int, level: float, delta: float) -> float:
    """The chance that the look at ``n`` paired seeds decides (its central ``level`` t interval excludes zero or lies
    inside ±log(1 + delta)) when the seed differences are normal with mean ``d`` and sd ``sd``: the mean ``m`` is
    normal with sd ``sd / sqrt(n)``, independent of the sample sd ``s`` (``s^2 (n-1) / sd^2`` chi-square of ``n -
    1`` df); given ``s``, the look is undecided when ``max(0, B - h) <= |m| <= h`` (``h`` the half-width, ``B`` the
    same-bound). Averaged over the chi-square's quantiles at ``_QUANTILES`` equal-probability points:
    deterministic, so that two workers planning at once choose alike."""
    if sd <= 0:
        return 1.0
    k = n - 1
    q = stats.chi2.ppf((np.arange(_QUANTILES) + 0.5) / _QUANTILES, k)  # s = sd * sqrt(q / k)
    se = sd / math.sqrt(n)
    h = paired_half_width(sd, n, level) * np.sqrt(q / k)
    lo = np.maximum(0.0, same_bound(delta) - h)

    def between(a, b):  # P(a <= |m| <= b)
        return (special.ndtr((b - d) / se) - special.ndtr((a - d) / se)
                + special.ndtr((-a - d) / se) - special.ndtr((-b - d) / se))

    undecided = np.where(lo < h, between(lo, h), 0.0)
    return float(1.0 - undecided.mean())


def _chance(d: float | None, sd: float | None, n: int, level: float, delta: float) -> float:
    if d is None or sd is None:
        return 0.0
    return decide_chance(round(d, 6), round(sd, 6), n, level, delta)


def options(row: RowRuns, base: RowRuns, spec: SettleSpec, pooled: dict[float, float | None] | None = None
            ) -> list[Option]:
    """Every option of an unanswered row within the caps (the module docstring); ``pooled``: :func:`pooled_sd` at
    each budget multiple."""
    out, lvl = [], look_level(spec)
    most = min(spec.seeds, spec.base_seeds)
    for level in levels(spec):
        if level < row.top():
            continue
        d, sd = predicted_diff(row, base, level), pair_sd(row, base, level, (pooled or {}).get(level))
        for n in range(max(min(FIRST_LOOK, most), len(row.seeds_at(level))), most + 1):
            runs = tuple(trials_to(row, level, n))
            seeds = sorted([*row.seeds_at(level), *(s for s, _ in runs)])[:n]
            base_runs = tuple((s, level - base.reached(s)) for s in seeds if s not in base.seeds_at(level))
            if not runs and not base_runs:
                continue  # this look is taken: judged already
            out.append(Option(level, n, runs, base_runs, sum(m for _, m in runs) * row.cost,
                              sum(m for _, m in base_runs) * base.cost, _chance(d, sd, n, lvl, spec.delta)))
    return out


def _waits(opt: Option, row: RowRuns, base: RowRuns, spec: SettleSpec) -> str:
    parts = []
    if opt.runs:
        parts.append(f"{len(opt.runs)} more seed(s) to {opt.seeds}" if opt.level == row.top() or not row.values
                     else f"budget {opt.level:g}x ({opt.seeds} seeds)")
    if opt.base_runs:
        parts.append(f"the base's seed(s) {', '.join(str(s) for s, _ in opt.base_runs)} at {opt.level:g}x")
    return ", ".join(parts)


def plan(rows: dict[str, RowRuns], base: str, spec: SettleSpec, *, hours_spent: float = 0.0) -> Plan:
    """The next pass (the module docstring): every row's answer, the trials to run, what each row waits for."""
    b = rows[base]
    answers = {name: judge(r, b, spec) for name, r in sorted(rows.items()) if name != base}
    open_rows = [name for name, a in answers.items() if not a.answered]
    waiting, chosen = {}, {}
    out_of_time = spec.hours is not None and hours_spent >= spec.hours
    pooled = {level: pooled_sd(rows, base, level) for level in levels(spec)}
    # nothing measured of a seed's difference yet: the cheapest open row is looked at, to measure it
    scout = (min(open_rows, key=lambda n: (rows[n].cost, n))
             if open_rows and all(v is None for v in pooled.values()) else None)
    for name in open_rows:
        if out_of_time:
            waiting[name] = f"at its cap: {spec.hours:g} hours spent"
            continue
        opts = options(rows[name], b, spec, pooled)
        share = max(1, len(open_rows))
        opts.sort(key=lambda o: (o.cost + o.base_cost / share, o.level, o.seeds))
        pick = next((o for o in opts if o.decides), opts[0] if name == scout and opts else None)
        if pick is None:
            cap = ("its seeds, base seeds and budget at the caps" if not opts else
                   "no look within the caps would answer it if today's numbers held")
            waiting[name] = f"at its cap: {cap}"
            continue
        chosen[name] = pick
        waiting[name] = _waits(pick, rows[name], b, spec)
    needs = {name: [Action(name, seed, opt.level, f"{name}: {waiting[name]}") for seed, _ in opt.runs]
             + [Action(base, seed, opt.level, f"the base's seed {seed} at {opt.level:g}x (pairs of the rows' seed "
                                              f"{seed})") for seed, _ in opt.base_runs]
             for name, opt in chosen.items()}
    actions = sorted({a for need in needs.values() for a in need}, key=lambda a: (a.variant != base, a.variant,
                                                                                  a.budget, a.seed))
    return Plan(answers, actions, waiting, done=not actions, needs=needs)


def seeds_needed(row: RowRuns, base: RowRuns, spec: SettleSpec, level: float = 1.0, most: int = 30) -> int | None:
    """What it would take: the least seeds a row (:data:`.answers.FIRST_LOOK` to ``most``, the caps raised to it,
    and so the looks' correction with them) at which the plug-in look at ``level`` decides more likely than not
    (the module docstring); None by ``most`` or without numbers."""
    d, sd = predicted_diff(row, base, level), pair_sd(row, base, level)
    if d is None or sd is None:
        return None
    for n in range(min(FIRST_LOOK, most), most + 1):
        wider = dataclasses.replace(spec, seeds=n, base_seeds=max(n, spec.base_seeds))
        if _chance(d, sd, n, look_level(wider), spec.delta) >= DECIDE_CHANCE:
            return n
    return None
