"""The Table 3 report's figures (matplotlib's object API: no pyplot, no display needed): dev perplexity per
row family, dev BLEU against model size, pre- against post-norm training curves, dev perplexity against training
compute, each row's curve fitted and extrapolated (:func:`plot_outlook`: the verdict's evidence, and the
back-test's) (the lead figure, each row's change beside the paper's, is :mod:`.lead`).

Each is written as :mod:`.core.plots` writes a figure (PNG, and on request SVG and PDF beside it; one with
nothing to show is a :class:`~.core.plots.LeftOut`); a pipeline check's (runs tagged ``pipeline-check``) says so
across it (:func:`~.core.plots.mark_pipeline_check`)."""
from __future__ import annotations

import math
from pathlib import Path

from ...training.runs import results
from ..core.plots import LeftOut, mark_pipeline_check, new_figure, save_figure
from ..inputs.records import ReportData, RunRecord, is_pipeline_check
from ..table3.paper import load_paper
from ..table3.table import Table3, ordered_variants


def metric_series(rec: RunRecord, key: str) -> tuple[list[int], list[float]]:
    """A run's history of one metric: (its steps, its values), the rows that have it."""
    pts = [(row["step"], row[key]) for row in rec.history if key in row]
    return [p[0] for p in pts], [p[1] for p in pts]


def ema(values: list[float], smoothing: float = 0.6) -> list[float]:
    """Exponential moving average with the start-up bias removed (TensorBoard's smoothing): each point is
    the weighted mean of those before it, weights ``smoothing`` ** age."""
    out, acc, weight = [], 0.0, 0.0
    for v in values:
        acc = smoothing * acc + (1 - smoothing) * v
        weight = smoothing * weight + (1 - smoothing)
        out.append(acc / weight)
    return out


def seed_band(recs: list[RunRecord], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, low, high) of ``key`` over the records' curves, at the steps every curve has."""
    curves = [dict(zip(*metric_series(r, key))) for r in recs]
    curves = [c for c in curves if c]
    if not curves:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    values = [[c[s] for c in curves] for s in steps]
    return steps, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def base_label(seeds: int) -> str:
    """The base row's legend entry: one curve, the mean over its seeds when it has several (their range shaded)."""
    return "base" if seeds == 1 else f"base (mean of {seeds} seeds, their range shaded)"


def _plot_base(ax, recs: list[RunRecord], key: str, smooth: bool = False, **style) -> bool:
    """The base row as one legend entry: its curve (the mean over its seeds) with the seeds' range shaded.
    ``smooth``: each seed's curve smoothed by :func:`ema` first, the raw points drawn faint."""
    with_curve = [r for r in recs if metric_series(r, key)[0]]
    if not with_curve:
        return False
    if smooth:
        for r in with_curve:
            xs, ys = metric_series(r, key)
            ax.plot(xs, ys, color="black", alpha=0.15, linewidth=0.6)
        with_curve = [RunRecord(r.variant, history=[{"step": x, key: y} for x, y in zip(xs, ema(ys))])
                      for r in with_curve for xs, ys in [metric_series(r, key)]]
    steps, mean, lo, hi = seed_band(with_curve, key)
    n = len(with_curve)
    ax.plot(steps, mean, color="black", label=base_label(n), linewidth=1.4, **style)
    if n > 1:
        ax.fill_between(steps, lo, hi, color="black", alpha=0.15, linewidth=0)
    return True


def _label(rec: RunRecord, many_seeds: bool) -> str:
    return f"{rec.variant} s{rec.seed}" if many_seeds else rec.variant


PAPER_FAMILIES = ("A", "B", "C", "D", "E", "big")


OTHER = "other rows"


# Panel titles a reader understands without the sweep file: what each of the paper's row families varies.
FAMILY_TITLES = {"A": "(A) number of heads h, with h·d_k fixed", "B": "(B) smaller key size d_k",
                 "C": "(C) model size: N, d_model, d_ff", "D": "(D) dropout P_drop and label smoothing ε_ls",
                 "E": "(E) learned instead of sinusoidal positions", "big": "big model (3× the steps)",
                 "norm": "norm: layer norm before the sublayers", "base": "base",
                 OTHER: OTHER}


