"""``ltfm sweep``: run or join an Optuna sweep (Table 3's rows or a search), its status, its dry run and its keys."""
from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import TYPE_CHECKING

from ..base.command import STOPPED_RC, Command, print_keys, say_done
from ..base.errors import UserError
from .common import with_default_data
from .sweep_cluster import check_cluster_options, cluster_arguments, serve_storage_cli, submit_slurm

if TYPE_CHECKING:
    from ..sweep.plan import Plan
    from ..training.config.config import Config


def _sweep_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("sweep_file", nargs="?", help="sweep YAML, e.g. sweeps/table3-cpu.yaml (not with --keys)")
    s.add_argument("--keys", nargs="?", const="", metavar="PREFIX", help="list every key of a sweep file (or "
                   "those starting with PREFIX, e.g. sampler or report.)")
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
    s.add_argument("--every", type=float, default=None, metavar="SECONDS", help="with --workers: seconds between "
                   "progress lines (default 30)")
    s.add_argument("--settle", action="store_true", help="after the rows, settle each against the base: queue "
                   "another seed of a row, more of the base or a longer budget, whichever answers it (better, worse, "
                   "the same within ±delta) at the least compute, until every row is answered or at the file's "
                   "settle: caps (settle.KEY=VALUE on the command line overrides one)")
    s.add_argument("--storage-from-env", action="store_true", help=argparse.SUPPRESS)
    cluster_arguments(s)
    s.add_argument("overrides", nargs="*", help="dotted.key=value applied to every trial's base experiment "
                   "(settle.KEY=VALUE: the sweep file's settle: section)")


def _check_local_data(cfg: Config) -> None:
    d = cfg.data
    if d.source != "local":
        return
    from ..training.data.corpus_id import split_file
    for split in (d.train_split, d.dev_split, d.test_split):
        if split:
            for lang in (d.src_lang, d.tgt_lang):
                split_file(d.path, split, lang)


def _corpus_line(cfg: Config) -> str:
    from ..training.config.config import has_data
    from ..training.data.corpus import status as corpus_status

    if not has_data(cfg):
        return ("prepared corpus and run folders: not shown without the data (data.path=FOLDER, or data.hub_name "
                "on the Hub, which the run ids include)")
    try:
        folder, ready = corpus_status(cfg)
    except UserError as e:
        return f"prepared corpus: cannot tell ({e})"
    return (f"prepared corpus: {folder} " + ("exists (every trial maps it)" if ready else
            "does not exist yet (built once before the first trial, or now with `ltfm prepare`)"))


def _join(sweep, plan: Plan, url: str, given: bool):
    """Check the inputs, build the prepared corpus once, open the storage and the study: (storage, study).

    A given ``--storage`` is checked first (fails fast, writes nothing here); the default SQLite file is only
    created once the data and the results folder are known to be fine."""
    from ..sweep.storage import open_storage, open_study, retry
    from ..training.data.corpus import prepare

    storage = open_storage(url, heartbeat=sweep.heartbeat) if given else None
    _check_local_data(plan.base_cfg)
    try:
        (plan.results_dir / "sweep-logs").mkdir(parents=True, exist_ok=True)
    except OSError:
        raise UserError(f"results folder {str(plan.results_dir)!r} is not writable: set run.results_dir to a "
                        "folder you can write") from None
    prepare(plan.base_cfg)  # one vocabulary and one set of ids for every trial, built before any trial starts
    storage = storage or open_storage(url, heartbeat=sweep.heartbeat)
    return storage, retry(open_study, sweep, storage)


def status_command(args) -> str:
    """``ltfm sweep FILE --status`` as this command's user would type it to find the same study: with the
    results folder it was given (the default storage lives there) and its storage URL, password masked."""
    from ..base.redact import mask_url

    words = ["ltfm", "sweep", args.sweep_file, "--status"]
    words += [o for o in args.overrides if o.split("=", 1)[0].strip() == "run.results_dir"]
    if args.storage:
        words += ["--storage", mask_url(args.storage)]
    return " ".join(shlex.quote(w) for w in words)


