"""The paper's Table 2 at small scale: architectures side by side in one sweep, each row beside the paper's
(:func:`build_table2`), and its claim checked in one line each.

A sweep is a Table 2 sweep (:func:`is_table2`) when a row's config uses another architecture than the Transformer
(``model.arch``, :mod:`lightning_tfm.model.registry`): rows of several architectures, or recurrent rows alone.
Per row, over its completed seeds (mean ± sample sd): test BLEU (the runs' closing beam search,
``decode.beam_size``: 4 in the protocol), dev PPL, training FLOPs (steps x FLOPs per step,
:func:`lightning_tfm.report.table3.compute.step_flops`: the architecture's own count), training wall time
(:func:`train_seconds`), training tokens/s and parameters. The paper's rows (GNMT + RL, ConvS2S, Transformer base
and big: BLEU EN-DE and training FLOPs, ``resources/paper_table2.csv``) stand in a table of their own: WMT 2014 on
GPUs, not our data nor our scale.

The claim, for each pair (a transformer row, a row of another architecture):

- (a) BLEU at equal training FLOPs: whose BLEU is higher, by how much, and whether the gap is beyond seed noise
  (Welch's 90% t interval of the difference at the seeds done excludes zero: :func:`.claims.pair_noise`); a pair
  whose budgets differ by more than :data:`EQUAL_TOLERANCE` says so;
- (b) the training FLOPs and wall time each needs to reach the other row's final dev BLEU, read on the dev-BLEU
  curves when every run of the pair logged one (``decode.dev_bleu_every_steps``: BLEU of the first
  ``decode.dev_bleu_subset`` dev sentences), else on the dev-PPL curves (the other row's final dev PPL): the first
  crossing of the row's mean curve, linear between validations (log PPL for PPL); the wall time at a step is the
  run's training wall time x step / steps (a constant rate). A row at the target by its first validation has only
  an upper bound of its cost ("at most"): no ratio of two bounds is said (:func:`.claims.fewer`).

The claim's lines: :mod:`.claims`; the row, its columns and their views: :mod:`.table2.columns`.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from ...base.atomic import write_text
from ...findings.noise import finite, mean_std
from ...training.runs import results
from ..core.columns import CSV
from ..core.text import md_code, md_text
from ..inputs.records import ReportData, RunRecord, is_pipeline_check
from ..table3.compute import step_flops
from ..table3.paper import PAPER2_SHOWN, load_paper2
from ..table3.table import as_shown, learning_curves, ordered_variants, row_status
from .claims import (
    DEFAULT_ARCH,
    EQUAL_TOLERANCE,
    PAIR_NOISE_RULE,
    SETTLE_NOTE,
    any_bleu_curves,
    claim_lines,
    has_bleu_curve,
    pair_settle,
    pairs,
)
from .columns import ROWS, SUMMARY, Row, columns

CURVES = {"ppl": results.DEV_PPL, "bleu": results.DEV_BLEU}


def arch_of(config: dict) -> str:
    """The architecture of a flat config (a saved transformer config leaves ``model.arch`` out)."""
    return str(config.get("model.arch") or DEFAULT_ARCH)


def planned_archs(sweep) -> dict[str, str]:
    """variant -> the architecture its trial config builds (the sweep's own
    :func:`~lightning_tfm.sweep.trial_config`)."""
    from ...base.errors import UserError
    from ...sweep import Entry, trial_config
    from ...training.config.config import flatten

    out = {}
    for name, v in (sweep.variants or {}).items():
        try:
            flat = flatten(trial_config(sweep, Entry(name, v["family"], sweep.seeds[0], v["overrides"], v["budget"]),
                                        checked=False))
        except UserError:
            flat = {k: val for k, val in v["overrides"].items()}
        out[name] = arch_of(flat)
    return out


def is_table2(sweep) -> bool:
    """A sweep of variants with a row of another architecture than the Transformer: rows of several architectures,
    or of the recurrent baseline alone. Table 3 is the Transformer's ablation (its knobs, the paper's rows, a
    Transformer base): a sweep without a Transformer row is reported as Table 2 reports rows, each by its own
    architecture, numbers and cost (its claim, which needs a Transformer row beside, says it is not checked)."""
    return sweep.mode == "variants" and bool(set(planned_archs(sweep).values()) - {DEFAULT_ARCH})


# ------------------------------------------------------------------------------------- a run's numbers
def _summary(rec: RunRecord) -> dict:
    """The run folder's summary.json (local runs), else {}."""
    from ...training.runs.results import read_summary

    return (read_summary(Path(rec.run)) or {}) if rec.run and Path(rec.run).is_dir() else {}


