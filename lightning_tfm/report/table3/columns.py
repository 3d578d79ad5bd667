"""The Table 3 replica's row and its columns, declared once.

:class:`Row` is one row of the table (:func:`~.table.build_table` makes them): one typed field
per value. :data:`COLUMNS` is the one list of the table's columns, in the CSV's order; each
:class:`~.core.columns.Column` says what it means, its value (a field of the row by default), and where it appears:

- ``views``: :data:`CSV` (``table3.csv``, header = the key), :data:`WANDB_PPL` / :data:`WANDB_BLEU` (the report
  run's W&B tables ``table3/dev_ppl`` and ``table3/dev_bleu``), :data:`NOTE` (the optuna-dashboard note's
  dev-perplexity table, as the :data:`PPL` table shows it), :data:`COMPARE_ROW` (a comparison row's own columns);
- ``shown``: the markdown tables it is a column of (:data:`PPL`, :data:`BLEU`, :data:`CONFIG` of ``table3.md`` and
  so of the HTML page, :data:`COMPARE` of ``compare.md``), each with its header and how its cell prints;
- ``compare_at``: its place among each side's columns of a comparison (:data:`SIDE`; ``compare.csv``: ``a_<key>``,
  ``b_<key>``);
- ``latex``: its column of ``table3.tex`` (:data:`LATEX`, :mod:`.latex`: the paper's columns, ours beside the
  paper's): a header in LaTeX, a cell as text (:mod:`.latex` escapes it), and ``group``, the header spanning it and
  its neighbours of the same group (``PPL (dev)`` over ``ours`` and ``paper``).

Every view reads this list: :mod:`.render` (markdown, CSV), :mod:`.latex` (LaTeX), :mod:`.publish.kinds` (W&B
tables, the note), :mod:`.compare`. A new column is one more entry of :data:`COLUMNS` (and a field of :class:`Row`,
or a ``value`` computed from the row).

The mechanism is :mod:`.core.columns`', Table 2's too (:mod:`.table2.columns`: its row, its list, its views):
:class:`~.core.columns.Column`, :class:`~.core.columns.Shown`, :class:`~.core.columns.Fields` (a row read as a
mapping), and :class:`~.core.columns.Kind`, a report's table as W&B and optuna-dashboard take it
(:data:`.publish.kinds.KINDS`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...findings.noise import NOISE_K
from ...training.config.config import TABLE3_KNOBS, Knob, choices
from ..core.columns import CSV, Column, Fields, Shown, in_view
from ..core.text import fmt, fmt_knob, md_text
from .stats import BLEU_FLOOR
from .verdict import HOLDS, MAY_FLIP, TOO_FEW


@dataclass
class Row(Fields):
    """One row of the Table 3 replica: a variant beside the paper's, its numbers and their changes against the
    base (``None``: not known). Also read as a mapping (``row.dev_ppl``; a knob by its config key,
    ``row["model.heads"]``)."""
    variant: str
    family: str | None = None
    in_paper: bool = False
    knobs: dict[str, Any] = field(default_factory=dict)   # flat config key -> value, of TABLE3_KNOBS
    seeds_completed: int = 0
    seeds_total: int = 0
    dev_ppl: float | None = None
    dev_ppl_std: float | None = None
    paper_dev_ppl: float | None = None
    delta_ppl: float | None = None
    paper_delta_ppl: float | None = None
    delta_ppl_rel: float | None = None
    paper_delta_ppl_rel: float | None = None
    ppl_agrees: bool | None = None
    ppl_noise: str | None = None             # beyond | within | unknown
    ppl_verdict: str | None = None           # .verdict: holds | may flip | within noise | too few points
    ppl_verdict_why: str | None = None
    ppl_settle: str | None = None            # .verdict.settle_text: the budget at which a row would settle
    answer: str | None = None                # .answers: better | worse | the same | unsettled (None: the base)
    answer_why: str | None = None            # its interval and seeds, or why it has none
    answer_low: float | None = None          # its interval as relative changes of dev PPL
    answer_high: float | None = None
    answer_seeds: int | None = None          # the seeds (each paired with the base's) it used
    answer_flops: float | None = None        # training FLOPs of the row's completed runs
    flops_per_step: float | None = None      # .compute
    train_flops: float | None = None
    dev_ppl_equal_flops: float | None = None
    delta_ppl_equal_flops: float | None = None
    delta_ppl_equal_flops_rel: float | None = None
    equal_flops_note: str | None = None
    dev_bleu: float | None = None
    dev_bleu_std: float | None = None
    paper_dev_bleu: float | None = None
    delta_bleu: float | None = None
    paper_delta_bleu: float | None = None
    delta_bleu_rel: float | None = None
    paper_delta_bleu_rel: float | None = None
    bleu_agrees: bool | None = None
    bleu_noise: str | None = None
    bleu_tested: bool | None = None          # the paired bootstrap (.stats)
    bleu_p_value: float | None = None
    bleu_differing: int | None = None
    bleu_sentences: int | None = None
    bleu_test_seeds: list[int] | None = None
    bleu_significant: bool | None = None
    params: int | None = None
    paper_params_m: float | None = None
    status: str = ""

    def _other(self, key: str) -> Any:
        return self.knobs[key]

# The views (see the module docstring)
WANDB_PPL, WANDB_BLEU, NOTE, COMPARE_ROW = "wandb.dev_ppl", "wandb.dev_bleu", "note", "compare.row"
PPL, BLEU, CONFIG, COMPARE = "md.ppl", "md.bleu", "md.config", "md.compare"
LATEX = "tex.table3"   # table3.tex: the columns with a ``latex`` view
Cell = Callable[[Row, Any], str]   # (row, its table: .table.Table3) -> the markdown cell


# ------------------------------------------------------------------------------------------- how cells print
def params_m(n: int | None) -> str:
    if n is None:
        return ""
    m = n / 1e6
    return f"{m:.2f}" if m < 10 else f"{m:.1f}"


def mean_std(mean, sd, digits) -> str:
    if mean is None:
        return ""
    return fmt(mean, digits) + (f" ± {sd:.{digits}f}" if sd is not None else "")


def yes(x: bool | None) -> str:
    return "" if x is None else ("yes" if x else "no")


def delta(d: float | None, rel: float | None, digits: int) -> str:
    """A change with its relative size: ``+1.10 (+22%)``."""
    if d is None:
        return ""
    return fmt(d, digits, sign=True) + (f" ({100 * rel:+.0f}%)" if rel is not None else "")


def _noise(metric: str) -> Cell:
    def cell(row: Row, table) -> str:
        if row.variant == "base":
            sd = table.base_std[metric]
            return f"noise: {NOISE_K:g}σ = {NOISE_K * sd:.2f}" if sd is not None else "noise unknown (1 seed)"
        return {"beyond": "yes", "within": "no", "unknown": "unknown"}.get(row[f"{metric}_noise"], "")
    return cell


def _test(row: Row, table) -> str:  # noqa: ARG001
    if row.bleu_p_value is None:
        return ""
    n, of = row.bleu_differing, row.bleu_sentences
    if n == 0:
        return f"identical outputs ({of} sentences)"
    if not row.bleu_tested:
        why = "equal BLEU" if row.delta_bleu is not None and round(row.delta_bleu, 2) == 0 else \
            f"both BLEU < {BLEU_FLOOR:g}"
        return f"not tested: {why} ({n}/{of} sentences differ)"
    p = row.bleu_p_value
    return f"p = {p:.3f}, {n}/{of} sentences differ" if p >= 0.001 else f"p < 0.001, {n}/{of} sentences differ"


def _flops(row: Row, table) -> str:
    """The change at the base's training compute, or why there is none; the base: its compute."""
    if row.variant == "base":
        flops = table.compute.get("base_flops")
        return f"budget {flops:.3g} FLOPs" if flops else ""
    if row.delta_ppl_equal_flops is not None:
        return delta(row.delta_ppl_equal_flops, row.delta_ppl_equal_flops_rel, 2)
    return row.equal_flops_note or ""


