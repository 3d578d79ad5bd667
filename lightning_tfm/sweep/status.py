"""What a sweep would do and what it did: the dry run (every trial's experiment, architecture, overrides, parameter
count, steps and training FLOPs, without training or storage) and the status table of a study.

**Verdicts** (:func:`row_verdicts`; ``--status`` and the progress line of ``--workers``): each finished row of a
variants sweep against the base, by the report's rule and function
(:func:`lightning_tfm.findings.verdict.curve_verdict`: *holds*, *may flip*, *within noise*, *too few points*; one
rule, one answer), on the same inputs the report reads:
the dev-PPL curves of its completed trials' run folders (``metrics.csv``) and the base's, fitted and extrapolated
to ``k`` x each side's budget, and the change at the end, Δ = the mean dev PPL (each run's summary at the budget)
of the row's seeds minus the base's, against the base's seed noise
(:func:`~lightning_tfm.findings.noise.end_change`); the sweep file's ``report:`` settings, at most
:data:`MAX_DRAWS` bootstrap draws (the size's interval; the verdict does not depend on the draws). Shown as
:func:`~lightning_tfm.findings.verdict.verdict_text` (``holds: -12% at 3x, bound -9% (80% [-15, -9])``: the one-sided
bound the call rests on, then the size's interval). Nothing is shown without a completed base or a change.

**At the sweep's budget**: a run folder another sweep trained on past this one's budget (a continued sweep, two
sweep files sharing a results folder) is read at each trial's own budget (its ``max_steps``), as the report reads
it (:func:`lightning_tfm.sweep.budget.at_budget`): the status table's value and steps (:func:`read_at_budgets`, with
a note saying so) and the verdicts' curves (validations up to the budget, :func:`run_curve`)."""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass

from ..findings.noise import end_change
from ..findings.verdict import Verdict, curve_verdict, direction_bound, verdict_text
from ..training.runs.results import DEV_PPL, in_results, read_metrics, read_summary, storage_in_results
from ..training.runs.run_folder import existing_run_id
from .budget import CONTINUED, at_budget, folder_at_budget, is_budget
from .plan import Plan, check_buildable, flops_per_step, sentence_lengths
from .queue import STOPPED
from .settle import MULTIPLE
from .spec import REPORT_DEFAULTS, Entry, Sweep, suggest
from .storage import quiet_optuna


def dry_run(sweep: Sweep, plan: Plan, n_trials: int | None) -> list[dict]:
    """Every trial's name, experiment, architecture, overrides, parameter count, steps and training FLOPs (its
    steps x its FLOPs per step, :func:`~.plan.flops_per_step` at the sweep's sentence lengths), without training or
    touching any storage."""
    rows = []
    if sweep.mode == "variants":
        entries = sweep.entries()
    else:  # show the kind of points the space yields: random draws from it
        import optuna
        quiet_optuna()
        seed = sweep.sampler.get("seed", 0)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction=sweep.direction)
        entries = []
        for i in range(n_trials or sweep.n_trials or 10):
            trial = study.ask()
            params = suggest(trial, sweep.space)
            entries.append(Entry(f"search-{i:04d}", "search", sweep.seeds[0], params))
    lengths = sentence_lengths(sweep)
    for entry in entries:
        cfg, params, reason = check_buildable(plan, entry)
        # data.path is part of a run id; a row trains on in a folder of its config under another name
        rid = existing_run_id(cfg) if cfg is not None and plan.has_data else None
        steps = plan.max_steps(entry)
        fps = flops_per_step(cfg, lengths) if cfg is not None else None
        rows.append({"name": entry.name, "family": entry.family, "seed": entry.seed, "overrides": entry.overrides,
                     "max_steps": steps, "params": params, "skipped": reason, "run_id": rid,
                     "trained_steps": _trained_steps(plan.results_dir / rid) if rid else None,
                     "experiment": str(sweep.experiment_of(entry.name)), "arch": cfg.model.arch if cfg else None,
                     "flops_per_step": fps, "train_flops": fps * steps if fps is not None else None})
    return rows


