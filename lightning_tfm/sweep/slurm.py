"""``ltfm sweep FILE --launcher slurm``: the sweep's workers as a Slurm job array (submitit), on the study's shared
storage.

Each job of the array runs one ``ltfm sweep FILE --storage-from-env`` worker (:class:`SweepJob`), the same worker
as on one machine: it claims the queued rows one at a time and trains each as its own ``ltfm train``; the rows are
queued once, by the command that submits. The storage URL reaches the jobs through the environment Slurm gives them
(:data:`~.storage.STORAGE_ENV`, never a command line or submitit's pickle), so a password stays off ``ps`` and off
the shared folder. Where the worker claims a trial it records the job (:func:`job_attrs`: ``slurm_job``, e.g.
``4242_1``), which ``--status`` shows.

**Stops.** Slurm signals every process of a job's step:

- Before its time limit, and on ``scancel --signal=USR1 JOB``: SIGUSR1 (``--signal=USR1@N``: submitit's
  preemption signal is set to USR1, the one ``ltfm train`` and the worker already take as SIGTERM). The trial stops
  at the end of the step under way with ``last.ckpt`` written, the worker puts it back in the queue as *stopped*,
  and :meth:`SweepJob.checkpoint` (called by submitit once the worker has ended) has the job requeued: its next
  start claims the stopped trial first and resumes it from that step, mid-epoch, on the same batches.
- Preemption (``PreemptMode=REQUEUE``), ``scontrol requeue JOB``: SIGTERM, the same stop; Slurm requeues the job.
- ``scancel JOB``: SIGTERM, the same stop, and the job ends: the trial waits, stopped, for the next worker (the
  same ``--launcher slurm`` command again resumes it first).
- A job killed outright (SIGKILL, a node lost): its trial stops beating and another worker of the study re-runs it
  from its checkpoint once the heartbeat's grace has passed, as on one machine.

**A trial of several processes** (``train.devices`` x ``train.num_nodes`` > 1): each job asks for that many Slurm
tasks (:func:`job_parameters`), runs its worker as one of them, and the worker starts each trial under ``srun``
(:func:`srun_prefix`): Lightning's ``SLURMEnvironment`` takes the ranks from Slurm, and rank 0 alone reports.

**Storage.** Every job must reach the study: a SQLite file on this machine's disk is refused
(:func:`check_shareable`) unless ``--slurm-local-storage`` says the cluster is this one machine (a one-node
cluster, as the tests' is); the way out is PostgreSQL, or Optuna's gRPC proxy in front of it (:mod:`.proxy`). The
results folder and the data cache must be on a filesystem every node mounts (a cluster's home or scratch).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..base.errors import UserError
from ..base.redact import mask_url

#: submitit's preemption and time-limit signal, which it reads from the environment where it is imported (here
#: and in each job): USR1, the one ``ltfm train`` and the sweep worker stop on already (USR2 would kill them)
SIGNAL_ENV, SIGNAL = "SUBMITIT_PREEMPT_SIGNAL", "USR1"
#: The user attribute of a trial naming the Slurm job whose worker claimed it (``<array job>_<task>``, or the job id)
JOB_ATTR = "slurm_job"
#: How many times a job may reach its time limit and be requeued (submitit's ``max_num_timeout``, 3 by default,
#: after which it would not requeue: a row longer than three time limits would then wait for another command)
MAX_TIME_LIMITS = 10_000
#: How long a stopped worker may take to stop its trial (its step, its checkpoint) and put it back
STOP_PATIENCE_S = 300.0


@dataclasses.dataclass
class SlurmOptions:
    """What the jobs ask Slurm for (``ltfm sweep --help``: ``--jobs``, ``--partition``, ...)."""

    jobs: int = 1  # workers, one job of the array each
    partition: str | None = None
    time_min: int = 240  # each job's time limit; the job is requeued before it (signal_s) and resumes
    cpus: int = 2  # CPUs of each job (its trial's train.threads, unless the overrides set them)
    gpus: int = 0  # GPUs of each job (on its node)
    mem_gb: float | None = None
    signal_s: int = 120  # seconds before the time limit at which the job is told to stop (SIGUSR1) and requeued
    extra: tuple[str, ...] = ()  # other sbatch options, as --key=value
    nodes: int = 1  # nodes of each job: its trials' train.num_nodes
    tasks_per_node: int = 1  # Slurm tasks of each job on each node: its trials' processes per node (train.devices)


def trial_shape(train_cfg, gpus: int = 0) -> tuple[int, int]:
    """(nodes, processes per node) a trial of ``train_cfg`` (its ``num_nodes`` and ``devices``) runs on: what each
    job asks Slurm for (``--nodes``, ``--ntasks-per-node``). ``devices`` auto or -1 with ``gpus`` > 1 or several
    nodes is refused: the login node cannot count a compute node's GPUs, and the job's tasks must be that count."""
    from ..training.train import world_size

    if train_cfg.devices.strip() in ("auto", "-1") and (gpus > 1 or train_cfg.num_nodes > 1):
        raise UserError(f"--launcher slurm: train.devices={train_cfg.devices.strip()} cannot size the jobs' tasks: "
                        "give the processes per node as a count (train.devices=N, with --gpus-per-job N)")
    return train_cfg.num_nodes, max(1, world_size(train_cfg) // train_cfg.num_nodes)


def srun_prefix(train_cfg, environ) -> list[str]:
    """In a job of ours (its worker sets :data:`~..training.train.LAUNCHER_REQUEUES_ENV`), a trial of several
    processes starts as the tasks of a job step of its own: ``srun --nodes N --ntasks N*D --ntasks-per-node D``
    before its ``ltfm train``, so that Lightning's ``SLURMEnvironment`` takes each rank from Slurm (``SLURM_PROCID``;
    rank 0 alone reports to Optuna, logs to W&B and writes the run's summary, which the worker reads as the trial's
    one result). ``--overlap``: the step shares the CPUs of the job's first step, where the worker waits;
    ``--disable-status``: the worker's SIGINT (a stop at the end of the step) reaches the ranks at once. A trial of
    one process, of ``devices`` auto or -1 (counted on the node: not what the job was sized by), or outside such a
    job: [] (Lightning starts any ranks itself, as on a workstation).

    The ranks meet on a port free on this node now (``MASTER_PORT``, unless the user set one): Lightning's
    ``SLURMEnvironment`` would take 15000 + the job id's last 4 digits, which two jobs on one node share when
    their ids end alike (job 10003 and 20003; or two clusters' job 3 on one machine) and then fail to meet. The
    worker runs on the job's first node, where rank 0 of the step runs."""
    from ..training.train import LAUNCHER_REQUEUES_ENV

    nodes, per_node = trial_shape(train_cfg)
    if nodes * per_node <= 1 or train_cfg.devices.strip() in ("auto", "-1") or not environ.get("SLURM_JOB_ID") \
            or not environ.get(LAUNCHER_REQUEUES_ENV):
        return []
    port = [] if environ.get("MASTER_PORT") else [f"--export=ALL,MASTER_PORT={free_port()}"]
    return ["srun", "--overlap", "--unbuffered", "--disable-status", "--kill-on-bad-exit=1", *port,
            f"--nodes={nodes}", f"--ntasks={nodes * per_node}", f"--ntasks-per-node={per_node}"]


def free_port() -> int:
    """A TCP port free on this machine now (the kernel's choice), for a trial's ranks to meet on."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def job_attrs(environ) -> dict[str, str]:
    """The Slurm job a process runs in, as a trial's user attribute (:data:`JOB_ATTR`); {} outside Slurm."""
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return {JOB_ATTR: f"{array}_{task}" if array and task else job}


def check_shareable(url: str, local_ok: bool) -> None:
    """Refuse a storage the jobs' nodes cannot share (a SQLite file: on this machine's disk, and SQLite's locks do
    not hold across a network filesystem), unless ``local_ok`` (``--slurm-local-storage``: one node)."""
    if url.startswith("sqlite") and not local_ok:
        raise UserError(f"--launcher slurm: storage {mask_url(url)} is a SQLite file the jobs' nodes cannot share: "
                        "give --storage postgresql://user@host/db (or grpc://host:port of `ltfm sweep "
                        "--serve-storage`), or --slurm-local-storage if the cluster is this one machine")


def sbatch_extra(words: list[str]) -> dict[str, str | bool]:
    """``--slurm-arg --key=value`` (or ``key=value``, or ``--flag``) as submitit's ``slurm_additional_parameters``."""
    out: dict[str, str | bool] = {}
    for w in words:
        key, eq, value = w.lstrip("-").partition("=")
        if not key:
            raise UserError(f"--slurm-arg {w!r}: give an sbatch option as --key=value (e.g. --slurm-arg "
                            "--account=lab) or --flag")
        out[key.replace("-", "_")] = value if eq else True
    return out


class SweepJob:
    """What one job of the array runs: the sweep's worker, as a process of its own (the job's own process stays
    free to answer submitit's signals). ``checkpoint`` is submitit's hook for a job told to stop (its time limit,
    ``scancel --signal=USR1``): it waits for the worker to have put its trial back, then returns the same job,
    which submitit requeues."""

    def __init__(self, argv: list[str], cwd: str):
        self.argv, self.cwd = list(argv), cwd
        self.proc: subprocess.Popen | None = None

    def __call__(self) -> int:
        from ..training.train import LAUNCHER_REQUEUES_ENV

        env = {**os.environ, LAUNCHER_REQUEUES_ENV: "1"}  # its trials stop on SIGUSR1; this job's requeue is ours
        self.proc = subprocess.Popen([sys.executable, "-m", "lightning_tfm", *self.argv], cwd=self.cwd, env=env,
                                     stdin=subprocess.DEVNULL)
        while (rc := self.proc.poll()) is None:  # polled, not waited: a signal's checkpoint() may poll it meanwhile
            time.sleep(1.0)
        if rc not in (0, 1):
            raise RuntimeError(f"the sweep worker exited {rc}")
        return rc

    def checkpoint(self):
        import submitit

        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it has the signal from Slurm too: a second one is ignored
                proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + STOP_PATIENCE_S
            while proc.poll() is None and not _zombie(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.5)
        return submitit.helpers.DelayedSubmission(SweepJob(self.argv, self.cwd))

    def __getstate__(self):
        return {"argv": self.argv, "cwd": self.cwd}

    def __setstate__(self, state):
        self.__init__(state["argv"], state["cwd"])


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits to be reaped (its state in /proc), for a poll that cannot reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def job_parameters(sweep_name: str, opts: SlurmOptions) -> dict:
    """submitit's parameters of each job of the array. A job of several tasks (``opts.nodes`` x
    ``opts.tasks_per_node``: a trial of several processes, :func:`srun_prefix`) runs its worker as one task
    (``srun_args``): the trial's own step starts its ranks."""
    params = {"time": opts.time_min, "cpus_per_task": opts.cpus, "ntasks_per_node": opts.tasks_per_node,
              "nodes": opts.nodes, "job_name": f"ltfm-{sweep_name}", "signal_delay_s": opts.signal_s,
              "additional_parameters": {"requeue": True, **sbatch_extra(list(opts.extra))},
              "array_parallelism": opts.jobs}
    if opts.nodes * opts.tasks_per_node > 1:
        params["srun_args"] = ["--nodes=1", "--ntasks=1"]
    if opts.partition:
        params["partition"] = opts.partition
    if opts.gpus:
        params["gpus_per_node"] = opts.gpus
    if opts.mem_gb is not None:
        params["mem"] = f"{int(opts.mem_gb * 1024)}MB"
    return params


def submit(sweep_file: str, sweep_name: str, overrides: list[str], url: str, logs: Path, opts: SlurmOptions,
           say=print) -> list[str]:
    """Submit ``opts.jobs`` workers of the study as one Slurm job array; their job ids. Each job's log:
    ``<logs>/<job id>_0_log.out`` (submitit's names), which the lines said name."""
    os.environ[SIGNAL_ENV] = SIGNAL  # before submitit is imported: it reads it once; the jobs inherit it
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    from .storage import STORAGE_ENV

    os.environ[STORAGE_ENV] = url  # the jobs' environment (sbatch exports this one): never argv, never the pickle
    try:
        import submitit
    except ImportError:
        raise UserError("--launcher slurm needs submitit: pip install 'lightning_tfm[slurm]'") from None
    if not any(o.split("=", 1)[0].strip() == "train.threads" for o in overrides):
        overrides = [*overrides, f"train.threads={opts.cpus}"]
    executor = submitit.SlurmExecutor(folder=str(logs), max_num_timeout=MAX_TIME_LIMITS)
    executor.update_parameters(**job_parameters(sweep_name, opts))
    argv = ["sweep", sweep_file, "--storage-from-env", *overrides]
    try:
        with executor.batch():
            pending = [executor.submit(SweepJob(argv, os.getcwd())) for _ in range(opts.jobs)]
    except (FileNotFoundError, subprocess.CalledProcessError, RuntimeError) as e:
        detail = str(getattr(e, "output", b"") or e).strip().splitlines()
        raise UserError(f"sbatch failed: {(detail[-1] if detail else e)!s:.300}: check the --partition and "
                        "--slurm-arg options, and that this is a Slurm login node (sbatch on PATH)") from None
    ids = [j.job_id for j in pending]
    say(f"[{sweep_name}] submitted {len(ids)} Slurm job(s) of {opts.cpus} CPU(s)"
        + (f" and {opts.gpus} GPU(s)" if opts.gpus else "") + f", {opts.time_min} min each (requeued before it): "
        + " ".join(ids))
    say(f"[{sweep_name}] their logs: {logs}/<job id>_0_log.out (and .err); squeue --me shows them, "
        f"scancel {ids[0].split('_')[0]} stops them (their trials go back to the queue)")
    return ids

