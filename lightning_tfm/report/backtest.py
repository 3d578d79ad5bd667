"""``ltfm report --backtest``: the verdict's back-test (:mod:`lightning_tfm.findings.backtest`: how often a row
called *holds* kept its sign at a later budget, measured on curves whose later part is known) on a report's export.

``ltfm report SWEEP --from-export DIR`` and one of:

- ``--backtest FRACTION``: every row's curves cut to the first ``FRACTION`` of its budget ``T`` (its last
  validation; the steps ``<= FRACTION * (T + 1) - 1``: 2/3 of 600 updates keeps the steps up to 399) predict the
  gap at ``T`` (``k = (T + 1) / (cut + 1)``), each row at its own budget as the table reads it (big's 1,800 steps
  against the base's 600: :mod:`.budget`);
- ``--backtest-to LATER_DIR``: the export of a sweep that trained this sweep's runs on (the same run folders, such
  as ``sweeps/table3-cpu-continued.yaml``) is the later budget: this export's curves predict each row the later one
  has at its budget. Its sweep file (the export names it) is read from beside ``SWEEP``. Each of its completed runs
  must be one of this export's (the same row, seed, run folder and config but for the budget) and each row's last
  validation later than here, the base's among them: else a one-line error naming the rows (:func:`_check_later`).
  ``--backtest`` refuses a fraction before the base's first validation the same way; a row cut to no validation
  is *too few points*.

Each row's verdict at the earlier budget, the gap measured at the later one and the totals are the findings'
(:func:`lightning_tfm.findings.backtest.backtest`); here: the exports read, the budgets chosen, and the result printed
(:func:`backtest_text`), written and drawn. ``--json`` prints these and ``rows``; nothing is written unless ``--out
FILE.json`` is given (then the JSON, the printed table as ``.md`` and a figure of every row's curves as ``.png``,
:func:`~.figures.verdicts_figure`, under that name).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from ..base.errors import UserError
from ..findings.backtest import backtest, cut_runs
from ..findings.verdict import HOLDS, last_step


def _curves(data):
    from .table3.table import learning_curves, ordered_variants

    return learning_curves(data, ordered_variants(data.sweep, data.records))


def at_budget(curves, updates: int, sweep=None):
    """The curves read as if each run's budget were ``updates`` updates (a row the sweep file trains ``b`` times
    the steps, such as big, at ``b`` times that, as the table compares it): the validations at steps < each side's
    budget."""
    variants = getattr(sweep, "variants", None) or {}
    factor = {v: float((variants.get(v) or {}).get("budget") or 1.0) for v in curves.runs}
    return dataclasses.replace(curves, runs={v: [{s: p for s, p in r.items() if s < round(factor[v] * updates)}
                                                 for r in runs] for v, runs in curves.runs.items()})


def _check_budget(curves, updates: int) -> None:
    """Every side keeps its last validation at the earlier budget ``updates`` (else it cannot be read there)."""
    short = [v for v, runs in curves.runs.items() if any(r and max(r) < 0.9 * updates - 1 for r in runs)
             or not any(runs)]
    if "base" in short or not curves.runs.get("base"):
        raise UserError(f"--backtest-budget {updates}: the base's runs have no validation near step {updates - 1}: "
                        "give the budget of a validation they made (e.g. 600 for runs validated every 50)")


NOISE_WORDS = {"beyond": "yes", "within": "no", "unknown": "unknown"}


def _share(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "0/0"


def _yes(x) -> str:
    return "" if x is None else "yes" if x else "no"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


def backtest_text(result: dict, title: str) -> str:
    """The back-test as a markdown table and its totals (what the command prints)."""
    lines = [title, "", "| row | change then | verdict then | predicted at the later budget [interval] | measured "
             "| sign kept | inside | beyond noise later |", "|---|--:|---|--:|--:|---|---|---|"]
    for r in result["rows"]:
        pred = "" if r["predicted"] is None else (f"{_pct(r['predicted'])} [{_pct(r['low'])}, {_pct(r['high'])}] at "
                                                  f"{r['at_step'] + 1}")
        then = "" if r["step"] is None else f"{_pct(r['change'])} at {r['step'] + 1}"
        lines.append(f"| {r['variant']} | {then} | {r['verdict']} | {pred} | "
                     f"{_pct(r['measured'])} | {_yes(r['sign_kept'])} | {_yes(r['inside'])} | "
                     f"{NOISE_WORDS.get(r['noise_later'], '')} |")
    n_pred = sum(1 for r in result["rows"] if r["inside"] is not None)
    inside = sum(1 for r in result["rows"] if r["inside"])
    holds = [r for r in result["rows"] if r["verdict"] == HOLDS]
    still = sum(1 for r in holds if r["noise_later"] == "beyond")
    lines += ["", f"- beyond noise at the earlier budget: {result['beyond_noise']} of {len(result['rows'])} rows",
              f"- called holds: {_share(result['called_holds'], result['beyond_noise'])} of those beyond noise "
              "(target: at least 2/3)",
              f"- kept their sign: {_share(result['kept_sign'], result['called_holds'])} of the rows called holds "
              f"(target: at least 95%; the direction's one-sided bound at {100 * result['sign_level']:g}%); still "
              f"beyond seed noise at the later budget: {_share(still, len(holds))}",
              f"- interval coverage: {_share(inside, n_pred)} of the predicted rows' measured gaps inside their "
              f"{100 * result['level']:g}% interval (target: within 10 points of it)"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the command
def _listed(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def _differs(a: dict, b: dict) -> list[str]:
    """The config keys two runs differ in, those that do not change what is trained aside (the run id's
    ``NOT_HASHED``: the budget, the study, the results folder, ...); a key one export lacks (written before the key
    existed) is at its default there, as the run id has it (training/config/run_id.py)."""
    from ..training.config.config import NOT_HASHED, SCHEMA
    from ..training.config.run_id import KEYS_V1

    def default(k: str):
        sec, _, name = k.partition(".")
        return SCHEMA[sec][name][1] if sec in SCHEMA and name in SCHEMA[sec] else KEYS_V1.get(k)

    keys = {k for k in set(a) | set(b) if k not in NOT_HASHED and k.split(".")[0] not in NOT_HASHED}
    return sorted(k for k in keys if a.get(k, default(k)) != b.get(k, default(k)))


def _check_later(earlier, later, path: str, curves, later_curves) -> None:
    """The later export is this one's rows continued: a run folder in common; each of its completed runs a run of
    this export (the same row and seed, the same run folder, the same config but for the keys of
    :func:`_differs`), the base among them; and each row's budget (its last validation) later than here."""
    ours = {r.run for r in earlier.records if r.run}
    theirs = {r.run for r in later.records if r.run}
    where = f"--backtest-to {path!r}: sweep {later.sweep.name!r}"
    if not ours & theirs:
        raise UserError(f"{where} has no run folder in common with {earlier.sweep.name!r}: give the export of a sweep "
                        "that trained this sweep's runs on (the same rows at a larger train.max_steps)")
    mine = {(r.variant, r.seed): r for r in earlier.records}
    odd = []
    for r in later.records:
        if not r.completed:
            continue
        name, other = f"{r.variant} seed {r.seed}", mine.get((r.variant, r.seed))
        keys = [] if other is None else _differs(other.config or {}, r.config or {})
        if other is None:
            odd.append(f"{name} (not in this export)")
        elif r.run and other.run and r.run != other.run:
            odd.append(f"{name} (run {r.run}, here {other.run})")
        elif keys:
            shown = [f"{k} {r.config.get(k)!r}, here {other.config.get(k)!r}" for k in keys[:2]]
            odd.append(f"{name} ({', '.join(shown)}{', ...' if len(keys) > 2 else ''})")
    if odd:
        raise UserError(f"{where} is not this export's rows continued: {_listed(odd)}; give the export of a sweep that "
                        "trained these runs on (the same rows and seeds, only train.max_steps larger)")
    if not later_curves.runs.get("base"):
        raise UserError(f"{where} has no completed base run: give the export of a sweep that trained this sweep's "
                        "base on too")
    early = [f"{v} (step {last_step(runs)}, here {last_step(curves.runs[v])})"
             for v, runs in later_curves.runs.items()
             if curves.runs.get(v) and last_step(runs) <= last_step(curves.runs[v])]
    if early:
        raise UserError(f"{where}: its budget is not later than this export's: {_listed(early)} end no later; give "
                        "the export of the longer budget")