def _variant_family(data: ReportData, v: str) -> str | None:
    recs = [r for r in data.records if r.variant == v]
    return next((r.family for r in recs if r.family), None) or ((data.sweep.variants or {}).get(v) or {}).get("family")


def panel_of(data: ReportData, v: str) -> str | None:
    """The dev-perplexity panel of a row: its paper family (A-E, big), none for base and pre-norm rows
    (they have their own figure), else the panel of other rows."""
    fam = _variant_family(data, v)
    if v == "base" or fam in ("base", "norm", "search"):
        return None
    return fam if fam in PAPER_FAMILIES else OTHER


def _set_yscale(ax) -> None:
    ys = [y for line in ax.lines for y in line.get_ydata() if y > 0]
    if ys and max(ys) / min(ys) > 5:  # the first evaluations of a short run are far above the rest
        ax.set_yscale("log")


def family_panels(data: ReportData) -> tuple[list[str], list[str]]:
    """(the rows in the paper's order, the dev-perplexity panels: the paper's families A-E and big in order,
    then other rows; just the base when there is nothing else)."""
    variants = ordered_variants(data.sweep, data.records)
    panels: list[str] = []
    for v in variants:
        p = panel_of(data, v)
        if p is not None and p not in panels:
            panels.append(p)
    panels.sort(key=lambda p: PAPER_FAMILIES.index(p) if p in PAPER_FAMILIES else len(PAPER_FAMILIES))
    return variants, panels or ["base"]


def plot_dev_ppl_by_family(data: ReportData, path: str | Path, formats=("png",)) -> str:
    """Dev perplexity against step, one panel per row family (A-E, big, then other rows), with the base in
    every panel; rows without a curve are named in their panel's title with their status."""
    variants, panels = family_panels(data)
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = new_figure(nrows, ncols, 4.6 * ncols, 3.4 * nrows)
    many = len(data.sweep.seeds) > 1
    for i, panel in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        members = ["base"] + [v for v in variants if panel_of(data, v) == panel]
        no_curve = []
        for j, v in enumerate(members):
            recs = [r for r in data.records if r.variant == v]
            drawn = False
            if v == "base":
                drawn = _plot_base(ax, recs, results.DEV_PPL, marker=".")
                recs = []
            for r in sorted(recs, key=lambda r: (r.seed is None, r.seed or 0)):
                xs, ys = metric_series(r, results.DEV_PPL)
                if xs:
                    ax.plot(xs, ys, marker=".", color="black" if v == "base" else f"C{j % 10}",
                            label=_label(r, many), linewidth=1.2)
                    drawn = True
            if not drawn and v in variants:
                no_curve.append(f"{v} ({recs[0].status if recs else 'missing'})")
        _set_yscale(ax)
        ax.set_xlabel("training step")
        ax.set_ylabel("dev perplexity (lower is better)" + (", log scale" if ax.get_yscale() == "log" else ""))
        title = FAMILY_TITLES.get(panel, f"family {panel}")
        if no_curve:
            import textwrap
            title += "\n" + textwrap.fill("no curve: " + ", ".join(no_curve), 62)
        if len(members) > 1 and len(no_curve) == len(members) - 1:  # the base alone: the family has nothing yet
            ax.text(0.5, 0.5, "no data: no row of this family has a curve", ha="center", va="center",
                    transform=ax.transAxes, color="dimgray", fontsize=9,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})
        ax.set_title(title, fontsize=8)
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    fig.suptitle(f"Dev perplexity during training, each row family against the base (black); sweep "
                 f"{data.sweep.name}", fontsize=10)
    mark_pipeline_check(fig, is_pipeline_check(data.records))
    return save_figure(fig, path, formats, empty="no row has a dev-perplexity curve (no validation logged)")


