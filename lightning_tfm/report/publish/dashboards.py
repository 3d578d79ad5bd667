"""Table 3 and Table 2 where researchers look: after ``ltfm report`` has written a variants sweep's report folder,
:func:`publish` puts it in the W&B project of the sweep's runs and in the sweep's Optuna study.

W&B: ONE run of job type ``report`` in the sweep's group, id ``report-<sweep>-table3`` (stable, with
``resume="allow"``: a re-run writes the same run again rather than a second one). It holds:

- ``table3/dev_ppl`` and ``table3/dev_bleu``: ``wandb.Table``\\ s, one row per row of the table, the columns of
  :data:`~.table3.columns.WANDB_PPL` and :data:`~.table3.columns.WANDB_BLEU` (ours, the paper's, both changes,
  agreement, the noise verdict, status) with the values ``table3.csv`` gives them (:func:`wandb_tables`);
- the summary: the headline numbers (:func:`headline_numbers`: direction agreement over all rows and over the
  rows beyond seed noise and over the rows whose verdict holds, rows beyond noise, rows of each verdict, the
  sweep's wall time), counted from the table's rows with the report's own
  :func:`~.stats.agreement_summary` and :func:`~.verdict.verdict_summary`;
- ``figures/<name>``: every ``*.png`` of the report as a ``wandb.Image``;
- the artifact ``table3-<sweep>`` (type ``report``): ``table3.md``, ``table3.csv``, ``table3.html``.

A Table 2 report (a sweep of several architectures, :mod:`.table2`) goes the same way: run
``report-<sweep>-table2``, the W&B table ``table2/rows`` (``table2.csv``'s rows: ours, then the paper's), the
summary of :func:`.table2.table.summary_numbers`, its figures, the artifact ``table2-<sweep>`` and a study note of its
own block; no custom plots. What each kind gives each place: its :class:`~.columns.Kind` in :data:`KINDS`.

Mode, project and entity are resolved as for the training runs (``WANDB_MODE`` else the experiment's
``wandb.mode`` through :func:`lightning_tfm.training.tracking.tracking.resolve_mode`; ``WANDB_PROJECT``/``WANDB_ENTITY``
else ``wandb.project``/``wandb.entity``); ``disabled`` logs nothing. The run's files go to
``<results>/wandb-report/wandb/`` (never into the report folder, which each report replaces); offline, the
older ``offline-run-*-<id>`` folders of the same id are removed once the new run is written, so
``wandb sync`` finds one. Two reports of one sweep at once publish one after the other (:func:`publish_lock`,
``<results>/wandb-report/.publish.lock``; the one that waits says so in a line): the last one's run is the one
left, in the folder it printed. A W&B error is one warning line on stderr: the report stays a success.

A pipeline check's report (its runs tagged ``pipeline-check``: ``make ablation QUICK=1``) is its own run:
id ``report-<sweep>-pipeline-check-table3``, group ``<sweep>-pipeline-check`` (where its training runs are,
:func:`lightning_tfm.training.tracking.tracking.wandb_group`), tag ``pipeline-check``: the real report's run and group
are never touched. Strings of the runs go into plotly's text (which it reads as HTML) escaped.

optuna-dashboard (only when the report read an Optuna storage and ``optuna_dashboard`` and ``plotly`` are
importable; else nothing): the study's note gets the headline and the dev-perplexity table of ``table3.md``
(:func:`note_text`, the columns of :data:`~.columns.NOTE`; a note a person wrote is kept below it), and its custom
plots two plotly figures of the matplotlib ones' data: dev perplexity per row family (:func:`plotly_dev_ppl_by_family`;
the base as one curve, the mean over its seeds, their range shaded) and every row's learning curve
(:func:`plotly_learning_curves`), under the stable ids of :data:`GRAPH_IDS` (a re-run replaces them).
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from ..table2 import table as table2, columns as table2_columns
from ..table3.columns import NOTE, WANDB_BLEU, WANDB_PPL, columns
from ..core.columns import Kind
from ..table3.table import rebuilt_table
from ..views.render import headline_markdown, ppl_markdown
from ..inputs.records import REPORT_JOB_TYPE as JOB_TYPE
from ..core.text import environment, first_line, html_text, md_code, waiting_lock

KIND = "table3"
WANDB_DIR = "wandb-report"   # below the sweep's results folder
LOCK = ".publish.lock"       # in WANDB_DIR: one report at a time publishes a sweep's results folder
WANDB_TABLES = {"table3/dev_ppl": WANDB_PPL, "table3/dev_bleu": WANDB_BLEU}   # W&B table -> its view (.columns)
GRAPH_IDS = {"family": "ltfm-table3-dev-ppl-by-family", "curves": "ltfm-table3-learning-curves"}


#: Each report kind: its columns and what W&B and optuna-dashboard take of it (:class:`~.columns.Kind`)
KINDS = {k.name: k for k in (
    Kind("table3", columns, ("table3.md", "table3.csv", "table3.html", "table3.tex", "table3-standalone.tex"),
         WANDB_TABLES, lambda t: headline_numbers(t["rows"], t["run_info"]),
         lambda t: [headline_markdown(t), ppl_markdown(t, NOTE)], lambda data, sweep, out: rebuilt_table(sweep, out),
         plots=True),
    Kind("table2", table2_columns.columns, ("table2.md", "table2.csv", "table2.html"),
         {"table2/rows": table2_columns.CSV}, table2.summary_numbers, table2.note_parts,
         lambda data, sweep, out: table2.build_table2(data), rows=table2.csv_rows, digits=None))}
# Each report kind's block of the study note (markdown link-reference "comments", not rendered): a person's note stays
NOTES = {k: (f"[//]: # (ltfm report {k}: begin)", f"[//]: # (ltfm report {k}: end)") for k in KINDS}
NOTE_BEGIN, NOTE_END = NOTES[KIND]


def _warn(message: str) -> None:
    print(f"ltfm: warning: {message}", file=sys.stderr, flush=True)


def wandb_tables(table: dict) -> dict[str, tuple[list[str], list[list]]]:
    """Each W&B table of a Table 3 report (:data:`WANDB_TABLES`) as (its columns, a list of cells per row)."""
    return KINDS[KIND].wandb_tables(table)


def headline_numbers(rows: list[dict], run_info: dict | None = None) -> dict:
    """The headline as numbers for a W&B summary: per metric (``dev_ppl``, ``dev_bleu``) the rows whose
    direction agrees with the paper and the rows compared, over all rows and over the rows beyond seed noise
    (with the fractions), the rows beyond/within noise or unknown; dev PPL's agreement over the rows that hold and the
    rows of each budget verdict; the sweep's wall time. ``rows``: the table's; the counting is the
    report's own (:func:`~.stats.agreement_summary`, :func:`~.verdict.verdict_summary`)."""
    from ..table3.stats import agreement_summary

    s = agreement_summary(rows)
    out: dict[str, Any] = {}
    for metric in ("ppl", "bleu"):
        key = f"dev_{metric}"
        for suffix, (k, n) in (("", s[metric]), ("_beyond_noise", s[f"{metric}_beyond"])):
            out[f"{key}/agree_rows{suffix}"] = k
            out[f"{key}/compared_rows{suffix}"] = n
            if n:
                out[f"{key}/agreement{suffix}"] = k / n
        for verdict, count in s[f"{metric}_noise"].items():
            out[f"{key}/rows_{verdict}_noise" if verdict != "unknown" else f"{key}/rows_noise_unknown"] = count
    out["both/agree_rows"], out["both/compared_rows"] = s["both"]
    from ..table3.verdict import verdict_summary
    v = verdict_summary(rows)  # the budget verdicts (the rows' ppl_verdict)
    out["dev_ppl/agree_rows_findings"], out["dev_ppl/compared_rows_findings"] = v["ppl_findings"]
    for verdict, count in v["verdicts"].items():
        out[f"dev_ppl/verdict_{verdict.replace(' ', '_')}"] = count
    info = run_info or {}
    for key, name in (("wall_s", "wall_time_s"), ("train_s", "train_time_s"), ("runs", "completed_runs"),
                      ("records", "runs")):
        if info.get(key) is not None:
            out[name] = info[key]
    return out


