"""The Table 3 replica as data: :func:`build_table` gives one row per variant beside the paper's, with its
knobs, its status, its numbers and their changes against the base, plus how the sweep ran and the learning
curves.

The rows: one per variant of the sweep file, in the paper's order (base, A1-A4, B1, B2, C1-C7, D1-D4, E, big),
then the sweep's other rows in file order, then runs of variants the file no longer lists
(:func:`ordered_variants`). A variant that is missing, waiting, running, failed, skipped (unbuildable), pruned,
diverged (dev PPL no number: :func:`as_shown`) or continued (not readable at its sweep's budget: :mod:`.inputs.budget`)
keeps its row with that status; its numbers stay empty (only completed seeds are averaged). Several
seeds: mean ± sample standard deviation. Change (Δ) = the row's value minus its base's, ours against our base
and the paper's against the paper's base, each also given relative to its base. Each row also gets its change at
the base's training compute (:mod:`.compute`), its verdict from the learning curves extrapolated (:mod:`.verdict`)
and its answer from its own seeds (:mod:`.answers`).

A row's knobs are those of ``training.config.config.TABLE3_KNOBS`` (the config fields with a Table 3 column). The
statistics (seed noise, direction agreement, the paired bootstrap) are in :mod:`.stats`; the markdown and the CSV in
:mod:`.render`.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ...findings.noise import finite, mean_std, noise_verdict, relative
from ...findings.verdict import Verdict
from ...training.config.config import SCHEMA, TABLE3_KNOBS
from ...training.config.run_id import KEYS_V1, was_saved
from ...training.runs import results
from ..inputs.export import read_export
from ..inputs.records import DONE, ReportData, RunRecord, is_pipeline_check, mark_diverged, nonfinite
from .answers import AnswerSummary, add_answers
from .columns import Row
from .compute import add_equal_compute
from .paper import PAPER_ORDER, load_paper
from .stats import BLEU_FLOOR, agreement_summary, agrees, bleu_significant, paired_bootstrap
from .verdict import add_table_verdicts, seconds_per_step, settle_summary, verdict_summary


@dataclass
class LearningCurves:
    """Each row's dev perplexity at each validation step (:func:`learning_curves`)."""
    steps: list[int] = field(default_factory=list)   # the base's validation steps (else every row's)
    rows: dict[str, dict[int, float]] = field(default_factory=dict)   # variant -> {step: mean PPL over its seeds}
    runs: dict[str, list[dict[int, float]]] = field(default_factory=dict)   # variant -> [{step: PPL} a seed]
    warmup: dict[str, int] = field(default_factory=dict)   # variant -> its train.warmup (what the verdict fits)


def _no_base_std() -> dict[str, float | None]:
    return {"ppl": None, "bleu": None}


@dataclass
class Table3:
    """The Table 3 replica (:func:`build_table`; the module docstring); a table built by hand (a test, a figure of a
    few rows) may leave out what it does not show."""
    #: the sweep's name, its experiment's name
    sweep: str = ""
    experiment: str = ""
    #: every seed a row has or plans (the sweep file's and the rows' own); the sweep file's; a row's own, by variant
    seeds: list[int] = field(default_factory=list)
    sweep_seeds: list[int] = field(default_factory=list)
    own_seeds: dict[str, list[int]] = field(default_factory=dict)
    #: one row a variant, in :func:`ordered_variants`' order
    rows: list[Row] = field(default_factory=list)
    #: each row's dev PPL at each validation (:func:`learning_curves`)
    curves: LearningCurves = field(default_factory=LearningCurves)
    #: the headline's counts: direction agreement (:func:`.stats.agreement_summary`), the verdicts
    #: (:func:`.verdict.verdict_summary`) and their settle budgets under ``"settle"`` (:func:`.verdict.settle_summary`)
    summary: dict = field(default_factory=dict)
    #: the paired bootstrap's notes and the runs read off their planned budget (:func:`off_budget`); what reading the
    #: runs noted
    notes: list[str] = field(default_factory=list)
    data_notes: list[str] = field(default_factory=list)
    #: the sacreBLEU signatures of the runs' dev BLEU; the paired bootstrap's (None: not run)
    bleu_signatures: list[str] = field(default_factory=list)
    test_signature: str | None = None
    #: the base row has a completed seed; how many; its seed sd of dev PPL and BLEU (``"ppl"``, ``"bleu"``; None: one
    #: seed)
    has_base: bool = False
    base_seeds: int = 0
    base_std: dict[str, float | None] = field(default_factory=_no_base_std)
    #: how the sweep ran (:func:`sweep_run_info`, or the export's); where the runs were read from
    run_info: dict = field(default_factory=dict)
    source: str = ""
    #: the comparison at the base's compute: ``base_flops``, ``lengths_measured`` (:func:`.compute.add_equal_compute`)
    compute: dict = field(default_factory=dict)
    #: the sweep file's ``report:`` settings (the verdict's); each row's verdict, by variant (the figures read its gap)
    report_settings: dict = field(default_factory=dict)
    outlook: dict[str, Verdict] = field(default_factory=dict)
    #: the answers in all: each answer's count, the compute spent, every row at the cap (:mod:`.answers`; None: a
    #: table built without them)
    answers: AnswerSummary | None = None
    #: the paired bootstrap's (tests, notes, signature), as the export keeps them
    bootstrap: tuple = ({}, [], None)
    #: the runs are a pipeline check (``make ablation QUICK=1``): its numbers say nothing
    pipeline_check: bool = False
    #: where the report is published (W&B, optuna-dashboard): the notebook's lines (:func:`.published.where_published`)
    published: list[str] = field(default_factory=list)


