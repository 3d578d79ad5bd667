"""The settle loop, ``ltfm sweep FILE --settle``: after the queued rows, each worker reads what the study's runs
say, asks the planner (:func:`lightning_tfm.findings.settle.plan`) what would answer every row at the least
compute, queues those trials in the same study and runs them, until every row is answered or at its cap (the sweep
file's ``settle:``, :class:`~lightning_tfm.findings.settings.SettleSpec`).

- **What the planner reads** (:func:`row_runs`): every row's completed trials of this sweep's definition, as
  :class:`~lightning_tfm.findings.settle.RowRuns`: its dev log-PPL (``dev_loss``) per budget multiple and seed (a
  run read at each multiple's steps through :mod:`.budget`, as every reader of a sweep reads it), the curve of each
  seed's longest run, and one run's training FLOPs at the row's budget (:func:`~.plan.flops_per_step` x steps).
- **What it asks** (:class:`~lightning_tfm.findings.settle.Action`): a (variant, seed, budget multiple m) trial.
  It is the row's own :class:`~.spec.Entry` at budget ``row budget x m``, so its ``grid_key`` (which holds the
  steps) names it, the queue's duplicate check and :func:`~.queue.enqueue_missing` never queue it twice, and its run
  id is the row's seed's (run ids do not depend on ``train.max_steps``): a trial of m > 1 continues that run from its
  last checkpoint, and the shorter trial's result stays readable at its budget (:mod:`.budget`). The trial carries
  :data:`MULTIPLE` and :data:`WHY`.
- **Many workers** compute the same plan from the same trials (the planner is deterministic, new seeds are the next
  integers a row has not used) and queue under the study's queue lock (:func:`enqueue`): each trial once. A worker
  runs the settle trials of its own sweep definition (their keys rebuilt from their attributes), whoever queued them.
- **Resumable**: the trials are the study's; a loop killed and run again finds what it queued and goes on. A trial
  that failed is queued again once per worker process (then its row waits, and the loop stops saying so).
- **The hours cap** counts the wall time settle trials ran (the union of their intervals, so K workers at once count
  once, and time with no worker counts not at all): :func:`hours_spent`.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections import Counter
from dataclasses import dataclass

from ..base.errors import UserError
from ..findings.answers import UNSETTLED
from ..findings.settings import SettleSpec
from ..training.runs.results import DEV_LOSS, read_metrics
from .budget import cut_history, folder_at_budget
from .plan import Plan, flops_per_step, sentence_lengths
from .queue import NOT_AGAIN, add_waiting, dashboard_space
from .spec import Entry, Sweep
from .storage import queue_lock, retry

#: The row every other is answered against
BASE = "base"
#: The user attribute of a trial the settle loop queued: its budget multiple of the row's budget (1.0: a new seed at
#: the sweep's budget); a trial of the sweep file's own rows has none (multiple 1)
MULTIPLE = "settle_multiple"
#: ... and why the planner asked for it (one line, for --status)
WHY = "settle_why"


def refusal(sweep: Sweep) -> str | None:
    """Why ``--settle`` cannot settle this sweep (one line), or None."""
    if sweep.mode != "variants":
        return (f"--settle answers each row of a variants sweep against its base; {sweep.path} is a search (space:): "
                "leave --settle out")
    if BASE not in sweep.variants:
        return f"--settle answers each row against the row named {BASE}; {sweep.path} has none: add a {BASE} row"
    if len(sweep.variants) < 2:
        return f"--settle answers rows against the {BASE}; {sweep.path} has no other row"
    return None


def spec_of(sweep: Sweep) -> SettleSpec:
    return SettleSpec(**sweep.settle)


def entry_of(sweep: Sweep, variant: str, seed: int, multiple: float) -> Entry:
    """The trial of row ``variant`` at ``seed`` trained to ``multiple`` x the row's budget."""
    v = sweep.variants[variant]
    return Entry(variant, v["family"], int(seed), v["overrides"], v["budget"] * float(multiple))


def multiple_of(trial) -> float:
    """A trial's budget multiple of its row's budget: :data:`MULTIPLE`, 1 for a trial of the file's own rows."""
    return float(trial.user_attrs.get(MULTIPLE, 1.0))