def _keys(args) -> int:
    """``ltfm sweep --keys [PREFIX]``: every key of a sweep file with its type, default and meaning."""
    from ..sweep.schema import describe_keys

    if args.sweep_file or args.overrides:
        raise UserError("--keys lists the sweep file's keys: give no sweep file or overrides with it")
    print_keys(describe_keys(args.keys))
    return 0


def _dry_run(args, sweep, plan: Plan) -> int:
    from ..sweep.plan import format_overrides
    from ..sweep.status import dry_run

    rows = dry_run(sweep, plan, args.n_trials)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(_corpus_line(plan.base_cfg))
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        what = f"{r['params']:>12,} params" if r["params"] is not None else f"skipped: {r['skipped']}"
        done, steps = r["trained_steps"], f"steps {r['max_steps']}"
        if done and done >= r["max_steps"]:
            steps += f" (trained: {r['run_id']})"
        elif done:  # a larger budget than the run folder holds: the run continues
            steps += f" (continues {r['run_id']} from step {done})"
        if r.get("arch") and r["arch"] != "transformer" or r.get("train_flops"):  # a Table 2 sweep: what it compares
            what += f"  {r.get('arch') or 'transformer'}" + (f", {r['train_flops']:.3g} training FLOPs"
                                                            if r.get("train_flops") else "")
        print(f"{r['name']:<{width}}  seed {r['seed']}  {what}  {steps}  {format_overrides(r['overrides'])}")
    return 0


def _check_options(args) -> None:
    """Options that do nothing together are refused, never ignored: ``--status`` and ``--dry-run`` train nothing
    (so take no --workers, --n-trials, --every), ``--json`` goes with one of them, ``--every`` with ``--workers``."""
    looks = [o for o, on in (("--status", args.status), ("--dry-run", args.dry_run)) if on]
    if len(looks) == 2:
        raise UserError("--status and --dry-run do not go together: --status shows the study's trials, --dry-run the "
                        "trials the sweep file plans; give one")
    if args.json and not looks:
        raise UserError("--json goes with --status or --dry-run (it would otherwise run the whole sweep): add one")
    if looks:
        given = [o for o, v in (("--workers", getattr(args, "workers", None)), ("--n-trials", args.n_trials),
                                ("--every", args.every), ("--workers-per-gpu", getattr(args, "workers_per_gpu", None)))
                 if v is not None]
        if given and not (looks == ["--dry-run"] and given == ["--n-trials"]):  # a search's dry run: its N points
            raise UserError(f"{looks[0]} trains nothing, so {', '.join(given)} would be ignored: leave "
                            f"{'it' if len(given) == 1 else 'them'} out (or drop {looks[0]} to run the sweep)")
    if args.every is not None and getattr(args, "workers", None) is None:
        raise UserError("--every sets the progress lines of --workers: add --workers auto (or K), or leave --every out")
    if getattr(args, "settle", False):
        if looks:
            raise UserError(f"--settle trains the trials that answer the rows; {looks[0]} trains nothing: give one "
                            f"(--status shows each row's answer and what it waits for)")
        if args.n_trials is not None:
            raise UserError("--settle runs until every row is answered or at its cap, so --n-trials would stop it "
                            "midway: leave --n-trials out (the sweep file's settle: section sets the caps)")


def _settle_overrides(overrides: list[str]) -> tuple[list[str], list[str], dict]:
    """The command line's overrides split: the trials' dotted config keys, and ``settle.KEY=VALUE`` (the sweep
    file's settle: section) as given and as {KEY: value}."""
    from ..training.config.config import parse_override

    rest, texts, settle = [], [], {}
    for text in overrides or []:
        if text.split("=", 1)[0].strip().startswith("settle."):
            key, value = parse_override(text)
            settle[key[len("settle."):]] = value
            texts.append(text)
        else:
            rest.append(text)
    return rest, texts, settle


