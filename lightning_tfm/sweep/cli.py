"""``ltfm sweep``: the command line of a worker, the dry run and the status table."""
from __future__ import annotations

import json
import os
import shlex

from ..training.corpus import prepare
from ..training.corpus import status as corpus_status
from ..training.errors import UserError
from ..training.redact import mask_url
from .plan import Plan, format_overrides
from .spec import load_sweep
from .status import dry_run, format_status, status_rows
from .storage import STORAGE_ENV, default_storage, open_storage, open_study, quiet_optuna, retry
from .queue import enqueue_missing
from .worker import Worker, stop_on_sigterm
from ..training.config import Config, has_data


def _check_local_data(cfg: Config) -> None:
    d = cfg.data
    if d.source != "local":
        return
    from ..training.data import split_file  # here: data imports torch, which a worker (it trains nothing itself) never needs
    for split in (d.train_split, d.dev_split, d.test_split):
        if split:
            for lang in (d.src_lang, d.tgt_lang):
                split_file(d.path, split, lang)


def _corpus_line(cfg: Config) -> str:
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
    words = ["ltfm", "sweep", args.sweep_file, "--status"]
    words += [o for o in args.overrides if o.split("=", 1)[0].strip() == "run.results_dir"]
    if args.storage:
        words += ["--storage", mask_url(args.storage)]
    return " ".join(shlex.quote(w) for w in words)


def sweep_cli(args) -> int:
    """``ltfm sweep SWEEP.yaml [--storage URL] [--n-trials N] [--dry-run] [--json] [--status] [k=v ...]``"""
    if args.n_trials is not None and args.n_trials < 1:
        raise UserError(f"--n-trials {args.n_trials} must be at least 1")
    sweep = load_sweep(args.sweep_file)
    plan = Plan(sweep, args.overrides, data=not (args.dry_run or args.status))  # neither reads the data
    if args.dry_run:
        rows = dry_run(sweep, plan, args.n_trials)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print(_corpus_line(plan.base_cfg))
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                what = f"{r['params']:>12,} params" if r["params"] is not None else f"skipped: {r['skipped']}"
                done, steps = r["trained_steps"], f"steps {r['max_steps']}"
                if done and done >= r["max_steps"]:
                    steps += f" (trained: {r['run_id']})"
                elif done:  # a larger budget than the run folder holds: the run continues
                    steps += f" (continues {r['run_id']} from step {done})"
                print(f"{r['name']:<{width}}  seed {r['seed']}  {what}  {steps}  {format_overrides(r['overrides'])}")
        return 0
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
        if args.every <= 0:
            raise UserError(f"--every {args.every} must be a positive number of seconds")
    per_gpu = getattr(args, "workers_per_gpu", None)
    if per_gpu is not None and (workers is None or per_gpu < 1):
        raise UserError(f"--workers-per-gpu {per_gpu} must be at least 1 and goes with --workers" if per_gpu < 1
                        else "--workers-per-gpu goes with --workers auto (or K): add --workers auto")
    if args.status:
        storage = open_storage(url, create=False)
        study = open_study(sweep, storage, create=False)
        rows = status_rows(study)
        print(json.dumps(rows, indent=1, default=str) if args.json else format_status(sweep, rows, url, plan.results_dir))
        return 0
    storage, study = _join(sweep, plan, url, given=bool(args.storage))
    if workers is not None:
        # The rows are queued here, once, before any worker starts (workers started together would each queue
        # every row: duplicates, closed untrained, but noise in --status).
        from .launch import launch
        if sweep.mode == "variants":
            retry(enqueue_missing, study, plan)
        from .launch import WORKERS_PER_GPU
        return launch(args.sweep_file, sweep, plan, args.overrides, url, lambda: study, workers, args.every,
                      per_gpu=per_gpu or WORKERS_PER_GPU, status_hint=status_command(args))
    retry(study.set_user_attr, "ltfm.pruner", sweep.pruner)
    retry(study.set_user_attr, "ltfm.metric", sweep.metric)
    stop_on_sigterm()
    worker = Worker(sweep, plan, url, storage, study)
    worker.say(f"study {sweep.name} in {mask_url(url)}; results in {plan.results_dir}")
    return worker.run(args.n_trials)