def plot_bleu_vs_params(table: Table3, path: str | Path, formats=("png",)) -> str:
    """Dev BLEU against parameter count, ours and the paper's (rows of this sweep)."""
    fig, axes = new_figure(1, 2, 10, 4)
    ours, paper = axes[0]
    pbase = load_paper()["base"]
    for row in table.rows:
        if row.dev_bleu is not None and row.params is not None:
            x = row.params / 1e6
            ours.errorbar([x], [row.dev_bleu], yerr=[row.dev_bleu_std] if row.dev_bleu_std else None,
                          fmt="o", color="black" if row.variant == "base" else "C0", capsize=3)
            ours.annotate(row.variant, (x, row.dev_bleu), textcoords="offset points", xytext=(4, 3), fontsize=7)
        if row.paper_dev_bleu is not None:
            given = row.paper_params_m is not None
            x = row.paper_params_m if given else pbase["params_m"]  # blank in the paper: the base's size
            paper.plot([x], [row.paper_dev_bleu], "o", color="black" if row.variant == "base" else "C1",
                       fillstyle="full" if given else "none")
            paper.annotate(row.variant, (x, row.paper_dev_bleu), textcoords="offset points", xytext=(4, 3),
                           fontsize=7)
    ours.set_title(f"ours (sweep {table.sweep}, Multi30k-scale models)", fontsize=9)
    paper.set_title("paper, Table 3 (hollow: size not given, drawn at the base's)", fontsize=9)
    fig.suptitle("Dev BLEU against model size (higher is better; black = base row)", fontsize=10)
    for ax in (ours, paper):
        ax.set_xlabel("parameters (millions)")
        ax.set_ylabel("dev BLEU")
        ax.grid(True, alpha=0.3)
    if not ours.lines and not ours.collections:
        ours.text(0.5, 0.5, "no completed run", ha="center", va="center", transform=ours.transAxes)
    if not paper.lines:
        paper.text(0.5, 0.5, "no row of the paper in this sweep", ha="center", va="center", transform=paper.transAxes)
    mark_pipeline_check(fig, bool(table.pipeline_check))
    return save_figure(fig, path, formats, empty="no completed run with a dev BLEU and no row of the paper")


def plot_norm_curves(data: ReportData, path: str | Path, formats=("png",)) -> str:
    """Pre-norm against post-norm: train loss (all steps and the first steps) and dev perplexity."""
    post = [r for r in data.records if r.variant == "base"]
    pre = [r for r in data.records if r.config.get("model.norm") == "pre" and r.variant != "base"]
    pre += [r for r in data.records if _variant_family(data, r.variant) == "norm" and r not in pre
            and r.variant != "base"]
    fig, axes = new_figure(1, 3, 14, 3.8)
    full, first, dev = axes[0]
    many = len(data.sweep.seeds) > 1
    last = max([row["step"] for r in post + pre for row in r.history] or [0])
    early = max(last // 10, 1)
    if post:  # the base (post-norm) as one entry per panel, its seeds' range shaded
        _plot_base(full, post, results.TRAIN_LOSS, smooth=True)
        _plot_base(dev, post, results.DEV_PPL, marker=".")
    for i, r in enumerate(post + pre):
        color = "black" if r.variant == "base" else f"C{i % 10}"
        kind = "post" if r.variant == "base" else r.config.get("model.norm", "?")
        label = f"{_label(r, many)} ({kind}-norm)"
        xs, ys = metric_series(r, results.TRAIN_LOSS)
        if r.variant != "base":  # single-batch losses: smoothed, the raw points faint
            full.plot(xs, ys, color=color, alpha=0.2, linewidth=0.6)
            full.plot(xs, ema(ys), color=color, label=label, linewidth=1.2)
        pts = [(x, y) for x, y in zip(xs, ys) if x <= early]
        if len(pts) < 5:
            pts = list(zip(xs, ys))[:5]
        first.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=color,
                   label=label if r.variant != "base" or r is post[0] else None, linewidth=1)
        if r.variant != "base":
            xs, ys = metric_series(r, results.DEV_PPL)
            dev.plot(xs, ys, marker=".", color=color, label=label, linewidth=1)
    full.set_title("training loss, whole run (smoothed; raw single-batch losses faint)", fontsize=9)
    shown = max((int(x) for line in first.lines for x in line.get_xdata()), default=early)
    first.set_title(f"training loss, first {shown} steps", fontsize=9)
    dev.set_title("dev perplexity (lower is better)", fontsize=9)
    _set_yscale(dev)
    for ax, ylabel in ((full, "label-smoothed training loss"), (first, "label-smoothed training loss"),
                       (dev, "dev perplexity")):
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    missing = []
    if not post or not any(r.history for r in post):
        missing.append("no base (post-norm) curve")
    if not pre:
        missing.append("no pre-norm row in this sweep")
    elif not any(r.history for r in pre):
        missing.append("pre-norm rows: " + ", ".join(f"{r.variant} ({r.status})" for r in pre))
    fig.suptitle("Layer norm before (pre-norm) or after (post-norm, the paper's) each sublayer: training curves"
                 + (f" ({'; '.join(missing)})" if missing else ""),
                 fontsize=10)
    mark_pipeline_check(fig, is_pipeline_check(data.records))
    return save_figure(fig, path, formats, empty="neither the base nor a pre-norm row has a training curve")


