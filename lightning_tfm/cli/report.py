"""``ltfm report``: regenerate a sweep's report (Table 3 beside the paper's) and, with ``--backtest``, the verdict's
back-test."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..base.command import Command, say_done
from ..base.errors import UserError
from .common import check_outputs


def _report_arguments(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("sweep_file", help="the sweep YAML the results belong to")
    rp.add_argument("--storage", metavar="URL", help="the sweep's Optuna storage (default: <results>/<sweep>.db)")
    rp.add_argument("--results", metavar="DIR", help="the results folder the runs are in (default: the "
                    "experiment's run.results_dir)")
    rp.add_argument("--out", metavar="DIR", help="where the report goes (default: reports/build/<sweep>/); "
                    "replaced only if an earlier report made it; a back-test's FILE.json (FILE.md and FILE.png "
                    "beside it; without --out it writes nothing)")
    rp.add_argument("--from-wandb", metavar="ENTITY/PROJECT", help="read the runs from W&B (group = sweep "
                    "name) instead of local run folders")
    rp.add_argument("--from-export", metavar="DIR", help="rebuild the report from the export an earlier report "
                    "wrote (its export/ folder, or the JSON file in it) instead of the runs")
    rp.add_argument("--against", metavar="SWEEP_B.yaml", help="compare with another sweep's Table 3 (or this "
                    "one's from other results): per row both changes, both verdicts, transfers / flips / "
                    "unsettled; written to reports/build/<A>-vs-<B>/")
    rp.add_argument("--against-results", metavar="DIR", help="with --against: the results folder of side B "
                    "(default: its experiment's run.results_dir)")
    rp.add_argument("--against-storage", metavar="URL", help="with --against: the Optuna storage of side B "
                    "(default: <its results>/<its sweep>.db)")
    rp.add_argument("--against-export", metavar="DIR", help="with --against: read side B from an export "
                    "instead of its results")
    rp.add_argument("--backtest", metavar="FRACTION", help="with --from-export: back-test the verdict: each row's "
                    "curves cut to the first FRACTION of its budget (0.667: steps <= 399 of 600) predict its end; "
                    "prints each row's verdict, predicted and measured gap, and the share that kept their sign")
    rp.add_argument("--backtest-budget", metavar="STEPS", help="with --backtest: read the export as if its budget "
                    "were STEPS updates (its validations after step STEPS - 1 left out), so that one long curve gives "
                    "a back-test at an earlier stage too (1,800-step runs with --backtest-budget 600 --backtest "
                    "0.334: steps <= 199 predict 599)")
    rp.add_argument("--backtest-to", metavar="LATER_DIR", help="with --from-export: back-test the verdict against the "
                    "export of a sweep that trained these runs on (its sweep file beside SWEEP): this export's "
                    "curves predict the later budget")
    rp.add_argument("--json", action="store_true", help="with --backtest or --backtest-to: print the result as JSON "
                    "(beyond_noise, called_holds, kept_sign, interval_coverage, rows)")
    rp.add_argument("--settle-replay", metavar="EXPORT_DIR", nargs="+", help="replay the settle loop offline on "
                    "committed exports (their runs stand for the trials it asks for; the first export holding a run "
                    "wins): each row's answer and what it took, against every row at the cap; --out FILE.md writes "
                    "it (lightning_tfm/report/settle_replay.py)")
    rp.add_argument("--settle-grid", action="store_true", help="with --settle-replay: also replay a grid of the "
                    "settle: settings (delta, alpha, seeds, base seeds, budget): the measured reason for the defaults")
    rp.add_argument("--formats", metavar="LIST", help="a Table 3 or Table 2 report's figure formats, comma-"
                    "separated, of png, svg, pdf (default: png): each figure is also written as .svg/.pdf beside "
                    "its .png, which the markdown and the HTML embed")


def report_cli(args) -> int:
    """``ltfm report SWEEP.yaml [--storage URL] [--results DIR] [--out DIR] [--from-wandb ENTITY/PROJECT]
    [--from-export DIR] [--against SWEEP_B.yaml [--against-results DIR] [--against-storage URL]
    [--against-export DIR]]``; with ``--backtest FRACTION`` or ``--backtest-to LATER_DIR`` the verdict's
    back-test (:mod:`.backtest`)."""
    from ..report.publish.notebooks import (
        check_out,
        check_sources,
        compare_cli,
        execute,
        notebook_name,
        notebook_path,
        report_parameters,
        stopped_by_signals,
    )
    from ..sweep import load_sweep

    sweep = load_sweep(args.sweep_file)
    if args.backtest_budget is not None and args.backtest is None:  # else the full report, the option unread
        raise UserError("--backtest-budget reads the export at an earlier budget for --backtest FRACTION: give "
                        "--backtest too, or drop --backtest-budget")
    if args.settle_replay:
        from ..report.settle_replay import settle_replay_cli
        return settle_replay_cli(args, sweep)
    if args.settle_grid:
        raise UserError("--settle-grid replays a grid of settings: give it with --settle-replay EXPORT_DIR ...")
    if args.backtest is not None or args.backtest_to:
        from ..report.backtest import backtest_cli
        return backtest_cli(_backtest_args(args), sweep)
    if args.json:
        raise UserError("--json prints a back-test: give it with --backtest FRACTION or --backtest-to LATER_DIR")
    check_sources(args)
    formats = _formats(args, sweep)
    if args.against:
        given = Path(args.out or Path("reports") / "build" / f"{sweep.name}-vs-{load_sweep(args.against).name}")
        check_outputs(folders=[given], reads=report_reads(args))
        check_report_out(given.absolute())
        code = compare_cli(args, sweep)
        if code == 0:
            _say_done(given, "compare")
        return code
    from ..report.publish.kinds import KINDS

    name = notebook_name(sweep)
    kind = KINDS.get(name)  # what the report gives the outside (None: a search report, its notebook alone)
    if args.from_export and not (kind and kind.exported):
        rebuilt = " or ".join(k.what for k in KINDS.values() if k.exported)
        raise UserError(f"--from-export rebuilds {rebuilt}, not {kind.what if kind else 'a search report'}: drop "
                        "--from-export and read the runs")
    out = Path(args.out or Path("reports") / "build" / sweep.name)
    check_outputs(folders=[out], reads=report_reads(args))
    out = out.absolute()
    check_report_out(out)
    check_out(out)
    parameters = report_parameters(sweep, args.results, args.storage, args.from_wandb, args.from_export)
    if kind:
        parameters["formats"] = list(formats)
        if not kind.exported:
            parameters.pop("export_dir")  # its notebook reads the runs only
    notebook = notebook_path(name)
    print(f"report of sweep {sweep.name}: executing {notebook.name}", flush=True)

    def published() -> int:  # the report folder is in place (its lock held): say so, then W&B and optuna-dashboard
        md, table = out / f"{name}.md", None
        if kind and kind.exported:  # the rows the notebook wrote its tables from, rebuilt from its export
            table = kind.build(None, sweep, out)  # (not parsed back)
            if kind.headline:
                print(kind.headline(table), end="")
        pngs = sorted(p.name for p in out.glob("*.png"))
        also = f" (each also as {', '.join(formats[1:])})" if len(formats) > 1 else ""
        print(f"report: {md}\n  html: {out / (name + '.html')}\n  notebook: {out / (name + '.ipynb')}\n"
              f"  csv: {out / (name + '.csv')}\n  figures: {', '.join(pngs)}{also}", flush=True)
        if (out / f"{name}.tex").exists():
            print(f"  latex: {out / (name + '.tex')} (pdflatex {name}-standalone.tex compiles it alone)")
        if kind and kind.exported:
            print(f"  export: {out / 'export' / (sweep.name + '.json')}")
        if kind and kind.exported and args.from_export:
            print("  W&B, optuna-dashboard: not published (a report rebuilt from an export)")
        elif kind:  # the same report in W&B and optuna-dashboard; a failure: a warning
            from ..report.publish.published import publish
            if kind.claims:
                print("".join(f"  {line}\n" for line in kind.claims(md)), end="", flush=True)
            for line in publish(sweep, parameters, out, table):
                print(line, flush=True)
        return 0

    with stopped_by_signals(out) as stopped:
        code = execute(notebook, parameters, out, name, then=published)
        if code == 0:
            from ..report.publish.published import dashboard_next
            study = dashboard_next(sweep, parameters) if kind else None
            _say_done(Path(args.out or Path("reports") / "build" / sweep.name), name, study)
        return code
    return stopped["code"]


def report_reads(args) -> list[tuple[str, str]]:
    """What ``ltfm report`` reads, as (its option, its path): no report folder is one of them or holds one
    (:func:`~lightning_tfm.base.outputs.check_outputs`)."""
    reads = [("the sweep file", args.sweep_file)]
    for option in ("against", "results", "storage", "from_export", "against_results", "against_storage",
                   "against_export", "backtest_to"):
        value = getattr(args, option, None)
        if option.endswith("storage") and value:  # an SQLite file's path; a server's URL is no path here
            value = value.removeprefix("sqlite:///") if value.startswith("sqlite:///") else None
        if value:
            reads.append((f"--{option.replace('_', '-')}", value))
    return reads


def check_report_out(out: Path) -> None:
    """That the report folder ``out`` can be made, before any notebook runs (:func:`~lightning_tfm.base.atomic.
    check_writable`): its name, and the names :mod:`.publish.notebooks` gives the folders and the lock beside it while
    it replaces it (``.<name>.tmp-<pid>``, ``.<name>.old-<pid>``, ``.<name>.lock``), each within NAME_MAX."""
    from ..base.atomic import NAME_MAX, check_writable

    beside = [out.with_name(f".{out.name}.{kind}-{os.getpid()}") for kind in ("tmp", "old")]
    room = NAME_MAX - max(len(os.fsencode(p.name)) - len(os.fsencode(out.name)) for p in beside)
    if len(os.fsencode(out.name)) > room:
        raise UserError(f"--out {str(out)[:60]}...: the report folder's name is {len(os.fsencode(out.name))} bytes; "
                        f"the folders made beside it while it is replaced need it at most {room}: give a shorter name")
    check_writable(files=[out.with_name(f".{out.name}.lock")], folders=[out, *beside])


def _say_done(out: Path, name: str, study: str | None = None) -> None:
    """A report's closing lines: its folder (as given, or the default relative to here) and its page to open; with
    ``study``, also the optuna-dashboard command that opens the sweep's study (:func:`.published.dashboard_next`)."""
    say_done(f"{out}/ ({name}.html, .md, .csv, .ipynb, the figures)",
             f"open {out / (name + '.html')} in a browser (its tables: {out / (name + '.md')})"
             + (f"   or   {study} (the study, its note holds this report)" if study else ""))


