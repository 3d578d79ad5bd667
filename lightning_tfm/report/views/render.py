"""The Table 3 replica as text: the markdown (``table3.md``) and the CSV (``table3.csv``) of the table that
:func:`lightning_tfm.report.table3.table.build_table` gives, and :func:`write_table`, which writes both and the LaTeX
table (``table3.tex``, :mod:`.latex`).

The markdown (and the HTML) put the headline first (direction agreement, rows beyond noise, the verdicts and the
agreement over the rows that hold, the answers and the compute they took beside every row at the cap, how much
longer a run would settle how many rows, the sweep's wall time, the machines), then a PPL table (with the change at
the base's training FLOPs, each row's verdict and its answer), a BLEU table, the learning curves, the configuration
table and notes (the verdict's and the equal-compute rules among them).

Every string that comes from a sweep, its runs or an export (a row's name, a status, a note, a machine, the
source) goes in through :func:`~.text.md_text` (or :func:`~.text.md_code`): it reads as itself in the markdown,
in the HTML page made from it and in the optuna-dashboard note, never as a tag or a link. A pipeline check's
report (runs tagged ``pipeline-check``: ``make ablation QUICK=1``) says so in its title and first line. Its last
section says where ``ltfm report`` publishes it (:mod:`.published`): the W&B report run and the command that opens
the study in optuna-dashboard.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from ...base.atomic import write_text
from ...findings.noise import NOISE_K, NOISE_RULE, share
from ...training.runs import results
from ..core.columns import CSV
from ..core.text import fmt, md_cell, md_code, md_text
from ..table3.columns import BLEU, CONFIG, PPL, columns, shown
from ..table3.compute import COMPUTE_RULE
from ..table3.stats import BLEU_FLOOR, SIGNIFICANCE
from ..table3.table import Table3
from ..table3.verdict import HOLDS, MAY_FLIP, TOO_FEW, WITHIN, settings_of, verdict_rule


def _md_table(table: Table3, view: str) -> list[str]:
    """The markdown table of ``view`` (:mod:`.table3.columns`): a header, the alignments, a line per row."""
    cols = shown(view)
    lines = ["| " + " | ".join(c.title for c in cols) + " |",
             "|" + "|".join("---" if i == 0 or c.left else "--:" for i, c in enumerate(cols)) + "|"]
    for row in table.rows:
        lines.append("| " + " | ".join(md_cell(c.cell(row, table)) for c in cols) + " |")
    return lines


def _fraction(pair: tuple[int, int]) -> str:
    k, n = pair
    return f"{k}/{n} rows ({100 * k / n:.0f}%)" if n else "no rows"


def agreement_line(table: Table3) -> str:
    s = table.summary
    return (f"Direction agrees with the paper: dev PPL {_fraction(s['ppl'])}, dev BLEU {_fraction(s['bleu'])}, "
            f"both {_fraction(s['both'])}.")


def verdict_line(table: Table3) -> str:
    """The verdicts in one line: how many rows of each, the rows that may flip by name, the budget multiple they
    predict at, and direction agreement with the paper over the rows that hold (beside the agreement over all
    rows, the first line)."""
    s = table.summary
    n = s["verdicts"]
    flip = s["may_flip"]
    k = settings_of(table.report_settings)["k"]
    return (f"Verdicts (dev PPL learning curves extrapolated to {k:g} × the budget): {n[HOLDS]} hold, {n[MAY_FLIP]} "
            f"may flip{' (' + ', '.join(map(md_text, flip)) + ')' if flip else ''}, {n[WITHIN]} within noise, "
            f"{n[TOO_FEW]} too few points; direction agrees with the paper on the rows that hold: dev PPL "
            f"{_fraction(s['ppl_findings'])}.")


def record_line(table: Table3) -> str | None:
    """How many rows beyond noise hold their direction at k x and how often such calls kept their sign in the
    back-tests, then the size interval's coverage, each with its count and confidence interval (the records of
    :mod:`lightning_tfm.findings.curves`: each export left out, and the first constants' held-out record); None
    without a row beyond noise."""
    n = table.summary["verdicts"]
    beyond = n[HOLDS] + n[MAY_FLIP]
    if not beyond:
        return None
    from ...findings.curves import (
        DIRECTION_RECORD,
        EXTRAPOLATION_K,
        EXTRAPOLATION_LEVEL,
        HELDOUT_RECORD,
        SIGN_LEVEL,
        SIZE_RECORD,
    )

    k = settings_of(table.report_settings)["k"]
    _, called, kept = DIRECTION_RECORD
    inside, rows = SIZE_RECORD
    held, held_size = HELDOUT_RECORD["holds"], HELDOUT_RECORD["size"]
    at = f" at {k:g}x" if k == EXTRAPOLATION_K else f" at {k:g}x (back-tested at {EXTRAPOLATION_K:g}x)"
    return (f"{n[HOLDS]} of the {beyond} rows beyond noise hold their direction{at} ({100 * SIGN_LEVEL:g}% "
            f"one-sided bound on the gap on today's side): such calls kept their sign in {share(kept, called)} "
            f"back-tested rows, each export left out, and in {share(held[2], held[1])} held out; the size of each "
            f"gap comes with its {100 * EXTRAPOLATION_LEVEL:g}% interval that held {share(inside, rows)} measured "
            f"gaps, each export left out; it is recalibrated on the held-out rows, where the interval before held "
            f"{share(*held_size)} (reports/reference/backtest/).")


def settle_line(table: Table3) -> str | None:
    """How much longer a run would settle how many of the rows that may flip (their settle budgets counted at the
    multiples of :data:`~.verdict.SETTLE_AT` that change the count, :func:`~.verdict.settle_summary`), on which side,
    said to be predictions, with each kind's back-tested record
    (:data:`~lightning_tfm.findings.curves.SETTLE_RECORD`); None without such rows."""
    s = table.summary.get("settle")
    if not s or not s["unsettled"]:
        return None
    from ...findings.curves import SETTLE_MOST, SETTLE_RECORD

    steps: list[tuple[float, int]] = []
    for m, n in s["settled"]:
        if n > (steps[-1][1] if steps else 0):
            steps.append((m, n))
    rows = f"of the {s['unsettled']} rows that may flip" if s["unsettled"] > 1 else "of the 1 row that may flip"
    if steps:
        (m, n), kinds = steps[0], s.get("kinds") or {}
        how = [f"{kinds[kind]} {'on their side' if kind == 'holds' else 'by flipping to the other'}"
               for kind in ("holds", "flips") if kinds.get(kind)]
        text = (f"A run {m:g}x as long would settle {n} {rows}" + "".join(f", {m:g}x {n}" for m, n in steps[1:])
                + f" ({', '.join(how)})")
        text += f"; {s['not_within']} not within {SETTLE_MOST:g}x" if s["not_within"] else ""
    else:
        text = f"No run up to {SETTLE_MOST:g}x as long is predicted to settle any {rows}"
    text += f"; {s['no_prediction']} without a prediction" if s["no_prediction"] else ""
    record = "; ".join(f"'{kind}' {ok} of {n}" for kind, (ok, n) in SETTLE_RECORD.items())
    return (f"{text}. These are predictions of the fitted curves; back-tested at 3x, such predictions came true: "
            f"{record} (rows within noise get none: theirs came true no more often than saying nothing).")


def answer_line(table: Table3) -> str | None:
    """The answers in all (:mod:`..table3.answers`): the count of each, the rows of one seed among the unsettled,
    the error rate they hold, the compute spent beside every row at the cap; None without answers."""
    a = table.answers
    if a is None or not a.rows:
        return None
    c = a.counts
    one = sum(1 for r in table.rows if r.answer_seeds == 1)
    text = (f"Answers from each row's own seeds paired with the base's: {c['better']} better, {c['worse']} worse, "
            f"{c['the same']} the same within ±{100 * a.delta:g}%, {c['unsettled']} unsettled"
            + (f" ({one} of one seed: no controlled answer, their verdict beside)" if one else "")
            + f"; each row's chance of a false answer at most {a.alpha:g} over all its looks"
            + (f" (at most {a.alpha * a.rows:.1f} false answers expected among these {a.rows} rows)."
               if a.rows > c["unsettled"] else "."))
    if a.spent and a.at_cap:
        text += (f" Training compute spent: {a.spent:.3g} FLOPs; every row at {a.seeds} seeds and the base at the "
                 f"caps: {a.at_cap:.3g} ({a.at_cap / a.spent:.2f}x).")
    return text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not recorded"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


PIPELINE_CHECK_LINE = ("Pipeline check (runs tagged `pipeline-check`): its numbers say nothing about the paper's "
                       "claims; it shows that every row trains, evaluates and is reported (`make ablation` runs the "
                       "protocol).")


# Lightning's precisions by their full names (what summary.json records: training.runs.results.precision_name) as a
# reader names them
PRECISIONS = {"32-true": "fp32", "64-true": "fp64", "16-mixed": "fp16 (mixed)", "16-true": "fp16",
              "bf16-mixed": "bf16 (mixed)", "bf16-true": "bf16", "transformer-engine": "fp8 (Transformer Engine)",
              "transformer-engine-float16": "fp8 (Transformer Engine, fp16)"}


def precision_name(precision) -> str:
    """``"32"`` or ``"32-true"`` -> ``"fp32"``, ``"bf16-mixed"`` -> ``"bf16 (mixed)"``; a string Lightning may add
    later, as it is."""
    full = results.precision_name(precision)
    return PRECISIONS.get(full, full)


def precision_names(precisions) -> list[str]:
    """The precisions as a reader names them, each once (an older export's ``"32"`` and a newer run's
    ``"32-true"`` are one fp32)."""
    return list(dict.fromkeys(precision_name(p) for p in precisions))


def headline_lines(table: Table3) -> list[str]:
    """The facts a reader wants first, one per line (``ltfm report`` prints them too)."""
    s, info, std = table.summary, table.run_info, table.base_std
    lines = [PIPELINE_CHECK_LINE] if table.pipeline_check else []
    lines.append(agreement_line(table))
    if std["ppl"] is None and std["bleu"] is None:
        lines.append(f"Beyond seed noise: unknown, the base row has {table.base_seeds} completed seed(s); "
                     "seed noise needs at least 2 (in the sweep file: `base: {seeds: [1, 2, 3]}`).")
    else:
        beyond = {m: s[f"{m}_noise"]["beyond"] for m in ("ppl", "bleu")}
        compared = {m: sum(s[f"{m}_noise"].values()) for m in ("ppl", "bleu")}
        lines.append(f"Rows beyond seed noise: dev PPL {beyond['ppl']}/{compared['ppl']}, dev BLEU "
                     f"{beyond['bleu']}/{compared['bleu']} (|Δ| > {NOISE_K:g} × the base's seed std: PPL "
                     f"{fmt(std['ppl'], 2) or '?'}, BLEU {fmt(std['bleu'], 2) or '?'}, "
                     f"over {table.base_seeds} seeds).")
        lines.append(f"Direction agrees with the paper on the rows beyond noise: dev PPL {_fraction(s['ppl_beyond'])}, "
                     f"dev BLEU {_fraction(s['bleu_beyond'])}.")
    lines.append(verdict_line(table))
    answers = answer_line(table)
    if answers:
        lines.append(answers)
    record = record_line(table)
    if record:
        lines.append(record)
    settle = settle_line(table)
    if settle:
        lines.append(settle)
    lines.append(f"Sweep: {info['runs']} completed run(s) of {info['records']}; wall time "
                 f"{_duration(info['wall_s'])} (first start to last end), training time summed over runs "
                 f"{_duration(info['train_s'])}.")
    precisions = info.get("precisions")  # an export written before they were recorded has none
    lines.append("Machine: " + ("; ".join(map(md_text, info["machines"])) if info["machines"] else "not recorded")
                 + "; trained in " + (", ".join(map(md_text, precision_names(precisions))) if precisions
                                      else "a precision not recorded") + ".")
    return lines


def headline_markdown(table: Table3) -> str:
    own = table.own_seeds
    sweep_seeds = table.sweep_seeds
    seed_text = (f"seed{'s' if len(sweep_seeds) > 1 else ''} {', '.join(map(str, sweep_seeds))}"
                 + "".join(f"; {md_text(v)} at seeds {', '.join(map(str, s))}" for v, s in own.items()))
    title = "Pipeline check, not a result" if table.pipeline_check else "Table 3 replica"
    head = [f"# {title}: sweep {md_code(table.sweep)}", "",
            f"Base experiment {md_code(table.experiment)}; {seed_text}. "
            "Paper = Vaswani et al. (2017), Table 3 (newstest2013). Absolute values "
            "are not comparable across corpora, model sizes and BLEU tokenizations: compare the directions of "
            "change and their relative sizes.", ""]
    return "\n".join(head + [f"- {ln}" for ln in headline_lines(table)]) + "\n"


def ppl_markdown(table: Table3, view: str = PPL) -> str:
    """The dev-perplexity section; ``view``: :data:`~.columns.NOTE` gives the optuna-dashboard note's table."""
    lines = ["## Dev perplexity", "",
             "Ours " + ("(mean ± std over the completed seeds) " if _several_seeds(table) else "")
             + "beside the paper's; Δ = change against the same side's base row, with its size relative to that "
               "base, at equal steps and at the base's training FLOPs; \"agrees\" = our change has the paper's "
               "sign; \"beyond noise\": " + NOISE_RULE + "; \"budget verdict\": holds, may flip, within noise or "
               "too few points, from each run's learning curve extrapolated, with the predicted change at the longer "
               "budget and its interval; \"answer\": better, worse, the same or unsettled, from the row's own seeds "
               "paired with the base's, with its interval (the rules are in the notes).", ""]
    return "\n".join(lines + _md_table(table, view)) + "\n"


