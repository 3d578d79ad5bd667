"""The verdict's back-test: how often a row called *holds* (:mod:`.verdict`) kept its sign at a later budget,
measured on curves whose later part is known.

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

For each row (:func:`backtest`): the verdict at the earlier budget (the change and its seed noise there, the
predicted gap with its interval), the measured gap (mean log PPL of the row's seeds minus the base's, at the later
steps), whether it kept the sign of the earlier change, whether it fell inside the interval, and whether the
change is beyond seed noise at the later budget too (``noise_later``). In all:
``beyond_noise`` (rows beyond seed noise at the earlier budget), ``called_holds``, ``kept_sign`` (of the rows
called holds) and ``interval_coverage`` (the share of the predicted rows whose measured gap is inside the
interval). ``--json`` prints these and ``rows``; nothing is written unless ``--out FILE.json`` is given (then the
JSON, the printed table as ``.md`` and a figure of every row's curves as ``.png``, :func:`~.figures.plot_outlook`,
under that name).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..base.errors import UserError
from ..findings.curves import SIGN_LEVEL, extrapolation_score, sign_score
from .table3.stats import mean_std, noise_verdict, relative
from .table3.verdict import HOLDS, TOO_FEW, change, curve_verdict, last_step, settings_of

KEYS = ("beyond_noise", "called_holds", "kept_sign", "interval_coverage", "level", "sign_level", "rows")


def _curves(data) -> dict:
    from .table3.table import learning_curves, ordered_variants

    return learning_curves(data, ordered_variants(data.sweep, data.records))


def cut_runs(runs: list[dict[int, float]], fraction: float) -> list[dict[int, float]]:
    """The runs' validations in the first ``fraction`` of the side's budget (the module docstring)."""
    end = last_step(runs)
    if end is None:
        return []
    cut = fraction * (end + 1) - 1 + 1e-9 * (end + 1)  # a hair: 2/3 of 600 keeps step 399 whatever the rounding
    return [{s: p for s, p in r.items() if s <= cut} for r in runs]


def at_budget(curves: dict, updates: int, sweep=None) -> dict:
    """The curves read as if each run's budget were ``updates`` updates (a row the sweep file trains ``b`` times
    the steps, such as big, at ``b`` times that, as the table compares it): the validations at steps < each side's
    budget."""
    variants = getattr(sweep, "variants", None) or {}
    factor = {v: float((variants.get(v) or {}).get("budget") or 1.0) for v in curves["runs"]}
    return {**curves, "runs": {v: [{s: p for s, p in r.items() if s < round(factor[v] * updates)} for r in runs]
                               for v, runs in curves["runs"].items()}}


def _check_budget(curves: dict, updates: int) -> None:
    """Every side keeps its last validation at the earlier budget ``updates`` (else it cannot be read there)."""
    short = [v for v, runs in curves["runs"].items() if any(r and max(r) < 0.9 * updates - 1 for r in runs)
             or not any(runs)]
    if "base" in short or not curves["runs"].get("base"):
        raise UserError(f"--backtest-budget {updates}: the base's runs have no validation near step {updates - 1}: "
                        "give the budget of a validation they made (e.g. 600 for runs validated every 50)")


def _at(runs: list[dict[int, float]], step: int | None) -> list[float]:
    """The runs' dev PPL at ``step``, those that are numbers a log takes."""
    return [r[step] for r in runs if step in r and math.isfinite(r[step]) and r[step] > 0]


def today(row_runs, base_runs) -> dict:
    """The change at the earlier budget, as the table reads it: each side's mean dev PPL at its last validation,
    the row's minus the base's, and its seed noise (the base's seeds' spread there); ``delta`` and ``noise`` None
    when a side has no validation (a curve cut before its first)."""
    row_end, base_end = last_step(row_runs), last_step(base_runs)
    row_mean, _ = mean_std(_at(row_runs, row_end))
    base_mean, base_sd = mean_std(_at(base_runs, base_end))
    if row_mean is None or base_mean is None:
        return {"step": row_end, "base_step": base_end, "delta": None, "delta_rel": None, "noise": None}
    delta = row_mean - base_mean
    return {"step": row_end, "base_step": base_end, "delta": delta, "delta_rel": relative(delta, base_mean),
            "noise": noise_verdict(delta, base_sd)}