def _backtest_args(args):
    """The back-test's arguments checked: --backtest a number; none of the options that build a report."""
    for option in ("against", "against_results", "against_storage", "against_export", "from_wandb", "results",
                   "storage", "formats"):
        if getattr(args, option, None):
            raise UserError(f"--{option.replace('_', '-')} with a back-test: it reads --from-export alone; drop it")
    if args.backtest is not None:
        try:
            args.backtest = float(args.backtest)
        except ValueError:
            raise UserError(f"--backtest {args.backtest!r}: give a fraction of the budget between 0 and 1, e.g. "
                            "0.667") from None
        if not math.isfinite(args.backtest):
            raise UserError(f"--backtest {args.backtest!r}: give a fraction of the budget between 0 and 1, e.g. 0.667")
    if args.backtest_budget is not None:  # (without --backtest: refused by report_cli)
        given = args.backtest_budget
        try:
            args.backtest_budget = int(given)
        except ValueError:
            args.backtest_budget = 0
        if args.backtest_budget < 2:
            raise UserError(f"--backtest-budget {given!r}: give a number of updates of at least 2 (e.g. 600)")
    return args


def _formats(args, sweep) -> tuple[str, ...]:
    """The figures' formats: ``--formats``, else PNG alone; other formats than PNG only for a Table 3 report (the
    search and comparison figures are PNG)."""
    from ..report.core.plots import parse_formats

    formats = parse_formats(args.formats, "--formats")
    if formats != ("png",) and (args.against or sweep.mode != "variants"):
        kind = "a comparison (--against)" if args.against else "a search report"
        raise UserError(f"--formats {','.join(formats)}: {kind} writes its figures as PNG only; drop --formats (a "
                        "Table 3 report of one sweep takes it)")
    return formats


REPORT = Command("report", "regenerate a sweep's report (Table 3 beside the paper's)", _report_arguments,
                 report_cli)