# ---------------------------------------------------------------------------------------------------------
# W&B
# ---------------------------------------------------------------------------------------------------------
def publish_lock(results_dir: str | Path) -> Path:
    """The lock a report holds while it publishes a sweep (its W&B report run, the study's note and plots):
    two reports of one sweep at once publish one after the other, the last one's run is the one left."""
    return Path(results_dir) / WANDB_DIR / LOCK


def report_run_id(sweep_name: str, kind: str = KIND, pipeline_check: bool = False) -> str:
    """``report-<sweep>-<kind>``: one W&B run per (sweep, report kind), whatever the machine or the day; a
    pipeline check's (``make ablation QUICK=1``) is ``report-<sweep>-pipeline-check-<kind>``, never the real one."""
    if pipeline_check:
        from ...training.tracking.tracking import PIPELINE_CHECK
        sweep_name = f"{sweep_name}-{PIPELINE_CHECK}"
    rid = f"report-{sweep_name}-{kind}"
    if len(rid) > 64:  # a long sweep name: keep the id short, and unique with a hash of the full name
        rid = f"report-{sweep_name[:40]}-{hashlib.sha1(sweep_name.encode()).hexdigest()[:8]}-{kind}"
    return rid


def wandb_target(sweep, wandb_path: str | None = None) -> dict:
    """mode / project / entity of the sweep's W&B runs, resolved as the training runs resolve them; a report
    read ``--from-wandb ENTITY/PROJECT`` goes to that project."""
    import os

    from ...sweep import trial_config
    from ...training.tracking.tracking import resolve_mode

    cfg = trial_config(sweep, checked=False)
    target = {"mode": resolve_mode(cfg), "project": os.environ.get("WANDB_PROJECT") or cfg.wandb.project,
              "entity": os.environ.get("WANDB_ENTITY") or cfg.wandb.entity}
    if wandb_path:
        target["entity"], target["project"] = wandb_path.split("/", 1)
    return target