def _trial_attrs(rec: RunRecord, study) -> dict:
    if study is None or rec.trial is None:
        return {}
    try:
        return dict(study.trials[rec.trial].user_attrs)
    except (IndexError, AttributeError):
        return {}


def run_value(rec: RunRecord, key: str, study=None) -> float | None:
    """``key`` (``test_bleu``, ``tokens_per_s``) of a run: the record's own field, else its summary.json, else the
    trial's user attributes; None for a run read at an earlier budget than its folder holds (those values are
    of the later one)."""
    v = getattr(rec, key, None)
    if v is None and not rec.later_attempt:
        v = _summary(rec).get(key)
        if v is None:
            v = _trial_attrs(rec, study).get(key)
    return float(v) if finite(v) else None


def train_seconds(rec: RunRecord, study=None) -> float | None:
    """The run's training wall time: fitting, validations included, the closing decoding of dev and test not
    (summary.json's ``train_time_s``), else its whole wall time."""
    return run_value(rec, "train_time_s", study) or rec.wall_time_s


def run_flops(rec: RunRecord) -> float | None:
    """Training FLOPs of a run: its steps x its FLOPs per step."""
    f, _ = step_flops(rec)
    steps = rec.steps or max((h["step"] for h in rec.history), default=None)
    return f * steps if f and steps else None


def _curve(rec: RunRecord, key: str) -> dict[int, float]:
    return {int(h["step"]): float(h[key]) for h in rec.history if finite(h.get(key))}


# ------------------------------------------------------------------------------------------ the table
@dataclass
class Table2:
    """Table 2 at small scale (:func:`build_table2`); a table built by hand may leave out what it does not show."""
    sweep: str = ""                                       # the sweep's name
    rows: list[Row] = field(default_factory=list)          # ours, one a variant, in the sweep's order
    paper: list[dict] = field(default_factory=list)        # the paper's rows (:func:`paper_rows`)
    claims: list[str] = field(default_factory=list)        # the claim checked, a line a pair (:func:`.claims`)
    paper_claim: str = ""                                  # the paper's claim (:func:`paper_claim`)
    metric: str = "ppl"                                    # the curves the claims read: "bleu" or "ppl"
    notes: list[str] = field(default_factory=list)         # what building the table and reading the runs noted
    source: str = ""                                       # where the runs were read from
    bleu_signatures: list[str] = field(default_factory=list)   # the sacreBLEU signatures of the runs' BLEU
    pipeline_check: bool = False                           # the runs are a pipeline check: numbers say nothing