def _verdict(row: Row, table) -> str:  # noqa: ARG001
    if not row.ppl_verdict:
        return ""
    return row.ppl_verdict + (f" ({row.ppl_verdict_why})" if row.ppl_verdict in (HOLDS, MAY_FLIP, TOO_FEW) else "")


def _answer(row: Row, table) -> str:  # noqa: ARG001
    """The answer with its interval; a row of one seed says that the verdict beside is no controlled answer."""
    if row.answer_seeds == 1:
        return "unsettled (one seed: the verdict beside is no controlled answer)"
    return md_text(row.answer_why or "")


def _name(row: Row, table) -> str:  # noqa: ARG001
    return md_text(row.variant)


def _ppl_ours(row: Row, table) -> str:  # noqa: ARG001
    return mean_std(row.dev_ppl, row.dev_ppl_std, 2)


def _ppl_paper(row: Row, table) -> str:  # noqa: ARG001
    return fmt(row.paper_dev_ppl, 2)


def _bleu_ours(row: Row, table) -> str:  # noqa: ARG001
    return mean_std(row.dev_bleu, row.dev_bleu_std, 2)


def _bleu_paper(row: Row, table) -> str:  # noqa: ARG001
    return fmt(row.paper_dev_bleu, 1)


def _params_ours(row: Row, table) -> str:  # noqa: ARG001
    return params_m(row.params)


