"""The settle loop replayed on committed exports, offline: ``ltfm report SWEEP --settle-replay EXPORT_DIR
[EXPORT_DIR ...] [--out FILE.md]``.

The runs of the exports stand for the trials the planner (:mod:`lightning_tfm.findings.settle`) asks for: the
loop starts from the first pass of ``SWEEP`` (each row at its seeds in the sweep file, the base at its; at the
sweep's budget, each row's learning curve cut there), asks for its trials, and each trial is answered by a
committed run. Seeds are labels: one relabelling for every row and the base (so that a row's seed and the base's
same seed, a pair of the answers, stay one committed seed): the exports' seeds ordered by how many rows hold them,
then by number (the en->de exports: 1, 3, 4, 2, 5, ..., 9), the planner's seed ``k`` standing for the ``k``-th (its
seed 2 is the exports' seed 3); a run continued to ``L`` x the budget is the committed curve read at step ``L x
(T + 1) - 1``. A trial the exports lack (a seed they do not hold, a curve that stops short) stops its row *at the
cap of the data*, said as such. A run in two exports (the same row and seed) is read from the first export given.

Each export is read with its own sweep file from beside ``SWEEP`` (:func:`.inputs.export.read_export_beside`, as
``--backtest-to`` reads it); the dev
log-PPL is each record's ``dev/loss`` at the step. The compute of a run: its row's training FLOPs per step
(:func:`.table3.compute.flops_per_step`) x the steps it trained.

The settings: the sweep file's ``settle:`` section over :data:`lightning_tfm.findings.settings.SETTLE_DEFAULTS`.
It prints (and writes with ``--out``): each row's answer, the seeds, steps and compute it took; how many rows it
answered at what compute, against the first pass and against every row at the cap; the interval's width Welch
and paired by seed, row by row (the measurement :mod:`lightning_tfm.findings.answers` chose Welch by); and a grid
of settings (:func:`grid`), the measured reason for :data:`lightning_tfm.findings.settings.SETTLE_DEFAULTS`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..base.errors import UserError
from ..findings.answers import ANSWERS, Answer, levels, look_level, looks, one_seed_false_rate, paired, welch
from ..findings.settings import SETTLE_DEFAULTS, SettleSpec
from ..findings.settle import RowRuns, judge, plan, seeds_needed
from ..findings.verdict import later_step
from ..training.runs.results import DEV_LOSS

BASE = "base"
DATA_CAP = "at the cap of the data"
MOST_PASSES = 100  # a replay's passes at most (each pass adds a trial or stops)


@dataclass
class Observed:
    """What the exports hold of one row: each seed's curve ``{step: dev log-PPL}`` and where it came from."""
    variant: str
    curves: dict[int, dict[int, float]]
    source: dict[int, str]
    budget_step: int            # the sweep's budget of the row: its last step (599 for 600 updates)
    cost: float                 # FLOPs of one run at the budget
    warmup: int
    first: list[int]            # the first pass's seeds (the sweep file's)


@dataclass
class ReplayRow:
    """A row's end in the replay."""
    variant: str
    answer: Answer
    seeds: int                   # seeds it trained (any budget)
    steps: int                   # the most steps one of its runs trained
    compute: float               # FLOPs its runs trained (the base's apart)
    end: str                     # "answered", or what stopped it
    stand_in: dict[int, int]     # the planner's seed -> the exports' seed it stood for


@dataclass
class Replay:
    """The replay's result (the module docstring)."""
    spec: SettleSpec
    rows: list[ReplayRow]
    passes: int
    first_pass: float            # FLOPs of the first pass (the rows that have runs, and the base)
    spent: float                 # FLOPs of the first pass and every trial the loop ran
    at_cap: float                # FLOPs of every row and the base at the caps (seeds, base seeds, budget)
    base_compute: float
    absent: list[str] = field(default_factory=list)  # the sweep's rows no export holds
    base_stand: dict[int, int] = field(default_factory=dict)  # the base's planner seed -> committed seed

    @property
    def answered(self) -> int:
        return sum(r.answer.answered for r in self.rows)

    @property
    def data_cap(self) -> int:
        """The rows the exports lacked a trial of (at the cap of the data)."""
        return sum(r.end.startswith(DATA_CAP) for r in self.rows)