def build_table2(data: ReportData) -> Table2:
    """Table 2 of the sweep's runs (the module docstring)."""
    sweep = data.sweep
    archs = planned_archs(sweep)
    by_variant: dict[str, list[RunRecord]] = {}
    for r in data.records:
        by_variant.setdefault(r.variant, []).append(as_shown(r))
    rows, measured = [], True
    variants = ordered_variants(sweep, data.records)
    fits = learning_curves(data, variants, by_variant)  # each run's dev-PPL curve, as Table 3's verdict reads them
    for v in variants:
        recs = by_variant.get(v, [])
        done = [r for r in recs if r.completed]
        seeds = list((sweep.variants or {}).get(v, {}).get("seeds") or sweep.seeds)
        row = Row(v, arch=next((arch_of(r.config) for r in recs if r.config), archs.get(v, DEFAULT_ARCH)),
                  status=row_status(v, recs, seeds), seeds_completed=len(done), seeds_total=max(len(seeds), len(recs)),
                  params=next((r.params for r in recs if r.params is not None), None),
                  beam_size=next((r.config.get("decode.beam_size") for r in done if r.config), None),
                  runs=fits.runs.get(v, []), warmup=fits.warmup.get(v, 0))
        values = {"test_bleu": [run_value(r, "test_bleu", data.study) for r in done],
                  "dev_bleu": [r.dev_bleu for r in done], "dev_ppl": [r.dev_ppl for r in done],
                  "train_flops": [run_flops(r) for r in done],
                  "train_time_s": [train_seconds(r, data.study) for r in done],
                  "tokens_per_s": [run_value(r, "tokens_per_s", data.study)
                                   or (r.train_tokens / t if r.train_tokens and (t := train_seconds(r)) else None)
                                   for r in done]}
        for key, vals in values.items():
            mean, sd = mean_std([x for x in vals if finite(x)])
            setattr(row, key, mean)
            setattr(row, f"{key}_std", sd)
        per_step = [step_flops(r) for r in done]
        fs = [f for f, _ in per_step if f]
        measured = measured and all(m for f, m in per_step if f)
        row.flops_per_step = sum(fs) / len(fs) if fs else None
        rates = [t / r.steps for r in done if (t := train_seconds(r, data.study)) and r.steps]
        row.s_per_step = sum(rates) / len(rates) if rates else None
        row.curves = {m: _mean_curve([_curve(r, key) for r in done]) for m, key in CURVES.items()}
        row.bleu_every, row.bleu_subset = next(((r.config.get("decode.dev_bleu_every_steps"),
                                                       r.config.get("decode.dev_bleu_subset"))
                                                      for r in done if r.config), (None, None))
        rows.append(row)
    for t, o in pairs(rows):
        if o.against is None:  # a row's columns: its pair with the first transformer row
            o.against, (o.bleu_noise, o.bleu_settle_seeds, o.bleu_settle_steps) = t.variant, pair_settle(t, o,
                                                                                                       sweep.report)
    metric = "bleu" if any_bleu_curves(rows) else "ppl"
    claims = claim_lines(rows, settings=sweep.report)
    notes = []
    if not measured:
        notes.append("Some runs' prepared corpus was not readable here: their FLOPs per step use `ltfm bench`'s "
                     "default sentence lengths.")
    signatures = sorted({r.bleu_signature for r in data.records if r.bleu_signature})
    return Table2(sweep=sweep.name, rows=rows, paper=paper_rows(), claims=claims, metric=metric,
                  paper_claim=paper_claim(), notes=notes + list(data.notes), source=data.source,
                  bleu_signatures=signatures, pipeline_check=is_pipeline_check(data.records))


def _mean_curve(curves: list[dict[int, float]]) -> dict[int, tuple[float, float, float]]:
    """{step: (mean, min, max)} over the seeds' curves, at the steps every one has."""
    curves = [c for c in curves if c]
    if not curves:
        return {}
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return {s: (sum(c[s] for c in curves) / len(curves), min(c[s] for c in curves), max(c[s] for c in curves))
            for s in steps}


# ------------------------------------------------------------------------------------------ the paper
def paper_rows() -> list[dict]:
    paper = load_paper2()
    return [paper[name] for name in PAPER2_SHOWN if name in paper]


def paper_claim() -> str:
    """The paper's claim in its own numbers: the Transformer (base)'s BLEU and training cost against each shown
    recurrent and convolutional row."""
    paper = load_paper2()
    base = paper["Transformer (base model)"]
    others = [p for name in PAPER2_SHOWN if (p := paper.get(name)) and p["family"] != "transformer"]
    parts = [f"{p['model']} {p['bleu_en_de']:g} at {p['train_flops_en_de']:.2g} "
             f"({p['train_flops_en_de'] / base['train_flops_en_de']:.1f}x the base's FLOPs)"
             for p in others if p["bleu_en_de"] and p["train_flops_en_de"]]
    return (f"The paper (WMT 2014 EN-DE, newstest2014): Transformer (base model) {base['bleu_en_de']:g} BLEU at "
            f"{base['train_flops_en_de']:.2g} training FLOPs, against " + ", ".join(parts) + ".")