def _trained_steps(run_dir) -> int | None:
    """The steps a row's run folder already holds (its summary's), None for a run not started: the run id does not
    depend on train.max_steps, so a larger budget continues from there."""
    summary = read_summary(run_dir) if run_dir.is_dir() else None
    steps = summary.get("steps") if isinstance(summary, dict) else None
    return steps if isinstance(steps, int) else None


def _duration(t) -> float | None:
    """How long the trial ran: to its end, to now while it runs; None for one waiting (a stopped trial put back in
    the queue keeps the start of its attempt but runs no more)."""
    from optuna.trial import TrialState

    if t.datetime_start is None or t.state == TrialState.WAITING:
        return None
    end = t.datetime_complete or _dt.datetime.now()
    return (end - t.datetime_start).total_seconds()


# How --status names a trial the worker closed without training it (its ``skip`` attribute): a row the model
# cannot build, a second trial of a row, a row whose run folder another process is training, a row whose run
# folder another sweep trained past this one's budget without the sweep's metric there.
SKIP_STATES = {"unbuildable": "skipped", "duplicate": "duplicate", "running": "running elsewhere",
               "past_budget": "past budget"}


def status_rows(study, sweep: Sweep | None = None) -> list[dict]:
    """One row per trial of ``study``; with ``sweep``, each completed row read at its budget
    (:func:`read_at_budgets`) and each row's ``verdict`` (:func:`add_status_verdicts`)."""
    rows = trial_rows(study.get_trials(deepcopy=False))
    if sweep is not None:
        read_at_budgets(rows, sweep.metric)
        add_status_verdicts(sweep, rows)
    return rows


def read_at_budgets(rows: list[dict], metric: str) -> None:
    """Each completed row whose run folder holds training past its trial's budget (``max_steps``), read at that
    budget (:func:`lightning_tfm.sweep.budget.at_budget`), in place: its ``value`` (``metric`` then: None when not
    known there, as BLEU from a curve), ``steps`` (the budget) and a ``note`` saying so."""
    for r in rows:
        if r["state"] != "complete" or not r.get("run_dir"):
            continue
        read = folder_at_budget(r["run_dir"], r.get("max_steps"))
        if read is None:
            continue
        value = read.summary.get(metric)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        r["value"], r["steps"] = float(value) if ok else None, read.summary["steps"]
        r["note"] = read.note if ok or read.summary["status"] == CONTINUED else \
            f"no {metric} at step {r['steps']}, this sweep's budget: its run folder was trained on ({read.later})"


def trial_rows(trials) -> list[dict]:
    """Each trial's number, variant, family, seed, state, value, steps, its budget (``max_steps``; ``multiple``: of
    the row's budget, over 1 for a run the settle loop continued, :mod:`.settle`), duration, run folder, W&B run and
    note."""
    rows = []
    retried_as = _retries(trials)
    for t in trials:
        a = t.user_attrs
        state = t.state.name.lower()
        if a.get("skip"):
            state = SKIP_STATES.get(a["skip"], "skipped")
        elif state == "waiting" and a.get("status") == STOPPED:  # Ctrl-C: back in the queue, resumed first
            state = STOPPED
        steps = a.get("steps")
        if steps is None and t.intermediate_values:
            steps = max(t.intermediate_values)
        note = _note(t, retried_as.get(t.number))
        if state == STOPPED and isinstance(a.get("stopped_at"), int):
            # a stopped row holds the steps its next run resumes from; the ones validated past its newest
            # checkpoint (a stop harder than Ctrl-C: killed before it wrote last.ckpt) run again
            validated, steps = steps, a["stopped_at"]
            if isinstance(validated, int) and validated > steps:
                note = (f"{note}; validated to step {validated}, past its checkpoint: steps {steps}-{validated} run "
                        "again")
        rows.append({"number": t.number, "variant": a.get("variant"), "family": a.get("family"),
                     "seed": a.get("seed"), "state": state, "value": t.value, "steps": steps,
                     "max_steps": a.get("max_steps"), "multiple": float(a.get(MULTIPLE, 1.0)),
                     "duration_s": _duration(t), "run_dir": a.get("run_dir"), "wandb_run_id": a.get("wandb_run_id"),
                     "note": note, "slurm_job": a.get("slurm_job")})
    return rows