def observe(sweep, datas: list) -> tuple[dict[str, Observed], list[str]]:
    """Each row's seeds and curves over the exports (the first export holding a run wins), and the rows of the
    sweep no export holds."""
    from .table3.compute import flops_per_step

    base_steps = _base_steps(sweep)
    out, absent = {}, []
    for v, spec in sweep.variants.items():
        curves, source, recs = {}, {}, []
        for data in datas:
            for r in data.records:
                if r.variant != v or not r.completed or r.seed in curves:
                    continue
                c = {int(h["step"]): float(h[DEV_LOSS]) for h in r.history
                     if isinstance(h.get(DEV_LOSS), (int, float)) and math.isfinite(h[DEV_LOSS])}
                if c:
                    curves[r.seed], source[r.seed] = c, data.sweep.name
                    recs.append(r)
        if not curves:
            absent.append(v)
            continue
        steps = int(round(base_steps * spec["budget"]))
        fps, _ = flops_per_step(recs)
        warm = next((r.config.get("train.warmup") for r in recs if isinstance(r.config.get("train.warmup"), int)), 0)
        first = list(spec.get("seeds") or sweep.seeds)
        out[v] = Observed(v, curves, source, steps - 1, (fps or 1.0) * steps, warm, first)
    if BASE not in out:
        raise UserError("--settle-replay: no export holds a completed base run: every answer is against the base; "
                        "give the export of a sweep that trained it")
    return out, absent


def _base_steps(sweep) -> int:
    steps = sweep.overrides.get("train.max_steps") or (sweep.experiment_tree().get("train") or {}).get("max_steps")
    if not isinstance(steps, int) or steps < 2:
        raise UserError(f"--settle-replay: {sweep.path.name} sets no train.max_steps (its budget): the replay reads "
                        "each curve at the sweep's budget; give the protocol's sweep file")
    return steps


class _Sim:
    """The loop's state: the runs revealed so far, per row (planner seeds), and the compute spent."""

    def __init__(self, obs: dict[str, Observed], spec: SettleSpec):
        self.obs, self.spec = obs, spec
        self.known = {v: RowRuns(v, {}, {}, o.cost, o.budget_step, o.warmup) for v, o in obs.items()}
        self.stand: dict[str, dict[int, int]] = {v: {} for v in obs}
        self.compute = dict.fromkeys(obs, 0.0)
        self.steps = dict.fromkeys(obs, 0)
        held = {}
        for o in obs.values():
            for seed in o.curves:
                held[seed] = held.get(seed, 0) + 1
        self.order = sorted(held, key=lambda seed: (-held[seed], seed))  # the relabelling (the module docstring)

    def _data_seed(self, v: str, seed: int) -> int | None:
        d = self.order[seed - 1] if 0 < seed <= len(self.order) else None
        self.stand[v][seed] = d if d in self.obs[v].curves else None
        return self.stand[v][seed]

    def run(self, v: str, seed: int, level: float) -> bool:
        """Reveal the committed run standing for trial (``v``, ``seed``) to ``level`` x; False if the exports lack
        it."""
        o, known = self.obs[v], self.known[v]
        d = self._data_seed(v, seed)
        end = later_step(o.budget_step, level)
        if d is None or end not in o.curves[d]:
            return False
        curve = o.curves[d]
        before = known.reached(seed)
        for lv in levels(self.spec):
            if lv <= level and later_step(o.budget_step, lv) in curve:
                known.values.setdefault(lv, {})[seed] = curve[later_step(o.budget_step, lv)]
        known.curves[seed] = {s: y for s, y in curve.items() if s <= end}
        self.compute[v] += o.cost * (level - before)
        self.steps[v] = max(self.steps[v], end + 1)
        return True