def run_folders(wandb_dir: Path, run_id: str, offline_only: bool = False) -> list[Path]:
    """wandb's folders of run ``run_id`` in ``wandb_dir``: ``offline-run-<time>-<id>`` (and, unless
    ``offline_only``, ``run-<time>-<id>``; wandb adds ``-<n>`` to a second run started in the same second),
    oldest first."""
    prefix = "offline-" if offline_only else "(?:offline-)?"
    pattern = re.compile(rf"{prefix}run-(?P<time>\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(?P<n>\d+))?")
    found = [(m, p) for p in Path(wandb_dir).glob(f"*{run_id}*") if p.is_dir() and (m := pattern.fullmatch(p.name))]
    return [p for m, p in sorted(found, key=lambda mp: (mp[0]["time"], int(mp[0]["n"] or 0)))]


def superseded_folders(wandb_dir: Path, run_id: str, keep: Path | None) -> list[Path]:
    """Offline run folders of ``run_id`` in ``wandb_dir`` other than ``keep``."""
    return [p for p in run_folders(wandb_dir, run_id, offline_only=True)
            if keep is None or p.resolve() != keep.resolve()]


def log_wandb_report(sweep, out: Path, results_dir: Path, table: dict, target: dict,
                     pipeline_check: bool = False, kind: str = KIND) -> dict | None:
    """The report folder ``out`` and its ``table`` (:func:`~.table3.table.rebuilt_table`) as the sweep's W&B report run
    (see the module docstring); None when W&B is disabled. Raises whatever wandb raises (:func:`publish` turns
    it into a warning). Call it holding :func:`publish_lock` (:func:`publish` does): it removes the run's older
    offline folders."""
    if target["mode"] == "disabled":
        return None
    root = Path(results_dir) / WANDB_DIR
    root.mkdir(parents=True, exist_ok=True)
    run_id = report_run_id(sweep.name, kind, pipeline_check)
    before = set(run_folders(root / "wandb", run_id))
    try:
        return _log_run(sweep, out, table, target, root, run_id, pipeline_check, kind)
    except BaseException:
        # a failed start leaves an empty online run folder (as in tracking.py), a failed write an incomplete
        # offline one: `wandb sync` would upload them as attempts of this run; the earlier, complete run stays
        for stub in set(run_folders(root / "wandb", run_id)) - before:
            shutil.rmtree(stub, ignore_errors=True)
        raise


