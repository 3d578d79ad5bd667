"""``ltfm sweep --launcher slurm`` on a real one-node Slurm cluster (tests/slurm_cluster.py: Debian's slurm-wlm and
munge on loopback) and a real PostgreSQL (tests/pg.py), through the commands a user types: the jobs complete every
row once, as the same sweep run here does; a job told to stop (``scancel --signal=USR1``: Slurm's warning before the
time limit) is requeued and its trial resumes from its step to the weights an unstopped run ends with; so is a job
that reaches its time limit (Slurm's own signal); a trial of two devices runs as two Slurm tasks of its job (``srun``
inside it) with one result and one W&B run; a job killed outright (SIGKILL to each of its processes; its trial held
with SIGSTOP first, so it cannot finish before the kill) leaves its trial to the heartbeat, which runs it again
once; ``--status`` names the jobs. Every wait is for a count or a file (a checkpoint step, the jobs gone from
``squeue``), bounded by a patience that only a broken cluster reaches. The one-line refusals need no cluster:
tests/test_cluster_cli.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from lightning_tfm.training.runs.run_folder import LOCK_FILE, lock_free

from conftest import ltfm, write_sweep
from pg import pg_url, postgres  # noqa: F401  (fixtures)
from slurm_cluster import Cluster, missing

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

#: A bound on every wait: only a cluster that does not schedule reaches it (the rows train for seconds)
PATIENCE_S = 900.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    c = Cluster(tmp_path_factory.mktemp("slurm")).up()
    try:
        yield c
    finally:
        c.down()


def wait_for(what: str, check, patience: float = PATIENCE_S, every: float = 1.0):
    """``check()``'s first true value, polled; the test fails naming ``what`` past ``patience``."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"waited {patience:.0f} s for {what}")


def submit(cluster: Cluster, sweep: Path, storage: str, results: Path, data_dir: Path, *extra: str) -> list[str]:
    """``ltfm sweep SWEEP --launcher slurm ...``: the job ids it printed."""
    p = ltfm("sweep", sweep, "--launcher", "slurm", "--storage", storage, "--cpus-per-job", "1", *extra,
             f"data.path={data_dir}", f"run.results_dir={results}", env=cluster.env({}))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = re.search(r"submitted \d+ Slurm job\(s\).*: ([\d_ ]+)$", p.stdout, re.M)
    assert m, p.stdout
    assert "ltfm: next:" in p.stderr and str(results / "sweep-logs") in p.stdout  # where the logs are, what next
    return m.group(1).split()


def queued(cluster: Cluster, job_ids: list[str]) -> list[str]:
    """The jobs of ``job_ids`` Slurm still has (pending, running, completing)."""
    base = {j.split("_")[0] for j in job_ids}
    p = cluster.run("squeue", "-h", "-o", "%i %T", check=False)
    return [line for line in p.stdout.splitlines() if line.split()[0].split("_")[0] in base]


def status(sweep: Path, storage: str, results: Path) -> list[dict]:
    p = ltfm("sweep", sweep, "--status", "--json", "--storage", storage, f"run.results_dir={results}")
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def release_requeued(cluster: Cluster, job: str) -> bool:
    """A requeued job waits out Slurm's requeue delay (BeginTime, ~2 min): started now, as an admin may. True once
    the job runs again (or has run again to its end); not while it is still being requeued (COMPLETING, REQUEUED)."""
    show = cluster.run("scontrol", "show", "job", job, check=False).stdout
    if "JobState=PENDING" in show and "Reason=BeginTime" in show:
        cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
    return "Restarts=1" in show and ("JobState=RUNNING" in show or "JobState=COMPLETED" in show)