def replay(obs: dict[str, Observed], spec: SettleSpec, absent: list[str] | None = None) -> Replay:
    """The loop on the committed runs (the module docstring)."""
    sim = _Sim(obs, spec)
    for v, o in obs.items():
        for s in o.first:
            sim.run(v, s, 1.0)
    first = sum(sim.compute.values())
    stopped: dict[str, str] = {}
    passes = 0
    while passes < MOST_PASSES:
        rows = {v: r for v, r in sim.known.items() if v not in stopped}
        p = plan(rows, BASE, spec)
        for v, w in p.waiting.items():
            if v not in p.needs:
                stopped.setdefault(v, w)
        if p.done:
            break
        passes += 1
        lacking = {(a.variant, a.seed, a.budget) for a in p.actions if not sim.run(a.variant, a.seed, a.budget)}
        for v, need in p.needs.items():
            miss = [a for a in need if (a.variant, a.seed, a.budget) in lacking]
            if miss:
                what = ", ".join(f"{a.variant} seed {a.seed} at {a.budget:g}x" for a in miss[:3])
                stopped[v] = f"{DATA_CAP}: the exports lack {what}"
        if lacking and not p.needs:
            break
    base = sim.known[BASE]
    out = []
    for v in sorted(obs):
        if v == BASE:
            continue
        a = judge(sim.known[v], base, spec)
        out.append(ReplayRow(v, a, len(sim.known[v].used()), sim.steps[v], sim.compute[v],
                             "answered" if a.answered else stopped.get(v, "unsettled"),
                             {k: s for k, s in sim.stand[v].items() if s is not None}))
    top = max(levels(spec))
    most = min(spec.seeds, spec.base_seeds)  # the base trains its rows' seeds (pairs)
    at_cap = sum(o.cost * top * (max(len(o.first), most) if v == BASE else spec.seeds) for v, o in obs.items())
    return Replay(spec, out, passes, first, sum(sim.compute.values()), at_cap, sim.compute[BASE], absent or [],
                  {k: s for k, s in sim.stand[BASE].items() if s is not None})


# ---------------------------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Width:
    """A row's interval at one budget from all its committed seeds (up to the cap), Welch's and paired by seed."""
    variant: str
    budget: float
    seeds: int
    welch: tuple[float, float]
    paired: tuple[float, float] | None


def widths(obs: dict[str, Observed], spec: SettleSpec) -> list[Width]:
    """The unpaired interval (Welch's standard error over every committed base seed, Hsu's degrees of freedom) and
    the paired one over the row's seeds, at the looks' level, of every row with two seeds or more (up to the cap
    ``seeds``), at 1 x and 3 x (the measurement :mod:`lightning_tfm.findings.answers` chose by)."""
    level, out = look_level(spec), []
    b = obs[BASE]
    for lv in (1.0, 3.0):
        bvals = {s: c[later_step(b.budget_step, lv)] for s, c in b.curves.items() if later_step(b.budget_step, lv) in c}
        for v, o in sorted(obs.items()):
            step = later_step(o.budget_step, lv)
            rvals = {s: c[step] for s, c in o.curves.items() if step in c}
            rvals = {s: rvals[s] for s in sorted(rvals)[:spec.seeds]}
            if v == BASE or len(rvals) < 2 or len(bvals) < 2:
                continue
            _, lo, hi, _ = welch(list(rvals.values()), list(bvals.values()), level)
            pr = paired(rvals, bvals, level)
            out.append(Width(v, lv, len(rvals), (lo, hi), None if pr is None else (pr[1], pr[2])))
    return out


GRID = {"delta": (0.02, 0.05, 0.1, 0.2), "alpha": (0.05, 0.1, 0.2), "seeds": (2, 3), "budget": (1.0, 3.0)}