def _log_run(sweep, out: Path, table: dict, target: dict, root: Path, run_id: str,
             pipeline_check: bool = False, kind: str = KIND) -> dict:
    import wandb

    from ...training.redact import scrub
    from ...training.tracking.tracking import PIPELINE_CHECK, scrubbed_argv, wandb_group  # wandb records sys.argv

    tags = [JOB_TYPE, kind] + ([PIPELINE_CHECK] if pipeline_check else [])
    with scrubbed_argv():
        run = wandb.init(id=run_id, resume="allow", mode=target["mode"], dir=str(root), project=target["project"],
                         entity=target["entity"], group=wandb_group(sweep.name, tags), job_type=JOB_TYPE,
                         name=f"{sweep.name} {kind}" + (f" ({PIPELINE_CHECK})" if pipeline_check else ""), tags=tags,
                         config=scrub({"report.kind": kind, "report.sweep": sweep.name,
                                       "report.pipeline_check": pipeline_check,
                                       "report.sweep_file": str(Path(sweep.path).absolute()),
                                       "report.folder": str(out)}),
                         settings=wandb.Settings(silent=True, console="off", save_code=False, disable_git=True))
    folder = Path(run.dir).parent
    try:
        with _staging_in(folder):
            _log_report(run, out, table, sweep.name + (f"-{PIPELINE_CHECK}" if pipeline_check else ""), kind)
    except BaseException:
        run.finish(exit_code=1)
        wandb.teardown()
        raise
    run.finish()
    wandb.teardown()  # as tracking.finish: the run's files are complete only once wandb-core has exited
    removed = []
    if target["mode"] == "offline":
        for old in superseded_folders(folder.parent, run_id, keep=folder):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return {"run_id": run_id, "mode": target["mode"], "project": target["project"], "folder": folder,
            "removed": removed}


@contextlib.contextmanager
def _staging_in(folder: Path):
    """wandb stages artifact files (the tables', the report's) in ``$WANDB_DATA_DIR/artifacts/staging``
    (default ``~/.local/share/wandb``) until they are uploaded: put them in the run's own folder, so an offline
    run carries them to ``wandb sync`` and a superseded run takes them away with it."""
    with environment("WANDB_DATA_DIR", str(folder / "staging")):
        yield


def report_contents(table: dict, kind: str = KIND) -> tuple[dict, dict]:
    """(the summary numbers, the W&B tables {name: (columns, rows)}) of a report of ``kind`` (:data:`KINDS`)."""
    return KINDS[kind].summary(table), KINDS[kind].wandb_tables(table)


def _log_report(run, out: Path, table: dict, sweep_name: str, kind: str = KIND) -> None:
    import wandb

    summary, tables = report_contents(table, kind)
    logged = {name: wandb.Table(columns=cols, data=data) for name, (cols, data) in tables.items()}
    for png in sorted(out.glob("*.png")):
        logged[f"figures/{png.stem}"] = wandb.Image(str(png), caption=png.name)
    run.log(logged)
    run.summary.update(summary)
    artifact = wandb.Artifact(f"{kind}-{sweep_name}", type=JOB_TYPE, metadata=dict(summary))
    for name in KINDS[kind].files:
        artifact.add_file(str(out / name), name=name)
    run.log_artifact(artifact, aliases=["latest"])


