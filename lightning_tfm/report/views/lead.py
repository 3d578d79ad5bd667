"""The report's lead figure, ``changes.png``: what each row of Table 3 changes against the base, ours beside the
paper's, in one picture (the first thing after the headline; the tables follow).

One line per row of the table (:func:`~.table.build_table`), in its order, grouped by family under the family's
title (:data:`~.figures.FAMILY_TITLES`); each row named with the knobs it sets apart from the base. Per metric (dev
perplexity, and dev BLEU when our rows have it) a panel of paired horizontal bars: ours above the paper's, each
side's change against its own base as a share of that base (the table's ``delta_*_rel`` and ``paper_delta_*_rel``:
absolute values are not comparable across corpora and model sizes, relative changes and their directions are).
Our bar is blue where its direction is the paper's, orange where it is the opposite, purple where the paper has no
direction to compare with; pale where the change is within seed noise. The band shaded around zero is the seed
noise (``NOISE_K`` × the base's standard deviation over its seeds, as a share of the base: the table's rule,
:mod:`.stats`). The right column is each row's verdict (:mod:`.verdict`: holds, may flip, within noise, too few
points). A row with no change to show (no completed run, or no base) says "no data" in place of its bar; a row the
paper lacks says so in place of the paper's. A change is never shown as a share of a base of (about) nothing: where
our base's value shows as 0, or a dev BLEU below :data:`~.stats.BLEU_FLOOR` (BLEU set by the smoothing of zero
counts), our bars give way to "n/a" and the absolute change (:func:`relative_shown`). A pipeline check's figure
(runs tagged ``pipeline-check``) says so in its title and across it (:func:`~.plots.mark_pipeline_check`).

:func:`changes_markdown` is its section of ``table3.md`` (the figure and its caption), :func:`changes_caption` the
same without the image (the notebook shows the figure itself below it).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from ...findings.answers import BETTER, SAME, UNSETTLED, WORSE
from ...findings.noise import NOISE_K
from ...training.config.config import TABLE3_KNOBS
from ..core.plots import mark_pipeline_check, save_figure
from ..core.text import fmt_knob
from ..table3.stats import BLEU_FLOOR
from ..table3.table import Table3
from ..table3.verdict import HOLDS, MAY_FLIP, TOO_FEW, WITHIN
from .figures import FAMILY_TITLES, OTHER

NAME = "changes.png"
TITLE = "Each row's change against the base, ours beside the paper's"
METRICS = (("ppl", "dev perplexity", "lower is better"), ("bleu", "dev BLEU", "higher is better"))
AGREES, OPPOSITE, NO_SIGN, PAPER = "#1f77b4", "#ff7f0e", "#9467bd", "#8c8c8c"   # matplotlib's C0, C1, C4; grey
PALE = 0.35           # the alpha of our bar within seed noise
VERDICT_STYLE = {HOLDS: {"color": "black", "fontweight": "bold"}, MAY_FLIP: {"color": "black", "fontstyle": "italic"},
                 WITHIN: {"color": "dimgray"}, TOO_FEW: {"color": "dimgray", "fontstyle": "italic"}}
ANSWER_STYLE = {BETTER: {"color": "#2ca02c", "fontweight": "bold"}, WORSE: {"color": "#d62728", "fontweight": "bold"},
                SAME: {"color": "black"}, UNSETTLED: {"color": "dimgray", "fontstyle": "italic"}}
_BAR, _GAP = 0.36, 0.19   # a bar's height; each bar's offset from its row's line (ours above, the paper's below)


def row_label(row, base) -> str:
    """The row's name and the Table 3 knobs it sets apart from the base's (``A1: h 1, d_k 128, d_v 128``)."""
    knobs, base_knobs = row.knobs or {}, (base.knobs or {}) if base is not None else {}
    parts = []
    for k in TABLE3_KNOBS:  # each as its Table 3 column labels it ("h 1", "learned positions")
        v = knobs.get(k.key)
        if v is None or v == base_knobs.get(k.key) or not base_knobs:
            continue
        parts.append(k.label.format(fmt_knob(v)))
    name = str(row.variant)
    return textwrap.fill(name + (": " + ", ".join(parts) if parts else ""), 46, subsequent_indent="  ")


def _family(row) -> str:
    return row.family or OTHER


def lines(table: Table3) -> list[tuple[str, object]]:
    """The figure's lines top to bottom: ``("family", title)`` before each family's first row, then
    ``("row", row)`` for each row but the base, in the table's order."""
    out: list[tuple[str, object]] = []
    last = None
    for row in table.rows:
        if row.variant == "base":
            continue
        fam = _family(row)
        if fam != last:
            out.append(("family", FAMILY_TITLES.get(fam, f"family {fam}")))
            last = fam
        out.append(("row", row))
    return out


def _base(table: Table3):
    return next((r for r in table.rows if r.variant == "base"), None)