def measured_gap(row_runs, base_runs, step: int, base_step: int) -> float | None:
    """Mean log PPL of the row's runs at ``step`` minus the base's at ``base_step`` (None where a side lacks it)."""
    row, base = _at(row_runs, step), _at(base_runs, base_step)
    if not row or not base:
        return None
    return sum(map(math.log, row)) / len(row) - sum(map(math.log, base)) / len(base)


def _r(x: float | None) -> float | None:
    """Rounded to 4 decimals; None where there is no number (a relative change beyond a float's range included)."""
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


def backtest(earlier: dict, later: dict, settings: dict | None = None) -> tuple[dict, dict]:
    """The back-test of ``earlier`` curves against ``later`` ones (each :func:`~.table.learning_curves`' shape:
    ``runs`` and ``warmup`` per variant): each row the later curves have (the base among them), predicted at the
    later budget of each side. Returns (the result: :data:`KEYS`, the rows' predictions as the table's
    ``outlook`` for :func:`~.figures.plot_outlook`)."""
    runs, later_runs, warmup = earlier["runs"], later["runs"], earlier.get("warmup") or {}
    base, later_base = runs.get("base") or [], later_runs.get("base") or []
    rows, outlook = [], {}
    for v in runs:
        if v == "base" or not later_runs.get(v):
            continue
        now = today(runs[v], base)
        at = (last_step(later_runs[v]), last_step(later_base))
        verdict = curve_verdict(runs[v], base, now["delta"], now["noise"], settings, at=at,
                                warmup=warmup.get(v) or 0, base_warmup=warmup.get("base") or 0) or {
            "verdict": TOO_FEW, "why": "no validation in the earlier budget", "gap": None}  # a curve cut to none
        outlook[v] = verdict
        gap = verdict["gap"]
        measured = measured_gap(later_runs[v], later_base, *at)
        then = today(later_runs[v], later_base)  # the change at the later budget, as that table reads it
        sign = None if now["delta"] is None else (now["delta"] > 0) - (now["delta"] < 0)
        settle = verdict.get("settle")
        rows.append({"variant": v, "step": now["step"], "base_step": now["base_step"],
                     "change": _r(now["delta_rel"]), "noise": now["noise"], "verdict": verdict["verdict"],
                     "at_step": at[0], "at_base_step": at[1],
                     "predicted": _r(gap and change(gap["point"])), "low": _r(gap and change(gap["low"])),
                     "high": _r(gap and change(gap["high"])),
                     "measured": _r(None if measured is None else change(measured)),
                     "noise_later": then["noise"],
                     "sign_kept": None if measured is None or sign is None else (measured > 0) - (measured < 0) == sign,
                     "inside": None if gap is None or measured is None else gap["low"] <= measured <= gap["high"],
                     "width": _r(gap and change(gap["high"]) - change(gap["low"])),
                     "score": None if gap is None or measured is None or gap["k"] <= 1 else _r(extrapolation_score(
                         gap["point"], gap["boot_low"], gap["boot_high"], measured, gap["k"])),
                     "settle": settle and {"kind": settle["kind"], "k": _r(settle["k"]), "step": settle["step"],
                                           "sign": settle["sign"]},
                     "bound": _r(gap and sign and change(gap["point"] - sign * gap["sign_margin"])),
                     "sign_score": None if gap is None or measured is None or not sign or gap["k"] <= 1 else _r(
                         sign_score(gap["now"], gap["noise_sd"], gap["point"], measured, gap["k"])),
                     "log": gap and {"now": _r(gap["now"]), "noise_sd": _r(gap["noise_sd"]), "point": _r(gap["point"]),
                                     "boot_low": _r(gap["boot_low"]), "boot_high": _r(gap["boot_high"]),
                                     "k": _r(gap["k"]), "measured": _r(measured)}})
    holds = [r for r in rows if r["verdict"] == HOLDS]
    predicted = [r for r in rows if r["inside"] is not None]
    result = {"beyond_noise": sum(1 for r in rows if r["noise"] == "beyond"), "called_holds": len(holds),
              "kept_sign": sum(1 for r in holds if r["sign_kept"]),
              "interval_coverage": _r(sum(r["inside"] for r in predicted) / len(predicted)) if predicted else None,
              "level": settings_of(settings)["level"], "sign_level": SIGN_LEVEL, "rows": rows}
    return result, outlook


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
def _later_export(sweep, path: str, option: str = "--backtest-to") -> "object":
    """The ReportData of the later export ``path`` (a folder holding one export, or its JSON file), read with its
    own sweep file from beside ``sweep``'s (``option``: the option that named it, for the errors)."""
    from ..sweep import load_sweep
    from .inputs.export import read_export

    p = Path(path)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p] if p.is_file() else []
    if len(files) != 1:
        what = "several JSON files" if files else "no export"
        raise UserError(f"{option} {path!r}: {what} there; give the export/ folder of a sweep's report "
                        "(one JSON file), or its JSON file")
    try:
        tree = json.loads(files[0].read_text(encoding="utf-8"))
        name, sweep_file = tree["sweep"], tree["sweep_file"]
        if not isinstance(name, str) or not isinstance(sweep_file, str):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        raise UserError(f"{option} {str(files[0])!r} is not a report export: give the export/ folder an "
                        "`ltfm report` wrote for the later sweep") from None
    beside = sweep.path.parent / Path(sweep_file).name
    if not beside.is_file():
        raise UserError(f"{option} {path!r}: the export is of sweep {name!r}, whose file {beside.name} is not "
                        f"beside {sweep.path.name}: put it there")
    later_sweep = load_sweep(beside)
    if later_sweep.name != name:
        raise UserError(f"{option} {path!r}: the export is of sweep {name!r}, but {beside} names sweep "
                        f"{later_sweep.name!r}: give the sweep file the export was written for")
    return read_export(later_sweep, files[0], option)


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