def _retries(trials) -> dict[int, int]:
    """A failed trial's number -> the trial that runs its row again: the study's retry (``failed_trial``), else
    the next trial of the same row (``grid_key``: queued again by a later ``ltfm sweep``)."""
    from optuna.trial import TrialState

    out = {t.system_attrs["failed_trial"]: t.number for t in trials if "failed_trial" in t.system_attrs}
    for t in trials:
        key = t.user_attrs.get("grid_key")
        if t.state == TrialState.FAIL and t.number not in out and key and not t.user_attrs.get("skip"):
            later = [o.number for o in trials if o.number > t.number and o.user_attrs.get("grid_key") == key]
            if later:
                out[t.number] = min(later)
    return out


def _note(t, retry: int | None) -> str | None:
    """The trial's reason or error; for an attempt run again, by which trial first (a failed trial without an
    error of its own is one the study failed when its worker stopped beating: killed, stopped or gone); for a
    retry the study queued, what it retries."""
    from optuna.trial import TrialState

    note = t.user_attrs.get("reason") or t.user_attrs.get("error")
    if retry is not None:
        why = note or ("its worker stopped (no heartbeat)" if t.state == TrialState.FAIL else None)
        return f"retried as trial {retry}: {why}" if why else f"retried as trial {retry}"
    if note is None and "failed_trial" in t.system_attrs and t.state in (TrialState.WAITING, TrialState.RUNNING):
        return f"retry of trial {t.system_attrs['failed_trial']}"
    return note


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def format_status(sweep: Sweep, rows: list[dict], storage_url: str, results_dir) -> str:
    """The status table: run folders relative to the results folder, the storage by its name there; a column of
    verdicts when a row has one (:func:`add_status_verdicts`, computed here for rows without)."""
    if any("verdict" not in r for r in rows):
        add_status_verdicts(sweep, rows)
    shown = any(r["verdict"] for r in rows)
    k = {**REPORT_DEFAULTS, **(sweep.report or {})}["k"]
    jobs = any(r.get("slurm_job") for r in rows)  # a sweep of Slurm jobs: the job whose worker holds each trial
    head = ("#", "variant", "seed", "state", sweep.metric, "steps", *([f"verdict at {k:g}x"] if shown else []),
            "duration", *(["slurm job"] if jobs else []), "run folder", "note")
    table = [head]
    for r in rows:
        table.append((str(r["number"]), r["variant"] or "-", str(r["seed"] if r["seed"] is not None else "-"),
                      r["state"], f"{r['value']:.4f}" if isinstance(r["value"], float) else "-",
                      str(r["steps"] if r["steps"] is not None else "-"), *([r["verdict"] or "-"] if shown else []),
                      _fmt_duration(r["duration_s"]), *([r.get("slurm_job") or "-"] if jobs else []),
                      in_results(r["run_dir"], results_dir) or "-",
                      (r["note"] or "")[:80]))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    lines.append(f"study {sweep.name} in {storage_in_results(storage_url, results_dir)}: {summary}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- verdicts
#: The most bootstrap draws a status verdict takes (the report's ``report.bootstraps`` if fewer): status is a glance.
MAX_DRAWS = 200


def run_curve(run_dir, budget: int | None = None) -> tuple[dict[int, float], int, float | None]:
    """A run's dev PPL at each validation, ``{step: PPL}`` (Lightning's steps, as the report reads them), up to
    ``budget`` steps when given (the trial's: a folder trained on past it is read at it,
    :func:`lightning_tfm.sweep.budget.at_budget`; ``{}`` when it holds no validation there), its ``train.warmup``,
    and its dev PPL at the end (its summary's at the budget, as the report's records read it; None when no finite
    number); ``({}, 0, None)`` for a folder that cannot be read."""
    try:
        history = read_metrics(run_dir)
    except (OSError, ValueError):
        return {}, 0, None
    summary = read_summary(run_dir) or {}
    end = summary
    if is_budget(budget):
        read = at_budget(summary, history, budget)
        if read is not None and read.summary["status"] == CONTINUED:
            return {}, 0, None
        history, end = (read.history, read.summary) if read is not None else (history, summary)
    curve = {int(h["step"]): float(h[DEV_PPL]) for h in history
             if isinstance(h.get(DEV_PPL), float) and math.isfinite(h[DEV_PPL])}
    train = (summary.get("config") or {}).get("train") or {}
    warmup = train.get("warmup") if isinstance(train, dict) else None
    ppl = end.get("dev_ppl")
    ok = isinstance(ppl, (int, float)) and not isinstance(ppl, bool) and math.isfinite(ppl)
    return curve, warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else 0, float(ppl) if ok else None


@dataclass(frozen=True)
class RowVerdict:
    """A finished row's verdict as ``--status`` and the launcher's lines say it."""
    verdict: Verdict   # the rule's (:func:`~lightning_tfm.findings.verdict.curve_verdict`)
    text: str          # in a few words (:func:`~lightning_tfm.findings.verdict.verdict_text`)


def _verdict(row: list[tuple[dict, int, float]], base: list[tuple[dict, int, float]], s: dict) -> RowVerdict | None:
    """A row's verdict from its runs' and the base's (curve, warmup, dev PPL at the end) (the module docstring),
    or None without a change."""
    delta, noise = end_change([p for _, _, p in row], [p for _, _, p in base])
    v = curve_verdict([c for c, _, _ in row], [c for c, _, _ in base], delta, noise,
                      {**s, "bootstraps": min(int(s["bootstraps"]), MAX_DRAWS)}, warmup=row[0][1],
                      base_warmup=base[0][1])
    return RowVerdict(v, verdict_text(v, s)) if v else None


def row_verdicts(sweep: Sweep, rows: list[dict], curves: dict | None = None) -> dict[str, RowVerdict]:
    """Each variant's verdict against the base, from the completed rows of ``rows`` (:func:`trial_rows`; the module
    docstring); a variant without one is absent, and a search has none. ``curves``: :func:`run_curve`'s reads
    kept by a caller that asks again (a finished run does not change), keyed by (run folder, budget)."""
    if sweep.mode != "variants":
        return {}
    curves = {} if curves is None else curves
    runs: dict[str, dict[str, tuple[dict, int, float | None]]] = {}
    for r in rows:
        if r.get("state") != "complete" or not r.get("variant") or not r.get("run_dir") or r.get("multiple", 1) != 1:
            continue  # (a run the settle loop continued past the sweep's budget: its trial there stands for it)
        key = (r["run_dir"], r.get("max_steps"))
        if key not in curves:
            curves[key] = run_curve(*key)
        if curves[key][0] and curves[key][2] is not None:  # a run the report counts: a curve and a dev PPL
            runs.setdefault(r["variant"], {})[r["run_dir"]] = curves[key]
    base = list(runs.pop("base", {}).values())
    if not base:
        return {}
    s = {**REPORT_DEFAULTS, **(sweep.report or {})}
    out = {v: _verdict(list(by_dir.values()), base, s) for v, by_dir in runs.items()}
    return {v: x for v, x in out.items() if x}


def add_status_verdicts(sweep: Sweep, rows: list[dict], curves: dict | None = None) -> dict[str, RowVerdict]:
    """Each completed row's ``verdict`` (the text, e.g. ``holds: -12% at 3x, bound -9% (80% [-15, -9])``; None
    without one) and ``prediction`` (the same as numbers, for ``--status --json``: ``verdict``, the predicted
    log-PPL gap's ``point``, ``low``, ``high``, the one-sided ``bound`` the verdict reads (None without a side
    today), at ``at_step``, the row's step at k x its budget; None without a prediction), in place; returns
    :func:`row_verdicts`."""
    verdicts = row_verdicts(sweep, rows, curves)
    for r in rows:
        v = verdicts.get(r.get("variant")) if r.get("state") == "complete" else None
        gap = v.verdict.gap if v else None
        r["verdict"] = v.text if v else None
        r["prediction"] = ({"verdict": v.verdict.verdict, "point": float(gap.point), "low": float(gap.low),
                            "high": float(gap.high), "bound": direction_bound(gap), "at_step": int(gap.at_step)}
                           if gap else None)
    return verdicts