def grid(obs: dict[str, Observed], values: dict | None = None) -> list[tuple[SettleSpec, int, int, float]]:
    """The replay at every combination of ``values`` (:data:`GRID`): (settings, rows answered, rows, compute as a
    multiple of the first pass)."""
    import itertools

    values = values or GRID
    out = []
    for combo in itertools.product(*values.values()):
        spec = SettleSpec(**{**SETTLE_DEFAULTS, **dict(zip(values, combo))})
        r = replay(obs, spec)
        out.append((spec, r.answered, len(r.rows), r.spent / r.first_pass))
    return out


# ---------------------------------------------------------------------------------------------------- the text
def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * math.expm1(x):+.1f}%"


def _flops(x: float) -> str:
    return f"{x / 1e15:.2f} PFLOPs"


def replay_text(result: Replay, obs: dict[str, Observed], sweep_name: str, sources: list[str],
                grid_rows: list | None = None, ws: list[Width] | None = None) -> str:
    """The replay as markdown (the module docstring)."""
    s = result.spec
    n = len(result.rows)
    counts = {a: sum(r.answer.answer == a for r in result.rows) for a in ANSWERS}
    answered = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    held = n - result.data_cap
    first, spent, cap = result.first_pass, result.spent, result.at_cap
    lines = [f"# The settle loop replayed on the committed exports ({sweep_name})", "",
             f"Exports, in the order given (a run in two is read from the first): {', '.join(sources)}.",
             f"Settings: delta {s.delta:g} (the same within ±{100 * s.delta:g}% of dev PPL), alpha {s.alpha:g} a "
             f"row, at most {s.seeds} seeds a row and {s.base_seeds} of the base, budget up to {s.budget:g}x: "
             f"{len(looks(s))} look(s) a row, each interval at {100 * look_level(s):.2f}% (Bonferroni; "
             "lightning_tfm/findings/answers.py).", "",
             f"**{result.answered} of {n} rows answered** ({answered}): {result.answered} of the {held} whose trials "
             f"the exports hold ({result.data_cap} stop {DATA_CAP}), in {result.passes} pass(es), at "
             f"{_flops(spent)}: {spent / first:.2f}x the first pass ({_flops(first)}), against {_flops(cap)} "
             f"({cap / first:.2f}x) with every row and the base at the caps. The base took "
             f"{_flops(result.base_compute)} of it.", "",
             f"Each row's chance of a false answer, all its looks together: at most {s.alpha:g}; at most "
             f"{n * s.alpha:.1f} false answers expected among these {n} rows ({20 * s.alpha:g} in a table of 20). "
             "A row of one seed judged by the 2x base-sd rule errs "
             f"{100 * one_seed_false_rate(3):.1f}% of the time on a true difference of 0 (3 base seeds).", ""]
    if result.absent:
        lines += [f"No export holds {', '.join(result.absent)}: not replayed.", ""]
    lines += ["Runs: each seed the loop trained as `planner seed→committed seed (export)`; the base's: "
              + _runs(result.base_stand, obs[BASE]) + ". A pair of runs from two exports may pair two training "
              "commits (each export's provenance.txt names its own).", "",
              "| row | answer | diff (PPL) | interval | seeds | steps | compute | what stopped it | runs |",
              "|---|---|---|---|---|---|---|---|---|"]
    base = obs[BASE]
    for r in result.rows:
        a = r.answer
        iv = f"[{_pct(a.low)}, {_pct(a.high)}]" if a.low is not None else ""
        stand = _runs(r.stand_in, obs[r.variant])
        end = r.end
        if not a.answered:
            need = seeds_needed(_row_runs(obs[r.variant]), _row_runs(base), s, a.budget)
            end += f" (plug-in: {need} seeds would answer it)" if need else " (plug-in: no seeds up to 30)"
        lines.append(f"| {r.variant} | {a.answer} at {a.budget:g}x | {_pct(a.diff)} | {iv} | {r.seeds} | {r.steps} | "
                     f"{r.compute / base.cost:.1f} base runs | {end} | {stand} |")
    if ws:
        lines += ["", f"## Unpaired or paired by seed, at {100 * look_level(s):.2f}%", "",
                  "Unpaired: Welch's standard error over every committed base seed, Hsu's min(n, m) - 1 degrees of "
                  "freedom (Welch-Satterthwaite's are not conservative at 2-3 seeds); paired: the t interval of the "
                  "row's seeds' differences to the base's same seeds (the answers').", "",
                  "| row | budget | seeds | unpaired | width | paired | width | paired/unpaired |",
                  "|---|---|---|---|---|---|---|---|"]
        for w in ws:
            wl = w.welch[1] - w.welch[0]
            pw = None if w.paired is None else w.paired[1] - w.paired[0]
            lines.append(f"| {w.variant} | {w.budget:g}x | {w.seeds} | [{_pct(w.welch[0])}, {_pct(w.welch[1])}] | "
                         f"{wl:.3f} | " + ("| | |" if pw is None else
                                           f"[{_pct(w.paired[0])}, {_pct(w.paired[1])}] | {pw:.3f} | {pw / wl:.2f} |"))
        ratios = sorted((w.paired[1] - w.paired[0]) / (w.welch[1] - w.welch[0]) for w in ws if w.paired)
        if ratios:
            lines += ["", f"Paired narrower in {sum(x < 1 for x in ratios)} of {len(ratios)}; median width ratio "
                      f"paired/unpaired {statistics.median(ratios):.2f}."]
    if grid_rows:
        lines += ["", "## The settings' grid", "", "Each a whole replay, the settings it does not vary at their "
                  "defaults (lightning_tfm/findings/settings.py), the base's seeds at most 10.", "",
                  "| delta | alpha | seeds | budget | answered | compute (x first pass) |", "|---|---|---|---|---|---|"]
        for sp, k, total, c in grid_rows:
            lines.append(f"| {sp.delta:g} | {sp.alpha:g} | {sp.seeds} | {sp.budget:g} | {k} of {total} | {c:.2f} |")
    return "\n".join(lines) + "\n"