# ------------------------------------------------------------------------------------------ the views
def title(table: Table2) -> str:
    head = "Pipeline check, not a result: " if table.pipeline_check else ""
    return f"# {head}Table 2 at small scale: sweep {md_text(table.sweep)}"


def claims_markdown(table: Table2) -> str:
    lines = ["## The claim checked", ""] + [f"- {ln}" for ln in table.claims + [table.paper_claim]]
    return "\n".join(lines) + "\n"


def rows_markdown(table: Table2) -> str:
    beams = sorted({r.beam_size for r in table.rows if r.beam_size is not None})
    beam = f" (beam {', '.join(map(str, beams))})" if beams else ""
    shown = [c.shown[ROWS] for c in columns(ROWS)]
    lines = ["## Ours", "", f"Each row: mean ± sample sd over its completed seeds; test BLEU: the runs' closing beam "
             f"search{beam}; training FLOPs = steps x the architecture's FLOPs per step.", "",
             "| " + " | ".join(s.title for s in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(s.cell(r, table) for s in shown) + " |" for r in table.rows]
    return "\n".join(lines) + "\n"


def paper_markdown(table: Table2) -> str:
    lines = ["## The paper's Table 2 (not comparable to ours)", "",
             "WMT 2014 English-German (newstest2014), trained on GPUs at the paper's scale: other data, other "
             "sizes, other budgets. Beside ours for the direction of the claim only.", "",
             "| model | family | BLEU EN-DE | training FLOPs EN-DE |", "|---|---|---|---|"]
    lines += [f"| {p['model']} | {p['family']} | {p['bleu_en_de']:g} | {p['train_flops_en_de']:.2g} |"
              for p in table.paper]
    return "\n".join(lines) + "\n"


def notes_markdown(table: Table2) -> str:
    lines = ["Training FLOPs per step: each architecture's own count (`train_flops_per_token` of its class, "
             "`ltfm bench`'s) at the run's vocabulary, token budget a step and the prepared corpus's mean sentence "
             "lengths; a row's training FLOPs: its steps x that.",
             "Training wall time: fitting, validations included, the closing decoding of dev and test not "
             "(summary.json's train_time_s; else the run's whole wall time); at a validation step: that x step / "
             "steps (a constant rate). Train tokens/s: target tokens over that time.",
             f"The claim's seed noise: {PAIR_NOISE_RULE}; equal budgets: within {100 * EQUAL_TOLERANCE:.0f}% of the "
             "larger."]
    if any(r.bleu_settle_seeds for r in table.rows):
        lines.append(SETTLE_NOTE)
    lines += [bleu_curves_note(table.rows)]
    lines += [f"BLEU: sacreBLEU {md_code(s)}." for s in table.bleu_signatures]
    lines += [f"Source: {md_text(table.source)}."] + [md_text(n) for n in table.notes]
    return "\n".join(["## Notes", "", *[f"- {ln}" for ln in lines]]) + "\n"


def bleu_curves_note(rows: list[dict]) -> str:
    """What the dev-BLEU curves are, per row (the first ``decode.dev_bleu_subset`` dev sentences every
    ``decode.dev_bleu_every_steps`` steps), or that there are none; the table's dev BLEU is the whole set's."""
    have = [r for r in rows if has_bleu_curve(r)]
    if not have:
        return ("Dev BLEU curves: none (decode.dev_bleu_every_steps is 0, or fewer than two validations logged "
                "one): claim (b) reads the dev-PPL curves. The table's dev BLEU: the whole dev set at the end.")
    parts = [f"{md_text(r.variant)} every {r.bleu_every} steps on the first {r.bleu_subset or 'all'} "
             f"dev sentences" for r in have]
    missing = [md_text(r.variant) for r in rows if r.seeds_completed and not has_bleu_curve(r)]
    return ("Dev BLEU curves (claim (b), the figure): beam search BLEU along training, " + "; ".join(parts)
            + (f"; none for {', '.join(missing)}" if missing else "")
            + ". The table's dev BLEU: the whole dev set at the end.")


def table2_markdown(table: Table2) -> str:
    return "\n".join([title(table) + "\n", claims_markdown(table), rows_markdown(table), paper_markdown(table),
                      "![Dev curves against training FLOPs and wall time](table2_curves.png)\n",
                      "![Cross-attention of the first dev sentences, each architecture's](table2_alignment.png)\n",
                      notes_markdown(table)])


def csv_rows(table: Table2) -> list[Row]:
    """The rows of table2.csv, ours then the paper's: also the W&B table of the report's run
    (:mod:`.publish.wandb_run`)."""
    return table.rows + [Row(p["model"], "paper", p["family"], test_bleu=p["bleu_en_de"],
                                train_flops=p["train_flops_en_de"], status="paper: WMT 2014 EN-DE, not comparable")
                            for p in table.paper]


def table2_csv(table: Table2) -> str:
    """table2.csv: the columns of :data:`~.columns.CSV`, floats as Python prints them."""
    cols = columns(CSV)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in cols])
    w.writerows([[c.csv_text(r, None) for c in cols] for r in csv_rows(table)])
    return buf.getvalue()


