"""How many concurrent workers one PostgreSQL takes, directly and through Optuna's gRPC storage proxy
(``ltfm sweep --serve-storage``): the figures of reports/cluster.md.

A throwaway PostgreSQL on loopback (tests/pg.py's: ``max_connections=50``, as a small shared server may have), and
for each count of workers N and each way (``direct``: ``postgresql://``; ``proxy``: ``grpc://`` to one proxy in front
of the same server) N worker processes, each opening the storage as a sweep worker does (``open_storage``: the
heartbeat on, its stale-trial retry) and running trivial trials (``study.optimize``: one suggested float, its value)
for ``--seconds`` after a common start (the study created first, once, as ``--launcher slurm`` does before it
submits). Measured: the trials completed per minute (all workers), the workers that
failed (a connection refused: "too many clients"), and the most connections the server held (``pg_stat_activity``,
sampled every 0.2 s).

    PYTHONPATH=. python bench/storage_workers.py --workers 8,32,64 --seconds 30 --out reports/cluster-bench.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def worker(url: str, go: float, seconds: float, out) -> None:
    """One worker: the storage opened as a sweep worker opens it, then trivial trials until ``go + seconds``."""
    import optuna

    from lightning_tfm.sweep.storage import open_storage, quiet_optuna

    quiet_optuna()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        storage = open_storage(url, heartbeat={"interval": 5, "grace": 60, "max_retry": 1})
        study = optuna.create_study(storage=storage, study_name="bench", load_if_exists=True)
        time.sleep(max(0.0, go - time.time()))
        n = 0
        while time.time() < go + seconds:
            study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
            n += 1
        out.put(("ok", n))
    except BaseException as e:  # noqa: BLE001 - counted: a worker the storage refused
        out.put(("failed", f"{e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"))


def create(url: str) -> None:
    """The study, created once before the workers start (as the command that submits a sweep's jobs does)."""
    import optuna

    from lightning_tfm.sweep.storage import open_storage

    optuna.create_study(storage=open_storage(url), study_name="bench", load_if_exists=True)


def connections(server) -> int:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=server.port, user=server.user, password=server.password,
                            dbname="postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            return int(cur.fetchone()[0]) - 1  # less this one
    finally:
        conn.close()


def measure(server, url: str, n: int, seconds: float) -> dict:
    ctx = mp.get_context("fork")
    first = ctx.Process(target=create, args=(url,))
    first.start()
    first.join()
    out = ctx.Queue()
    go = time.time() + 15 + 0.5 * n  # every worker has imported and opened its storage by then (2 cores)
    procs = [ctx.Process(target=worker, args=(url, go, seconds, out)) for _ in range(n)]
    for p in procs:
        p.start()
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.wait(0.2):
            try:
                peak[0] = max(peak[0], connections(server))
            except Exception:  # noqa: BLE001 - the server full: the next sample
                pass
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    results = [out.get(timeout=go - time.time() + seconds + 300) for _ in procs]
    stop.set()
    for p in procs:
        p.join(timeout=60)
    done = sum(r[1] for r in results if r[0] == "ok")
    failed = [r[1] for r in results if r[0] == "failed"]
    return {"workers": n, "trials": done, "trials_per_min": round(done / seconds * 60, 1), "failed_workers":
            len(failed), "first_failure": failed[0] if failed else None, "peak_connections": peak[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="8,32,64", help="worker counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each count runs its trials")
    ap.add_argument("--out", type=Path, help="the figures as JSON")
    args = ap.parse_args()
    from lightning_tfm.sweep.storage import machine_description

    from pg import free_port, start_server

    server = start_server()
    rows = []
    try:
        for n in [int(x) for x in args.workers.split(",")]:
            for way in ("direct", "proxy"):
                db = server.create_database(f"bench_{way}_{n}")
                proxy = None
                url = db
                if way == "proxy":
                    port = free_port()
                    proxy = subprocess.Popen([sys.executable, "-m", "lightning_tfm", "sweep", "--serve-storage", db,
                                              "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
                    proxy.stdout.readline()  # its first line: serving
                    url = f"grpc://localhost:{port}"
                try:
                    row = {"way": way, **measure(server, url, n, args.seconds)}
                finally:
                    if proxy is not None:
                        proxy.terminate()
                        proxy.wait(timeout=60)
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_description(), "seconds": args.seconds,
                                        "max_connections": 50, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
