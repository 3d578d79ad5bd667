"""Two Table 3 replicas side by side: ``ltfm report A.yaml --against B.yaml`` (two sweep files, or two results
folders of one sweep file, e.g. two budgets) writes ``compare.md``, ``compare.csv``, ``compare.html`` and its
figures.

Each side is a table of :func:`~.table.build_table`: its rows' changes against *its own* base,
their verdicts (:mod:`.verdict`) and direction agreement with the paper. Per row (:func:`compare_tables`):

- **transfers**: both sides say the same: both hold with the same sign, or both within noise;
- **flips**: both sides hold with opposite signs;
- **unsettled**: anything else (a side that may flip or has too few points, a row that holds on one side and is
  within noise on the other);
- **only in A** / **only in B**: a row with no change against the base on one side (not trained there, as in a
  continuation of a few rows, or not completed): shown, not compared, and left out of the counts.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from ...base.atomic import write_text
from ...findings.noise import finite
from ...findings.verdict import sign
from ..core.columns import Shown
from ..core.text import md_cell, md_code, md_text
from .columns import COMPARE, COMPARE_ROW, SIDE, Row, columns, shown
from .verdict import HOLDS, WITHIN

TRANSFERS, FLIPS, UNSETTLED = "transfers", "flips", "unsettled"
ONLY_A, ONLY_B = "only in A", "only in B"
STATUS_RULE = ("*transfers*: both sides hold with the same sign, or both within noise; *flips*: both sides hold "
               "with opposite signs; *unsettled*: anything else (a side that may flip or has too few points, a row "
               "that holds on one side only); *only in A* / *only in B*: a row with a result on one side only, not "
               "compared")


def status(a: Row | None, b: Row | None) -> str:
    """The comparison status of one row from its two sides' table rows (None: the side lacks the row); a side whose
    change is no number (nan, inf) has no result."""
    has_a, has_b = (r is not None and finite(r.delta_ppl) for r in (a, b))
    if not (has_a and has_b):
        return ONLY_A if has_a else ONLY_B if has_b else UNSETTLED  # neither side has a result: unknown
    va, vb = a.ppl_verdict, b.ppl_verdict
    if va == vb == WITHIN:
        return TRANSFERS
    if va == vb == HOLDS:
        return TRANSFERS if sign(a.delta_ppl) == sign(b.delta_ppl) else FLIPS
    return UNSETTLED


def side_label(table) -> str:
    """``<sweep> at <base steps> steps``: what tells two sides of one sweep apart (their budget)."""
    steps = table.curves.steps
    base = next((r for r in table.rows if r.variant == "base"), None)
    budget = (base.knobs.get("train.max_steps") if base else None) or (steps[-1] if steps else None)
    return f"{table.sweep} at {budget} steps" if budget else table.sweep


@dataclass
class ComparedRow:
    """One row of two Table 3 replicas side by side (:func:`compare_tables`)."""
    variant: str          # the row's name
    either: Row           # the side's table row its own columns come from (A's when A has it, else B's)
    a: Row | None         # side A's table row (None: A lacks it)
    b: Row | None         # side B's
    status: str           # transfers, flips, unsettled, only in A, only in B (:func:`status`)


@dataclass
class Comparison:
    """Two Table 3 replicas side by side (:func:`compare_tables`)."""
    rows: list[ComparedRow]   # A's rows in its order, then B's others; the base left out (each side's reference)
    summary: dict             # ``counts`` of each status, each side's ``agreement`` (over all its rows and the
    #                           rows both sides have: ``agreement_shared``), the rows ``one_side`` and the ``flips``
    labels: dict[str, str]    # "a", "b" -> what tells the sides apart (:func:`side_label`)
    tables: dict              # "a", "b" -> each side's :class:`~.table.Table3`


def compare_tables(a, b) -> Comparison:
    """Side A and side B row by row (``a``, ``b``: each side's :class:`~.table.Table3`)."""
    rows_a = {r.variant: r for r in a.rows}
    rows_b = {r.variant: r for r in b.rows}
    order = [v for v in rows_a] + [v for v in rows_b if v not in rows_a]
    rows = [ComparedRow(v, rows_a.get(v) or rows_b[v], rows_a.get(v), rows_b.get(v), status(rows_a.get(v),
                                                                                        rows_b.get(v)))
            for v in order if v != "base"]
    counts = {s: sum(1 for r in rows if r.status == s) for s in (TRANSFERS, FLIPS, UNSETTLED)}
    one_side = {s: [r.variant for r in rows if r.status == s] for s in (ONLY_A, ONLY_B)}
    # each side's agreement with the paper over the rows both sides have (with a direction in the paper): the two
    # sides' own counts above may be over different rows
    both = [r for r in rows if r.status not in (ONLY_A, ONLY_B)
            and r.a.ppl_agrees is not None and r.b.ppl_agrees is not None]
    shared = {side: (sum(1 for r in both if getattr(r, side).ppl_agrees), len(both)) for side in ("a", "b")}
    agreement = {}
    for side, t in (("a", a), ("b", b)):
        s = t.summary
        agreement[side] = {"all": s["ppl"], "findings": s["ppl_findings"], "may_flip": s["may_flip"]}
    return Comparison(rows, {"counts": counts, "agreement": agreement, "one_side": one_side,
                             "agreement_shared": shared, "flips": [r.variant for r in rows if r.status == FLIPS]},
                      {"a": side_label(a), "b": side_label(b)}, {"a": a, "b": b})


def _frac(pair: tuple[int, int]) -> str:
    k, n = pair
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "0/0"


def headline_lines(cmp: Comparison) -> list[str]:
    s, lab = cmp.summary, cmp.labels
    c = s["counts"]
    compared = sum(c.values())
    lines = [f"Rows: {c[TRANSFERS]} transfer, "
             f"{c[FLIPS]} flip{' (' + ', '.join(s['flips']) + ')' if s['flips'] else ''}, "
             f"{c[UNSETTLED]} unsettled (of {compared}, the base left out)."]
    for status_, names in s["one_side"].items():
        if names:
            lines.append(f"Not compared, {status_} ({len(names)}): {', '.join(names)}.")
    if any(s["one_side"].values()):
        sh = s["agreement_shared"]
        lines.append(f"On the {sh['a'][1]} rows with a direction in the paper that both sides have: direction agrees "
                     f"A {_frac(sh['a'])}, B {_frac(sh['b'])}.")
    for side in ("a", "b"):
        ag = s["agreement"][side]
        flip = ag["may_flip"]
        lines.append(f"{side.upper()} ({lab[side]}): direction agrees with the paper on dev PPL "
                     f"{_frac(ag['all'])} rows, "
                     f"{_frac(ag['findings'])} of the rows that hold; may flip: {', '.join(flip) if flip else 'none'}.")
    return lines


def _md_columns() -> list[tuple[str, str, Shown | None]]:
    """compare.md's columns as (header, whose: "either", "a", "b" or "status", how it shows): the row's own, each
    side's, the status."""
    own = [(s.title, "either", s) for s in shown(COMPARE, COMPARE_ROW)]
    sides = [(s.title.format(side=side.upper()), side, s) for side in ("a", "b") for s in shown(COMPARE, SIDE)]
    return own + sides + [("status", "status", None)]


def _md_cell(cmp: Comparison, r: ComparedRow, whose: str, s: Shown | None) -> str:
    cell = getattr(r, whose)
    if s is None:
        return md_text(cell)
    return "" if cell is None else s.cell(cell, cmp.tables.get(whose))


def comparison_markdown(cmp: Comparison) -> str:
    """compare.md: the headline, the side-by-side table, the rule; one fact per line."""
    lab, ta, tb = cmp.labels, cmp.tables["a"], cmp.tables["b"]
    # the strings of the sweeps, runs and exports as text (md_text): never markup in compare.html
    lines = [f"# Table 3 side by side: A {md_code(ta.sweep)}, B {md_code(tb.sweep)}", "",
             f"A: {md_text(lab['a'])} ({md_text(ta.source)}). B: {md_text(lab['b'])} ({md_text(tb.source)}). "
             "Each side's Δ is against its own base.",
             "", *[f"- {md_text(ln)}" for ln in headline_lines(cmp)], "", "## Rows", ""]
    cols = _md_columns()
    lines += ["| " + " | ".join(title for title, _, _ in cols) + " |",
              "|" + "|".join("---" if s is None or s.left else "--:" for _, _, s in cols) + "|"]
    for r in cmp.rows:
        cells = [_md_cell(cmp, r, whose, s) for _, whose, s in cols]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")  # the cells are markdown (md_text)
    from .verdict import verdict_rule
    lines += ["", "## Notes", "", f"- Status: {STATUS_RULE}.", f"- A: {verdict_rule(ta.report_settings)}",
              f"- B: {verdict_rule(tb.report_settings)}"]
    return "\n".join(lines) + "\n"


def comparison_csv(cmp: Comparison) -> str:
    """compare.csv: the row's own columns, each side's (``a_<key>``, ``b_<key>``), the status."""
    own, side_cols = columns(COMPARE_ROW), columns(SIDE)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in own] + [f"{side}_{c.key}" for side in ("a", "b") for c in side_cols] + ["status"])
    for r in cmp.rows:
        w.writerow([c.csv_text(r.either) for c in own]
                   + ["" if getattr(r, side) is None else c.csv_text(getattr(r, side)) for side in ("a", "b")
                      for c in side_cols]
                   + [r.status])
    return buf.getvalue()


