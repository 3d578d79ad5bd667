"""What each kind of report (:data:`KINDS`: Table 3's, Table 2's) gives the outside: its files, its W&B tables and
summary, its block of the study's note, whether the study gets custom plots, and how :func:`.published.publish`
gets its table, each a :class:`~.core.columns.Kind`. Shared by :mod:`.wandb_run` (the W&B report run) and
:mod:`.optuna_note` (the study's note and plots).

Table 3: the W&B tables ``table3/dev_ppl`` and ``table3/dev_bleu`` (:data:`WANDB_TABLES`: the columns of
:data:`~.table3.columns.WANDB_PPL` and :data:`~.table3.columns.WANDB_BLEU`: ours, the paper's, both changes,
agreement, the noise verdict, status, with the values ``table3.csv`` gives them: :func:`wandb_tables`); the summary
(:func:`headline_numbers`: direction agreement over all rows and over the rows beyond seed noise and over the rows
whose verdict holds, rows beyond noise, rows of each verdict and of each answer, the sweep's wall time), counted
from the table's rows with the report's own :func:`~.stats.agreement_summary` and :func:`~.verdict.verdict_summary`;
the note: the headline and the dev-perplexity section (the columns of :data:`~.table3.columns.NOTE`); custom plots.

Table 2 (a sweep of several architectures, :mod:`.table2`): the W&B table ``table2/rows`` (``table2.csv``'s rows:
ours, then the paper's), the summary of :func:`.table2.table.summary_numbers`, the note of
:func:`.table2.table.note_parts`; no custom plots.
"""
from __future__ import annotations

from typing import Any

from ..core.columns import Kind
from ..table2 import columns as table2_columns
from ..table2 import table as table2_table
from ..table3 import columns as table3_columns
from ..table3.table import rebuilt_table
from ..views.render import headline_markdown, headline_text, ppl_markdown

KIND = "table3"   # the default kind of the functions that take one
WANDB_TABLES = {"table3/dev_ppl": table3_columns.WANDB_PPL,   # W&B table -> its view (.columns)
                "table3/dev_bleu": table3_columns.WANDB_BLEU}

#: Each report kind: its columns and what W&B and optuna-dashboard take of it (:class:`~.core.columns.Kind`)
KINDS = {k.name: k for k in (
    Kind("table3", table3_columns.columns,
         ("table3.md", "table3.csv", "table3.html", "table3.tex", "table3-standalone.tex"),
         WANDB_TABLES, lambda t: headline_numbers(t.rows, t.run_info),
         lambda t: [headline_markdown(t), ppl_markdown(t, table3_columns.NOTE)],
         lambda data, sweep, out: rebuilt_table(sweep, out), plots=True, exported=True, headline=headline_text,
         what="a Table 3 report (a sweep with variants)"),
    Kind("table2", table2_columns.columns, ("table2.md", "table2.csv", "table2.html"),
         {"table2/rows": table2_columns.CSV}, table2_table.summary_numbers, table2_table.note_parts,
         lambda data, sweep, out: table2_table.build_table2(data), rows=table2_table.csv_rows, digits=None,
         claims=table2_table.read_claims,
         what="a Table 2 report (rows of another architecture than the Transformer)"))}


def wandb_tables(table: dict) -> dict[str, tuple[list[str], list[list]]]:
    """Each W&B table of a Table 3 report (:data:`WANDB_TABLES`) as (its columns, a list of cells per row)."""
    return KINDS[KIND].wandb_tables(table)


def headline_numbers(rows: list, run_info: dict | None = None) -> dict:
    """The headline as numbers for a W&B summary: per metric (``dev_ppl``, ``dev_bleu``) the rows whose
    direction agrees with the paper and the rows compared, over all rows and over the rows beyond seed noise
    (with the fractions), the rows beyond/within noise or unknown; dev PPL's agreement over the rows that hold and the
    rows of each budget verdict and of each answer; the sweep's wall time. ``rows``: the table's; the counting is the
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
    from ...findings.answers import ANSWERS
    answered = [r.answer for r in rows if r.answer]  # each row's answer (..table3.answers)
    for answer in ANSWERS if answered else ():
        out[f"dev_ppl/answer_{answer.replace(' ', '_')}"] = answered.count(answer)
    info = run_info or {}
    for key, name in (("wall_s", "wall_time_s"), ("train_s", "train_time_s"), ("runs", "completed_runs"),
                      ("records", "runs")):
        if info.get(key) is not None:
            out[name] = info[key]
    return out