def bleu_markdown(table: Table3) -> str:
    lines = ["## Dev BLEU", "",
             "As the perplexity table. \"paired bootstrap\": sacreBLEU's paired bootstrap resampling of the row's dev "
             "hypotheses against the base's (p-value, and how many sentences the two outputs differ in); it "
             "measures test-set sampling noise only, not the variation between training seeds. "
             f"\\* = p < {SIGNIFICANCE} on outputs that differ"
             + (", and beyond seed noise" if _several_seeds(table) else "") + "; identical outputs or equal BLEU "
             f"are never significant, nor are two outputs that both score below {BLEU_FLOOR:g} BLEU "
             "(no 4-gram to speak "
             "of: the score is set by smoothing).", ""]
    return "\n".join(lines + _md_table(table, BLEU)) + "\n"


def _several_seeds(table: Table3) -> bool:
    return any((r.seeds_total or 0) > 1 for r in table.rows)


def curves_markdown(table: Table3) -> str:
    """Dev perplexity at each of the base's validation steps, per row (rows with more steps, such as big's
    3x budget, add their final value in the last column)."""
    steps, rows = table.curves.steps, table.curves.rows
    lines = ["## Learning curves", "",
             "Dev perplexity at each validation (mean over the completed seeds), the base's steps as columns; "
             "\"final\" is the row's last validation (big trains 3x the steps).", ""]
    if not steps or not rows:
        return "\n".join(lines + ["No validation history to show."]) + "\n"
    head = ["row", *[f"step {st}" for st in steps], "final"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["--:"] * (len(head) - 1)) + "|"]
    for v, series in rows.items():
        last = max(series)
        cells = [md_text(v)] + [f"{series[st]:.1f}" if st in series else "" for st in steps] + \
            [f"{series[last]:.1f} (step {last})"]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def config_markdown(table: Table3) -> str:
    lines = ["## Configuration", "", "Each row's Table 3 knobs (ours), its parameter count beside the paper's, and "
             "its status; missing, failed, skipped and pruned rows keep their row.", ""]
    return "\n".join(lines + _md_table(table, CONFIG)) + "\n"


