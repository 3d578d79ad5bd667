"""Where a report's records come from (:func:`load_report_data`): a sweep's local results (its run folders and its
Optuna storage), W&B, or an export a report wrote. The sources, the :class:`~.records.RunRecord` they become and the
rest of the readers: :mod:`.records`; a run read at its sweep's budget: :mod:`.budget`; an export: :mod:`.export`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...sweep.budget import PAST_BUDGET
from ...training.runs.results import storage_in_results
from .budget import budget_note, of_other_studies, read_at_budget
from .export import read_export
from .records import (
    DONE,
    HISTORY_KEYS,
    ReportData,
    RunRecord,
    as_int,
    as_number,
    check_wandb_access,
    fetch_wandb_records,
    latest_per_key,
    mark_diverged,
    planned_configs,
    resolve_local,
)

# prepared corpus folder -> its (mean source, mean target) training sentence length, read once
_LENGTHS: dict[str, tuple[float | None, float | None]] = {}


def corpus_lengths(folder: str | None) -> tuple[float | None, float | None]:
    """(mean source, mean target) sentence length in tokens of a prepared corpus's training split, from its
    ``manifest.json``; (None, None) when the folder is not here (another machine, a removed cache)."""
    if not folder:
        return None, None
    if folder not in _LENGTHS:
        try:
            train = json.loads((Path(folder) / "manifest.json").read_text())["splits"]["train"]
            pairs = train["pairs"]
            lengths = (train["src_tokens"] / pairs, train["tgt_tokens"] / pairs) if pairs else (None, None)
            ok = all(isinstance(n, float) and math.isfinite(n) and n > 0 for n in lengths)
            _LENGTHS[folder] = lengths if ok else (None, None)  # a hand-edited manifest: bench's default lengths
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            _LENGTHS[folder] = (None, None)
    return _LENGTHS[folder]


def _flatten(cfg: dict) -> dict:
    """A summary's nested config, its sections' keys flat (``model.layers``)."""
    from ...training.config.config import flatten
    return flatten({k: v for k, v in (cfg or {}).items() if isinstance(v, dict)})


def load_report_data(sweep_file: str | Path, results_dir: str | Path | None = None, storage: str | None = None,
                     wandb_path: str | None = None, export_dir: str | Path | None = None) -> ReportData:
    """Everything the notebooks show, from the local results (+ Optuna storage), from W&B, or from an export
    a report wrote (``export_dir``: :func:`lightning_tfm.report.inputs.export.read_export`)."""
    from ...sweep import load_sweep, quiet_optuna

    quiet_optuna()
    sweep = load_sweep(sweep_file)
    if export_dir:
        return read_export(sweep, export_dir)
    if wandb_path:
        check_wandb_access(wandb_path)
        records = latest_per_key(fetch_wandb_records(wandb_path, sweep.name))
        of_other_studies(sweep, records)
        return ReportData(sweep, records, f"W&B {wandb_path}, group {sweep.name}", planned_configs(sweep, records),
                          notes=[n for n in [budget_note(records)] if n])
    results, url = resolve_local(sweep, results_dir, storage)
    return collect_local(sweep, results, url)


def record_from_summary(summary: dict, run_dir: str | Path | None = None) -> RunRecord:
    """A run folder's ``summary.json`` (+ its metric history and dev hypotheses when ``run_dir`` is given)."""
    from ...training.runs.results import read_metrics

    cfg = summary.get("config") or {}
    run_cfg = cfg.get("run") or {}
    flat = _flatten(cfg)
    rec = RunRecord(variant=str(run_cfg.get("variant") or summary.get("run_id") or Path(run_dir or "?").name),
                    family=run_cfg.get("family"), seed=as_int(run_cfg.get("seed")),
                    status=str(summary.get("status") or "unknown"), config=flat,
                    params=as_int(summary.get("params")), dev_loss=as_number(summary.get("dev_loss")),
                    dev_ppl=as_number(summary.get("dev_ppl")), dev_bleu=as_number(summary.get("dev_bleu")),
                    steps=as_int(summary.get("steps")), run=str(run_dir) if run_dir else summary.get("run_id"),
                    note=summary.get("error"), bleu_signature=summary.get("bleu_signature"),
                    wall_time_s=as_number(summary.get("wall_time_s")), started_at=summary.get("started_at"),
                    finished_at=summary.get("finished_at"), host=summary.get("host"),
                    precision=summary.get("precision"),
                    train_tokens=as_number(summary.get("train_tokens")), vocab_size=as_int(summary.get("vocab_size")),
                    effective_batch_tokens=as_int(summary.get("effective_batch_tokens")))
    rec.src_len, rec.tgt_len = corpus_lengths(summary.get("data_cache"))
    mark_diverged(rec, summary)
    if run_dir is not None:  # a curve keeps its finite values (a diverged validation's inf is no point of it)
        rec.history = [{k: v for k, v in row.items() if k == "step" or (k in HISTORY_KEYS and as_number(v) is not None)}
                       for row in read_metrics(run_dir)]
        tgt = (cfg.get("data") or {}).get("tgt_lang")
        hyps = Path(run_dir) / "hyps" / f"dev.{tgt}.txt"
        if tgt and hyps.is_file():
            rec.hyps = str(hyps)
    return rec


