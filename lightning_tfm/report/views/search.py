"""The search report (a sweep with a ``space``): one row per trial in every state (``search.md``,
``search.csv``) and Optuna's own plots (optimization history, parameter importances, intermediate values).
Without a storage (W&B, run folders only) the study is rebuilt in memory from the records with the sweep's
distributions (:func:`lightning_tfm.sweep.distributions`)."""
from __future__ import annotations

import csv
import io
import warnings
from pathlib import Path
from typing import Any

from ...base.atomic import write_text
from ...training.runs.results import history_key
from ..core.plots import literal_text, placeholder
from ..core.text import fmt, fmt_knob, md_cell, md_code, md_text
from ..inputs.records import DONE, ReportData


def search_study(data: ReportData):
    """The search's Optuna study: the storage's own, or (W&B, run folders only) one rebuilt in memory from
    the records with the sweep file's distributions, so the same Optuna plots work."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from ...sweep import distributions

    if data.study is not None:
        return data.study
    sweep = data.sweep
    study = optuna.create_study(study_name=sweep.name, direction=sweep.direction)
    states = {DONE: TrialState.COMPLETE, "pruned": TrialState.PRUNED, "running": TrialState.RUNNING,
              "waiting": TrialState.WAITING}
    dists = distributions(sweep.space or {})
    for r in sorted(data.records, key=lambda r: r.variant):
        params = {k: r.config[k] for k in dists if k in r.config}
        if set(params) != set(dists):
            data.notes.append(f"{r.variant}: not all searched keys in its config; left out of the Optuna plots")
            continue
        state = states.get(r.status, TrialState.FAIL)
        value = getattr(r, sweep.metric) if state == TrialState.COMPLETE else None
        if state == TrialState.COMPLETE and value is None:
            state = TrialState.FAIL
        key = history_key(sweep.metric)
        inter = {row["step"]: row[key] for row in r.history if key in row}
        try:
            study.add_trial(create_trial(state=state, value=value, params=params, distributions=dists,
                                         intermediate_values=inter, user_attrs={"variant": r.variant, "run": r.run}))
        except ValueError as e:
            data.notes.append(f"{r.variant}: left out of the Optuna plots ({e})")
    return study


def search_rows(data: ReportData, study) -> list[dict]:
    """One row per trial (every state, never dropped): number, variant, state, value, params, steps, run."""
    from ...sweep.status import SKIP_STATES

    by_trial = {r.trial: r for r in data.records if r.trial is not None}
    by_variant = {r.variant: r for r in data.records}
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        rec = by_trial.get(t.number) or by_variant.get(a.get("variant"))
        state = t.state.name.lower()
        if a.get("skip"):
            state = SKIP_STATES.get(a["skip"], "skipped")
        value = t.value
        if rec is not None and rec.later_attempt and t.state.name == "COMPLETE":
            value = getattr(rec, data.sweep.metric, None)  # its folder trained on past the budget: read at it
        rows.append({"trial": t.number, "variant": a.get("variant") or (rec.variant if rec else None), "state": state,
                     "value": value, "params": dict(t.params), "steps": (rec.steps if rec else None) or
                     (max(t.intermediate_values) if t.intermediate_values else None),
                     "dev_ppl": rec.dev_ppl if rec else None, "dev_bleu": rec.dev_bleu if rec else None,
                     "run": (rec.run if rec else None) or a.get("run_dir") or a.get("run"),
                     "note": a.get("reason") or a.get("error") or (rec.note if rec else None)})
    return rows


def _param(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else fmt_knob(x)


def search_markdown(data: ReportData, study, rows: list[dict]) -> str:
    sweep = data.sweep
    keys = list(sweep.space or {})
    head = ["trial", "variant", "state", sweep.metric, *map(md_text, keys), "steps", "dev PPL", "dev BLEU", "note"]
    # the trials' strings (variant, note, values) as text (md_text): never markup in search.html
    lines = [f"# Search {md_code(sweep.name)}", "",
             f"Base experiment {md_code(sweep.experiment.name)}; {sweep.direction} {sweep.metric}; sampler "
             f"{sweep.sampler.get('type')}, pruner {sweep.pruner.get('type')}; {len(rows)} trial(s).", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [str(r["trial"]), r["variant"] or "", r["state"], fmt(r["value"], 4),
                 *[_param(r["params"].get(k)) for k in keys],
                 fmt_knob(r["steps"]), fmt(r["dev_ppl"], 2), fmt(r["dev_bleu"], 2), (r["note"] or "")[:80]]
        lines.append("| " + " | ".join(md_cell(md_text(c)) for c in cells) + " |")
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    if done:
        best = (min if sweep.direction == "minimize" else max)(done, key=lambda r: (r["value"], r["trial"]))
        lines += ["", f"Best: trial {best['trial']} ({md_text(best['variant'])}), {sweep.metric} {best['value']:.4f}, "
                      + ", ".join(md_text(f"{k}={_param(best['params'].get(k))}") for k in keys) + "."]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines.append("States: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials") + ".")
    lines += [md_text(n) for n in data.notes]
    return "\n".join(lines) + "\n"


def search_csv(data: ReportData, rows: list[dict]) -> str:
    keys = list(data.sweep.space or {})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["trial", "variant", "state", data.sweep.metric, *keys, "steps", "dev_ppl", "dev_bleu", "run", "note"])
    for r in rows:
        w.writerow([r["trial"], r["variant"] or "", r["state"], "" if r["value"] is None else f"{r['value']:.6g}",
                    *["" if r["params"].get(k) is None else r["params"][k] for k in keys],
                    "" if r["steps"] is None else r["steps"], "" if r["dev_ppl"] is None else f"{r['dev_ppl']:.6g}",
                    "" if r["dev_bleu"] is None else f"{r['dev_bleu']:.6g}", r["run"] or "", r["note"] or ""])
    return buf.getvalue()


def write_search(data: ReportData, study, rows: list[dict], out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return (write_text(out / "search.md", search_markdown(data, study, rows)),
            write_text(out / "search.csv", search_csv(data, rows)))


def _pyplot():
    import matplotlib
    import matplotlib.pyplot as plt
    if matplotlib.get_backend().lower() != "agg":
        plt.switch_backend("Agg")
    return plt


def _optuna_plot(fn, study, path, **kw) -> str:
    import matplotlib
    import optuna
    plt = _pyplot()
    with matplotlib.rc_context(), warnings.catch_warnings():  # optuna applies a global style: undo it after
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = fn(study, **kw)
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        fig.set_size_inches(8, 4.5)
        literal_text(fig)
        fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight")
        plt.close(fig)
    return str(path)


def plot_optimization_history(study, path: str | Path) -> str:
    from optuna.trial import TrialState
    from optuna.visualization.matplotlib import plot_optimization_history as plot
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return placeholder(path, "optimization history", "no completed trial yet")
    return _optuna_plot(plot, study, path)


def plot_param_importances(study, path: str | Path) -> str:
    """Optuna's parameter importances (its default evaluator, PED-ANOVA: deterministic, numpy only)."""
    from optuna.trial import TrialState
    from optuna.visualization.matplotlib import plot_param_importances as plot
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varied = {k for t in done for k in t.params if len({repr(u.params.get(k)) for u in done}) > 1}
    if len(done) < 2 or not varied:
        return placeholder(path, "parameter importances",
                            f"needs at least 2 completed trials that differ ({len(done)} completed)")
    return _optuna_plot(plot, study, path)


def plot_intermediate_values(study, path: str | Path) -> str:
    from optuna.visualization.matplotlib import plot_intermediate_values as plot
    if not any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        return placeholder(path, "intermediate values", "no trial reported a dev metric yet")
    return _optuna_plot(plot, study, path)