def notes_markdown(table: Table3) -> str:
    s = table.summary
    lines = []
    if not table.has_base:
        lines.append("No completed base row: no change against the base can be computed.")
    if s["not_compared"]:
        lines.append("Not compared (no completed run): "
                     + ", ".join(f"{md_text(v)} ({md_text(st.split()[0].rstrip(':;'))})" for v, st in s["not_compared"])
                     + ".")
    if table.test_signature:
        lines.append(f"Paired bootstrap: sacreBLEU {md_code(table.test_signature)}.")
    for sig in table.bleu_signatures:
        lines.append(f"Our dev BLEU: sacreBLEU {md_code(sig)}.")
    lines.append(verdict_rule(table.report_settings))
    if table.answers is not None:
        lines.append(table.answers.rule)
    lines.append(COMPUTE_RULE + ".")
    compute = table.compute
    if compute.get("base_flops") and not compute.get("lengths_measured"):
        lines.append("FLOPs per step: some runs' prepared corpus was not readable here, so their sentence lengths "
                     "are `ltfm bench`'s default sentence lengths (bench.src_len, bench.tgt_len); "
                     "their attention FLOPs are estimates.")
    lines.append(f"Source: {md_text(table.source)}.")
    lines += [md_text(n) for n in table.notes + table.data_notes]
    return "\n".join(["## Notes", "", *[f"- {ln}" for ln in lines]]) + "\n"