def own_key(plan: Plan, trial) -> str | None:
    """The trial's ``grid_key`` if it is a trial of this plan's rows (its variant, seed and multiple rebuilt with
    this sweep file's definition give the same key: the same overrides, budget and steps), else None."""
    sweep, attrs = plan.sweep, trial.user_attrs
    if attrs.get("variant") not in (sweep.variants or {}) or attrs.get("seed") is None:
        return None
    try:
        key = plan.grid_key(entry_of(sweep, attrs["variant"], attrs["seed"], multiple_of(trial)))
    except (UserError, TypeError, ValueError):
        return None
    return key if key == attrs.get("grid_key") else None


def settle_entries(plan: Plan, trials) -> list[Entry]:
    """The entries of the trials the settle loop queued in the study for this plan's rows, each once."""
    out = {}
    for t in trials:
        if MULTIPLE in t.user_attrs and (key := own_key(plan, t)) is not None:
            a = t.user_attrs
            out.setdefault(key, entry_of(plan.sweep, a["variant"], a["seed"], multiple_of(t)))
    return list(out.values())


# --------------------------------------------------------------------------------------------- what the runs say
@dataclass
class SeedRun:
    """One (row, seed) run as the study knows it: its completed trials' multiples and the dev log-PPL each read."""
    run_dir: str
    values: dict[float, float]          # budget multiple -> dev log-PPL at its steps (completed trials)
    steps: dict[float, int]             # budget multiple -> its steps

    @property
    def longest(self) -> float:
        return max(self.values)


def seed_runs(plan: Plan, trials) -> dict[str, dict[int, SeedRun]]:
    """Each row's completed runs of this plan's definition: variant -> seed -> :class:`SeedRun`."""
    out: dict[str, dict[int, SeedRun]] = {}
    for t in trials:
        a = t.user_attrs
        if t.state.name != "COMPLETE" or not a.get("run_dir") or own_key(plan, t) is None:
            continue
        value = _dev_loss(a)
        if value is None:
            continue
        run = out.setdefault(a["variant"], {}).setdefault(int(a["seed"]), SeedRun(a["run_dir"], {}, {}))
        m = multiple_of(t)
        run.values[m], run.steps[m] = value, int(a["max_steps"])
    return out


def _dev_loss(attrs: dict) -> float | None:
    v = attrs.get("dev_loss")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _curve(run: SeedRun) -> dict[int, float]:
    """The dev log-PPL at each validation of the run's longest completed trial, ``{step: nats}`` (Lightning's
    steps, as the verdict's curves are read), up to that trial's budget."""
    try:
        history = read_metrics(run.run_dir)
    except (OSError, ValueError):
        return {}
    kept, _ = cut_history(history, run.steps[run.longest])
    return {int(h["step"]): float(h[DEV_LOSS]) for h in kept
            if isinstance(h.get(DEV_LOSS), float) and math.isfinite(h[DEV_LOSS])}


def _read_at(run: SeedRun, steps: int) -> float | None:
    """The run's dev log-PPL at ``steps`` (a budget no trial of it stopped at, below its longest): its curve's
    validation there, through :mod:`.budget`; None when the folder cannot say."""
    read = folder_at_budget(run.run_dir, steps)
    if read is None or read.summary.get("status") != "completed":
        return None
    return _dev_loss(read.summary)


def row_facts(plan: Plan, variant: str) -> tuple[float, int, int]:
    """What the planner needs of a row's config: (training FLOPs of one run at its budget (multiple 1): FLOPs per
    step x steps; the last step of that budget, as Lightning counts them; its train.warmup)."""
    entry = entry_of(plan.sweep, variant, 1, 1.0)
    cfg, steps = plan.config(entry), plan.max_steps(entry)
    return flops_per_step(cfg, sentence_lengths(plan.sweep)) * steps, steps - 1, int(cfg.train.warmup)


def row_runs(plan: Plan, runs: dict[str, dict[int, SeedRun]], facts: dict[str, tuple] | None = None) -> dict:
    """What the planner reads: variant -> :class:`~lightning_tfm.findings.settle.RowRuns`, the rows with a
    completed run. Each seed's value at every budget multiple the study holds for any row, up to its longest run
    (a multiple no trial of it stopped at is read from its curve); ``facts``: :func:`row_facts` of each row, kept
    by a caller that asks again."""
    from ..findings.settle import RowRuns

    facts = {} if facts is None else facts
    multiples = sorted({m for by_seed in runs.values() for run in by_seed.values() for m in run.values})
    out = {}
    for variant, by_seed in runs.items():
        values: dict[float, dict[int, float]] = {}
        for seed, run in sorted(by_seed.items()):
            for m in multiples:
                if m > run.longest:
                    break
                v = run.values.get(m)
                if v is None:
                    v = _read_at(run, plan.max_steps(entry_of(plan.sweep, variant, seed, m)))
                if v is not None:
                    values.setdefault(m, {})[seed] = v
        if variant not in facts:
            facts[variant] = row_facts(plan, variant)
        cost, budget_step, warmup = facts[variant]
        out[variant] = RowRuns(variant, values, {seed: _curve(run) for seed, run in sorted(by_seed.items())},
                               cost, budget_step, warmup)
    return out


