"""The cluster options of ``ltfm sweep`` that need no cluster (issue #63): a storage the jobs' nodes cannot share is
refused in one line naming the way out, before anything is written; Slurm options without ``--launcher slurm`` and
the proxy's address without ``--serve-storage`` are refused, never ignored; a proxy URL that is malformed or that no
proxy answers is one line; the proxy refuses SQLite behind it. The cluster itself: tests/test_slurm.py."""
from __future__ import annotations

import socket

import pytest

from conftest import write_sweep
from pg import free_port


def _one_line(p, *words: str) -> None:
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ltfm: error:"), p.stderr
    assert "Traceback" not in p.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_a_sqlite_storage_is_refused_for_slurm_jobs_and_nothing_is_written(tmp_path, ltfm_here, data_dir):
    sweep = write_sweep(tmp_path / "s.yaml", "s", {"base": {}})
    results = tmp_path / "results"
    p = ltfm_here("sweep", sweep, "--launcher", "slurm", "--jobs", "2", f"data.path={data_dir}",
                  f"run.results_dir={results}")
    _one_line(p, "SQLite", "postgresql://", "grpc://", "--slurm-local-storage")
    assert not results.exists()  # no study, no corpus, no job


def test_gpus_the_login_node_cannot_count_are_refused_before_anything_is_written(tmp_path, ltfm_here, data_dir):
    sweep = write_sweep(tmp_path / "s.yaml", "s", {"base": {}})
    results = tmp_path / "results"
    p = ltfm_here("sweep", sweep, "--launcher", "slurm", "--slurm-local-storage", "--gpus-per-job", "4",
                  "train.devices=auto", f"data.path={data_dir}", f"run.results_dir={results}")
    _one_line(p, "train.devices=auto", "train.devices=N", "--gpus-per-job N")
    assert not results.exists()  # no study, no corpus, no job


@pytest.mark.parametrize("args, named", [
    (["--jobs", "2"], "--jobs"),
    (["--partition", "gpu", "--time", "60"], "--partition, --time"),
    (["--slurm-arg=--account=lab"], "--slurm-arg"),
    (["--launcher", "slurm", "--status"], "--status"),
    (["--launcher", "slurm", "--workers", "2"], "--workers"),
    (["--launcher", "slurm", "--jobs", "0"], "--jobs 0"),
    (["--port", "13000"], "--serve-storage"),
])
def test_cluster_options_that_do_nothing_together_are_refused(tmp_path, ltfm_here, args, named):
    sweep = write_sweep(tmp_path / "s.yaml", "s", {"base": {}})
    p = ltfm_here("sweep", sweep, *args, f"run.results_dir={tmp_path / 'results'}")
    _one_line(p, named)
    assert not (tmp_path / "results").exists()


def test_a_proxy_url_that_is_malformed_or_unanswered_is_one_line(tmp_path, ltfm_here):
    sweep = write_sweep(tmp_path / "s.yaml", "s", {"base": {}})
    p = ltfm_here("sweep", sweep, "--status", "--storage", "grpc://nohost", f"run.results_dir={tmp_path}")
    _one_line(p, "grpc://host:port")
    port = free_port()  # nothing listens there
    p = ltfm_here("sweep", sweep, "--status", "--storage", f"grpc://127.0.0.1:{port}", f"run.results_dir={tmp_path}")
    _one_line(p, f"grpc://127.0.0.1:{port}", "--serve-storage")


def test_the_proxy_serves_no_sqlite_and_takes_no_sweep_file(tmp_path, ltfm_here):
    p = ltfm_here("sweep", "--serve-storage", f"sqlite:///{tmp_path / 'x.db'}")
    _one_line(p, "PostgreSQL")
    assert not (tmp_path / "x.db").exists()
    p = ltfm_here("sweep", tmp_path / "s.yaml", "--serve-storage", "postgresql://u@127.0.0.1:1/db")
    _one_line(p, "no sweep file")


