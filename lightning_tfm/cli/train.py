"""``ltfm train`` (one model, trained or resumed; a sweep's trial is this command in a process of its own) and
``ltfm prepare`` (a config's or a sweep file's prepared corpus, built once)."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING

from ..base.command import OVERRIDES, Command, say_done
from .common import default_data, with_default_data

if TYPE_CHECKING:
    pass


def _train_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("config", help="experiment YAML, e.g. experiments/multi30k-smoke.yaml")
    t.add_argument("overrides", nargs="*", help=OVERRIDES)


def train_cli(args) -> int:
    """``ltfm train CONFIG.yaml [k=v ...]``. A sweep trial (``sweep.trial`` set; the worker starts this very
    command, so it reads the same in a trial's log as by hand) reports to its Optuna study through the sweep's
    pruning callback: training itself knows nothing of sweeps. The config is read once and validated once, by
    :func:`~lightning_tfm.training.train.train`; its data folder is checked before."""
    import signal

    from ..base.errors import UserError
    from ..training.config.config import check_data_folder, load_config, validate
    from ..training.runs.run_folder import existing_run_id

    cfg = load_config(args.config, args.overrides, checked=False)  # train() validates it
    if extra := default_data(cfg):
        cfg = load_config(args.config, extra + args.overrides, checked=False)
    try:
        check_data_folder(cfg)  # before Lightning is imported: a typo in data.path is one line at once
    except UserError:
        validate(cfg)  # ... after any error of the config's own keys, as ltfm config says them
        raise
    from ..training.train import LAUNCHER_REQUEUES_ENV, Abandoned, completed_summary, stop_reason, train
    if (done := completed_summary(cfg)) is not None:  # at once: no Lightning, no pruning callback to build
        return _finished(cfg, done)
    callbacks = []
    if cfg.sweep.trial is not None:
        from ..sweep.pruning import OptunaPruning
        callbacks.append(OptunaPruning(cfg))
    # progress lines where Lightning's bar would not show (a log, a pipe): a sweep trial's too (its worker sets no
    # bar), whose log's last "step N/M" line the launcher's progress line reads while the row trains
    from ..training.tracking.progress import ProgressLines, wants_lines
    if not sys.stderr.isatty():
        cfg.train.progress_bar = False  # Lightning's bar in a log is a line per refresh (not part of the run id)
    if wants_lines(cfg, sys.stderr.isatty()):
        callbacks.append(ProgressLines(existing_run_id(cfg, others=False)))
    if "SLURM_JOB_ID" not in os.environ or os.environ.get(LAUNCHER_REQUEUES_ENV):  # SLURM's requeue warning outside
        # SLURM, or in a sweep's job (its launcher requeues it): stop as on SIGTERM (in a job of its own, Lightning's
        # SLURM environment handles SIGUSR1 itself and requeues the job)
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
    return _finished(cfg, summary)


def _finished(cfg, summary: dict) -> int:
    """The exit code for a run that ended with ``summary`` (1 unless completed or pruned) and, by hand, where it
    went and what to run next."""
    from ..training.runs.run_folder import existing_run_id

    if summary.get("status") not in ("completed", "pruned"):
        return 1
    if cfg.sweep.trial is None:  # a trial's sweep says what comes next
        rid = summary.get("run_id") or existing_run_id(cfg, others=False)  # the folder it trained in
        run, results = shlex.quote(f"{cfg.run.results_dir}/{rid}"), shlex.quote(cfg.run.results_dir)
        print(f"ltfm: {finished_line(summary)}", file=sys.stderr, flush=True)
        say_done(f"{run}/ (summary.json: dev and test BLEU; checkpoints/, hyps/, logs/)",
                 f"ltfm runs {results}   or   echo 'A man rides a bike.' | ltfm translate {run}")
    return 0


def finished_line(summary: dict) -> str:
    """What a finished run measured, as its last lines say it: ``finished at step 200: dev PPL 48.64, dev BLEU
    1.14, test BLEU 0.49`` (each where summary.json has it; BLEU is sacreBLEU, its signature in summary.json)."""
    def num(key: str, fmt: str) -> str | None:
        v = summary.get(key)
        return None if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, fmt)

    parts = [f"{label} {value}" for label, value in (("dev PPL", num("dev_ppl", ".2f")),
                                                      ("dev BLEU", num("dev_bleu", ".2f")),
                                                      ("test BLEU", num("test_bleu", ".2f"))) if value is not None]
    return f"finished at step {summary.get('steps')}: " + (", ".join(parts) or "no dev or test numbers recorded")


def _stop_on_sigterm_outside_fit() -> None:
    """SIGTERM before or after ``Trainer.fit`` (building the corpus and the model; the final evaluation) stops the
    run as Lightning does during fit: its ``SIGTERMException``, which the run records as "stopped by SIGTERM" in
    summary.json (not a summary left "running" by a process the signal ended at once) and which exits 143.
    During fit Lightning's own handler calls this one too, and handles the signal itself."""
    import signal

    from ..training.train import SIGTERMException

    def stop(signum, frame):  # noqa: ARG001
        if signal.getsignal(signal.SIGTERM) is stop:  # not inside fit
            raise SIGTERMException
    signal.signal(signal.SIGTERM, stop)


TRAIN = Command("train", "train (or resume) one model", _train_arguments, train_cli,
                "Train one model from an experiment file; the same command resumes it. Every key: ltfm config "
                "--keys; the resolved config and run id: ltfm config CONFIG.yaml [k=v ...].")


def _prepare_arguments(pr: argparse.ArgumentParser) -> None:
    pr.add_argument("config", help="experiment or sweep YAML")
    pr.add_argument("--rebuild", action="store_true", help="build it again even if it exists")
    pr.add_argument("overrides", nargs="*", help=OVERRIDES)


def prepare_cli(args) -> int:
    """``ltfm prepare CONFIG|SWEEP [k=v ...] [--rebuild]``: build (or check) the prepared corpus of an experiment,
    or of a sweep's base experiment with the sweep's own overrides (what its trials use)."""
    from ..training.config.config import check_data_folder, load_config, read_yaml
    from ..training.data.corpus import folder_size, prepare

    if "experiment" in read_yaml(args.config):  # a sweep file
        from ..sweep.plan import Plan
        from ..sweep.spec import load_sweep
        sweep = load_sweep(args.config)
        cfg = Plan(sweep, with_default_data(sweep, args.overrides)).base_cfg
        then = f"ltfm sweep {shlex.quote(args.config)} (its trials map it)"
    else:
        cfg = load_config(args.config, default_data(load_config(args.config, args.overrides, checked=False))
                          + args.overrides)
        then = f"ltfm train {shlex.quote(args.config)} (the run maps it)"
    check_data_folder(cfg)
    folder, manifest = prepare(cfg, progress=True, rebuild=args.rebuild)
    counts = ", ".join(f"{role} {c['pairs']:,} pairs" + (f" ({c['skipped_pairs']:,} skipped)" if c.get('skipped_pairs')
                                                          else "") for role, c in manifest["splits"].items())
    print(f"{folder}\n  vocabulary {manifest['vocab_size']} ({manifest['dtype']}), {counts}, "
          f"{folder_size(folder) / 2**20:.1f} MiB")
    say_done(str(folder), then)
    return 0


PREPARE = Command("prepare", "build a config's prepared corpus (vocabulary + token ids) once", _prepare_arguments,
                  prepare_cli)