def hours_spent(plan: Plan, trials, now: _dt.datetime | None = None) -> float:
    """Wall hours the settle trials ran: the union of their [start, end] (now while one runs)."""
    now = now or _dt.datetime.now()
    spans = sorted((t.datetime_start, t.datetime_complete or now) for t in trials
                   if MULTIPLE in t.user_attrs and t.datetime_start is not None and t.state.name != "WAITING"
                   and own_key(plan, t) is not None)
    total, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            total += (b - a).total_seconds()
            end = b
        elif b > end:
            total += (b - end).total_seconds()
            end = b
    return total / 3600


@dataclass
class Reading:
    """The planner's answer on the study as it stands, with what it was computed from."""
    plan: object                        # findings.settle.Plan
    runs: dict[str, dict[int, SeedRun]]
    rows: dict                          # variant -> RowRuns
    hours: float


def read(plan: Plan, trials, facts: dict[str, tuple] | None = None) -> Reading | None:
    """:func:`lightning_tfm.findings.settle.plan` on the study's trials; None without a completed base."""
    from ..findings import settle

    runs = seed_runs(plan, trials)
    if BASE not in runs:
        return None
    rows = row_runs(plan, runs, facts)
    hours = hours_spent(plan, trials)
    return Reading(settle.plan(rows, BASE, spec_of(plan.sweep), hours_spent=hours), runs, rows, hours)


# --------------------------------------------------------------------------------------------------- the queue
def enqueue(study, plan: Plan, actions, again: set[str]) -> tuple[int, set[str]]:
    """Queue ``actions`` (the planner's) as WAITING trials under the study's queue lock, each once: an action whose
    trial is live or done is not queued again, nor one whose trial failed unless its key is in ``again`` (then it is
    taken out: once per worker process). Returns (trials added, the actions' keys)."""
    from optuna.trial import TrialState

    keys = set()
    added = 0
    with queue_lock(study._storage, plan.sweep.name):
        by_key: dict[str, list] = {}
        for t in retry(study.get_trials, deepcopy=False):
            by_key.setdefault(t.user_attrs.get("grid_key"), []).append(t)
        space = dashboard_space(plan)
        for a in actions:
            entry = entry_of(plan.sweep, a.variant, a.seed, a.budget)
            key = plan.grid_key(entry)
            trials = by_key.get(key, [])
            if key in keys or any(t.state != TrialState.FAIL for t in trials) or \
                    any(t.user_attrs.get("skip") in NOT_AGAIN for t in trials):
                keys.add(key)  # an action listed twice is queued once
                continue
            keys.add(key)
            if trials and key not in again:
                continue
            again.discard(key)
            add_waiting(study, plan, entry, space, **{MULTIPLE: float(a.budget), WHY: a.why})
            added += 1
    return added, keys


def label(a) -> str:
    return f"{a.variant} seed {a.seed}" + (f" to {a.budget:g}x" if a.budget != 1 else "")


