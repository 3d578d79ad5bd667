"""``ltfm``: a thin command line over library functions that the tests call too.

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
    from .training.config import load_config
    from .training.train import train

    cfg = load_config(args.config, args.overrides)
    callbacks = []
    if cfg.sweep.trial is not None:
        from .sweep.pruning import OptunaPruning
        callbacks.append(OptunaPruning(cfg))
    summary = train(cfg, callbacks=callbacks)
    return 0 if summary.get("status") in ("completed", "pruned") else 1


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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ltfm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train one model: ltfm train CONFIG.yaml [dotted.key=value ...]")
    t.add_argument("config")
    t.add_argument("overrides", nargs="*", help="dotted.key=value")

    pr = sub.add_parser("prepare", help="build the prepared corpus (vocabulary + token ids) of a config once: "
                                         "ltfm prepare CONFIG.yaml [dotted.key=value ...]")
    pr.add_argument("config")
    pr.add_argument("--rebuild", action="store_true", help="build it again even if it exists")
    pr.add_argument("overrides", nargs="*", help="dotted.key=value")

    e = sub.add_parser("evaluate", help="BLEU of a run's checkpoint on a split or on any files")
    e.add_argument("run_dir")
    e.add_argument("--split")
    e.add_argument("--src")
    e.add_argument("--ref")
    e.add_argument("--checkpoint", default="last", help="last | best | average | PATH")
    e.add_argument("--out", help="hypotheses file (default: in the run folder)")
    e.add_argument("overrides", nargs="*", help="decode.* overrides, e.g. decode.beam_size=1")

    tr = sub.add_parser("translate", help="translate stdin to stdout with a run's checkpoint")
    tr.add_argument("run_dir")
    tr.add_argument("--checkpoint", default="last")
    tr.add_argument("overrides", nargs="*", help="decode.* overrides")

    a = sub.add_parser("average", help="average the last N checkpoints of a run")
    a.add_argument("run_dir")
    a.add_argument("--last", type=int, default=5)
    a.add_argument("--out")

    r = sub.add_parser("runs", help="table of the runs in a results folder")
    r.add_argument("results_dir", nargs="?", default="results")
    r.add_argument("--json", action="store_true")
    r.add_argument("--sort")

    s = sub.add_parser("sweep", help="run (or join) an Optuna sweep")
    s.add_argument("sweep_file")
    s.add_argument("--storage")
    s.add_argument("--n-trials", type=int)
    s.add_argument("--dry-run", action="store_true")
    s.add_argument("--json", action="store_true")
    s.add_argument("--status", action="store_true")
    s.add_argument("--workers", metavar="K|auto", help="start K workers of this study here and show one progress "
                   "line (auto: --workers-per-gpu on every CUDA device, else one per CPU core)")
    s.add_argument("--workers-per-gpu", type=int, default=None, metavar="K", help="with --workers auto on CUDA: "
                   "workers sharing each GPU (default 4: a Table 3 row leaves most of a large GPU idle)")
    s.add_argument("--every", type=float, default=30.0, metavar="SECONDS", help="with --workers: seconds between "
                   "progress lines (default 30)")
    s.add_argument("--storage-from-env", action="store_true", help=argparse.SUPPRESS)
    s.add_argument("overrides", nargs="*", help="dotted.key=value applied to every trial's base experiment")

    rp = sub.add_parser("report", help="regenerate the ablation report of a sweep")
    rp.add_argument("sweep_file")
    rp.add_argument("--storage")
    rp.add_argument("--results")
    rp.add_argument("--out")
    rp.add_argument("--from-wandb", metavar="ENTITY/PROJECT")

    b = sub.add_parser("bench", help="training and decoding speed, ours against MarianMTModel")
    b.add_argument("--config")
    b.add_argument("--vs", choices=["marian", "none"], default="none")
    b.add_argument("--json", action="store_true")
    b.add_argument("--dtypes", help="comma-separated, from fp32,bf16 (default: fp32, plus bf16 where the CPU has it)")
    b.add_argument("--data", type=int, metavar="N", help="instead: benchmark the data pipeline on a generated "
                   "corpus of N pairs (prepare time, second trial's time to its first step, RSS, cache size)")
    b.add_argument("overrides", nargs="*")
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
