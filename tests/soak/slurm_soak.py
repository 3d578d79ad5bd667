"""The soak's Slurm phase (issue #63): a sweep of Slurm jobs on a one-node cluster (tests/slurm_cluster.py) and a
PostgreSQL (tests/pg.py) while a seeded chaos driver, counting checkpoints rather than watching a clock, requeues
jobs (``scancel --signal=USR1``: the time-limit warning), kills every process of a job outright (a lost node) and
submits one in its place, and restarts the database; then the invariants: every row completed exactly once, none
run twice to completion, no completion without its run trained to its budget (no false completion), no trial left
running, no job left in the queue.

    OMP_NUM_THREADS=1 PYTHONPATH=. python tests/soak/slurm_soak.py --seed 1 --rows 6 --jobs 2 --actions 5

Root (slurmd runs the jobs as their user); a few minutes on 2 cores. Exit 1 when an invariant breaks.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # the jobs'

import yaml  # noqa: E402

from conftest import DATA, SMOKE, TINY, ltfm  # noqa: E402
from pg import start_server  # noqa: E402
from slurm_cluster import Cluster, missing  # noqa: E402
from test_slurm import kill_outright, queued, release_requeued  # noqa: E402

STEPS = 120


def say(msg: str) -> None:
    print(f"[slurm-soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_sweep(path: Path, rows: int) -> Path:
    variants = {"base": {}, **{f"D{i}": {"model.dropout": round(0.03 * i, 2)} for i in range(1, rows)}}
    path.write_text(yaml.safe_dump({
        "name": "slurmsoak", "experiment": str(SMOKE), "metric": "dev_loss", "pruner": {"type": "none"},
        "seeds": [1], "heartbeat": {"interval": 2, "grace": 10, "max_retry": 3},
        "overrides": {**TINY, "train.max_steps": STEPS}, "variants": variants}, sort_keys=False))
    return path


def submit(cluster, sweep, url, results, jobs: int) -> list[str]:
    p = ltfm("sweep", sweep, "--launcher", "slurm", "--jobs", jobs, "--cpus-per-job", "1", "--storage", url,
             f"data.path={DATA}", f"run.results_dir={results}", env=cluster.env({}), cwd=results.parent)
    if p.returncode != 0:
        raise SystemExit(f"submit failed: {p.stderr[-2000:]}")
    line = [x for x in p.stdout.splitlines() if "submitted" in x][0]
    return line.rsplit(": ", 1)[1].split()


def trials(sweep, url, results) -> list[dict]:
    p = ltfm("sweep", sweep, "--status", "--json", "--storage", url, f"run.results_dir={results}", cwd=results.parent)
    return json.loads(p.stdout) if p.returncode == 0 else []


def checkpoints(results: Path) -> int:
    return len(list(results.glob("*/checkpoints/step=*.ckpt")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--actions", type=int, default=5, help="chaos actions, one every --every new checkpoints")
    ap.add_argument("--every", type=int, default=6, help="new step checkpoints (all rows) between actions")
    args = ap.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"slurm-soak: {why}")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="ltfm-slurm-soak-"))
    cluster, server = Cluster(tmp / "slurm").up(), start_server()
    start = time.time()
    done_actions: list[str] = []
    try:
        url = server.create_database("soak")
        sweep, results = write_sweep(tmp / "slurmsoak.yaml", args.rows), tmp / "results"
        jobs = submit(cluster, sweep, url, results, args.jobs)
        say(f"{args.rows} rows, jobs {jobs}")
        mark = 0
        deadline = time.monotonic() + 3600
        while queued(cluster, jobs) and time.monotonic() < deadline:
            for j in jobs:
                release_requeued(cluster, j)  # a requeued job waits out Slurm's delay: started now
            n = checkpoints(results)
            if len(done_actions) < args.actions and n >= mark + args.every:
                mark = n
                running = [r for r in trials(sweep, url, results) if r["state"] == "running" and r["slurm_job"]]
                action = rng.choice(["requeue", "kill", "db restart"])
                if action != "db restart" and not running:
                    continue
                if action == "requeue":
                    victim = rng.choice(running)["slurm_job"]
                    cluster.run("scancel", "--signal=USR1", victim, check=False)
                elif action == "kill":
                    victim = rng.choice(running)["slurm_job"]
                    kill_outright(cluster, victim)
                    jobs += submit(cluster, sweep, url, results, 1)  # a job in its place
                else:
                    victim = "postgres"
                    server.stop()
                    time.sleep(3)
                    server.start()
                done_actions.append(f"{action} {victim}")
                say(f"chaos {len(done_actions)}: {action} {victim} (at {n} checkpoints)")
            time.sleep(1)
        rows = trials(sweep, url, results)
    finally:
        cluster.down()
        server.stop()
    problems = []
    complete: dict[str, int] = {}
    for r in rows:
        if r["state"] == "complete":
            complete[r["variant"]] = complete.get(r["variant"], 0) + 1
            summary = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
            if summary.get("status") != "completed" or summary.get("steps") != STEPS:
                problems.append(f"false completion: trial {r['number']} {r['variant']}: {summary.get('status')} "
                                f"at {summary.get('steps')}")
        if r["state"] in ("running", "waiting", "stopped"):
            problems.append(f"trial {r['number']} {r['variant']} left {r['state']}")
    expected = {"base", *{f"D{i}" for i in range(1, args.rows)}}
    for v in sorted(expected):
        if complete.get(v, 0) != 1:
            problems.append(f"row {v} completed {complete.get(v, 0)} times")
    figures = {"seed": args.seed, "rows": args.rows, "jobs submitted": len(jobs), "chaos": done_actions,
               "trials": len(rows), "attempts beyond one per row": len(rows) - len(expected),
               "minutes": round((time.time() - start) / 60, 1), "problems": problems}
    say(json.dumps(figures))
    if not problems:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