class Settler:
    """A worker's settle passes (:meth:`next_pass`), called when it has nothing left to claim or wait for."""

    def __init__(self, worker):
        self.worker = worker
        self.passes = 0
        self.again: set[str] | None = None  # keys of failed trials this process may queue once more
        self.facts: dict[str, tuple] = {}  # row_facts of each row

    def next_pass(self) -> bool:
        """Read the study, plan, queue the plan's trials. True when this worker has trials of its own waiting or
        running (the loop goes on), False when every row is answered or at its cap, or nothing more can run."""
        from optuna.trial import TrialState

        w = self.worker
        trials = retry(w.study.get_trials, deepcopy=False)
        if self.again is None:  # the first pass of this process: failed settle trials may run once more
            self.again = {t.user_attrs.get("grid_key") for t in trials if t.state == TrialState.FAIL}
        # the settle trials of this sweep's definition are this worker's to run, whoever queued them
        mine = {k for t in trials if MULTIPLE in t.user_attrs and (k := own_key(w.plan, t)) is not None}
        reading = read(w.plan, trials, self.facts)
        if reading is None:
            w.say("settle: no completed run of the base: nothing to answer the rows against")
            return False
        p = reading.plan
        if p.done:
            w.say(f"settle: done after {self.passes} pass(es) here: every row answered or at its cap")
            return False
        added, keys = enqueue(w.study, w.plan, p.actions, self.again)
        w.keys |= mine | keys
        self.passes += 1
        if added:
            asked = ", ".join(f"{label(a)} ({a.why})" for a in p.actions)
            w.say(f"settle pass {self.passes}: queued {added} trial(s): {asked}")
        trials = retry(w.study.get_trials, deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        if any(t.user_attrs.get("grid_key") in w.keys for t in trials):
            return True
        stuck = "; ".join(f"{r}: {why}" for r, why in sorted(p.waiting.items())) or "no action"
        w.say(f"settle: stopped: the plan asks for trials the study holds already, finished without a value (failed, "
              f"or their run folders unreadable: see --status): {stuck}; the same command runs a failed one once more")
        return False


# ---------------------------------------------------------------------------------------------- what it says
def took(reading: Reading, variant: str) -> tuple[int, float, float]:
    """What a row's answer took: (seeds, the longest budget multiple, training FLOPs of its runs)."""
    by_seed = reading.runs.get(variant, {})
    cost = reading.rows[variant].cost if variant in reading.rows else 0.0
    longest = max((r.longest for r in by_seed.values()), default=0.0)
    return len(by_seed), longest, sum(cost * r.longest for r in by_seed.values())


def cap_cost(reading: Reading, sweep: Sweep) -> float:
    """The training FLOPs of every row at its cap, as the report counts them
    (:func:`lightning_tfm.report.table3.answers.add_answers`): ``settle.seeds`` seeds a row and the base's seeds
    its rows can reach (its own if more), each trained to ``settle.budget`` x its budget."""
    s = spec_of(sweep)
    total = 0.0
    for variant, rows in reading.rows.items():
        have = len(reading.runs.get(variant, {}))
        total += rows.cost * s.budget * (max(have, min(s.seeds, s.base_seeds)) if variant == BASE else s.seeds)
    return total


def summary_lines(sweep: Sweep, reading: Reading | None) -> list[str]:
    """The loop's closing lines: one a row (its answer, what it took) and the counts with the compute spent,
    against every row at the cap."""
    if reading is None:
        return [f"[{sweep.name}] settle: no completed run of the base: no row answered"]
    p, lines = reading.plan, []
    width = max(map(len, p.answers), default=0)
    for variant, a in p.answers.items():
        seeds, longest, flops = took(reading, variant)
        wait = waits(p.waiting.get(variant)) if a.answer == UNSETTLED else ""
        lines.append(f"[{sweep.name}] {variant:<{width}}  {a.why} (took {seeds} seed(s) to {longest:g}x, "
                     f"{flops:.3g} FLOPs{wait})")
    for variant in sweep.variants:
        if variant != BASE and variant not in p.answers:
            lines.append(f"[{sweep.name}] {variant:<{width}}  not answered: no completed run (failed or skipped: see "
                         "--status)")
    bseeds, blong, _ = took(reading, BASE)
    spent = sum(took(reading, v)[2] for v in reading.rows)
    cap = cap_cost(reading, sweep)
    counts = Counter(a.answer for a in p.answers.values())
    said = ", ".join(f"{counts[k]} {k}" for k in sorted(counts, key=lambda k: (k == UNSETTLED, k)))
    lines.append(f"[{sweep.name}] settled {len(p.answers) - counts[UNSETTLED]} of {len(p.answers)} rows ({said}); "
                 f"base {bseeds} seed(s) to {blong:g}x; compute {spent:.3g} training FLOPs, "
                 f"{spent / cap:.0%} of every row at the cap ({cap:.3g})" + ("" if p.done else
                                                                           "; not done: run the same command again"))
    return lines


def waits(waiting: str | None) -> str:
    """What an unanswered row waits for, as the end of its line: "; waits for another seed of the row", or
    "; at its cap: 3 seeds" where the loop has nothing left to try for it; "" for a row that waits for nothing."""
    if not waiting:
        return ""
    return f"; {waiting}" if waiting.startswith("at its cap") else f"; waits for {waiting}"


def row_answers(reading: Reading | None) -> dict[str, dict]:
    """Each row's answer and what it waits for, for --status and the launcher: variant -> {"answer", "why",
    "waiting"}; the base and rows without a completed run absent."""
    if reading is None:
        return {}
    p = reading.plan
    return {v: {**dataclasses.asdict(a), "waiting": p.waiting.get(v)} for v, a in p.answers.items()}