def test_a_trial_in_a_sweeps_slurm_job_never_requeues_the_job_itself(monkeypatch):
    """A sweep's job is requeued by its launcher (submitit), once the trial is back in the queue: the trial gets
    Lightning's SLURM environment without its requeue where Slurm runs its ranks (one task a rank), and Lightning's
    own where it runs more ranks than the job has tasks (it starts them, as on a workstation: a trial of
    ``train.devices`` auto or -1, which the job's tasks were not sized by); outside such a job, Lightning's choice."""
    from pytorch_lightning.plugins.environments import LightningEnvironment, SLURMEnvironment

    from lightning_tfm.training.train import LAUNCHER_REQUEUES_ENV, job_plugins

    monkeypatch.delenv(LAUNCHER_REQUEUES_ENV, raising=False)
    assert job_plugins(1) == []
    monkeypatch.setenv(LAUNCHER_REQUEUES_ENV, "1")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "ltfm-table3")
    (one,) = job_plugins(1)
    assert isinstance(one, SLURMEnvironment) and one.auto_requeue is False
    (two,) = job_plugins(2)
    assert type(two) is LightningEnvironment


def test_a_trial_on_two_nodes_gets_a_job_of_two_nodes_and_its_ranks_from_srun(tmp_path, monkeypatch):
    """train.num_nodes=2 train.devices=4 (no cluster has two nodes here): each job asks for --nodes=2
    --ntasks-per-node=4 and runs its worker as one task; inside the job the trial's ``ltfm train`` starts under
    ``srun`` as 8 tasks, 4 a node (Lightning's SLURMEnvironment takes each rank from them); a trial of one process,
    or outside a sweep's job, starts as it does on a workstation."""
    import submitit

    from lightning_tfm.base.errors import UserError
    from lightning_tfm.sweep.slurm import SlurmOptions, job_parameters, srun_prefix, trial_shape
    from lightning_tfm.training.config.config import TrainConfig
    from lightning_tfm.training.train import LAUNCHER_REQUEUES_ENV

    two = TrainConfig(num_nodes=2, devices="4", accelerator="gpu")
    assert trial_shape(two) == (2, 4)
    params = job_parameters("t3", SlurmOptions(gpus=4, nodes=2, tasks_per_node=4))
    # submitit takes each of them (its executor checks them against the batch script it would write); the executor
    # wants srun on the machine, which has none where Slurm is not installed (.ci/run installs it): told it is there
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    submitit.SlurmExecutor(folder=str(tmp_path)).update_parameters(**params)
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)
    assert params["additional_parameters"]["requeue"] is True
    assert params["srun_args"] == ["--nodes=1", "--ntasks=1"]  # the worker: one task of the job
    job = {"SLURM_JOB_ID": "42", LAUNCHER_REQUEUES_ENV: "1"}
    prefix = srun_prefix(two, job)
    port = prefix.pop(5)  # the ranks' meeting port: free on this node now, not Lightning's 15000 + the job id
    assert prefix == ["srun", "--overlap", "--unbuffered", "--disable-status", "--kill-on-bad-exit=1",
                      "--nodes=2", "--ntasks=8", "--ntasks-per-node=4"]
    assert port.startswith("--export=ALL,MASTER_PORT=") and int(port.rsplit("=", 1)[1]) != 15042
    with socket.socket() as s:  # free when chosen: it binds
        s.bind(("127.0.0.1", int(port.rsplit("=", 1)[1])))
    assert "--export=ALL,MASTER_PORT=29500" not in srun_prefix(two, {**job, "MASTER_PORT": "29500"})  # the user's
    assert not any(w.startswith("--export") for w in srun_prefix(two, {**job, "MASTER_PORT": "29500"}))
    assert srun_prefix(TrainConfig(devices="auto"), job) == []  # counted on the node: Lightning's own launcher
    assert srun_prefix(two, {"SLURM_JOB_ID": "42"}) == []  # a Slurm job of the user's own: Lightning's choice
    assert srun_prefix(TrainConfig(), job) == []  # one process
    with pytest.raises(UserError, match="train.devices=N"):  # a login node cannot count a compute node's GPUs
        trial_shape(TrainConfig(devices="auto"), gpus=4)
    one_node = job_parameters("t3", SlurmOptions())
    assert (one_node["nodes"], one_node["ntasks_per_node"]) == (1, 1) and "srun_args" not in one_node
