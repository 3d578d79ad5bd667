"""What a sweep would do and what it did: the dry run (every trial's experiment, architecture, overrides, parameter
count, steps and training FLOPs, without training or storage) and the status table of a study."""
from __future__ import annotations

import datetime as _dt

from ..training.run_folder import existing_run_id
from ..training.results import in_results, read_summary, storage_in_results
from .plan import Plan, check_buildable, flops_per_step, sentence_lengths
from .spec import Entry, Sweep, suggest
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
    if t.datetime_start is None:
        return None
    end = t.datetime_complete or _dt.datetime.now()
    return (end - t.datetime_start).total_seconds()


# How --status names a trial the worker closed without training it (its ``skip`` attribute): a row the model
# cannot build, a second trial of a row, a row whose run folder another process is training.
SKIP_STATES = {"unbuildable": "skipped", "duplicate": "duplicate", "running": "running elsewhere"}


def status_rows(study) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        state = t.state.name.lower()
        if a.get("skip"):
            state = SKIP_STATES.get(a["skip"], "skipped")
        steps = a.get("steps")
        if steps is None and t.intermediate_values:
            steps = max(t.intermediate_values)
        rows.append({"number": t.number, "variant": a.get("variant"), "family": a.get("family"),
                     "seed": a.get("seed"), "state": state, "value": t.value, "steps": steps,
                     "duration_s": _duration(t), "run_dir": a.get("run_dir"), "wandb_run_id": a.get("wandb_run_id"),
                     "note": a.get("reason") or a.get("error")})
    return rows


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def format_status(sweep: Sweep, rows: list[dict], storage_url: str, results_dir) -> str:
    """The status table: run folders relative to the results folder, the storage by its name there."""
    head = ("#", "variant", "seed", "state", sweep.metric, "steps", "duration", "run folder", "note")
    table = [head]
    for r in rows:
        table.append((str(r["number"]), r["variant"] or "-", str(r["seed"] if r["seed"] is not None else "-"),
                      r["state"], f"{r['value']:.4f}" if isinstance(r["value"], float) else "-",
                      str(r["steps"] if r["steps"] is not None else "-"), _fmt_duration(r["duration_s"]),
                      in_results(r["run_dir"], results_dir) or "-", (r["note"] or "")[:80]))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    lines.append(f"study {sweep.name} in {storage_in_results(storage_url, results_dir)}: {summary}")
    return "\n".join(lines)
