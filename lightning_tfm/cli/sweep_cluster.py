"""``ltfm sweep``'s cluster options: ``--launcher slurm`` (the workers as a Slurm job array, :mod:`~..sweep.slurm`)
and ``--serve-storage`` (Optuna's gRPC storage proxy in front of a database, :mod:`~..sweep.proxy`)."""
from __future__ import annotations

import argparse

from ..base.errors import UserError

#: The Slurm options and their defaults (each refused without ``--launcher slurm``)
_SLURM = {"jobs": None, "partition": None, "time": None, "cpus_per_job": None, "gpus_per_job": None, "mem": None,
          "signal_before": None, "slurm_arg": None, "slurm_local_storage": False}


def cluster_arguments(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("on a cluster (README: On a cluster)")
    g.add_argument("--launcher", choices=("local", "slurm"), default="local", help="slurm: submit the workers as a "
                   "Slurm job array (from a login node; submitit), on the shared --storage, and return")
    g.add_argument("--jobs", type=int, metavar="N", help="with --launcher slurm: N jobs, a worker each (default 1)")
    g.add_argument("--partition", metavar="NAME", help="with --launcher slurm: the jobs' partition (default: the "
                   "cluster's)")
    g.add_argument("--time", type=int, metavar="MIN", help="with --launcher slurm: each job's time limit in minutes "
                   "(default 240); the job stops its trial before it, with a checkpoint, and is requeued")
    g.add_argument("--cpus-per-job", type=int, metavar="N", help="with --launcher slurm: CPUs of each job, its "
                   "trials' train.threads (default 2)")
    g.add_argument("--gpus-per-job", type=int, metavar="N", help="with --launcher slurm: GPUs of each job (default "
                   "0); a trial on several: train.devices=N")
    g.add_argument("--mem", type=float, metavar="GB", help="with --launcher slurm: memory of each job in GB "
                   "(default: the partition's)")
    g.add_argument("--signal-before", type=int, metavar="SECONDS", help="with --launcher slurm: how long before its "
                   "time limit a job is told to stop (SIGUSR1) and requeued (default 120: a step and a checkpoint)")
    g.add_argument("--slurm-arg", action="append", metavar="--KEY=VALUE", help="with --launcher slurm: another "
                   "sbatch option, passed through (repeat: --slurm-arg=--account=lab --slurm-arg=--qos=low)")
    g.add_argument("--slurm-local-storage", action="store_true", help="with --launcher slurm: allow a SQLite "
                   "storage, for a cluster that is this one machine (a one-node test cluster); else refused")
    g.add_argument("--serve-storage", metavar="URL", help="run Optuna's gRPC storage proxy in front of the database "
                   "URL (postgresql://user@host/db) until Ctrl-C; workers join with --storage grpc://HOST:PORT")
    g.add_argument("--host", default=None, metavar="HOST", help="with --serve-storage: the address to listen on "
                   "(default localhost; 0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=None, metavar="N", help="with --serve-storage: the port (default "
                   "13000)")


def check_cluster_options(args) -> None:
    """Slurm options without ``--launcher slurm``, proxy options without ``--serve-storage``: refused, never
    ignored; ``--launcher slurm`` with what it cannot do."""
    slurm_given = [f"--{k.replace('_', '-')}" for k, default in _SLURM.items() if getattr(args, k, default) != default]
    if args.launcher != "slurm" and slurm_given:
        raise UserError(f"{', '.join(slurm_given)} set{'s' if len(slurm_given) == 1 else ''} the Slurm jobs: add "
                        "--launcher slurm, or leave it out")
    if args.launcher == "slurm":
        clash = [o for o, on in (("--status", args.status),  # (--dry-run: the trials it would submit)
                                 ("--workers", getattr(args, "workers", None) is not None),
                                 ("--n-trials", args.n_trials is not None), ("--every", args.every is not None)) if on]
        if clash:
            raise UserError(f"--launcher slurm submits the workers and returns: {', '.join(clash)} do(es) not go with "
                            "it (--status afterwards shows which job holds which trial)")
        for name in ("jobs", "cpus_per_job", "time"):
            v = getattr(args, name)
            if v is not None and v < 1:
                raise UserError(f"--{name.replace('_', '-')} {v} must be at least 1")
    if (args.host is not None or args.port is not None) and not args.serve_storage:
        raise UserError("--host and --port go with --serve-storage (the proxy's address): add it, or leave them out")


def serve_storage_cli(args) -> int:
    """``ltfm sweep --serve-storage URL [--host H] [--port N]``."""
    from ..base.redact import mask_url
    from ..sweep.proxy import DEFAULT_PORT, refuse_unservable, serve
    from ..sweep.storage import open_storage

    if args.sweep_file or args.overrides:
        raise UserError("--serve-storage serves a database for every sweep on it: give no sweep file or overrides")
    url, shown = args.serve_storage, mask_url(args.serve_storage)
    refuse_unservable(url, shown)
    rdb = open_storage(url)  # one-line errors: a bad URL, an unreachable server, a missing driver
    return serve(rdb, shown, args.host or "localhost", args.port or DEFAULT_PORT)


def submit_slurm(args, sweep, plan, url: str, status_hint: str) -> int:
    """``--launcher slurm``: the storage checked, the rows queued once, the jobs submitted (their ids and logs said)."""
    from ..sweep.slurm import SlurmOptions, check_shareable, submit, trial_shape

    check_shareable(url, args.slurm_local_storage)
    d = SlurmOptions()
    nodes, per_node = trial_shape(plan.base_cfg.train, args.gpus_per_job or 0)  # num_nodes x devices: the tasks
    opts = SlurmOptions(jobs=args.jobs or d.jobs, partition=args.partition, time_min=args.time or d.time_min,
                        cpus=args.cpus_per_job or d.cpus, gpus=args.gpus_per_job or d.gpus, mem_gb=args.mem,
                        signal_s=args.signal_before if args.signal_before is not None else d.signal_s,
                        extra=tuple(args.slurm_arg or ()), nodes=nodes, tasks_per_node=per_node)
    from ..base.command import say_done
    from ..base.redact import mask_url

    logs = plan.results_dir / "sweep-logs" / sweep.name / "slurm"
    # each job is the same worker as --workers starts here: with --settle, it settles the rows too
    worker_args = [*(["--settle"] if getattr(args, "settle", False) else []), *args.overrides]
    ids = submit(args.sweep_file, sweep.name, worker_args, url, logs, opts)
    say_done(f"{logs}/ (the jobs' logs; their trials' logs beside it; the study: {mask_url(url)})",
             f"{status_hint}   (which job holds which trial; squeue -j {ids[0].split('_')[0]}: the jobs)")
    return 0