def noise_band(table: Table3, metric: str) -> float | None:
    """Seed noise as a share of our base's value: ``NOISE_K`` × the base's std over its seeds / the base's mean
    (None: fewer than two base seeds, or no base)."""
    base, sd = _base(table), table.base_std.get(metric)
    value = getattr(base, f"dev_{metric}") if base is not None else None
    if sd is None or not value:
        return None
    return NOISE_K * sd / abs(value)


def shown_metrics(table: Table3) -> list[tuple[str, str, str]]:
    """dev perplexity, and dev BLEU when one of our rows has a BLEU."""
    return [m for m in METRICS if m[0] == "ppl" or any(r.dev_bleu is not None for r in table.rows)]


_STATUS = re.compile(r"\b(missing|waiting|running|failed|stopped|skipped|pruned|diverged|continued)\b")


def _no_data(row) -> str:
    """"no data", with why in a word when the row's status says it (missing, failed, ...)."""
    why = _STATUS.search(str(row.status or ""))
    return "no data" + (f" ({why.group(1)})" if why else "")


def relative_shown(table: Table3, metric: str) -> bool:
    """Whether our changes of ``metric`` are shown as a share of our base: its value shows as nonzero at the
    figure's precision and, for BLEU, is at least :data:`~.stats.BLEU_FLOOR` (a share of about nothing is no
    number: a pipeline check's +0.22 BLEU over a base of 0.004 is "+5525%")."""
    base = _base(table)
    value = getattr(base, f"dev_{metric}") if base is not None else None
    if value is None:
        return True  # no base: every row says "no data" anyway
    return round(abs(value), 2 if metric == "ppl" else 1) > 0 and (metric != "bleu" or abs(value) >= BLEU_FLOOR)


def _base_text(table: Table3, metric: str) -> str:
    base = _base(table)
    ours, sd, paper = ((getattr(base, f"dev_{metric}"), getattr(base, f"dev_{metric}_std"),
                        getattr(base, f"paper_dev_{metric}")) if base is not None else (None, None, None))
    digits = 2 if metric == "ppl" else 1
    side = "no completed base run" if ours is None else f"ours {ours:.{digits}f}" + (
        f" ± {sd:.{digits}f} ({table.base_seeds} seeds)" if sd is not None else " (1 seed)")
    return f"base: {side}" + (f"; paper {paper:g}" if paper is not None else "")


def _draw_metric(ax, table: Table3, metric: str, label: str, better: str, items) -> None:
    relative = relative_shown(table, metric)
    band = noise_band(table, metric) if relative else None  # a share of about nothing: no band either
    if band is not None:
        ax.axvspan(-100 * band, 100 * band, color="black", alpha=0.1, linewidth=0, zorder=0)
    ax.axvline(0, color="black", linewidth=0.8, zorder=1)
    values = []
    for y, (kind, row) in enumerate(items):
        if kind != "row":
            ax.axhline(y - 0.5, color="black", linewidth=0.4, alpha=0.4)
            continue
        ours, paper = getattr(row, f"delta_{metric}_rel"), getattr(row, f"paper_delta_{metric}_rel")
        absolute = getattr(row, f"delta_{metric}")
        if not relative and absolute is not None:
            ax.annotate(f"n/a: our base is about 0 (change {absolute:+.2f})", (0, y - _GAP), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7, fontstyle="italic", color="dimgray")
        elif ours is None:
            ax.annotate(_no_data(row), (0, y - _GAP), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=7, fontstyle="italic", color="dimgray")
        else:
            agrees = getattr(row, f"{metric}_agrees")
            color = AGREES if agrees else OPPOSITE if agrees is False else NO_SIGN
            pale = getattr(row, f"{metric}_noise") != "beyond"
            ax.barh(y - _GAP, 100 * ours, height=_BAR, color=color, alpha=PALE if pale else 1.0,
                    edgecolor=color, linewidth=0.8, zorder=2)
            values.append(100 * ours)
            _value(ax, 100 * ours, y - _GAP)
        if paper is not None:
            ax.barh(y + _GAP, 100 * paper, height=_BAR, color=PAPER, zorder=2)
            values.append(100 * paper)
            _value(ax, 100 * paper, y + _GAP)
        elif not row.in_paper:
            ax.annotate("not in the paper", (0, y + _GAP), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7, fontstyle="italic", color="dimgray")
    edge = 100 * band if band else 5.0
    lo, hi = min(values + [-edge]), max(values + [edge])
    pad = 0.18 * (hi - lo)  # room for the values at the bars' ends
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_xlabel(f"change of {label} against the base, % of the base ({better})", fontsize=8)
    ax.set_title(f"{label}\n{_base_text(table, metric)}", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelsize=8)


def _value(ax, x: float, y: float) -> None:
    ax.annotate(f"{x:+.0f}%" if abs(x) >= 1 or x == 0 else f"{x:+.1f}%", (x, y), xytext=(3 if x >= 0 else -3, 0),
                textcoords="offset points", ha="left" if x >= 0 else "right", va="center", fontsize=6.5)