# ---------------------------------------------------------------------------------------------------------
# optuna-dashboard
# ---------------------------------------------------------------------------------------------------------
def note_text(table: dict, where: str | None = None, kind: str = KIND) -> str:
    """The study note in its block (:data:`NOTES`): Table 3's headline and dev-perplexity section as table3.md has
    them (the section's columns: :data:`~.columns.NOTE`); Table 2's title, claim and rows as table2.md has them."""
    parts = KINDS[kind].note(table)
    tail = [f"_Written by `ltfm report`; the whole report: {md_code(where)}._"] if where else []
    return "\n\n".join([NOTES[kind][0], *(p.rstrip() for p in parts), *tail, NOTES[kind][1]]) + "\n"


def merge_note(existing: str, ours: str) -> str:
    """``ours`` in place of its report's earlier block (:data:`NOTES`); any other text of the note (a person's) kept
    after it."""
    begin, end = ours.splitlines()[0], ours.rstrip().splitlines()[-1]
    if begin in existing and end in existing:
        before, rest = existing.split(begin, 1)
        after = rest.split(end, 1)[1]
        others = (before.strip() + "\n\n" + after.strip()).strip()
    else:
        others = existing.strip()
    return ours + ("\n" + others + "\n" if others else "")


_TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")  # matplotlib's C0..C9, as the PNG figures use


def _wide(ys: list[float]) -> bool:
    ys = [y for y in ys if y and y > 0]
    return bool(ys) and max(ys) / min(ys) > 5  # the rule of figures._set_yscale


def plotly_dev_ppl_by_family(data):
    """Dev perplexity against step per row family, with the base (black) in each: the panels and curves of
    :func:`~.figures.plot_dev_ppl_by_family`, one family at a time behind a menu (optuna-dashboard draws a
    custom plot in a 450-pixel-high card, too small for a grid of panels)."""
    import plotly.graph_objects as go

    from ...training.runs.results import DEV_PPL
    from ..views.figures import FAMILY_TITLES, family_panels, metric_series, panel_of

    variants, panels = family_panels(data)
    curves = {v: [(r, metric_series(r, DEV_PPL)) for r in sorted((r for r in data.records if r.variant == v),
                                                                 key=lambda r: (r.seed is None, r.seed or 0))]
              for v in ["base", *variants]}
    many = len(data.sweep.seeds) > 1
    fig = go.Figure()
    groups, titles, logs = [], [], []
    for k, panel in enumerate(panels):
        members = ["base"] + [v for v in variants if panel_of(data, v) == panel]
        traces, ys_all = [], []
        for j, v in enumerate(members):
            if v == "base":  # as the PNG: one curve, the mean over the seeds, their range shaded
                added = _add_base(fig, [r for r, (xs, _) in curves[v] if xs], DEV_PPL, visible=k == 0)
                traces += added
                ys_all += [y for i in added for y in fig.data[i].y]
                continue
            for r, (xs, ys) in curves[v]:
                if xs:
                    fig.add_scatter(x=xs, y=ys, mode="lines+markers",
                                    name=html_text(f"{v} s{r.seed}" if many else v),
                                    visible=k == 0, line={"color": _TAB10[j % 10]})
                    traces.append(len(fig.data) - 1)
                    ys_all += ys
        # as the PNG: the rows without a curve are named with their status
        no_curve = [html_text(f"{v} ({curves[v][0][0].status if curves[v] else 'missing'})") for v in members
                    if v in variants and not any(xs for _, (xs, _) in curves[v])]
        groups.append(traces)
        titles.append(f"Dev perplexity per row family: {html_text(FAMILY_TITLES.get(panel, f'family {panel}'))}, "
                      "base in black"
                      + (f"<br><sub>no curve: {', '.join(no_curve)}</sub>" if no_curve else ""))
        logs.append("log" if _wide(ys_all) else "linear")
    buttons = [{"label": html_text(panel), "method": "update",
                "args": [{"visible": [i in traces for i in range(len(fig.data))]},
                         {"title.text": title, "yaxis.type": log}]}
               for panel, traces, title, log in zip(panels, groups, titles, logs)]
    fig.update_layout(title={"text": titles[0], "font": {"size": 13}}, xaxis_title="training step",
                      yaxis={"title": {"text": "dev perplexity"}, "type": logs[0]}, margin={"t": 90},
                      updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.02, "xanchor": "left",
                                    "y": 0.25, "yanchor": "top", "showactive": True}] if len(panels) > 1 else [],
                      annotations=[{"text": "row family:", "showarrow": False, "x": 1.02, "xanchor": "left",
                                    "y": 0.33, "yanchor": "top", "xref": "paper", "yref": "paper"}]
                      if len(panels) > 1 else [])
    return fig