def _check_later(earlier, later, path: str, curves: dict, later_curves: dict) -> None:
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
    if not later_curves["runs"].get("base"):
        raise UserError(f"{where} has no completed base run: give the export of a sweep that trained this sweep's "
                        "base on too")
    early = [f"{v} (step {last_step(runs)}, here {last_step(curves['runs'][v])})"
             for v, runs in later_curves["runs"].items()
             if curves["runs"].get(v) and last_step(runs) <= last_step(curves["runs"][v])]
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
    from .inputs.export import read_export

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
    if not curves["runs"].get("base"):
        raise UserError(f"--from-export {args.from_export!r}: no completed base run: nothing to predict a gap to")
    if args.backtest is not None:
        if args.backtest_budget is not None:
            curves = at_budget(curves, args.backtest_budget, sweep)
            _check_budget(curves, args.backtest_budget)
        later = curves
        cut = {"runs": {v: cut_runs(r, args.backtest) for v, r in curves["runs"].items()},
               "warmup": curves["warmup"]}
        _check_cut(curves["runs"]["base"], cut["runs"]["base"], args.backtest)
        title = (f"Back-test of sweep {sweep.name}: the first {args.backtest:g} of each row's curve predicts its "
                 "budget's end")
        earlier_curves = cut
    else:
        data = _later_export(sweep, args.backtest_to)
        later = _curves(data)
        _check_later(earlier, data, args.backtest_to, curves, later)
        title = (f"Back-test of sweep {sweep.name}: its budget predicts sweep {data.sweep.name}'s "
                 f"(the {len([v for v in later['runs'] if v != 'base'])} rows it continued)")
        earlier_curves = curves
    result, outlook = backtest(earlier_curves, later, sweep.report)
    text = backtest_text(result, title)
    if out is not None:
        from ..base.atomic import write_text
        from .views.figures import plot_outlook

        out.parent.mkdir(parents=True, exist_ok=True)
        table = {"sweep": sweep.name, "outlook": outlook, "curves": earlier_curves, "report_settings": sweep.report}
        plot_outlook(table, out.with_suffix(".png"), later=later, title=title)
        write_text(out.with_suffix(".md"), text)
        write_text(out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if args.json else text, end="\n" if args.json else "")
    return 0
