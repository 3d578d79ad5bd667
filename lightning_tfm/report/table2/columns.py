"""The Table 2 report's row and its columns, declared once, with the mechanism of Table 3's (:mod:`.columns`).

:class:`Row` is one row of ``table2.csv``: one of ours (:func:`~lightning_tfm.report.table2.table.build_table2` makes
them: mean ± sample sd over the row's completed seeds) or one of the paper's (``source`` ``paper``). :data:`COLUMNS`
is the one list of its columns, in the CSV's order; each :class:`~.columns.Column` says where it appears:

- ``views``: :data:`~.columns.CSV` (``table2.csv``, header = the key, and the report run's W&B table
  ``table2/rows``: :data:`.publish.kinds.KINDS`), :data:`SUMMARY` (the W&B run's summary: ``<row>/<key>``);
- ``shown``: :data:`ROWS`, the table of ours in ``table2.md`` (and so the HTML page and the optuna-dashboard
  note) with its header and how its cell prints.

A new column is one more entry of :data:`COLUMNS` and a field of :class:`Row`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.columns import CSV, Column, Fields, Shown, in_view
from ..core.text import md_cell, md_text

SUMMARY, ROWS = "wandb.summary", "md.table2"


@dataclass
class Row(Fields):
    """One row of the Table 2 report (``None``: not known, or not of a paper row). Also read as a mapping
    (``row["test_bleu"]``). Besides its columns: the figure's and claim (b)'s mean curves, the verdict's runs."""
    variant: str
    source: str = "ours"
    arch: str | None = None
    seeds_completed: int | None = None
    seeds_total: int | None = None
    beam_size: int | None = None
    test_bleu: float | None = None
    test_bleu_std: float | None = None
    dev_bleu: float | None = None
    dev_bleu_std: float | None = None
    dev_ppl: float | None = None
    dev_ppl_std: float | None = None
    train_flops: float | None = None
    train_flops_std: float | None = None
    flops_per_step: float | None = None
    train_time_s: float | None = None
    train_time_s_std: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_std: float | None = None
    params: int | None = None
    status: str = ""
    against: str | None = None            # the transformer row of claim (a)'s pair (the first in table order)
    bleu_noise: str | None = None         # that pair's BLEU difference against seed noise: beyond | within | unknown
    bleu_settle_seeds: str | None = None  # within noise: the seeds a row at which it would settle (.table2)
    bleu_settle_steps: str | None = None  # ... and in steps, on the pair's dev-PPL curves
    s_per_step: float | None = None
    bleu_every: int | None = None         # decode.dev_bleu_every_steps, decode.dev_bleu_subset
    bleu_subset: int | None = None
    curves: dict = field(default_factory=lambda: {"ppl": {}, "bleu": {}})  # {metric: {step: (mean, min, max)}}
    runs: list = field(default_factory=list)   # {step: dev PPL} a completed seed (the verdict's fits)
    warmup: int = 0


# ------------------------------------------------------------------------------------------- how cells print
def seconds(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.2f} h"


def pm(mean, sd, digits=2) -> str:
    if mean is None:
        return ""
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def _text(key: str):
    return lambda r, t: "" if r[key] is None else md_cell(md_text(r[key]))


def _mean_sd(key: str):
    return lambda r, t: pm(r[key], r[f"{key}_std"])


def _flops(r: Row, t: dict) -> str:  # noqa: ARG001
    v, sd = r.train_flops, r.train_flops_std
    return "" if v is None else f"{v:.3g}" + (f" ± {sd:.2g}" if sd else "")


def _time(r: Row, t: dict) -> str:  # noqa: ARG001
    v, sd = r.train_time_s, r.train_time_s_std
    return "" if v is None else seconds(v) + (f" ± {sd:.0f} s" if sd is not None else "")


def _tokens(r: Row, t: dict) -> str:  # noqa: ARG001
    v, sd = r.tokens_per_s, r.tokens_per_s_std
    return "" if v is None else f"{v:,.0f}" + (f" ± {sd:,.0f}" if sd is not None else "")


def _params(r: Row, t: dict) -> str:  # noqa: ARG001
    return "" if r.params is None else f"{r.params / 1e6:.2f}M"


C, S = Column, Shown
_T = frozenset({CSV, SUMMARY})
_SETTLE = ("for a pair within seed noise (the row against its transformer row, claim (a)): the least {what} at "
           "which the difference is predicted to settle, or why not (.table2)")

COLUMNS: list[Column] = [
    C("source", "ours, or the paper's (WMT 2014 EN-DE, not comparable)"),
    C("variant", "the row's name (the sweep file's variant; a paper row: its model)", shown={
        ROWS: S("row", _text("variant"), left=True)}),
    C("arch", "its architecture (model.arch; a paper row: its family)", shown={ROWS: S("arch", _text("arch"))}),
    C("seeds_completed", "completed seeds of the row", _T),
    C("seeds_total", "seeds the row has or plans"),
    C("beam_size", "decode.beam_size of the closing beam search"),
    C("test_bleu", "test BLEU, the mean over the completed seeds (a paper row: BLEU EN-DE)", _T,
      {ROWS: S("test BLEU", _mean_sd("test_bleu"))}),
    C("test_bleu_std", "its sample standard deviation over the seeds"),
    C("dev_bleu", "dev BLEU (the whole dev set at the end)", _T, {ROWS: S("dev BLEU", _mean_sd("dev_bleu"))}),
    C("dev_bleu_std", "its sample standard deviation"),
    C("dev_ppl", "dev perplexity", _T, {ROWS: S("dev PPL", _mean_sd("dev_ppl"))}),
    C("dev_ppl_std", "its sample standard deviation"),
    C("train_flops", "training FLOPs: steps x FLOPs per step", _T, {ROWS: S("training FLOPs", _flops)}),
    C("train_flops_std", "its sample standard deviation"),
    C("flops_per_step", "training FLOPs per step (the architecture's own count)"),
    C("train_time_s", "training wall time, seconds", _T, {ROWS: S("training wall time", _time)}),
    C("train_time_s_std", "its sample standard deviation"),
    C("tokens_per_s", "train target tokens per second", _T, {ROWS: S("train tokens/s", _tokens)}),
    C("tokens_per_s_std", "its sample standard deviation"),
    C("params", "parameters", _T, {ROWS: S("params", _params)}),
    C("status", "completed, missing, failed, ... with why", shown={ROWS: S("status", _text("status"))}),
    C("against", "the transformer row of the pair (claim (a)) the next three columns are of"),
    C("bleu_noise", "the pair's BLEU difference against seed noise: beyond, within, unknown"),
    C("bleu_settle_seeds", _SETTLE.format(what="seeds a row (the Welch t interval)"), _T),
    C("bleu_settle_steps", _SETTLE.format(what="budget (Table 3's settle budget on the dev-PPL curves)"), _T),
]
del C, S


def columns(view: str) -> list[Column]:
    """The columns of ``view`` (:data:`~.columns.CSV`, :data:`SUMMARY`, :data:`ROWS`) in their order."""
    return in_view(COLUMNS, view)