def knob_value(cfg: dict, key: str):
    """A Table 3 knob of a row's flat config; a key newer than the run (not among the keys the run ids froze,
    :data:`~lightning_tfm.training.config.run_id.KEYS_V1`) that its saved config lacks reads at its default where
    the config would have saved it (:func:`~lightning_tfm.training.config.run_id.was_saved`, the run id's rule): the
    behaviour the run trained with, as its run id says (a new key's default keeps today's behaviour). None: no
    such section saved, or another architecture's model section."""
    if key in cfg or key in KEYS_V1:
        return cfg.get(key)
    sec, name = key.split(".")
    return SCHEMA[sec][name][1] if was_saved(key, cfg) else None


def ordered_variants(sweep, records: list[RunRecord]) -> list[str]:
    """Paper rows in the paper's order, then the sweep's other rows in file order, then runs of variants
    the sweep file does not list (sorted)."""
    listed = list(sweep.variants or {})
    paper = [v for v in PAPER_ORDER if v in listed]
    others = [v for v in listed if v not in PAPER_ORDER]
    rank = {v: i for i, v in enumerate(PAPER_ORDER)}
    stray = sorted({r.variant for r in records} - set(listed), key=lambda v: (rank.get(v, len(rank)), v))
    return paper + others + stray


def row_status(variant: str, recs: list[RunRecord], seeds: list[int]) -> str:
    if not recs:
        return "missing (no run)"
    done = [r for r in recs if r.completed]
    if len(done) == len(recs) and len(recs) >= len(seeds):
        return DONE if len(recs) == 1 else f"{DONE} ({len(recs)} seeds)"
    parts = []
    for r in sorted(recs, key=lambda r: (r.seed is None, r.seed or 0)):
        if r.completed:
            continue
        what = r.status
        if r.status == "pruned" and r.steps is not None:
            what += f" at step {r.steps}"
        if r.note:
            what += f": {r.note}"
        parts.append((f"seed {r.seed} " if len(seeds) > 1 or len(recs) > 1 else "") + what)
    missing = [s for s in seeds if s not in {r.seed for r in recs}]
    parts += [f"seed {s} missing" for s in missing] if len(seeds) > 1 else []
    head = f"{len(done)}/{max(len(seeds), len(recs))} seeds {DONE}; " if done else ""
    return head + "; ".join(parts)


def _finite(values) -> list[float]:
    return [v for v in values if finite(v)]


def as_shown(r: RunRecord) -> RunRecord:
    """The record as the table counts it: a completed run whose dev loss or PPL is no finite number (the readers of
    :mod:`.records` mark those already; a record built otherwise may not be) is diverged, never a result."""
    if r.completed and (nonfinite(r.dev_ppl) or nonfinite(r.dev_loss)):
        return mark_diverged(dataclasses.replace(r), {"dev_ppl": r.dev_ppl, "dev_loss": r.dev_loss})
    return r


def _change(mean, base_mean, base_sd, p: dict | None, pbase: dict, key: str, is_base: bool) -> tuple:
    """One metric's (Δ ours, Δ paper, their sizes relative to their bases, agreement, noise verdict) of a row
    (``base_mean``, ``base_sd``: our base row's, None without one)."""
    d = mean - base_mean if not is_base and mean is not None and base_mean is not None else None
    pd = p[key] - pbase[key] if p and not is_base else None
    # a share of a BLEU below the floor is a share of smoothing (a pipeline check's base of 0.0: "+5525%"): none
    floor = key == "dev_bleu" and base_mean is not None and base_mean < BLEU_FLOOR
    return (d, pd, None if floor else relative(d, base_mean), relative(pd, pbase[key]), agrees(d, pd),
            noise_verdict(d, base_sd) if d is not None else None)


