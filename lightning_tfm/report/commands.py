"""The report layer's command, declared once beside its handler: ``ltfm report`` (what a
:class:`~lightning_tfm.training.commands.Command` is: that module). How a report is executed and published is
in :mod:`.notebooks`.

Only the standard library is imported at the top (``ltfm --help`` builds every command's parser): the handler
imports what it needs when it runs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..training.commands import Command
from ..training.errors import UserError


def _report_arguments(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("sweep_file", help="the sweep YAML the results belong to")
    rp.add_argument("--storage", metavar="URL", help="the sweep's Optuna storage (default: <results>/<sweep>.db)")
    rp.add_argument("--results", metavar="DIR", help="the results folder the runs are in (default: the "
                    "experiment's run.results_dir)")
    rp.add_argument("--out", metavar="DIR", help="where the report goes (default: reports/build/<sweep>/); "
                    "replaced only if an earlier report made it")
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


def report_cli(args) -> int:
    """``ltfm report SWEEP.yaml [--storage URL] [--results DIR] [--out DIR] [--from-wandb ENTITY/PROJECT]
    [--from-export DIR] [--against SWEEP_B.yaml [--against-results DIR] [--against-storage URL]
    [--against-export DIR]]``"""
    from ..sweep import load_sweep
    from .notebooks import (NOTEBOOKS, _check_out, _check_sources, compare_cli, execute, notebook_path,
                            report_parameters, stopped_by_signals)

    sweep = load_sweep(args.sweep_file)
    _check_sources(args)
    if args.against:
        return compare_cli(args, sweep)
    name = NOTEBOOKS[sweep.mode]
    if args.from_export and name != "table3":
        raise UserError("--from-export rebuilds a Table 3 report (a sweep with variants), not a search report")
    out = Path(args.out or Path("reports") / "build" / sweep.name).absolute()
    _check_out(out)
    parameters = report_parameters(sweep, args.results, args.storage, args.from_wandb, args.from_export)
    notebook = notebook_path(name)
    print(f"report of sweep {sweep.name}: executing {notebook.name}", flush=True)

    def published() -> int:  # the report folder is in place (its lock held): say so, then W&B and optuna-dashboard
        md, table = out / f"{name}.md", None
        if name == "table3":  # the rows the notebook wrote its tables from, rebuilt from its export (not parsed back)
            from .export import rebuilt_table
            from .render import headline_text
            table = rebuilt_table(sweep, out)
            print(headline_text(table), end="")
        pngs = sorted(p.name for p in out.glob("*.png"))
        print(f"report: {md}\n  html: {out / (name + '.html')}\n  notebook: {out / (name + '.ipynb')}\n"
              f"  csv: {out / (name + '.csv')}\n  figures: {', '.join(pngs)}", flush=True)
        if name == "table3":
            print(f"  export: {out / 'export' / (sweep.name + '.json')}")
        if name == "table3" and args.from_export:
            print("  W&B, optuna-dashboard: not published (a report rebuilt from an export)")
        elif name == "table3":  # the same report in W&B and optuna-dashboard; a failure there is a warning
            from .dashboards import publish
            for line in publish(sweep, parameters, out, table):
                print(line, flush=True)
        return 0

    with stopped_by_signals(out) as stopped:
        return execute(notebook, parameters, out, name, then=published)
    return stopped["code"]


REPORT = Command("report", "regenerate a sweep's report (Table 3 beside the paper's)", _report_arguments,
                 report_cli)

#: This layer's commands (:mod:`lightning_tfm.cli` sets the order of ``ltfm --help``).
COMMANDS = (REPORT,)