def _add_base(fig, recs: list, key: str, visible: bool) -> list[int]:
    """The base row's traces: its curve (the mean over its seeds, :func:`~.figures.seed_band`) and, with several
    seeds, their range as a shaded band (two bound traces outside the legend); the indices of the traces added."""
    from ..views.figures import base_label, seed_band

    if not recs:
        return []
    steps, mean, lo, hi = seed_band(recs, key)
    first = len(fig.data)
    if len(recs) > 1:
        for bound, ys, fill in (("highest", hi, None), ("lowest", lo, "tonexty")):
            fig.add_scatter(x=steps, y=ys, mode="lines", line={"width": 0, "color": "black"}, fill=fill,
                            fillcolor="rgba(0,0,0,0.15)", showlegend=False, visible=visible,
                            name=f"base, {bound} of {len(recs)} seeds", hoverinfo="x+y+name")
    fig.add_scatter(x=steps, y=mean, mode="lines+markers", name=html_text(base_label(len(recs))), visible=visible,
                    line={"color": "black", "width": 2})
    return list(range(first, len(fig.data)))


def plotly_learning_curves(data):
    """Every row's dev perplexity at each validation, the mean over its completed seeds (the report's
    learning-curve table, :func:`~.table3.table.learning_curves`)."""
    import plotly.graph_objects as go

    from ..table3.table import learning_curves, ordered_variants

    curves = learning_curves(data, ordered_variants(data.sweep, data.records))
    fig = go.Figure()
    ys_all: list[float] = []
    for j, (v, series) in enumerate(curves["rows"].items()):
        steps = sorted(series)
        fig.add_scatter(x=steps, y=[series[s] for s in steps], mode="lines+markers", name=html_text(v),
                        line={"color": "black" if v == "base" else _TAB10[j % 10]})
        ys_all += list(series.values())
    fig.update_layout(title={"text": f"Learning curves: dev perplexity of every row, mean over its seeds (sweep "
                                     f"{data.sweep.name})", "font": {"size": 13}},
                      xaxis_title="training step", yaxis={"title": {"text": "dev perplexity"},
                                                          "type": "log" if _wide(ys_all) else "linear"})
    return fig


def dashboard_available() -> bool:
    """optuna-dashboard (the ``dashboard`` extra) and plotly can be imported."""
    import importlib

    try:
        for module in ("optuna_dashboard", "plotly.graph_objects"):
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def save_plot(study, fig, graph_id: str) -> str:
    """optuna-dashboard's ``save_plotly_graph_object`` under a fixed id (its keyword differs by version)."""
    from optuna_dashboard import save_plotly_graph_object

    params = inspect.signature(save_plotly_graph_object).parameters
    key = "graph_object_id" if "graph_object_id" in params else "graph_id"
    return save_plotly_graph_object(study, fig, **{key: graph_id})


def _current_note(study) -> str:
    try:
        from optuna_dashboard import get_note  # public in recent versions
    except ImportError:
        from optuna_dashboard._note import get_note_from_system_attrs
        return get_note_from_system_attrs(study._storage.get_study_system_attrs(study._study_id), None)["body"]
    return get_note(study)