def sweep_cli(args) -> int:
    """``ltfm sweep SWEEP.yaml [--storage URL] [--n-trials N] [--dry-run] [--json] [--status] [k=v ...]``;
    ``ltfm sweep --keys [PREFIX]``."""
    if args.keys is not None:
        if getattr(args, "settle", False):
            raise UserError("--keys lists the sweep file's keys (ltfm sweep --keys settle. lists --settle's): leave "
                            "--settle out")
        return _keys(args)
    check_cluster_options(args)
    if args.serve_storage:
        return serve_storage_cli(args)
    if not args.sweep_file:
        raise UserError("give a sweep file (ltfm sweep sweeps/table3-cpu.yaml [k=v ...]) or --keys")
    if args.n_trials is not None and args.n_trials < 1:
        raise UserError(f"--n-trials {args.n_trials} must be at least 1")
    _check_options(args)
    from ..base.redact import mask_url
    from ..sweep.plan import Plan
    from ..sweep.spec import load_sweep, with_settle
    from ..sweep.status import format_status, status_rows
    from ..sweep.storage import STORAGE_ENV, default_storage, open_storage, open_study, quiet_optuna, retry

    sweep = load_sweep(args.sweep_file)
    trial_overrides, settle_texts, settle_given = _settle_overrides(args.overrides)
    sweep = with_settle(sweep, settle_given)
    settle = getattr(args, "settle", False)
    if settle:
        from ..sweep.settle import refusal
        if (why := refusal(sweep)) is not None:
            raise UserError(why)
    trial_overrides = with_default_data(sweep, trial_overrides)
    args.overrides = trial_overrides + settle_texts  # what the launcher hands its workers
    plan = Plan(sweep, trial_overrides, data=not (args.dry_run or args.status))  # neither reads the data
    if args.dry_run:
        return _dry_run(args, sweep, plan)
    quiet_optuna()
    url = args.storage or default_storage(sweep, plan.results_dir)
    if getattr(args, "storage_from_env", False) and os.environ.get(STORAGE_ENV):
        url = os.environ[STORAGE_ENV]  # a worker started by --workers: the URL (maybe with a password) off argv
    workers = getattr(args, "workers", None)
    if workers is not None and not args.status:
        if workers != "auto" and not (workers.isdigit() and int(workers) >= 1):
            raise UserError(f"--workers {workers!r} must be a count of at least 1 or 'auto'")
        if args.n_trials is not None:
            raise UserError("--workers and --n-trials do not go together: each worker runs until the study is done")
        if args.every is not None and args.every <= 0:
            raise UserError(f"--every {args.every} must be a positive number of seconds")
    per_gpu = getattr(args, "workers_per_gpu", None)
    if per_gpu is not None and (workers is None or per_gpu < 1):
        raise UserError(f"--workers-per-gpu {per_gpu} must be at least 1 and goes with --workers" if per_gpu < 1
                        else "--workers-per-gpu goes with --workers auto (or K): add --workers auto")
    if args.status:
        storage = open_storage(url, create=False)
        study = open_study(sweep, storage, create=False)
        rows = status_rows(study, sweep)  # with each finished row's verdict
        answers = _status_answers(sweep, plan, study, rows)
        print(json.dumps(rows, indent=1, default=str) if args.json
              else "\n".join([format_status(sweep, rows, url, plan.results_dir), *answers]))
        return 0
    if args.launcher == "slurm":
        from ..sweep.slurm import check_shareable, trial_shape
        check_shareable(url, args.slurm_local_storage)  # refused before anything is written
        trial_shape(plan.base_cfg.train, args.gpus_per_job or 0)  # so is a trial size the jobs cannot be given
    storage, study = _join(sweep, plan, url, given=bool(args.storage))
    if args.launcher == "slurm" and sweep.mode == "variants":
        from ..sweep.queue import enqueue_missing
        retry(enqueue_missing, study, plan)  # the rows queued once, here, before any job starts
    if args.launcher == "slurm":
        return submit_slurm(args, sweep, plan, url, status_command(args))
    if workers is not None:
        # The rows are queued here, once, before any worker starts (workers started together would each queue
        # every row: duplicates, closed untrained, but noise in --status).
        from ..sweep.launch import WORKERS_PER_GPU, launch
        from ..sweep.queue import enqueue_missing
        if sweep.mode == "variants":
            retry(enqueue_missing, study, plan)
        code = launch(args.sweep_file, sweep, plan, args.overrides, url, lambda: study, workers,
                      args.every if args.every is not None else 30.0, per_gpu=per_gpu or WORKERS_PER_GPU,
                      status_hint=status_command(args), settle=settle)
        return _said_done(args, sweep, plan, url, _settled(sweep, plan, study, code) if settle else code)
    from ..sweep.process import stop_on_sigterm
    from ..sweep.worker import Worker
    retry(study.set_user_attr, "ltfm.pruner", sweep.pruner)
    retry(study.set_user_attr, "ltfm.metric", sweep.metric)
    stop_on_sigterm()
    worker = Worker(sweep, plan, url, storage, study, settle=settle)
    worker.say(f"study {sweep.name} in {mask_url(url)}; results in {plan.results_dir}")
    code = worker.run(args.n_trials)
    return _said_done(args, sweep, plan, url, _settled(sweep, plan, study, code) if settle else code)