def summary_numbers(table: Table2) -> dict:
    """The W&B summary of the report's run: ``<row>/<key>`` for each of our rows' columns of :data:`SUMMARY`
    (where known), the claim's lines (``claims``) and whether every row logged a dev-BLEU curve
    (``bleu_curves``: claim (b) read on them)."""
    out = {f"{r.variant}/{c.key}": c.of(r) for r in table.rows for c in columns(SUMMARY)
           if c.of(r) is not None}
    return {**out, "claims": "\n".join(table.claims), "bleu_curves": table.metric == "bleu"}


def note_parts(table: Table2) -> list[str]:
    """The optuna-dashboard note's markdown (:mod:`.publish.optuna_note`): the title, the claim and our rows, as
    table2.md has them."""
    return [title(table), claims_markdown(table), rows_markdown(table)]


def read_claims(markdown: str | Path) -> list[str]:
    """The claim's lines of a written table2.md (what ``ltfm report`` prints), without their markdown bullets."""
    lines = Path(markdown).read_text(encoding="utf-8").split("\n## ")[1].splitlines()
    return [ln[2:] for ln in lines if ln.startswith("- ")] if lines and lines[0] == "The claim checked" else []


def write_table2(table: Table2, out_dir: str | Path) -> tuple[Path, Path]:
    """table2.md and table2.csv."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_text(out / "table2.md", table2_markdown(table)), write_text(out / "table2.csv", table2_csv(table))


def plot_curves(table: Table2, path: str | Path, formats=("png",)) -> str:
    """Dev PPL (and dev BLEU when logged) against training FLOPs and against wall time: one line per row (the
    mean over its seeds), the seeds' range shaded."""
    from ..core.plots import mark_pipeline_check, new_figure, save_figure

    metrics = ["ppl"] + (["bleu"] if any(len(r.curves["bleu"]) >= 2 for r in table.rows) else [])
    fig, axes = new_figure(len(metrics), 2, 11, 4.2 * len(metrics))
    for i, metric in enumerate(metrics):
        for j, (xkey, xlabel) in enumerate((("flops_per_step", "training FLOPs"),
                                            ("s_per_step", "training wall time (s)"))):
            ax = axes[i][j]
            for k, r in enumerate(table.rows):
                curve, scale = r.curves[metric], getattr(r, xkey)
                if not curve or not scale:
                    continue
                steps = sorted(curve)
                xs = [s * scale for s in steps]
                ax.plot(xs, [curve[s][0] for s in steps], marker=".", color=f"C{k % 10}",
                        label=f"{r.variant} ({r.arch})")
                if r.seeds_completed > 1:
                    ax.fill_between(xs, [curve[s][1] for s in steps], [curve[s][2] for s in steps],
                                    color=f"C{k % 10}", alpha=0.2, linewidth=0)
            if ax.lines:
                ax.legend(fontsize=7)
                if metric == "ppl":
                    ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("dev BLEU (higher is better)" if metric == "bleu" else "dev perplexity (log scale)")
            ax.grid(True, alpha=0.3)
    fig.suptitle(f"Dev curves against training compute and wall time; sweep {table.sweep}", fontsize=10)
    mark_pipeline_check(fig, bool(table.pipeline_check))
    return save_figure(fig, path, formats)