def write_comparison(cmp: Comparison, out_dir: str | Path) -> tuple[Path, Path]:
    """compare.md, compare.csv and compare.json (the headline and the counts as data: what ``ltfm report
    --against`` prints when the notebook is done, so nothing reads the markdown back)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"labels": cmp.labels, "headline": headline_lines(cmp), "counts": cmp.summary["counts"]}
    write_text(out / "compare.json", json.dumps(summary, indent=1, default=str) + "\n")
    return (write_text(out / "compare.md", comparison_markdown(cmp)),
            write_text(out / "compare.csv", comparison_csv(cmp)))


def read_headline(out_dir: str | Path) -> list[str]:
    """The headline lines :func:`write_comparison` saved in compare.json."""
    return json.loads((Path(out_dir) / "compare.json").read_text())["headline"]


STATUS_COLORS = {TRANSFERS: "C2", FLIPS: "C3", UNSETTLED: "C7"}


def plot_comparison(cmp: Comparison, path: str | Path) -> str:
    """Each row's relative ΔPPL on side A against side B (one point per row, coloured by its status; the
    diagonal is "the same change on both sides", the top-left and bottom-right quadrants are flips of sign)."""
    from ..core.plots import new_figure, save_figure

    fig, axes = new_figure(1, 1, 6.5, 5.5)
    ax = axes[0][0]
    for r in cmp.rows:
        x, y = (r.a and r.a.delta_ppl_rel, r.b and r.b.delta_ppl_rel)
        if x is None or y is None:
            continue
        ax.plot([100 * x], [100 * y], "o", color=STATUS_COLORS[r.status])
        ax.annotate(r.variant, (100 * x, 100 * y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    pts = [v for line in ax.lines for v in list(line.get_xdata()) + list(line.get_ydata())]
    lim = max([abs(v) for v in pts] + [1.0]) * 1.1
    ax.plot([-lim, lim], [-lim, lim], color="black", linewidth=0.6, alpha=0.5)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.axvline(0, color="black", linewidth=0.6)
    for s, c in STATUS_COLORS.items():
        ax.plot([], [], "o", color=c, label=s)
    ax.legend(fontsize=8)
    lab = cmp.labels
    ax.set_xlabel(f"ΔPPL against the base, % — A: {lab['a']}")
    ax.set_ylabel(f"ΔPPL against the base, % — B: {lab['b']}")
    ax.set_title("Each row's change on both sides (lower is better; top-left and bottom-right: the sign flips)",
                 fontsize=9)
    ax.grid(True, alpha=0.3)
    return save_figure(fig, path)
