"""``ltfm``: the command line, a table of commands (each a library function the tests call too).

Every user error (config, data, arguments, storage, checkpoint) ends as one line on stderr and exit
code 2, with no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .training.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + message otherwise)
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")


#: Each subcommand's handler as ``"module:function"`` (relative to this package), called with the parsed
#: arguments. The module is imported only when its command runs, so that ``ltfm --help`` and argument errors
#: never import torch, Lightning or Optuna. ``train``, ``prepare`` and ``bench`` decide something first (below).
COMMANDS = {
    "train": ".cli:_train",
    "config": ".cli:_config",
    "prepare": ".cli:_prepare",
    "evaluate": ".training.commands:evaluate_cli",
    "translate": ".training.commands:translate_cli",
    "average": ".training.commands:average_cli",
    "runs": ".training.runs:runs_cli",
    "sweep": ".sweep.cli:sweep_cli",
    "report": ".report.notebooks:report_cli",
    "bench": ".cli:_bench",
}


def _run(target: str, args) -> int:
    module, function = target.split(":")
    return getattr(importlib.import_module(module, __package__), function)(args)


def _train(args) -> int:
    """``ltfm train``. A sweep trial (``sweep.trial`` set; the worker starts this very command, so it reads the
    same in a trial's log as by hand) reports to its Optuna study through the sweep's pruning callback:
    training itself knows nothing of sweeps."""
    import signal

    from .training.config import load_config
    from .training.train import Abandoned, stop_reason, train

    cfg = load_config(args.config, args.overrides)
    callbacks = []
    if cfg.sweep.trial is not None:
        from .sweep.pruning import OptunaPruning
        callbacks.append(OptunaPruning(cfg))
    if "SLURM_JOB_ID" not in os.environ:  # SLURM's requeue warning outside SLURM: stop as on SIGTERM (in SLURM,
        # Lightning's SLURM environment handles SIGUSR1 itself and requeues the job)
        signal.signal(signal.SIGUSR1, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    _stop_on_sigterm_outside_fit()
    try:
        summary = train(cfg, callbacks=callbacks)
    except Abandoned as e:  # stopped short of its budget, recorded as failed in summary.json
        print(f"ltfm: {e}", file=sys.stderr)
        return 1
    except SystemExit as e:
        stopped = stop_reason(e)
        if stopped is None:
            raise
        print(f"ltfm: {stopped[0]}", file=sys.stderr)
        return stopped[1]
    return 0 if summary.get("status") in ("completed", "pruned") else 1


def _stop_on_sigterm_outside_fit() -> None:
    """SIGTERM before or after ``Trainer.fit`` (building the corpus and the model; the final evaluation) stops the
    run as Lightning does during fit: its ``SIGTERMException``, which the run records as "stopped by SIGTERM" in
    summary.json (not a summary left "running" by a process the signal ended at once) and which exits 143.
    During fit Lightning's own handler calls this one too, and handles the signal itself."""
    import signal

    from pytorch_lightning.utilities.exceptions import SIGTERMException

    def stop(signum, frame):  # noqa: ARG001
        if signal.getsignal(signal.SIGTERM) is stop:  # not inside fit
            raise SIGTERMException
    signal.signal(signal.SIGTERM, stop)


def _config(args) -> int:
    """``ltfm config CONFIG.yaml [k=v ...]``: the resolved config as the run saves it (``config.yaml``), under a
    comment with its run id; ``ltfm config --keys [PREFIX]``: every key of the schema with its type, default,
    allowed values and meaning (the schema validation uses, so nothing here can fall out of date)."""
    from .training import config

    if args.keys is not None:
        if args.config or args.overrides:
            raise UserError("--keys lists the schema: give no config file or overrides with it")
        rows = [(f"{sec}.{name}", config.describe(spec), "null" if default is None else str(default), help)
                for sec, keys in config.SCHEMA.items() for name, (spec, default, help) in keys.items()
                if f"{sec}.{name}".startswith(args.keys)]
        if not rows:
            raise UserError(f"no config key starts with {args.keys!r}: sections are {', '.join(config.SCHEMA)}")
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        for key, kind, default, help in rows:
            print(f"{key:<{w[0]}}  {kind:<{w[1]}}  default {default:<{w[2]}}  {help}")
        return 0
    if not args.config:
        raise UserError("give an experiment file (ltfm config experiments/multi30k-smoke.yaml [k=v ...]) or --keys")
    cfg = config.load_config(args.config, args.overrides)
    print(f"# run id: {config.run_id(cfg)} (its folder: {cfg.run.results_dir}/{config.run_id(cfg)})")
    print(config.saved_yaml(cfg), end="")
    return 0


def _prepare(args) -> int:
    """``ltfm prepare CONFIG|SWEEP``: a sweep file's corpus is that of its base experiment with the sweep's
    overrides (what its trials use); reading a sweep file belongs to the sweep package, above the corpus."""
    from .training.config import load_config, read_yaml
    from .training.corpus import prepare_cli

    if "experiment" in read_yaml(args.config):  # a sweep file
        from .sweep import Plan, load_sweep
        cfg = Plan(load_sweep(args.config), args.overrides).base_cfg
    else:
        cfg = load_config(args.config, args.overrides)
    return prepare_cli(cfg, rebuild=args.rebuild)


def _bench(args) -> int:
    # --data: the data pipeline's benchmark (prepared corpora), not the model's speed
    return _run(".training.bench_pipeline:bench_data_cli" if args.data is not None else ".training.bench:bench_cli", args)


USAGE = """Train the Transformer of "Attention Is All You Need", run the paper's Table 3 as an Optuna sweep,
and regenerate the table beside the paper's.

start with:
  ltfm train experiments/multi30k-smoke.yaml data.path=../shared/data/multi30k   one model, under a minute
  ltfm sweep sweeps/table3-cpu.yaml data.path=../shared/data/multi30k --workers auto
                                                                                 the Table 3 sweep
  ltfm report sweeps/table3-cpu.yaml                                             its report: md, csv, html

every config key, its type, default and meaning: ltfm config --keys [PREFIX]"""

OVERRIDES = "dotted.key=value settings on top of the file (ltfm config --keys lists every key)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ltfm", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    t = sub.add_parser("train", help="train (or resume) one model", description="Train one model from an "
                       "experiment file; the same command resumes it. Every key: ltfm config --keys; the "
                       "resolved config and run id: ltfm config CONFIG.yaml [k=v ...].")
    t.add_argument("config", help="experiment YAML, e.g. experiments/multi30k-smoke.yaml")
    t.add_argument("overrides", nargs="*", help=OVERRIDES)

    c = sub.add_parser("config", help="the resolved config of an experiment, or every config key",
                       description="Print the config a run would save (YAML, with its run id), or with --keys "
                       "every key with its type, default, allowed values and meaning.")
    c.add_argument("config", nargs="?", help="experiment YAML (not with --keys)")
    c.add_argument("--keys", nargs="?", const="", metavar="PREFIX", help="list every key (or those starting "
                   "with PREFIX, e.g. train or model.d_)")
    c.add_argument("overrides", nargs="*", help=OVERRIDES)

    pr = sub.add_parser("prepare", help="build a config's prepared corpus (vocabulary + token ids) once")
    pr.add_argument("config", help="experiment or sweep YAML")
    pr.add_argument("--rebuild", action="store_true", help="build it again even if it exists")
    pr.add_argument("overrides", nargs="*", help=OVERRIDES)

    s = sub.add_parser("sweep", help="run (or join) an Optuna sweep: Table 3 rows or a search")
    s.add_argument("sweep_file", help="sweep YAML, e.g. sweeps/table3-cpu.yaml")
    s.add_argument("--storage", metavar="URL", help="Optuna storage shared by workers (default: SQLite "
                   "<results>/<sweep>.db; postgresql://user@host/db with the password in PGPASSWORD or ~/.pgpass)")
    s.add_argument("--n-trials", type=int, metavar="N", help="this worker stops after N trials (default: when "
                   "the study is done)")
    s.add_argument("--dry-run", action="store_true", help="list the trials (rows, overrides, parameters, steps) "
                   "without training")
    s.add_argument("--json", action="store_true", help="with --dry-run or --status: JSON instead of a table")
    s.add_argument("--status", action="store_true", help="the study's trials: state, value, duration, run folder")
    s.add_argument("--workers", metavar="K|auto", help="start K workers of this study here and show one progress "
                   "line (auto: --workers-per-gpu on every CUDA device, else one per CPU core)")
    s.add_argument("--workers-per-gpu", type=int, default=None, metavar="K", help="with --workers auto on CUDA: "
                   "workers sharing each GPU (default 4: a Table 3 row leaves most of a large GPU idle)")
    s.add_argument("--every", type=float, default=30.0, metavar="SECONDS", help="with --workers: seconds between "
                   "progress lines (default 30)")
    s.add_argument("--storage-from-env", action="store_true", help=argparse.SUPPRESS)
    s.add_argument("overrides", nargs="*", help="dotted.key=value applied to every trial's base experiment")

    rp = sub.add_parser("report", help="regenerate a sweep's report (Table 3 beside the paper's)")
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

    r = sub.add_parser("runs", help="table of the runs in a results folder")
    r.add_argument("results_dir", nargs="?", default="results", help="results folder (default: results)")
    r.add_argument("--json", action="store_true", help="JSON instead of a table")
    r.add_argument("--sort", metavar="[-]FIELD", help="sort by a column, descending with a leading '-' "
                   "(e.g. -dev_bleu, dev_ppl, params)")

    e = sub.add_parser("evaluate", help="BLEU of a run's checkpoint on a split or on any files")
    e.add_argument("run_dir", help="a run folder written by ltfm train")
    e.add_argument("--split", metavar="NAME", help="a split of the run's data, e.g. test_2016_flickr (default: "
                   "its test split, else its dev split)")
    e.add_argument("--src", metavar="FILE", help="source sentences, one per line (with --ref)")
    e.add_argument("--ref", metavar="FILE", help="reference translations, line-aligned with --src")
    e.add_argument("--checkpoint", default="last", help="last | best | average | PATH (default last)")
    e.add_argument("--out", metavar="FILE", help="hypotheses file (default: in the run folder)")
    e.add_argument("overrides", nargs="*", help="decode.* (and data.*) overrides, e.g. decode.beam_size=1")

    tr = sub.add_parser("translate", help="translate stdin to stdout with a run's checkpoint")
    tr.add_argument("run_dir", help="a run folder written by ltfm train")
    tr.add_argument("--checkpoint", default="last", help="last | best | average | PATH (default last)")
    tr.add_argument("overrides", nargs="*", help="decode.* overrides, e.g. decode.beam_size=1")

    a = sub.add_parser("average", help="average the last N checkpoints of a run into one file")
    a.add_argument("run_dir", help="a run folder written by ltfm train")
    a.add_argument("--last", type=int, default=5, metavar="N", help="how many step checkpoints (default 5)")
    a.add_argument("--out", metavar="FILE", help="the averaged checkpoint (default checkpoints/average.ckpt)")

    b = sub.add_parser("bench", help="training and decoding speed, ours against MarianMTModel")
    b.add_argument("--config", metavar="CONFIG.yaml", help="take the model's shapes from an experiment")
    b.add_argument("--vs", choices=["marian", "none"], default="none", help="also measure Hugging Face's "
                   "MarianMTModel at the same shapes (pip install -e '.[bench]')")
    b.add_argument("--json", action="store_true", help="JSON instead of a table")
    b.add_argument("--dtypes", help="comma-separated, from fp32,bf16 (default: fp32, plus bf16 where the device has it)")
    b.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where both models run (auto: cuda when torch sees a GPU, else cpu)")
    b.add_argument("--data", type=int, metavar="N", help="instead: benchmark the data pipeline on a generated "
                   "corpus of N pairs (prepare time, second trial's time to its first step, RSS, cache size)")
    b.add_argument("overrides", nargs="*", help="bench.KEY=N shapes (bench.batch=256, bench.d_model=512, ...) "
                   "and, with --config, config overrides")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        # dotted.key=value overrides may come after options too (`ltfm evaluate RUN --src a --ref b
        # decode.beam_size=1`): argparse stops collecting positionals at the first option.
        unknown = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if extra:
            args.overrides = list(args.overrides or []) + extra
        return _run(COMMANDS[args.command], args)
    except UserError as e:
        print(f"ltfm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ltfm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ltfm runs | head`: the reader went away; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