def _params_paper(row: Row, table) -> str:  # noqa: ARG001
    return "" if row.paper_params_m is None else f"{row.paper_params_m:g}"


def _base(table) -> Row | None:
    return next((r for r in table.rows if r.variant == "base"), None)


def _tex_knob(key: str) -> Cell:
    """A knob as the paper prints it: the base row's value, and in another row only a value that differs from it."""
    def cell(row: Row, table) -> str:
        base = _base(table)
        if base is not None and row is not base and row.knobs.get(key) == base.knobs.get(key):
            return ""
        return fmt_knob(row.knobs.get(key))
    return cell


def _tex_name(row: Row, table) -> str:
    """The row's name, with the knobs it changes that are not among the paper's columns (``prenorm (norm pre)``)."""
    base = _base(table)
    changed = [f"{k.title} {fmt_knob(row.knobs.get(k.key))}" for k in TABLE3_KNOBS if not k.tex
               and base is not None and row is not base and row.knobs.get(k.key) != base.knobs.get(k.key)]
    return row.variant + (f" ({', '.join(changed)})" if changed else "")


ROW = Shown("row", _name, left=True)


def _knob(k: Knob) -> Column:
    """A Table 3 knob's column (its metadata: base/knobs.py's Table3); in table3.tex, the paper's own columns
    (positions and norm are none of them: a row that changes one says so beside its name, as the paper's row E)."""
    return Column(k.csv, f"Table 3 knob {k.title} (config key {k.key})", frozenset({CSV}),
                  {CONFIG: Shown(k.title, lambda r, t: md_text(fmt_knob(r.knobs.get(k.key))),
                                 left=choices(k.key) is not None)},
                  value=lambda r: r.knobs.get(k.key), latex=Shown(k.tex, _tex_knob(k.key)) if k.tex else None)


C = Column
S = Shown
_T = frozenset({CSV, WANDB_PPL, WANDB_BLEU})
_P = frozenset({CSV, WANDB_PPL, NOTE})
_B = frozenset({CSV, WANDB_BLEU})