def build_table(data: ReportData, bootstrap: bool = True) -> Table3:
    """The Table 3 replica (see the module docstring)."""
    paper = load_paper()
    pbase = paper["base"]
    sweep = data.sweep
    seeds = list(sweep.seeds)
    own_seeds = {v: list(body["seeds"]) for v, body in (sweep.variants or {}).items() if body.get("seeds")}
    by_variant: dict[str, list[RunRecord]] = {}
    for r in data.records:
        by_variant.setdefault(r.variant, []).append(as_shown(r))

    def agg(variant: str) -> dict:
        done = [r for r in by_variant.get(variant, []) if r.completed]
        ppl, ppl_sd = mean_std(_finite(r.dev_ppl for r in done))
        bleu, bleu_sd = mean_std(_finite(r.dev_bleu for r in done))
        params = [r.params for r in by_variant.get(variant, []) if r.params is not None]
        return {"ppl": ppl, "ppl_sd": ppl_sd, "bleu": bleu, "bleu_sd": bleu_sd, "n_done": len(done),
                "params": params[0] if params else None}

    base = agg("base") if "base" in by_variant else None
    variants = ordered_variants(sweep, data.records)
    if data.bootstrap is not None:  # read from an export: the test as the exported report computed it
        tests, test_notes, test_signature = data.bootstrap
    else:
        tests, test_notes, test_signature = (paired_bootstrap(by_variant, variants) if bootstrap else ({}, [], None))
    rows = []
    for v in variants:
        recs = by_variant.get(v, [])
        a = agg(v)
        cfg = {**data.planned.get(v, {}), **next((r.config for r in recs if r.config), {})}
        p = paper.get(v)
        vseeds = own_seeds.get(v, seeds)  # a row's own seeds (the base at three, for the noise), else the sweep's
        row = Row(variant=v, family=next((r.family for r in recs if r.family), None)
                  or ((sweep.variants or {}).get(v) or {}).get("family"), in_paper=p is not None,
                  knobs={k.key: knob_value(cfg, k.key) for k in TABLE3_KNOBS},
                  seeds_completed=a["n_done"], seeds_total=max(len(vseeds), len(recs)),
                  dev_ppl=a["ppl"], dev_ppl_std=a["ppl_sd"], dev_bleu=a["bleu"], dev_bleu_std=a["bleu_sd"],
                  params=a["params"], paper_dev_ppl=p["dev_ppl"] if p else None,
                  paper_dev_bleu=p["dev_bleu"] if p else None, paper_params_m=p["params_m"] if p else None)
        is_base = v == "base"
        (row.delta_ppl, row.paper_delta_ppl, row.delta_ppl_rel, row.paper_delta_ppl_rel, row.ppl_agrees,
         row.ppl_noise) = _change(a["ppl"], base and base["ppl"], base and base["ppl_sd"], p, pbase, "dev_ppl", is_base)
        (row.delta_bleu, row.paper_delta_bleu, row.delta_bleu_rel, row.paper_delta_bleu_rel, row.bleu_agrees,
         row.bleu_noise) = _change(a["bleu"], base and base["bleu"], base and base["bleu_sd"], p, pbase, "dev_bleu",
                                   is_base)
        t = tests.get(v)
        if t:
            row.bleu_p_value, row.bleu_tested, row.bleu_differing = t["p_value"], t["tested"], t["differing"]
            row.bleu_sentences, row.bleu_test_seeds = t["sentences"], t["seeds"]
            row.bleu_significant = bleu_significant(t, row.delta_bleu, row.bleu_noise)
        row.status = row_status(v, recs, vseeds)
        rows.append(row)
    curves = learning_curves(data, variants, by_variant)
    compute = add_equal_compute(rows, curves, by_variant)
    outlook = add_table_verdicts(rows, curves, sweep.report, seconds_per_step(by_variant))
    summary = {**agreement_summary(rows), **verdict_summary(rows), "settle": settle_summary(outlook)}
    answers = add_answers(rows, by_variant, sweep)
    notes = list(test_notes) + off_budget(by_variant, data.planned)
    signatures = sorted({r.bleu_signature for r in data.records if r.bleu_signature})
    all_seeds = sorted(set(seeds).union(*own_seeds.values()))
    return Table3(sweep=sweep.name, experiment=sweep.experiment.name, seeds=all_seeds, rows=rows, sweep_seeds=seeds,
                  own_seeds=own_seeds, curves=curves, summary=summary, notes=notes, bleu_signatures=signatures,
                  test_signature=test_signature, has_base=base is not None and base["n_done"] > 0,
                  run_info=data.run_info if data.run_info is not None else sweep_run_info(data),
                  source=data.source, data_notes=list(data.notes),
                  base_std={m: (base[f"{m}_sd"] if base else None) for m in ("ppl", "bleu")},
                  base_seeds=base["n_done"] if base else 0, compute=compute, report_settings=dict(sweep.report),
                  outlook=outlook, answers=answers, bootstrap=(tests, test_notes, test_signature))