_TRIAL_STATUS = {"COMPLETE": DONE, "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
                 "WAITING": "waiting"}


def record_from_trial(trial, results_dir: Path, study: str | None = None) -> RunRecord:
    """An Optuna trial of ``ltfm sweep``: state from the trial, numbers from its run folder (or, when the
    folder is elsewhere, from the results the worker recorded in the trial's user attributes). A folder trained
    on after the trial (another sweep ``study`` shares it) is read at the trial's budget (:mod:`.budget`)."""

    a = trial.user_attrs
    status = _TRIAL_STATUS.get(trial.state.name, trial.state.name.lower())
    note = a.get("reason") or a.get("error")
    if a.get("skip") == "unbuildable":
        status = "skipped"
    run_dir = None
    for candidate in (a.get("run_dir"), results_dir / a["run_id"] if a.get("run_id") else None):
        if candidate and (Path(candidate) / "summary.json").is_file():
            run_dir = Path(candidate)
            break
    summary = None
    if run_dir is not None:
        from ...training.runs.results import read_summary
        summary = read_summary(run_dir)
    if summary is not None:
        rec = record_from_summary(summary, run_dir)
        read_at_budget(rec, as_int(a.get("max_steps")), study or str(a.get("study") or ""), summary.get("attempts"))
    else:
        rec = RunRecord(variant=str(a.get("variant")), params=as_int(a.get("params") or a.get("planned_params")),
                        dev_loss=as_number(a.get("dev_loss")), dev_ppl=as_number(a.get("dev_ppl")),
                        dev_bleu=as_number(a.get("dev_bleu")), steps=as_int(a.get("steps")), run=a.get("run_dir"),
                        wall_time_s=as_number(a.get("wall_time_s")), train_tokens=as_number(a.get("train_tokens")))
    rec.host = rec.host or a.get("host")
    rec.variant = str(a.get("variant") or rec.variant)
    rec.family = a.get("family") or rec.family
    rec.seed = as_int(a.get("seed")) if a.get("seed") is not None else rec.seed
    if a.get("max_steps") is not None:
        rec.config.setdefault("train.max_steps", a["max_steps"])
    for key, value in (trial.params or {}).items():  # a search trial's sampled values
        rec.config.setdefault(key, value)
    if status == DONE and rec.status not in (DONE, "unknown"):
        status = rec.status  # the trial says complete but its folder says otherwise: show the folder's word
    elif a.get("skip") == PAST_BUDGET and rec.later_attempt:
        status, note = rec.status, rec.note  # no value at the sweep's budget for the study: the folder read there
    rec.status, rec.trial = status, trial.number
    rec.note = note or (rec.note if status != DONE else None)
    return mark_diverged(rec, a) if summary is None else rec