COLUMNS: list[Column] = [
    C("variant", "the row's name (the sweep file's variant)", _T | {NOTE, COMPARE_ROW},
      {PPL: ROW, BLEU: ROW, CONFIG: ROW, COMPARE: ROW}, latex=S("", _tex_name, left=True)),
    C("family", "the row's family (A-E, big, or the sweep's own)", _T | {COMPARE_ROW}),
    C("in_paper", "the paper's Table 3 has this row", frozenset({CSV, COMPARE_ROW})),
    *[_knob(k) for k in TABLE3_KNOBS],
    C("seeds_completed", "completed seeds of the row"),
    C("seeds_total", "seeds the row has or plans"),
    C("dev_ppl", "our dev perplexity, the mean over the completed seeds", _P,
      {PPL: S("dev PPL ours", _ppl_ours)}, compare_at=0, latex=S("ours", _ppl_ours, group="PPL (dev)")),
    C("dev_ppl_std", "its sample standard deviation over the seeds", frozenset({CSV, WANDB_PPL})),
    C("paper_dev_ppl", "the paper's dev perplexity (newstest2013)", _P,
      {PPL: S("dev PPL paper", _ppl_paper)}, latex=S("paper", _ppl_paper, group="PPL (dev)")),
    C("delta_ppl", "our dev PPL minus our base's, at equal steps", _P,
      {PPL: S("ΔPPL ours", lambda r, t: delta(r.delta_ppl, r.delta_ppl_rel, 2)),
       COMPARE: S("ΔPPL {side}", lambda r, t: delta(r.delta_ppl, r.delta_ppl_rel, 2))}, compare_at=1),
    C("delta_ppl_equal_flops", "our dev PPL minus our base's, at the base's training FLOPs (.compute)", _P,
      {PPL: S("ΔPPL ours at base FLOPs", _flops),
       COMPARE: S("ΔPPL {side} at base FLOPs",
                  lambda r, t: fmt(r.delta_ppl_equal_flops, 2, sign=True) or (r.equal_flops_note or ""))},
      compare_at=3),
    C("paper_delta_ppl", "the paper's dev PPL minus the paper's base's", _P | {COMPARE_ROW},
      {PPL: S("ΔPPL paper", lambda r, t: delta(r.paper_delta_ppl, r.paper_delta_ppl_rel, 2)),
       COMPARE: S("ΔPPL paper", lambda r, t: fmt(r.paper_delta_ppl, 2, sign=True))}),
    C("delta_ppl_rel", "delta_ppl relative to our base's dev PPL", frozenset({CSV, WANDB_PPL}), compare_at=2),
    C("delta_ppl_equal_flops_rel", "delta_ppl_equal_flops relative to our base's dev PPL"),
    C("paper_delta_ppl_rel", "paper_delta_ppl relative to the paper's base", frozenset({CSV, WANDB_PPL})),
    C("ppl_agrees", "our change of dev PPL has the paper's sign", _P,
      {PPL: S("PPL agrees", lambda r, t: yes(r.ppl_agrees), left=True),
       COMPARE: S("agrees {side}", lambda r, t: yes(r.ppl_agrees), left=True)}, compare_at=8),
    C("ppl_noise", "the change of dev PPL against seed noise: beyond, within, unknown (.stats)", _P,
      {PPL: S("PPL beyond noise", _noise("ppl"), left=True)}, compare_at=5),
    C("ppl_verdict", "the verdict from each run's learning curve extrapolated to k x the budget: holds (beyond "
      "noise, the one-sided bound of the predicted gap keeps today's sign), may flip, within noise, too few points "
      "(.verdict)", _P,
      {PPL: S("budget verdict", _verdict, left=True),
       COMPARE: S("verdict {side}", lambda r, t: r.ppl_verdict or "", left=True)}, compare_at=6),
    C("ppl_verdict_why", "the predicted change of dev PPL at k x the budget with its 80% interval and the direction's "
      "one-sided bound (e.g. -4.1% [-6.0, -2.2] at 1800 steps; direction bound -1.0%), or why there is none",
      compare_at=7),
    C("ppl_settle", "for a row that may flip: the least multiple of the budget (up to 10x) at which a verdict taken "
      "then is predicted to hold, on today's side (holds) or the other (flips), naming the side, as steps, FLOPs "
      "and hours on the machine that trained it; else 'not within 10x' (.verdict)", _P,
      {PPL: S("settles at", lambda r, t: r.ppl_settle or "", left=True)}),
    C("flops_per_step", "training FLOPs per step at the row's shapes (as `ltfm bench` counts them)"),
    C("train_flops", "training FLOPs at the row's last validation"),
    C("dev_ppl_equal_flops", "our dev PPL at the base's training FLOPs"),
    C("equal_flops_note", "why there is no dev PPL at the base's training FLOPs", compare_at=4),
    C("dev_bleu", "our dev BLEU, the mean over the completed seeds", _B,
      {BLEU: S("dev BLEU ours", _bleu_ours)}, latex=S("ours", _bleu_ours, group="BLEU (dev)")),
    C("dev_bleu_std", "its sample standard deviation over the seeds", _B),
    C("paper_dev_bleu", "the paper's dev BLEU (newstest2013)", _B,
      {BLEU: S("dev BLEU paper", _bleu_paper)}, latex=S("paper", _bleu_paper, group="BLEU (dev)")),
    C("delta_bleu", "our dev BLEU minus our base's", _B,
      {BLEU: S("ΔBLEU ours",
               lambda r, t: delta(r.delta_bleu, r.delta_bleu_rel, 2) + ("*" if r.bleu_significant else ""))}),
    C("paper_delta_bleu", "the paper's dev BLEU minus the paper's base's", _B,
      {BLEU: S("ΔBLEU paper", lambda r, t: delta(r.paper_delta_bleu, r.paper_delta_bleu_rel, 1))}),
    C("delta_bleu_rel", "delta_bleu relative to our base's dev BLEU", _B),
    C("paper_delta_bleu_rel", "paper_delta_bleu relative to the paper's base", _B),
    C("bleu_agrees", "our change of dev BLEU has the paper's sign", _B,
      {BLEU: S("BLEU agrees", lambda r, t: yes(r.bleu_agrees), left=True)}),
    C("bleu_noise", "the change of dev BLEU against seed noise: beyond, within, unknown", _B,
      {BLEU: S("BLEU beyond noise", _noise("bleu"), left=True)}),
    C("bleu_tested", "the paired bootstrap tested the row against the base"),
    C("bleu_p_value", "the paired bootstrap's p-value", _B, {BLEU: S("paired bootstrap", _test, left=True)}),
    C("bleu_differing", "dev sentences whose hypotheses differ from the base's"),
    C("bleu_sentences", "dev sentences the paired bootstrap compared"),
    C("bleu_significant", "the change of dev BLEU is significant (and beyond seed noise, with several seeds)", _B),
    C("params", "our parameter count", frozenset({CSV}),
      {CONFIG: S("params ours (M)", _params_ours)}, latex=S("ours", _params_ours, group=r"params $\times 10^6$")),
    C("paper_params_m", "the paper's parameter count, millions", frozenset({CSV}),
      {CONFIG: S("params paper (M)", _params_paper)},
      latex=S("paper", _params_paper, group=r"params $\times 10^6$")),
    C("answer", "the row against the base from its own seeds paired with the base's: better, worse, the same "
      "(within ±delta of dev PPL), unsettled; each row's chance of a false answer at most the settle: section's "
      "alpha over every look of the settle loop (lightning_tfm.findings.answers)", _P,
      {PPL: S("answer", _answer, left=True)},
      latex=S("answer", lambda r, t: r.answer or "", left=True)),
    C("answer_why", "the answer's interval of the change of dev PPL, its level and seeds, or why there is none"),
    C("answer_low", "the answer's interval, low end, as a relative change of dev PPL", frozenset({CSV, WANDB_PPL})),
    C("answer_high", "the answer's interval, high end, as a relative change of dev PPL", frozenset({CSV, WANDB_PPL})),
    C("answer_seeds", "the row's seeds the answer read (each paired with the base's same seed)"),
    C("answer_flops", "what the answer took: training FLOPs of the row's completed runs"),
    C("status", "completed, missing, failed, skipped, pruned, diverged, continued, with why", _T,
      {CONFIG: S("status", lambda r, t: md_text(r.status), left=True)}),
]
del C, S


SIDE = "compare.side"   # a comparison side's columns: those with a compare_at, in its order


def columns(view: str) -> list[Column]:
    """The columns of ``view`` in their order: the list's, or :data:`SIDE`'s (by ``compare_at``); :data:`LATEX`:
    those with a ``latex`` view."""
    if view == SIDE:
        return sorted((c for c in COLUMNS if c.compare_at is not None), key=lambda c: c.compare_at)
    if view == LATEX:
        return [c for c in COLUMNS if c.latex is not None]
    return in_view(COLUMNS, view)


def shown(view: str, among: str | None = None) -> list[Shown]:
    """The markdown columns of ``view`` (:data:`PPL`, :data:`BLEU`, :data:`CONFIG`, :data:`COMPARE`) among the
    columns of ``among`` (default: ``view``'s own); the note (:data:`NOTE`) shows its columns as :data:`PPL` does."""
    if view == NOTE:
        view, among = PPL, NOTE
    return [c.shown[view] for c in columns(among or view) if view in c.shown]