def held_trial(results: Path, past: int) -> tuple[Path, int] | None:
    """A run past step ``past`` whose trial still trains, held (SIGSTOP) where it stands, and its process: it
    cannot finish before the test kills it, however fast the machine (the run's lock file names the process that
    trains it). None while there is none."""
    for run in results.glob("*/"):
        if not any(int(p.stem.split("=")[1]) >= past for p in run.glob("checkpoints/step=*.ckpt")):
            continue
        try:
            pid = json.loads((run / LOCK_FILE).read_text())["pid"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if lock_free(run):
            continue  # finished: no process trains it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        if not lock_free(run):
            return run, pid
        with contextlib.suppress(ProcessLookupError):  # it finished in between: let it go
            os.kill(pid, signal.SIGCONT)
    return None


def kill_outright(cluster: Cluster, job: str) -> None:
    """SIGKILL to every process of ``job`` at once, as a lost node leaves it (``scancel --signal=KILL`` is a cancel:
    SIGTERM first, which stops the trial cleanly). The node is this machine: ``scontrol listpids`` names them."""
    import os
    import signal

    raw = cluster.run("squeue", "-h", "-j", job, "-o", "%A").stdout.split()[0]  # an array task's own job id
    pids = [int(line.split()[0]) for line in cluster.run("scontrol", "listpids", raw).stdout.splitlines()[1:]
            if line.split() and line.split()[0].isdigit()]
    assert pids, f"no processes of job {job}"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def step_checkpoints(results: Path) -> list[int]:
    return sorted(int(p.stem.split("=")[1]) for p in results.glob("*/checkpoints/step=*.ckpt"))


def test_two_jobs_complete_every_row_once_as_the_same_sweep_here(cluster, pg_url, data_dir, tmp_path):  # noqa: F811
    sweep = write_sweep(tmp_path / "two.yaml", "two", {"base": {}, "A1": {"model.heads": 1, "model.d_k": 32,
                                                                          "model.d_v": 32}})
    results = tmp_path / "results"
    jobs = submit(cluster, sweep, pg_url, results, data_dir, "--jobs", "2")
    assert len(jobs) == 2
    wait_for("the jobs to leave the queue", lambda: not queued(cluster, jobs))
    rows = status(sweep, pg_url, results)
    assert sorted(r["variant"] for r in rows) == ["A1", "base"]  # every row once
    assert all(r["state"] == "complete" for r in rows), rows
    assert {r["slurm_job"] for r in rows} <= set(jobs) and all(r["slurm_job"] for r in rows)
    shown = ltfm("sweep", sweep, "--status", "--storage", pg_url, f"run.results_dir={results}").stdout
    assert "slurm job" in shown and all(r["slurm_job"] in shown for r in rows)
    # the same sweep here, one worker, its own storage and results: the same runs, the same values
    here = tmp_path / "here"
    p = ltfm("sweep", sweep, f"data.path={data_dir}", f"run.results_dir={here}")
    assert p.returncode == 0, p.stdout[-2000:]
    local = {r["variant"]: r for r in status(sweep, f"sqlite:///{here / 'two.db'}", here)}
    for r in rows:
        assert Path(r["run_dir"]).name == Path(local[r["variant"]]["run_dir"]).name
        assert r["value"] == pytest.approx(local[r["variant"]]["value"], rel=1e-6)


def _weights(run_dir: Path) -> dict:
    import torch

    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.long  # make test-long; also exercised by tests/soak/slurm_soak.py (requeues, kills)
def test_a_job_told_to_stop_is_requeued_and_its_trial_resumes_from_its_step(cluster, pg_url, data_dir,  # noqa: F811
                                                                            tmp_path):
    sweep = write_sweep(tmp_path / "stop.yaml", "stop", {"base": {}})
    results, steps = tmp_path / "results", ["train.max_steps=300", "train.checkpoint_every_steps=10"]
    (job,) = submit(cluster, sweep, pg_url, results, data_dir, *steps)
    wait_for("a step checkpoint at step 30", lambda: any(s >= 30 for s in step_checkpoints(results)), every=0.2)
    cluster.run("scancel", "--signal=USR1", job)  # Slurm's warning before the time limit, sent now
    wait_for("the job to be requeued and run again", lambda: release_requeued(cluster, job))
    wait_for("the job to leave the queue", lambda: not queued(cluster, [job]))
    (row,) = status(sweep, pg_url, results)
    assert row["state"] == "complete" and row["steps"] == 300
    run_dir = Path(row["run_dir"])
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["version_0", "version_1"]  # two attempts
    first_log = (results / "sweep-logs" / "stop").glob("trial-*.log")
    said = "\n".join(p.read_text() for p in first_log)
    resumed = [int(m) for m in re.findall(r"training \S+ from step (\d+) to 300", said)]
    assert resumed[0] == 0 and resumed[-1] >= 30, said[-2000:]  # resumed at the step it stopped, not from 0
    # the weights equal those of the same run never stopped
    here = tmp_path / "here"
    p = ltfm("sweep", sweep, f"data.path={data_dir}", f"run.results_dir={here}", *steps)
    assert p.returncode == 0, p.stdout[-2000:]
    (other,) = [d for d in here.iterdir() if (d / "checkpoints").is_dir()]
    a, b = _weights(run_dir), _weights(other)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def _ckpt_step(path: Path) -> int | None:
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
    except (OSError, RuntimeError, KeyError, EOFError):
        return None


@pytest.mark.long  # make test-long
def test_a_job_at_its_time_limit_is_requeued_and_its_trial_resumes_from_its_step(
        cluster, pg_url, data_dir, tmp_path):  # noqa: F811
    """``--time 2 --signal-before 30``: Slurm itself tells the job to stop before its limit (no ``scancel``); the
    trial cannot finish in 2 minutes anywhere (10^6 steps), so it is put back *stopped* at some step k > 0 with its
    ``last.ckpt`` there, the job is requeued, and the resumed trial trains past k. Counted, never timed."""
    sweep = write_sweep(tmp_path / "limit.yaml", "limit", {"base": {}})
    results = tmp_path / "results"
    (job,) = submit(cluster, sweep, pg_url, results, data_dir, "--time", "2", "--signal-before", "30",
                    "train.max_steps=1000000", "train.checkpoint_every_steps=5")

    stopped_requeued_and_resumed(cluster, job, sweep, pg_url, results, 1_000_000)


def stopped_requeued_and_resumed(cluster: Cluster, job: str, sweep: Path, storage: str, results: Path,
                                 max_steps: int) -> None:
    """Waits (counts, never time) for the one trial of ``sweep`` to be put back *stopped* with its ``last.ckpt`` at
    a step k > 0, for ``job`` to be requeued and run again, and for the resumed trial (its log: from step k) to
    write a step checkpoint past k; then cancels the job: the trial is stopped again, for the next worker."""
    def stopped_at():  # the trial back in the queue, stopped, and the step of its last.ckpt (> 0)
        for r in status(sweep, storage, results):
            if r["state"] == "stopped" and r["run_dir"]:
                k = _ckpt_step(Path(r["run_dir"]) / "checkpoints" / "last.ckpt")
                return (r, k) if k else None
        return None
    row, k = wait_for("the trial stopped, with a last.ckpt past step 0", stopped_at)
    assert row["slurm_job"] == job
    wait_for("the job to be requeued (Restarts=1) and run again", lambda: release_requeued(cluster, job))
    show = cluster.run("scontrol", "show", "job", job).stdout
    assert "Restarts=1" in show and "Requeue=1" in show, show
    run_dir = Path(row["run_dir"])
    wait_for(f"the resumed trial to train past step {k}", lambda: any(
        int(p.stem.split("=")[1]) > k for p in run_dir.glob("checkpoints/step=*.ckpt")), every=0.5)
    said = "\n".join(p.read_text() for p in (results / "sweep-logs" / sweep.stem).glob("trial-*.log"))
    resumed = [int(m) for m in re.findall(rf"training \S+ from step (\d+) to {max_steps}", said)]
    assert resumed[:1] == [0] and k in resumed[1:], said[-2000:]  # the second attempt started at k, not at 0
    cluster.run("scancel", job)
    wait_for("the job to leave the queue", lambda: not queued(cluster, [job]))
    (row,) = status(sweep, storage, results)
    assert row["state"] == "stopped", row  # cancelled: stopped again, waiting for the next worker


@pytest.mark.long  # make test-long; also exercised by tests/soak/slurm_soak.py (requeues, kills)
def test_a_job_killed_outright_leaves_its_trial_to_the_heartbeat(cluster, pg_url, data_dir, tmp_path):  # noqa: F811
    sweep = write_sweep(tmp_path / "kill.yaml", "kill", {"base": {}, "A1": {"model.heads": 1, "model.d_k": 32,
                                                                            "model.d_v": 32}})
    results = tmp_path / "results"
    jobs = submit(cluster, sweep, pg_url, results, data_dir, "--jobs", "2", "train.max_steps=200")

    run, _ = wait_for("a trial past step 20", lambda: held_trial(results, 20), every=0.2)
    victim = wait_for("the frozen trial's row", lambda: next(
        (r for r in status(sweep, pg_url, results) if r["state"] == "running" and r["slurm_job"] and r["run_dir"]
         and Path(r["run_dir"]).resolve() == run.resolve()), None))
    kill_outright(cluster, victim["slurm_job"])
    wait_for("the jobs to leave the queue", lambda: not queued(cluster, jobs))
    rows = status(sweep, pg_url, results)
    done = [r for r in rows if r["state"] == "complete"]
    assert sorted(r["variant"] for r in done) == ["A1", "base"]  # each row completed once
    killed = [r for r in rows if r["number"] == victim["number"]][0]
    assert killed["state"] == "fail" and "retried as trial" in (killed["note"] or "")
    assert len([r for r in rows if r["variant"] == victim["variant"]]) == 2  # run again once


def test_a_trial_of_two_devices_runs_as_two_slurm_tasks_with_one_result_and_one_wandb_run(cluster, pg_url,  # noqa: F811
                                                                                         data_dir, tmp_path, request):
    """``train.devices=2`` (CPU, gloo DDP standing in for 2 GPUs): the job asks for 2 tasks on its node, and the
    trial's ``ltfm train`` runs under ``srun`` as those 2 tasks (Lightning's SLURMEnvironment: its ranks from Slurm);
    it completes with one result and one W&B run (rank 0's), read back from its files."""
    from wandb_offline import read_runs

    sweep = write_sweep(tmp_path / "ddp.yaml", "ddp", {"base": {}})
    results = tmp_path / "results"
    # The ports Lightning's SLURMEnvironment would give this cluster's jobs (15000 + the job id's last 4 digits),
    # held as another job's ranks on this node would hold them (two clusters on one machine did): the trial's
    # ranks meet on a port of their own.
    held = []
    for port in range(15001, 15200):
        s = socket.socket()
        try:
            s.bind(("", port))
            s.listen()
            held.append(s)
        except OSError:
            s.close()
    request.addfinalizer(lambda: [s.close() for s in held])
    (job,) = submit(cluster, sweep, pg_url, results, data_dir, "train.devices=2", "train.strategy=ddp",
                    "train.accelerator=cpu", "train.precision=32", "train.record_batches=true")
    show = cluster.run("scontrol", "show", "job", job).stdout
    assert "NumTasks=2 " in show, show  # the job: --ntasks-per-node=2
    raw = cluster.run("squeue", "-h", "-j", job, "-o", "%A").stdout.split()[0]  # its own job id
    wait_for("the job to leave the queue", lambda: not queued(cluster, [job]))
    (row,) = status(sweep, pg_url, results)
    assert row["state"] == "complete" and row["steps"] == 20 and row["value"] is not None, row
    run_dir = Path(row["run_dir"])
    assert sorted(p.name for p in (run_dir / "batches").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]  # two ranks
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    slurmd_log = (cluster.root / "log" / "slurmd.log").read_text()
    assert f"launch task StepId={raw}.1 " in slurmd_log  # the trial: a step of its own (srun), after the worker's
    (run,) = read_runs(results)  # one W&B run, rank 0's
    assert run.run_id == row["wandb_run_id"] and run.config["train.devices"] in ("2", 2)


@pytest.mark.long  # make test-long
def test_a_trial_of_two_slurm_tasks_told_to_stop_is_requeued_and_resumes_from_its_step(
        cluster, pg_url, data_dir, tmp_path):  # noqa: F811
    """The stop of a trial whose ranks are Slurm tasks (``srun`` inside the job): ``scancel --signal=USR1`` reaches
    both ranks and the worker; the trial stops at one step with one ``last.ckpt``, the job is requeued and the
    trial resumes from that step on its two ranks."""
    sweep = write_sweep(tmp_path / "ddpstop.yaml", "ddpstop", {"base": {}})
    results = tmp_path / "results"
    (job,) = submit(cluster, sweep, pg_url, results, data_dir, "train.devices=2", "train.strategy=ddp",
                    "train.accelerator=cpu", "train.precision=32", "train.max_steps=1000000",
                    "train.checkpoint_every_steps=10")
    wait_for("a step checkpoint at step 20", lambda: any(s >= 20 for s in step_checkpoints(results)), every=0.2)
    cluster.run("scancel", "--signal=USR1", job)
    stopped_requeued_and_resumed(cluster, job, sweep, pg_url, results, 1_000_000)