PUBLISHED_TITLE = "## W&B and optuna-dashboard"


def published_markdown(table: Table3) -> str:
    """The section of the report's W&B run and optuna-dashboard (:func:`.published.where_published`, in
    ``table.published``); empty when the table has none."""
    lines = table.published or []
    return "\n".join([PUBLISHED_TITLE, "", *[f"- {ln}" for ln in lines]]) + "\n" if lines else ""


def table_markdown(table: Table3) -> str:
    """table3.md: the headline, the lead figure, the PPL table, the BLEU table, the learning curves, the
    configuration table, notes, where the report is published (W&B, optuna-dashboard) (what the HTML shows, in the
    same order); one fact per line, so it diffs well in the repository."""
    from .lead import changes_markdown  # matplotlib's figure module: only where a page is written

    parts = (headline_markdown, changes_markdown, ppl_markdown, bleu_markdown, curves_markdown, config_markdown,
             notes_markdown, published_markdown)
    return "\n".join(text for text in (part(table) for part in parts) if text)


def table_csv(table: Table3) -> str:
    cols = columns(CSV)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in cols])
    for row in table.rows:
        w.writerow([c.csv_text(row) for c in cols])
    return buf.getvalue()


def headline_text(table: Table3) -> str:
    """The headline for the terminal (``ltfm report`` prints it), a line per fact."""
    return "".join(f"{ln}\n" for ln in headline_lines(table))


def write_table(table: Table3, out_dir: str | Path) -> tuple[Path, Path]:
    """table3.md and table3.csv (returned), and table3.tex with table3-standalone.tex (:mod:`.latex`)."""
    from .latex import write_latex

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_latex(table, out)
    return (write_text(out / "table3.md", table_markdown(table)), write_text(out / "table3.csv", table_csv(table)))
