"""A throwaway one-node Slurm cluster on loopback for the Slurm tests (and ``make slurm-up`` / ``make slurm-down``).

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them where missing): a folder of its own holds the
cluster's ``slurm.conf``, a munge key and socket, and Slurm's state, spool, pid and log files. ``munged`` runs with
that key and socket, then ``slurmctld`` and ``slurmd`` as daemons (root: this node runs its jobs as the user who
submits them, here root), on free loopback ports. Every client command (``sbatch``, ``squeue``, ``scancel``, and
submitit's calls of them) finds the cluster through ``SLURM_CONF``, which :meth:`Cluster.env` gives.

The node is this machine (its CPUs and memory as ``slurmd -C`` reports them), one partition ``debug``;
``proctrack/linuxproc`` (a job's processes are the descendants of its steps: a signal reaches each), no cgroups;
``KillWait`` long enough for a stopped trial to finish its step and write its checkpoint, and ``OverTimeLimit`` a
minute past a job's time limit for it to have itself requeued; jobs may be requeued.

    python tests/slurm_cluster.py up FOLDER     # prints: export SLURM_CONF=FOLDER/slurm.conf
    python tests/slurm_cluster.py down FOLDER
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: Seconds between the SIGTERM of a cancelled, requeued or preempted job and its SIGKILL: a trial stopping at the end
#: of its step, writing its checkpoint and put back in the queue needs a few (Slurm's default 30 s is enough too)
KILL_WAIT_S = 60
#: Minutes a job may run past its time limit before Slurm ends it: the job told to stop before its limit (SIGUSR1
#: up to 60 s earlier than ``--signal-before`` asks, or later: slurmctld checks its jobs' limits every 30 s or so)
#: finishes its step, writes its checkpoint and has itself requeued within them, on a loaded machine too
OVER_TIME_LIMIT_MIN = 1
#: How long the daemons may take to answer (``sinfo`` shows the node idle)
START_PATIENCE_S = 60.0


def missing() -> str | None:
    """Why a cluster cannot start here (None: it can)."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} not found: apt-get install slurm-wlm munge (.ci/run does)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user only when started as root: run the Slurm tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line() -> str:
    """``NodeName=localhost CPUs=.. RealMemory=..`` from ``slurmd -C`` (this machine as slurmd sees it)."""
    out = subprocess.run([_sbin("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    words = dict(w.split("=", 1) for w in out.split()[1:] if "=" in w and not w.startswith("UpTime"))
    mem = int(words.get("RealMemory", "1024"))
    return (f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={words.get('CPUs', '1')} RealMemory={mem} "
            f"Boards={words.get('Boards', '1')} SocketsPerBoard={words.get('SocketsPerBoard', '1')} "
            f"CoresPerSocket={words.get('CoresPerSocket', '1')} ThreadsPerCore={words.get('ThreadsPerCore', '1')} "
            "State=UNKNOWN")


def _sbin(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


@dataclass
class Cluster:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, base: dict | None = None) -> dict:
        """``base`` (default: this process's environment) with ``SLURM_CONF`` naming this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(cmd), capture_output=True, text=True, env=self.env(), check=check, timeout=timeout)

    def up(self) -> Cluster:
        r = self.root
        for sub in ("state", "spool", "log", "run", "munge"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        sock = r / "munge" / "munge.socket"
        subprocess.run([_sbin("munged"), "--force", f"--socket={sock}", f"--key-file={key}",
                        f"--pid-file={r / 'run' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
                        f"--seed-file={r / 'munge' / 'munged.seed'}"], check=True, capture_output=True, text=True)
        ctld, slurmd = _free_port(), _free_port()
        self.conf.write_text("\n".join([
            "ClusterName=ltfm-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            f"SlurmdPort={slurmd}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            f"KillWait={KILL_WAIT_S}",
            f"OverTimeLimit={OVER_TIME_LIMIT_MIN}",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "MinJobAge=600",
            _node_line(),
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
            ""]))
        env = self.env()
        subprocess.run([_sbin("slurmctld"), "-i"], check=True, env=env, capture_output=True, text=True)
        subprocess.run([_sbin("slurmd")], check=True, env=env, capture_output=True, text=True)
        deadline = time.monotonic() + START_PATIENCE_S
        while time.monotonic() < deadline:
            p = self.run("sinfo", "-h", "-o", "%t", check=False, timeout=20)
            if p.returncode == 0 and p.stdout.strip() in ("idle", "mix", "alloc"):
                return self
            if p.returncode == 0 and p.stdout.strip().startswith(("down", "drain")):
                self.run("scontrol", "update", "NodeName=localhost", "State=RESUME", check=False)
            time.sleep(0.5)
        logs = "; ".join(f"{f.name}: {f.read_text()[-400:]}" for f in (r / "log").glob("*.log"))
        self.down()
        raise RuntimeError(f"the Slurm cluster in {r} did not come up within {START_PATIENCE_S:.0f} s: {logs}")

    def down(self) -> None:
        """Cancel every job, stop the daemons (their pid files), leave the folder."""
        if self.conf.exists():
            self.run("scancel", "--full", "--user=root", check=False, timeout=20)
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / "run" / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("up", "down"):
        sys.exit("usage: python tests/slurm_cluster.py up|down FOLDER")
    cluster = Cluster(Path(sys.argv[2]).resolve())
    if sys.argv[1] == "up":
        why = missing()
        if why:
            sys.exit(f"slurm_cluster: {why}")
        cluster.up()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.down()
