"""``ltfm runs``: the table of the runs in a results folder, or one run's W&B run."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..base.command import Command
from ..base.errors import UserError

if TYPE_CHECKING:
    pass


def _runs_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("folder", nargs="?", metavar="RESULTS|RUN", help="the results folder (default: results); with "
                   "--wandb, a run folder or the id of a run in the results folder")
    r.add_argument("--json", action="store_true", help="JSON instead of a table")
    r.add_argument("--sort", metavar="[-]FIELD", help="sort by a column, descending with a leading '-' "
                   "(e.g. -dev_bleu, dev_ppl, params)")
    r.add_argument("--wandb", action="store_true", help="show one run's W&B run, read from its offline files "
                   "(no server): config, summary, and each history key with its steps and last value")


def runs_cli(args) -> int:
    """``ltfm runs [RESULTS_DIR] [--json] [--sort KEY]``; ``ltfm runs RUN --wandb [--json]``."""
    import json

    from ..training.runs.runs import find_run, format_table, list_runs, results_hint, sort_key, sort_rows

    if args.wandb:
        if args.sort:
            raise UserError("--sort orders the table of runs; --wandb shows one run: give one or the other")
        if not args.folder:
            raise UserError("--wandb shows one run: ltfm runs RUN --wandb, RUN a run folder or a run id")
        from ..training.runs.results import load_summary
        from ..training.tracking.wandb_files import describe, format_run, read_run_folder

        run_dir = find_run(args.folder)
        run = read_run_folder(run_dir, load_summary(run_dir)[0])
        print(json.dumps(describe(run), indent=2, default=str) if args.json else format_run(run))
        return 0
    if args.sort:
        sort_key(args.sort)  # a bad column is an error before the folder is read
    folder = args.folder or "results"
    rows = sort_rows(list_runs(folder), args.sort)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    elif not rows:
        hint = results_hint(folder)
        print(f"no runs in {folder}" + (f"; {hint}" if hint else ""), file=sys.stderr)
    else:
        print(format_table(rows))
    return 0


RUNS = Command("runs", "table of the runs in a results folder, or one run's W&B run", _runs_arguments, runs_cli,
               "Print the runs of a results folder (id, variant, status, parameters, dev perplexity, BLEU, wall "
               "time), or with --wandb one run's offline W&B run read from its files.")