def _settled(sweep, plan: Plan, study, code: int) -> int:
    """The settle loop's closing lines (one a row: its answer and what it took; the counts and the compute against
    every row at the cap); ``code`` returned. No lines for a stopped sweep: its loop has not ended."""
    from ..sweep.settle import read, summary_lines
    from ..sweep.storage import retry

    if code == STOPPED_RC:
        return code
    for line in summary_lines(sweep, read(plan, retry(study.get_trials, deepcopy=False))):
        print(line, flush=True)
    return code


def _status_answers(sweep, plan: Plan, study, rows: list[dict]) -> list[str]:
    """For a settling sweep (a settle: section, or trials the settle loop queued): each row's answer and what it
    waits for, as lines after the status table, and in each trial's row (``answer``, ``waiting``) for --json."""
    from ..sweep.settle import MULTIPLE, read, row_answers, waits

    trials = study.get_trials(deepcopy=False)
    if not (sweep.settles or any(MULTIPLE in t.user_attrs for t in trials)):
        return []
    answers = row_answers(read(plan, trials))
    for r in rows:
        a = answers.get(r.get("variant"))
        r["answer"], r["waiting"] = (a["answer"], a["waiting"]) if a else (None, None)
    if not answers:
        return ["settle: no answers yet (they need a completed run of the base and of the row)"]
    width = max(map(len, answers))
    return ["settle: each row's answer against the base, and what it waits for:",
            *(f"  {v:<{width}}  {a['why']}{waits(a['waiting'])}" for v, a in answers.items())]


def report_command(args) -> str:
    """``ltfm report FILE`` as this sweep's user would type it to read the same runs: with the results folder
    and the storage the sweep was given (:func:`status_command`'s)."""
    from ..base.redact import mask_url

    words = ["ltfm", "report", args.sweep_file]
    words += [w for o in args.overrides if o.split("=", 1)[0].strip() == "run.results_dir"
              for w in ("--results", o.split("=", 1)[1])]
    if args.storage:
        words += ["--storage", mask_url(args.storage)]
    return " ".join(shlex.quote(w) for w in words)


def _said_done(args, sweep, plan: Plan, url: str, code: int) -> int:
    """A sweep's closing lines (not a worker's that --workers started: the launcher's are): where its runs and
    study are, and the commands that show them; ``code`` returned."""
    from ..base.redact import mask_url

    if code in (0, 1) and not getattr(args, "storage_from_env", False):
        say_done(f"{plan.results_dir}/ (a run folder a trial; the study: {mask_url(url)})",
                 f"{status_command(args)}   then   {report_command(args)}")
    return code


SWEEP = Command("sweep", "run (or join) an Optuna sweep: Table 3 rows or a search", _sweep_arguments, sweep_cli,
                "Run (or join) the Optuna study of a sweep file: its Table 3 rows (one trial per variant and seed) "
                "or its search space, each trial an ltfm train of its own run folder; the same command resumes it "
                "and, on other machines with a shared --storage, joins it. The file's keys: ltfm sweep --keys; its "
                "rows: --dry-run; its progress: --status.")