def off_budget(by_variant: dict[str, list[RunRecord]], planned: dict[str, dict]) -> list[str]:
    """A note naming the completed runs trained to another train.max_steps than the sweep plans for their row beside
    the base's completed runs (:func:`~.records.planned_configs`), when the readers could not read them at it (a W&B
    run or an export of runs another sweep trained on, under command-line overrides): their changes are then read
    across two budgets, and the table says so."""
    if not any(r.completed for r in by_variant.get("base", [])):
        return []
    odd = []
    for v, recs in by_variant.items():
        want = (planned.get(v) or {}).get("train.max_steps")
        got = sorted({r.config.get("train.max_steps") for r in recs if r.completed} - {want, None}, key=str)
        if isinstance(want, int) and got:
            odd.append(f"{v} ({', '.join(map(str, got))} steps, planned {want})")
    return [f"trained to another budget than the sweep plans beside its base: {'; '.join(odd)}: their numbers are of "
            "that budget, not comparable at equal steps"] if odd else []


def sweep_run_info(data: ReportData) -> dict:
    """How the sweep ran: wall time from the first start to the last end of the shown rows' trials (else
    runs), their training time summed, the machines (CPU model, cores) the workers recorded and the precisions
    the runs trained in."""
    import datetime as dt

    starts, ends = [], []
    machines: dict[str, str] = {}
    trials = {r.trial for r in data.records if r.trial is not None}
    if data.study is not None and trials:
        for t in data.study.get_trials(deepcopy=False):
            if t.number in trials and t.datetime_start is not None:
                starts.append(t.datetime_start)
                if t.datetime_complete is not None:
                    ends.append(t.datetime_complete)
        machines = {k.split(".", 2)[2]: v for k, v in data.study.user_attrs.items() if k.startswith("ltfm.machine.")}
    else:
        for r in data.records:
            with contextlib.suppress(TypeError, ValueError):
                starts.append(dt.datetime.fromisoformat(r.started_at))
                ends.append(dt.datetime.fromisoformat(r.finished_at))
    hosts = sorted({r.host for r in data.records if r.host})
    named = [f"{machines[h]} ({h})" if h in machines else f"{h} (CPU not recorded)" for h in hosts]
    named += [f"{m} ({h})" for h, m in sorted(machines.items()) if h not in hosts and not hosts]
    walls = [r.wall_time_s for r in data.records if r.wall_time_s is not None]
    return {"wall_s": (max(ends) - min(starts)).total_seconds() if starts and ends else None,
            "train_s": sum(walls) if walls else None, "machines": named,
            "precisions": sorted({r.precision for r in data.records if r.precision}),
            "runs": sum(1 for r in data.records if r.completed), "records": len(data.records)}


def learning_curves(data: ReportData, variants: list[str], by_variant: dict | None = None) -> LearningCurves:
    """Each row's dev perplexity at each validation step, the mean over its completed seeds (a step every seed
    logged), each seed's own and each row's warmup (what the verdict fits, :mod:`.verdict`). At a short budget,
    whether the rows are still converging (and whether their order holds) is part of what the table says."""
    rows: dict[str, dict[int, float]] = {}
    runs: dict[str, list[dict[int, float]]] = {}
    warmup: dict[str, int] = {}
    if by_variant is None:
        by_variant = {}
        for r in data.records:
            by_variant.setdefault(r.variant, []).append(as_shown(r))
    for v in variants:
        series = [{int(h["step"]): h[results.DEV_PPL] for h in r.history if finite(h.get(results.DEV_PPL))}
                  for r in by_variant.get(v, []) if r.completed]
        series = [s for s in series if s]
        if not series:
            continue
        common = set.intersection(*(set(s) for s in series))
        rows[v] = {st: sum(s[st] for s in series) / len(series) for st in sorted(common)}
        runs[v] = series
        w = [r.config.get("train.warmup") for r in by_variant.get(v, []) if r.completed]
        warmup[v] = next((x for x in w if isinstance(x, int) and not isinstance(x, bool)), 0)
    base_steps = sorted(rows.get("base", {}))
    steps = base_steps or sorted(set().union(*(set(r) for r in rows.values()))) if rows else []
    return LearningCurves(steps=steps, rows=rows, runs=runs, warmup=warmup)


def rebuilt_table(sweep, report_dir: str | Path) -> Table3:
    """The table of the report folder ``report_dir`` rebuilt from the export it holds (``export/<sweep>.json``):
    the rows the notebook wrote ``table3.md`` and ``table3.csv`` from, for what ``ltfm report`` does after it (the
    terminal's headline, W&B, optuna-dashboard)."""
    data = read_export(sweep, Path(report_dir) / "export")
    table = build_table(data)
    table.pipeline_check = is_pipeline_check(data.records)
    return table