def plot_ppl_vs_flops(table: Table3, path: str | Path, formats=("png",)) -> str:
    """Each row's dev perplexity (mean over its seeds) against its training compute (validation step x its
    FLOPs per step, :mod:`.compute`), log-log, the base in black with its budget marked: where a row's curve
    crosses that line is its dev PPL at equal compute."""
    fig, axes = new_figure(1, 1, 9, 5.5)
    ax = axes[0][0]
    rows = {r.variant: r for r in table.rows}
    curves = table.curves.rows
    missing = []
    for j, (v, curve) in enumerate(curves.items()):
        f = rows[v].flops_per_step if v in rows else None
        if not f or not curve:
            missing.append(v)
            continue
        steps = sorted(curve)
        base = v == "base"
        ax.plot([s * f for s in steps], [curve[s] for s in steps], marker=".", linewidth=1.8 if base else 1.0,
                color="black" if base else f"C{j % 10}", label=v, zorder=3 if base else 2)
    drawn = bool(ax.lines)
    if drawn:
        ax.set_xscale("log")
        _set_yscale(ax)  # from the curves alone, before the budget's line
    budget = table.compute.get("base_flops")
    if budget and drawn:
        ax.axvline(budget, color="black", linestyle="--", linewidth=0.8, label=f"base budget ({budget:.3g} FLOPs)")
    if drawn:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no row with a curve and a FLOP count", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("training compute (FLOPs, log scale)")
    ax.set_ylabel("dev perplexity (lower is better)" + (", log scale" if ax.get_yscale() == "log" else ""))
    ax.set_title(f"Dev perplexity against training compute; sweep {table.sweep}"
                 + (f" (no FLOP count: {', '.join(missing)})" if missing else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    mark_pipeline_check(fig, bool(table.pipeline_check))
    return save_figure(fig, path, formats, empty="no row has a dev-perplexity curve and a FLOP count")


def _side_points(runs: list[dict[int, float]], log: bool = False) -> tuple[list[int], list[float]]:
    """A side's mean dev PPL (``log``: mean log-PPL) over its runs at the steps they all have."""
    runs = [r for r in runs if r]
    if not runs:
        return [], []
    steps = sorted(set.intersection(*(set(r) for r in runs)))
    f = math.log if log else float
    return steps, [sum(f(r[s]) for r in runs) / len(runs) for s in steps]


def plot_outlook(table, path: str | Path, formats=("png",), later=None, title: str | None = None) -> str:
    """The figure of a table's verdicts (:func:`verdicts_figure` of its ``outlook``, ``curves``, ``report_settings``,
    ``sweep`` and ``pipeline_check``; ``table``: :func:`~.table.build_table`'s)."""
    return verdicts_figure(table.outlook, table.curves, table.report_settings, table.sweep, path, formats, later,
                           title, pipeline_check=table.pipeline_check)


def verdicts_figure(outlook: dict, curves, settings: dict | None, sweep: str, path: str | Path, formats=("png",),
                    later=None, title: str | None = None, *, pipeline_check: bool = False) -> str:
    """A panel per row with a verdict (``outlook``: {variant: :class:`~lightning_tfm.findings.verdict.Verdict`}, of
    the learning ``curves``, :class:`~.table.LearningCurves`): the row's and the base's dev PPL at each validation
    (mean over seeds; hollow: before the warmup, left out of the fit), their fitted curves extended to the step the
    verdict predicts at, each with its bootstrap band, the budget dashed and, with ``later`` (a later export's
    curves, as the back-test gives them), the measured later points (crosses)."""
    import numpy as np

    from ...findings.curves import band
    from ..table3.verdict import settings_of

    s = settings_of(settings)
    runs = curves.runs
    later_runs = later.runs if later is not None else {}
    outlook = {v: o for v, o in outlook.items() if o.gap}
    if not outlook:  # nothing fitted: no figure, the reason instead
        from ...findings.curves import points_needed
        n = max((len(r) for r in runs.get("base") or []), default=0)
        return LeftOut(Path(path).name, "no row's learning curve could be fitted and extrapolated (a fit needs "
                       f"{points_needed(s['min_points'], s['family'])} validations after the warmup; the base has "
                       f"{n} in all)")
    ncols = min(4, len(outlook))
    nrows = math.ceil(len(outlook) / ncols)
    import textwrap

    from matplotlib.figure import Figure

    height = 3.1 * nrows + 1.4
    width = max(3.6 * ncols, 9.0)  # the titles' room: one panel alone is as wide as two and a half
    fig = Figure(figsize=(width, height), dpi=100)  # no layout engine: many panels draw fast
    fig.subplots_adjust(left=0.7 / width, right=0.98, top=1 - 1.2 / height, bottom=0.6 / height,
                        hspace=0.6, wspace=0.2)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    bands: dict = {}

    def draw(ax, fits, at: int, color: str, label: str) -> None:
        grid = np.unique(np.geomspace(fits[0].steps[0] + 1, at + 1, 40).round() - 1)
        key = (id(fits[0]), at)
        if key not in bands:
            bands[key] = band(fits, grid, s["bootstraps"], s["seed"], s["level"])
        mean, lo, hi = bands[key]
        ax.plot(grid, mean, color=color, linewidth=1.1, label=f"{label}: fit, {100 * s['level']:g}% band")
        ax.fill_between(grid, lo, hi, color=color, alpha=0.18, linewidth=0)

    for ax, (v, o) in zip([a for row in axes for a in row], outlook.items()):
        gap = o.gap
        for side, color, fits, at in (("base", "black", gap.base, gap.base_step), (v, "C0", gap.row, gap.at_step)):
            steps, ppl = _side_points(runs.get(side, []), log=True)
            name = "base" if side == "base" else "the row"
            fitted = set(fits[0].steps)
            ax.plot(steps, ppl, "o", markersize=3.5, color=color, zorder=3, label=name)
            early = [(x, y) for x, y in zip(steps, ppl) if x not in fitted]
            if early:
                ax.plot(*zip(*early), "o", markersize=3.5, markerfacecolor="white", color=color, zorder=4)
            draw(ax, fits, at, color, name)
            lsteps, lppl = _side_points(later_runs.get(side, []), log=True)
            measured = [(x, y) for x, y in zip(lsteps, lppl) if not steps or x > steps[-1]]
            if measured:
                ax.plot(*zip(*measured), "x", markersize=4, color=color, zorder=3, label=f"{name}: measured later")
            if side == v and steps:
                ax.axvline(steps[-1], color="gray", linestyle="--", linewidth=0.7)
        parts = o.why.split("; ")  # a line a clause, wrapped to a panel's width
        why = [w for i, part in enumerate(parts) for w in textwrap.wrap(part + ";" * (i < len(parts) - 1), 56)]
        ax.set_title("\n".join([f"{v}: {o.verdict}", *why]), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels()[:2], loc="lower center", ncol=6, fontsize=7, frameon=False)
    for ax in [a for row in axes for a in row][len(outlook):]:
        ax.set_axis_off()
    fig.supylabel("dev log-PPL (nats; the fitted quantity)", fontsize=8, x=0.005)
    fig.suptitle((title or f"Each row's dev log-PPL against the base's, fitted ({s['family']} law) and extrapolated to "
                  f"{s['k']:g} × the budget; sweep {sweep}")
                 + "\nx: training step, dashed: the budget; hollow: before the warmup (not fitted)", fontsize=9,
                 y=1 - 0.12 / height)  # inches from the top, as the margin is, whatever the number of rows
    mark_pipeline_check(fig, pipeline_check)
    return save_figure(fig, path, formats)
