"""The settle loop's planner: after each pass, each row's answer (:mod:`.answers`) and, for every row without one,
the trials that answer it at the least compute within the caps of the sweep file's ``settle:`` section
(:class:`.settings.SettleSpec`). Pure numerics: ``ltfm sweep FILE --settle`` enqueues the :class:`Action` list,
``--status`` shows :attr:`Plan.waiting`, the report and the replay (``ltfm report ... --settle-replay``) read the
answers.

**A row's answer** (:func:`judge`) is the first decisive one over the designated looks in their order (budget 1 x,
then the cap; the row's seeds from 2 up: :func:`.answers.looks`); without one, the answer at the highest budget
the row has runs at (unsettled). Once answered, a row gets no more trials.

**The options of an unanswered row** (:func:`options`): for each budget multiple ``L`` it may be judged at (not
below the highest it has runs at) and each seed count ``n`` from 2 to ``seeds``: bring the row to ``n`` seeds at
``L`` (continuing its runs that stopped at a lower multiple, then new seeds) and the base to ``base_seeds`` seeds
at ``L`` (likewise). Each option's compute: the rows' runs x their FLOPs per run (:attr:`RowRuns.cost` x the
budget multiples trained), plus the base's runs shared by the rows that wait for them.

**The choice** is plug-in: the cheapest option at which the interval would decide (exclude zero, or fit inside
±log(1 + delta)) if today's numbers were the truth: the difference measured at ``L`` (or, before any run reached
``L``, the mean of each side's fitted learning curves at ``L`` x its budget: :mod:`.curves`), the row's seed sd
(the base's while the row has one seed) and the base's, at the look's level (:func:`.answers.look_level`). A row
no option answers is *at its cap* (no trial: further seeds would not answer it if today's numbers hold), except
that a row with one seed always gets its second (its own noise is measured before it is given up). Ties go to the
lower budget, then the fewer seeds. New seeds are the next integers the row (or the base) has not used, from 1
up, so that two workers computing the plan at once ask for the same trials. Deterministic: the same inputs give
the same :class:`Plan`.

**The caps**: ``seeds`` a row, ``base_seeds`` of the base, the budget multiple ``budget``, and ``hours``: once
``hours_spent`` reaches it, no more trials (every unanswered row at its cap).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from scipy import stats

from .answers import Answer, answer_row, levels, look_level, same_bound
from .curves import fit_curve
from .settings import SettleSpec
from .verdict import later_step, mean_std


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


@dataclass(frozen=True)
class Option:
    """Bring a row to ``seeds`` seeds at ``level`` (and the base to its cap there): its runs and compute."""
    level: float
    seeds: int
    runs: tuple[tuple[int, float], ...]       # (seed, multiple) of the row's trials
    base_runs: tuple[tuple[int, float], ...]  # the base's
    cost: float                               # the row's runs' compute (FLOPs)
    base_cost: float                          # the base's runs' compute, before it is shared
    decides: bool                             # the plug-in says the interval at that look decides


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


def predicted_diff(row: RowRuns, base: RowRuns, level: float) -> float | None:
    """Today's difference at ``level`` if both sides have runs there, else the fitted curves' at ``level`` x the
    budget, else the difference at the highest multiple both have; None without runs."""
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


def half_width(sd_row: float, n: int, sd_base: float, m: int, level: float) -> float:
    """Welch's half-width at ``level`` of ``n`` row seeds and ``m`` base seeds of sds ``sd_row``, ``sd_base``."""
    vr, vb = sd_row ** 2 / n, sd_base ** 2 / m
    if vr + vb == 0:
        return 0.0
    df = (vr + vb) ** 2 / (vr ** 2 / (n - 1) + vb ** 2 / (m - 1))
    return float(stats.t.ppf((1 + level) / 2, df)) * math.sqrt(vr + vb)


def options(row: RowRuns, base: RowRuns, spec: SettleSpec) -> list[Option]:
    """Every option of an unanswered row within the caps (the module docstring), cheapest first."""
    out, lvl = [], look_level(spec)
    for level in levels(spec):
        if level < row.top():
            continue
        d = predicted_diff(row, base, level)
        sd_b = _sd(base, level)
        sd_r = _sd(row, level)
        sd_r = sd_b if sd_r is None else sd_r
        base_runs = tuple(trials_to(base, level, spec.base_seeds))
        base_cost = sum(m for _, m in base_runs) * base.cost
        for n in range(max(2, len(row.seeds_at(level))), spec.seeds + 1):
            runs = tuple(trials_to(row, level, n))
            if not runs and not base_runs:
                continue  # this look is taken: judged already
            decides = False
            if d is not None and sd_b is not None:
                h = half_width(sd_r, n, sd_b, spec.base_seeds, lvl)
                decides = abs(d) > h or abs(d) + h < same_bound(spec.delta)
            out.append(Option(level, n, runs, base_runs, sum(m for _, m in runs) * row.cost, base_cost, decides))
    return out


def _waits(opt: Option, row: RowRuns, base: RowRuns, spec: SettleSpec) -> str:
    parts = []
    if opt.runs:
        parts.append(f"{len(opt.runs)} more seed(s) to {opt.seeds}" if opt.level == row.top() or not row.values
                     else f"budget {opt.level:g}x ({opt.seeds} seeds)")
    if opt.base_runs:
        parts.append(f"the base's seeds at {opt.level:g}x ({len(base.seeds_at(opt.level))} of {spec.base_seeds})")
    return ", ".join(parts)


def plan(rows: dict[str, RowRuns], base: str, spec: SettleSpec, *, hours_spent: float = 0.0) -> Plan:
    """The next pass (the module docstring): every row's answer, the trials to run, what each row waits for."""
    b = rows[base]
    answers = {name: judge(r, b, spec) for name, r in sorted(rows.items()) if name != base}
    open_rows = [name for name, a in answers.items() if not a.answered]
    waiting, chosen = {}, {}
    out_of_time = spec.hours is not None and hours_spent >= spec.hours
    for name in open_rows:
        if out_of_time:
            waiting[name] = f"at its cap: {spec.hours:g} hours spent"
            continue
        opts = options(rows[name], b, spec)
        share = max(1, len(open_rows))
        opts.sort(key=lambda o: (o.cost + o.base_cost / share, o.level, o.seeds))
        pick = next((o for o in opts if o.decides), None)
        if pick is None and len(rows[name].used()) <= 1 and opts:
            pick = opts[0]  # one seed: its own noise is measured before it is given up
        if pick is None:
            cap = ("its seeds, base seeds and budget at the caps" if not opts else
                   f"no look within the caps answers {answers[name].why.split(':')[0]} if today's numbers hold")
            waiting[name] = f"at its cap: {cap}"
            continue
        chosen[name] = pick
        waiting[name] = _waits(pick, rows[name], b, spec)
    actions, seen = [], set()
    for name, opt in chosen.items():
        for seed, m in opt.runs:
            actions.append(Action(name, seed, opt.level, f"{name}: {waiting[name]}"))
        for seed, m in opt.base_runs:
            if (seed, opt.level) not in seen:
                seen.add((seed, opt.level))
                actions.append(Action(base, seed, opt.level, f"the base to {spec.base_seeds} seeds at "
                                                             f"{opt.level:g}x (every row's answer)"))
    actions.sort(key=lambda a: (a.variant != base, a.variant, a.budget, a.seed))
    return Plan(answers, actions, waiting, done=not actions)