def of_this_file(sweep, trials: list) -> tuple[list, list]:
    """(the trials whose row this sweep file defines as they were trained, the trials of rows trained under
    another definition). A trial's ``grid_key`` ends with the hash of its row's overrides and budget; a study
    name shared by two sweep files (or a file edited since) must not lend one file's row to the other's table.
    Rows the file does not list pass (the table shows them as rows the file no longer lists). A trial the settle
    loop queued to continue a row's run to a longer budget (:data:`~lightning_tfm.sweep.settle.MULTIPLE` over 1) is
    in neither: the table is at the sweep's budget, where that seed's own trial stands for it."""
    from ...sweep.settle import MULTIPLE

    if sweep.mode != "variants":
        return trials, []
    defined = {e.name: e.definition_hash() for e in sweep.entries()}
    kept, others = [], []
    for t in trials:
        variant, key = t.user_attrs.get("variant"), t.user_attrs.get("grid_key") or ""
        if t.user_attrs.get(MULTIPLE, 1.0) != 1.0:
            continue
        if variant in defined and key and key.rsplit("/", 1)[-1] != defined[variant]:
            others.append(t)
        else:
            kept.append(t)
    return kept, others


def collect_local(sweep, results_dir: Path, storage_url: str | None) -> ReportData:
    from ...sweep import open_storage, open_study
    from ...training.runs.results import read_summary

    records: list[RunRecord] = []
    study = None
    notes = []
    other_dirs: set[str] = set()
    if storage_url:
        study = open_study(sweep, open_storage(storage_url, create=False), create=False)
        trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("skip") != "duplicate"
                  and t.user_attrs.get("variant")]
        trials, others = of_this_file(sweep, trials)
        other_dirs = {str(Path(t.user_attrs["run_dir"]).resolve()) for t in others if t.user_attrs.get("run_dir")}
        if others:
            rows = sorted({t.user_attrs["variant"] for t in others})
            notes.append(f"{len(others)} trial(s) in the storage define rows {', '.join(rows)} otherwise "
                         f"than {sweep.path.name} does (another sweep file named {sweep.name}, or this file before an "
                         "edit): left out")
        trials.sort(key=lambda t: t.number)
        by_key: dict[tuple, Any] = {}
        for t in trials:  # the latest trial of each (variant, seed) stands for it
            by_key[(t.user_attrs["variant"], as_int(t.user_attrs.get("seed")))] = t
        records = [record_from_trial(t, results_dir, sweep.name)
                   for t in sorted(by_key.values(), key=lambda t: t.number)]
    known = {(r.variant, r.seed) for r in records}
    known_dirs = {str(Path(r.run).resolve()) for r in records if r.run and Path(r.run).is_dir()}
    known_dirs |= other_dirs if study is not None else set()  # another definition's runs are not this file's
    extra = []
    if results_dir.is_dir():
        for d in sorted(results_dir.iterdir()):
            summary = read_summary(d) if d.is_dir() else None
            if not isinstance(summary, dict) or str(d.resolve()) in known_dirs:
                continue
            run_cfg = (summary.get("config") or {}).get("run") or {}
            if run_cfg.get("study") != sweep.name:
                continue
            extra.append((str(summary.get("started_at") or ""), d.name, record_from_summary(summary, d)))
    extra.sort(key=lambda x: (x[0], x[1]))
    chosen: dict[tuple, RunRecord] = {}
    for _, _, rec in extra:  # without a trial: the latest run of each (variant, seed)
        if (rec.variant, rec.seed) not in known:
            chosen[(rec.variant, rec.seed)] = rec
    if chosen and study is not None:
        notes.append(f"{len(chosen)} run folder(s) of study {sweep.name} have no trial in the storage; shown from "
                     "their summary.json")
    records += list(chosen.values())
    notes += [n for n in [budget_note(records)] if n]
    source = f"results folder {Path(results_dir).name}/" + (
        f", Optuna storage {storage_in_results(storage_url, results_dir)}" if storage_url else
        " (no Optuna storage found: run folders only)")
    return ReportData(sweep, records, source, planned_configs(sweep, records), study, notes)