def write_dashboard(data, table: dict, out: Path, kind: str = KIND) -> dict:
    """The study's note (of ``table``) and, for Table 3, its custom plots (see the module docstring)."""
    from optuna_dashboard import save_note

    study = data.study
    save_note(study, merge_note(_current_note(study), note_text(table, str(out / f"{kind}.html"), kind)))
    ids = [save_plot(study, plotly_dev_ppl_by_family(data), GRAPH_IDS["family"]),
           save_plot(study, plotly_learning_curves(data), GRAPH_IDS["curves"])] if KINDS[kind].plots else []
    return {"study": study.study_name, "plots": ids}


# ---------------------------------------------------------------------------------------------------------
# After ltfm report
# ---------------------------------------------------------------------------------------------------------
def publish(sweep, parameters: dict, out: Path, table: dict | None = None) -> list[str]:
    """After the report folder ``out`` is written: the W&B report run and the optuna-dashboard note (and plots) of
    ``table``, a Table 3 report's or, for a sweep of several architectures (:func:`.table2.table.is_table2`), a Table 2
    report's (default: rebuilt from the folder's export; Table 2's: from the runs). Returns the lines to print;
    every failure here is a one-line warning, never the report's failure."""
    from ...training.redact import scrub
    from ..inputs.records import default_results_dir
    from ..inputs.sources import load_report_data

    lines: list[str] = []
    urls = [parameters.get("storage") or ""]  # its password masked in a warning, however the message quotes it
    try:
        data = load_report_data(parameters["sweep_file"], results_dir=parameters.get("results_dir"),
                                storage=parameters.get("storage"), wandb_path=parameters.get("wandb_path"))
    except Exception as e:  # noqa: BLE001 - the report is written; only its copies here are lost
        _warn(f"report not sent to W&B or optuna-dashboard: cannot re-read the sweep "
              f"({e.__class__.__name__}: {first_line(scrub(str(e), urls))})")
        return lines
    results = Path(parameters.get("results_dir") or default_results_dir(sweep))
    try:
        publish_lock(results).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _warn(f"report not sent to W&B or optuna-dashboard: cannot write {results / WANDB_DIR} ({e.strerror})")
        return lines
    with waiting_lock(publish_lock(results), f"sweep {sweep.name}'s W&B report run ({results / WANDB_DIR})"):
        return _publish(sweep, parameters, out, data, results, lines, urls, table)


def _publish(sweep, parameters: dict, out: Path, data, results: Path, lines: list[str], urls: list[str],
             table: dict | None) -> list[str]:
    from ...training.redact import scrub
    from .notebooks import notebook_name

    kind = notebook_name(sweep)  # table2 or table3: the report's notebook
    try:
        table = table if table is not None else KINDS[kind].build(data, sweep, out)
    except Exception as e:  # noqa: BLE001 - the report is written; only its copies here are lost
        _warn(f"report not sent to W&B or optuna-dashboard: cannot rebuild its table ({e.__class__.__name__}: "
              f"{first_line(scrub(str(e), urls))})")
        return lines
    try:
        target = wandb_target(sweep, parameters.get("wandb_path"))
        info = log_wandb_report(sweep, out, results, table, target, table["pipeline_check"], kind)
        if info is not None:
            where = (f"offline in {info['folder']} (upload: wandb sync {info['folder']})"
                     if info["mode"] == "offline" else f"project {info['project']}")
            lines.append(f"  W&B: report run {info['run_id']}, {where}")
    except Exception as e:  # noqa: BLE001 - W&B must never fail the report
        _warn(f"report not logged to W&B ({e.__class__.__name__}: {first_line(scrub(str(e), urls))}); the report "
              "itself is complete (run `ltfm report` again to log it)")
        try:
            import wandb
            wandb.teardown()
        except Exception:  # noqa: BLE001
            pass
    if data.study is not None and not parameters.get("wandb_path") and dashboard_available():
        try:
            d = write_dashboard(data, table, out, kind)
            plots = f" and {len(d['plots'])} plots" if d["plots"] else ""
            lines.append(f"  optuna-dashboard: note{plots} on study {d['study']}")
        except Exception as e:  # noqa: BLE001 - nor the dashboard
            _warn(f"report not written to optuna-dashboard ({e.__class__.__name__}: {first_line(scrub(str(e), urls))})")
    return lines