def _draw_verdicts(ax, items) -> None:
    ax.set_xlim(0, 1)
    ax.set_title("verdict · answer\n(dev PPL)", fontsize=9)
    for y, (kind, row) in enumerate(items):
        if kind == "row":
            verdict = row.ppl_verdict
            if verdict:
                ax.text(0.04, y - _GAP, verdict, va="center", fontsize=7.5, **VERDICT_STYLE.get(verdict, {}))
            answer = row.answer
            if answer:
                word = f"{answer} (one seed)" if row.answer_seeds == 1 else answer
                ax.text(0.04, y + _GAP, word, va="center", fontsize=7.5, **ANSWER_STYLE.get(answer, {}))
    ax.set_axis_off()  # a column of words: no frame, no ticks (nor a "no data" mark when no row has a verdict)


def _legend(fig, table: Table3) -> None:
    from matplotlib.patches import Patch

    band = noise_band(table, "ppl")
    handles = [Patch(color=AGREES, label="ours: the paper's direction"),
               Patch(color=OPPOSITE, label="ours: the opposite direction"),
               Patch(color=NO_SIGN, label="ours: no paper direction to compare"),
               Patch(color=AGREES, alpha=PALE, label="pale: within seed noise (or noise unknown)"),
               Patch(color=PAPER, label="the paper's (Table 3)"),
               Patch(color="black", alpha=0.1,
                     label=f"seed noise: {NOISE_K:g}σ of our base" if band is not None else
                     "seed noise unknown (one base seed)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)


def plot_changes(table: Table3, path: str | Path, formats=("png",)) -> str:
    """``changes.png`` of ``table`` (see the module docstring); with ``formats``, also its SVG/PDF beside it."""
    from matplotlib.figure import Figure

    items = lines(table)
    metrics = shown_metrics(table)
    rows = max(len(items), 1)
    fig = Figure(figsize=(5.2 * len(metrics) + 4.2, 1.9 + 0.25 * rows), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(metrics) + 1, sharey=True, width_ratios=[1.0] * len(metrics) + [0.22])
    for ax, (metric, label, better) in zip(axes, metrics):
        _draw_metric(ax, table, metric, label, better, items)
    _draw_verdicts(axes[-1], items)
    first = axes[0]
    first.set_ylim(rows - 0.5, -0.5)  # the table's order, top to bottom
    first.set_yticks(range(len(items)), [row_label(row, _base(table)) if kind == "row" else row
                                         for kind, row in items])
    first.tick_params(axis="y", length=0, labelsize=7.5)
    for tick, (kind, _) in zip(first.get_yticklabels(), items):
        if kind == "family":
            tick.set_fontweight("bold")
    if not items:
        first.text(0.5, 0.5, "no data: the sweep has no row beside the base", ha="center", va="center",
                   transform=first.transAxes, color="dimgray")
    check = bool(table.pipeline_check)
    fig.suptitle(("PIPELINE CHECK (runs tagged pipeline-check), not a result: numbers say nothing\n" if check else "")
                 + f"{TITLE} (sweep {table.sweep})\nEach side's change as a share of its own base; "
                 "the tables below give every number", fontsize=10, color="red" if check else "black")
    _legend(fig, table)
    mark_pipeline_check(fig, check)
    return save_figure(fig, path, formats)


def changes_caption(table: Table3) -> str:
    """The lead figure's section heading and caption (markdown)."""
    band = noise_band(table, "ppl")
    noise = (f"the shaded band is our seed noise ({NOISE_K:g} × the base's standard deviation over its "
             f"{table.base_seeds} seeds, ±{100 * band:.0f}% of its dev PPL)" if band is not None else
             "our seed noise is unknown (one base seed): no band")
    zero = [label for metric, label, _ in shown_metrics(table) if not relative_shown(table, metric)]
    return ("## " + TITLE + "\n\n"
            + ("**Pipeline check (runs tagged pipeline-check): numbers say nothing.** " if table.pipeline_check
               else "")
            + "Each row's change of dev perplexity"
            + (" and dev BLEU" if len(shown_metrics(table)) > 1 else "")
            + " against its own base, as a share of that base: ours (upper bar; blue: the paper's direction, "
              "orange: the opposite, purple: the paper has none to compare; pale: within seed noise) above the "
              "paper's (grey); " + noise
            + "; on the right, each row's verdict from its learning curve extrapolated (holds, may flip, within "
              "noise, too few points; the rule is in the notes) and below it its answer from its own seeds paired "
              "with the base's (better, worse, the same, unsettled; \"one seed\": no controlled answer). "
              "\"no data\": the row has no completed run to compare."
            + (f" \"n/a\": our base's {' and '.join(zero)} is about 0 (a share of it would be no number): the "
               "absolute change is given instead." if zero else "") + "\n")


def changes_markdown(table: Table3) -> str:
    """The lead figure's section of ``table3.md``: heading, ``changes.png``, caption."""
    head, caption = changes_caption(table).split("\n\n", 1)
    return f"{head}\n\n![{TITLE}]({NAME})\n\n{caption}"
