"""A report in the sweep's Optuna study, for optuna-dashboard (only when the report read an Optuna storage and
``optuna_dashboard`` and ``plotly`` are importable: :func:`dashboard_available`; else nothing).

The study's note gets the report's block (:func:`note_text`, between the markers of :data:`NOTES`; what a report of
each kind puts there: its :class:`~.core.columns.Kind`'s ``note``, :data:`.kinds.KINDS`): Table 3's headline and the
dev-perplexity table of ``table3.md`` (the columns of :data:`~.table3.columns.NOTE`), Table 2's title, claim and rows.
A note a person wrote is kept below it (:func:`merge_note`). A Table 3 report also gives the study two custom plots,
plotly figures of the matplotlib ones' data: dev perplexity per row family (:func:`plotly_dev_ppl_by_family`; the
base as one curve, the mean over its seeds, their range shaded) and every row's learning curve
(:func:`plotly_learning_curves`), under the stable ids of :data:`GRAPH_IDS` (a re-run replaces them). Strings of the
runs go into plotly's text (which it reads as HTML) escaped.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from ..core.text import html_text, md_code
from .kinds import KIND, KINDS

GRAPH_IDS = {"family": "ltfm-table3-dev-ppl-by-family", "curves": "ltfm-table3-learning-curves"}
# Each report kind's block of the study note (markdown link-reference "comments", not rendered): a person's note stays
NOTES = {k: (f"[//]: # (ltfm report {k}: begin)", f"[//]: # (ltfm report {k}: end)") for k in KINDS}
NOTE_BEGIN, NOTE_END = NOTES[KIND]


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
    for j, (v, series) in enumerate(curves.rows.items()):
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