def _check_cut(base: list[dict[int, float]], cut: list[dict[int, float]], fraction: float) -> None:
    """The base keeps a validation in the first ``fraction`` of its budget (else no row has a change to judge)."""
    if last_step(cut) is not None:
        return
    end, first = last_step(base), min(min(r) for r in base if r)
    least = math.ceil(1000 * (first + 1) / (end + 1)) / 1000
    if least >= 1:
        raise UserError(f"--backtest {fraction:g}: the base's runs have no validation before their last (step {end}): "
                        "nothing earlier predicts it; give the export of runs that validated along the way "
                        "(train.val_every_steps)")
    raise UserError(f"--backtest {fraction:g}: the first {fraction:g} of the base's budget ({end + 1} updates) holds "
                    f"none of its validations (the first is at step {first}): give a fraction of at least {least:g}, "
                    "e.g. 0.667")


def backtest_cli(args, sweep) -> int:
    """``ltfm report SWEEP --from-export DIR --backtest FRACTION | --backtest-to LATER_DIR [--json] [--out F]``."""
    from .inputs.export import read_export, read_export_beside

    if args.backtest is not None and args.backtest_to:
        raise UserError("--backtest and --backtest-to: give one (a fraction of this export's budget, or a later "
                        "export)")
    if not args.from_export:
        raise UserError("--backtest reads an export: give --from-export DIR (the export/ folder a report wrote)")
    if args.backtest is not None and not 0 < args.backtest < 1:
        raise UserError(f"--backtest {args.backtest:g}: the fraction of the budget the prediction reads must be "
                        "between 0 and 1 (exclusive), e.g. 0.667")
    out = None
    if args.out:
        out = Path(args.out)
        if out.suffix != ".json":
            raise UserError(f"--out {args.out!r}: a back-test writes FILE.json (and FILE.md, FILE.png beside it): "
                            "give a path ending in .json")
        from ..base.outputs import check_outputs
        from .inputs.export import owners
        export = Path(args.from_export)
        reads = [("the sweep file", sweep.path), ("--backtest-to", args.backtest_to),
                 ("the export --from-export names", export / f"{sweep.name}.json" if export.is_dir() else export)]
        # all three, before any reading: none an input, an export or a run's file
        check_outputs([out, out.with_suffix(".md"), out.with_suffix(".png")], reads=reads, owners=owners())
    earlier = read_export(sweep, args.from_export)
    curves = _curves(earlier)
    if not curves.runs.get("base"):
        raise UserError(f"--from-export {args.from_export!r}: no completed base run: nothing to predict a gap to")
    if args.backtest is not None:
        if args.backtest_budget is not None:
            curves = at_budget(curves, args.backtest_budget, sweep)
            _check_budget(curves, args.backtest_budget)
        later = curves
        cut = dataclasses.replace(curves, runs={v: cut_runs(r, args.backtest) for v, r in curves.runs.items()})
        _check_cut(curves.runs["base"], cut.runs["base"], args.backtest)
        title = (f"Back-test of sweep {sweep.name}: the first {args.backtest:g} of each row's curve predicts its "
                 "budget's end")
        earlier_curves = cut
    else:
        data = read_export_beside(sweep, args.backtest_to, "--backtest-to")
        later = _curves(data)
        _check_later(earlier, data, args.backtest_to, curves, later)
        title = (f"Back-test of sweep {sweep.name}: its budget predicts sweep {data.sweep.name}'s "
                 f"(the {len([v for v in later.runs if v != 'base'])} rows it continued)")
        earlier_curves = curves
    result, outlook = backtest(earlier_curves.runs, earlier_curves.warmup, later.runs, sweep.report)
    text = backtest_text(result, title)
    if out is not None:
        from ..base.atomic import write_text
        from .views.figures import verdicts_figure

        out.parent.mkdir(parents=True, exist_ok=True)
        verdicts_figure(outlook, earlier_curves, sweep.report, sweep.name, out.with_suffix(".png"), later=later,
                        title=title)
        write_text(out.with_suffix(".md"), text)
        write_text(out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if args.json else text, end="\n" if args.json else "")
    return 0