def _runs(stand: dict[int, int], o: Observed) -> str:
    """The committed runs that stood for the loop's trials: ``2→3 (table3-cpu-heldout-s3)``."""
    return ", ".join(f"{k}→{v} ({o.source[v]})" for k, v in sorted(stand.items()))


def _row_runs(o: Observed) -> RowRuns:
    """Every committed run of a row as the planner would read it (for the 'what it would take' plug-in)."""
    values: dict[float, dict[int, float]] = {}
    for lv in (1.0, 3.0):
        step = later_step(o.budget_step, lv)
        vals = {s: c[step] for s, c in o.curves.items() if step in c}
        if vals:
            values[lv] = vals
    return RowRuns(o.variant, values, o.curves, o.cost, o.budget_step, o.warmup)


# ------------------------------------------------------------------------------------------------ the command
def settle_replay_cli(args, sweep) -> int:
    """``ltfm report SWEEP --settle-replay EXPORT_DIR [EXPORT_DIR ...] [--out FILE.md] [--settle-grid]``."""
    from .inputs.export import read_export_beside

    settle = getattr(sweep, "settle", None)
    spec = SettleSpec(**{**SETTLE_DEFAULTS, **(dataclasses.asdict(settle) if dataclasses.is_dataclass(settle)
                                                else settle or {})})
    out = None
    if args.out:
        out = Path(args.out)
        if out.suffix != ".md":
            raise UserError(f"--out {args.out!r}: a settle replay writes one markdown page: give a path ending in .md")
        from ..base.outputs import check_outputs
        check_outputs([out], reads=[("the sweep file", sweep.path)] + [("--settle-replay", p)
                                                                       for p in args.settle_replay])
    datas = [read_export_beside(sweep, p, "--settle-replay") for p in args.settle_replay]
    obs, absent = observe(sweep, datas)
    result = replay(obs, spec, absent)
    text = replay_text(result, obs, sweep.name, [str(p) for p in args.settle_replay],
                       grid(obs) if args.settle_grid else None, widths(obs, spec))
    print(text, end="")
    if out:
        from ..base.atomic import write_text
        write_text(out, text)
        print(f"written: {out}")
    return 0

