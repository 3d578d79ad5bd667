"""``make soak``: a sweep run through a bad night, then checked.

A smoke-scale Table 3 sweep (``table3-soak.yaml``: 20 rows x 2 seeds) is run by 4 workers, once on SQLite and
once on PostgreSQL (a throwaway loopback cluster, as the test suite starts), and a search sweep
(``search-soak.yaml``) by 4 workers on SQLite, while a seeded chaos driver, logging every act to
``chaos.log``:

- measures T, the phase's trial time (its first trials completed, with every worker running: scale.py), and
  from then on every 0.7-1.4 T SIGKILLs a random worker (and starts another with the same command) or a random
  running trial's process;
- twice a sweep SIGSTOPs a worker and its trial past the heartbeat grace (Ctrl-Z), then SIGCONTs them;
- once a sweep fills the results filesystem (its own tmpfs) until writes fail, holds it, then frees it;
- on PostgreSQL, once stops the server for ~20 s and starts it again.

A phase ends when its sweep is finished; at its cap (3 x its chaos-free time in T, plus the holds), said on a
line of its own and counted as rows "unfinished at the cap", not as lost (a failure only if the work kept per
worker and T is below scale.MIN_RATE); or, a failure, when no checkpoint step is gained and no trial finished
for 5 T. Then every invariant is checked and printed with its count, and the figures are printed as one table
(``figures.md``, ``figures.json`` in the output folder; T and the kill interval among them):

- every (row, seed) has exactly one COMPLETE trial, whose value equals its run folder's summary.json (a
  finished result whose summary is gone or holds another value is a *lost* result; a row the sweep ended
  without is *given up*; both fail);
- every search trial that was started is finished (complete or pruned) or was re-run;
- no run folder holds ``-v1`` checkpoints, leftover temporary files, or a ``completed`` summary short of its
  budget; no run folder was trained by two processes at once (the lock audit log, ``LTFM_LOCK_LOG``);
- ``ltfm runs`` and ``ltfm report`` show every finished row;
- no traceback in any worker or trial log.

Usage (as root: tmpfs mounts, and PostgreSQL runs as the ``postgres`` user)::

    python tests/soak/soak.py --seed 1 [--out soak-out] [--storages sqlite,postgresql] [--search/--no-search]
                              [--workers 4] [--rows N]

``--rows N`` soaks only the first N variants (a few minutes, while developing the soak; its figures do not
compare with a full soak's). Exit 0 when every invariant holds, 1 when one does not (each failure printed),
2 on bad input.

SIGTERM, SIGINT or SIGHUP (a scheduler's stop, Ctrl-C, a closed terminal) stop the soak cleanly: its workers and
their trials are stopped, the PostgreSQL server stopped and its folder removed, the tmpfs mounts and the work
folder removed; one line says so and the exit code is 128 + the signal's number (:func:`stop_on_signals`). The
chaos log and the logs kept so far stay in the output folder.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # tests/pg.py: the throwaway PostgreSQL cluster
sys.path.insert(0, str(ROOT))

from lightning_tfm.sweep.storage import STORAGE_ENV  # noqa: E402
from lightning_tfm.training.runs.run_folder import LOCK_LOG_ENV  # noqa: E402

from scale import (  # noqa: E402
    CALIBRATION_TIMEOUT_S,
    CALIBRATION_TRIALS,
    HOLDS_S,
    MIN_RATE,
    STALL_T,
    chaos_scale,
    trial_time,
    work_kept,
    work_rate,
)

TMPFS_SIZE = "2g"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def say(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class ChaosLog:
    def __init__(self, path: Path):
        self.fh = open(path, "a")
        self.t0 = time.time()

    def __call__(self, phase: str, event: str, **kw) -> None:
        rec = {"t": round(time.time() - self.t0, 1), "phase": phase, "event": event, **kw}
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        say(f"{phase}: {event} " + " ".join(f"{k}={v}" for k, v in kw.items()))


# ----------------------------------------------------------------------------------------------- stopping
class Stopped(BaseException):
    """A stop signal (:data:`STOP_SIGNALS`) arrived: raised in the main thread, so every ``finally`` cleans up."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_STOP = {"signum": None, "held": 0}


def stop_on_signals() -> None:
    """SIGTERM, SIGINT and SIGHUP raise :class:`Stopped` (at the end of a :func:`signals_held` block when one
    arrives inside it); a signal ignored when the soak started (``nohup``) stays ignored. The first signal is
    remembered: a library call that swallows the exception raised inside it does not lose the stop, the driver's
    loop and each phase's start raise it again (:func:`check_stop`); a second signal, while the cleanup runs, does
    not cut it short."""
    def stop(signum, frame):  # noqa: ARG001
        if _STOP["signum"] is not None:
            return
        _STOP["signum"] = signum
        if not _STOP["held"]:
            raise Stopped(signum)

    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, stop)


def check_stop() -> None:
    """:class:`Stopped` when a stop signal arrived (and was not acted on yet)."""
    if _STOP["signum"] is not None and not _STOP["held"]:
        raise Stopped(_STOP["signum"])


@contextlib.contextmanager
def signals_held():
    """A stop signal that arrives while the block runs (a server started, a filesystem mounted, a worker started,
    and each recorded for the cleanup) stops the soak at the block's end, not inside it. (Not by the signal mask:
    the processes started inside would inherit it.)"""
    _STOP["held"] += 1
    try:
        yield
    finally:
        _STOP["held"] -= 1
    check_stop()


# ----------------------------------------------------------------------------------------------- processes
def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d))
    return out


def trial_of(worker_pid: int) -> int | None:
    """The ``ltfm train`` process a worker runs now, if any."""
    for pid in children(worker_pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in cmd:
            return pid
    return None


def signal_pid(pid: int | None, sig: int) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


@dataclass
class WorkerProc:
    index: int
    proc: subprocess.Popen
    log: Path
    stopped: bool = False


@dataclass
class Phase:
    """One sweep run through chaos: its figures, and the failures its checks found."""

    name: str
    storage: str
    sweep_file: Path
    results: Path
    url: str
    steps_per_trial: float = 1.0  # the rows' mean train.max_steps (work_rate's unit)
    figures: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- the driver
class Driver:
    """Runs one sweep with ``workers`` workers and the chaos schedule; returns when every worker has ended and
    the sweep is finished (re-running the worker command, as an operator would, if it ended unfinished)."""

    def __init__(self, phase: Phase, rng: random.Random, log: ChaosLog, workers: int, data: Path,
                 lock_log: Path, pg=None):
        self.p, self.rng, self.log, self.n, self.data = phase, rng, log, workers, data
        self.lock_log, self.pg = lock_log, pg
        self.workers: list[WorkerProc] = []
        self.count = {"worker kills": 0, "trial kills": 0, "stops past the heartbeat": 0, "disk-full episodes": 0,
                      "storage outages": 0, "workers started": 0, "re-runs of the command": 0}
        self.total = 0

    # -- workers
    def command(self) -> list[str]:
        return [sys.executable, "-m", "lightning_tfm", "sweep", str(self.p.sweep_file), "--storage-from-env",
                f"data.path={self.data}", f"run.results_dir={self.p.results}", "train.threads=1"]

    def start_worker(self) -> WorkerProc:
        logs = self.p.results / "sweep-logs" / self.p.sweep_file.stem  # where `ltfm sweep --workers` puts them
        logs.mkdir(parents=True, exist_ok=True)
        i = self.count["workers started"]
        self.count["workers started"] += 1
        log = logs / f"worker-{i}.log"
        env = {**os.environ, STORAGE_ENV: self.p.url, LOCK_LOG_ENV: str(self.lock_log), "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        with open(log, "ab") as fh, signals_held():  # a stop signal meanwhile finds the worker in the list
            proc = subprocess.Popen(self.command(), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=ROOT)
            w = WorkerProc(i, proc, log)
            self.workers.append(w)
        self.log(self.p.name, "start worker", worker=i, pid=proc.pid)
        return w

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.proc.poll() is None]

    def stop_workers(self, grace_s: float = 30.0) -> None:
        """Every worker still running stopped with its trial: woken (SIGCONT) if the chaos stopped it, SIGTERM (a
        worker stops its trial as for Ctrl-C), then SIGKILL for the worker and its trial after ``grace_s``."""
        alive = self.alive()
        trials = {w.index: trial_of(w.proc.pid) for w in alive}
        for w in alive:
            signal_pid(trials[w.index], signal.SIGCONT)
            signal_pid(w.proc.pid, signal.SIGCONT)
            w.stopped = False
            signal_pid(w.proc.pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        for w in alive:
            try:
                w.proc.wait(timeout=max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                signal_pid(trials[w.index], signal.SIGKILL)
                trial = trial_of(w.proc.pid)  # a trial started since
                w.proc.kill()
                w.proc.wait()
                signal_pid(trial, signal.SIGKILL)

    # -- progress: run folders whose summary says completed
    def completed(self) -> int:
        n = 0
        for s in self.p.results.glob("*/summary.json"):
            try:
                n += json.loads(s.read_text()).get("status") == "completed"
            except (OSError, ValueError):
                pass
        return n

    # -- chaos acts
    def kill_something(self) -> None:
        candidates = [w for w in self.alive() if not w.stopped]
        if not candidates:
            return
        w = self.rng.choice(candidates)
        trial = trial_of(w.proc.pid)
        if self.rng.random() < 0.5 or trial is None:
            signal_pid(w.proc.pid, signal.SIGKILL)
            w.proc.wait()
            self.count["worker kills"] += 1
            self.log(self.p.name, "SIGKILL worker", worker=w.index, pid=w.proc.pid, trial_pid=trial)
            self.start_worker()
        else:
            if signal_pid(trial, signal.SIGKILL):
                self.count["trial kills"] += 1
                self.log(self.p.name, "SIGKILL trial", worker=w.index, trial_pid=trial)

    def stop_past_heartbeat(self) -> None:
        candidates = [w for w in self.alive() if not w.stopped and trial_of(w.proc.pid)]
        if not candidates:
            return
        w = self.rng.choice(candidates)
        trial = trial_of(w.proc.pid)
        signal_pid(w.proc.pid, signal.SIGSTOP)
        signal_pid(trial, signal.SIGSTOP)
        w.stopped = True
        hold = HOLDS_S["stop_past_heartbeat"]
        self.count["stops past the heartbeat"] += 1
        self.log(self.p.name, "SIGSTOP worker and trial", worker=w.index, pid=w.proc.pid, trial_pid=trial, hold_s=hold)
        self.pending.append((time.time() + hold, "SIGCONT", (w, trial)))

    def fill_disk(self) -> None:
        filler = self.p.results / ".soak-filler"
        written = 0
        chunk = b"\0" * (4 << 20)
        with open(filler, "wb", buffering=0) as f:
            while True:
                try:
                    written += f.write(chunk)
                except OSError:
                    break
        self.count["disk-full episodes"] += 1
        hold = HOLDS_S["fill_disk"]
        self.log(self.p.name, "disk full", filler_mb=written >> 20, free=shutil.disk_usage(self.p.results).free,
                 hold_s=hold)
        self.pending.append((time.time() + hold, "free disk", filler))

    def stop_storage(self) -> None:
        self.pg.stop("fast")
        self.count["storage outages"] += 1
        self.log(self.p.name, "PostgreSQL stopped", hold_s=HOLDS_S["stop_storage"])
        self.pending.append((time.time() + HOLDS_S["stop_storage"], "start PostgreSQL", None))

    def undo(self, what: str, arg) -> None:
        if what == "SIGCONT":
            w, trial = arg
            signal_pid(trial, signal.SIGCONT)
            signal_pid(w.proc.pid, signal.SIGCONT)
            w.stopped = False
            self.log(self.p.name, "SIGCONT worker and trial", worker=w.index, pid=w.proc.pid, trial_pid=trial)
        elif what == "free disk":
            arg.unlink()
            self.log(self.p.name, "disk freed", free=shutil.disk_usage(self.p.results).free)
        elif what == "start PostgreSQL":
            r = self.pg.start()
            self.log(self.p.name, "PostgreSQL started", rc=r.returncode)

    # -- the run
    def calibrate(self) -> float | None:
        """T, the phase's trial time (:func:`check.trial_time`), once enough trials completed; else None."""
        from check import study_trials
        return trial_time(study_trials(self.p)[0], CALIBRATION_TRIALS)

    def run(self, total: int, special: list[tuple[float, str]]) -> None:
        """``special``: (fraction of ``total`` rows completed, act) for the acts done once or twice. Kills start
        once T is measured; the phase ends when the sweep is finished, at its cap (said, and a failure only if
        the work kept per worker and T is below MIN_RATE), or when it stops progressing (a failure)."""
        self.total = total
        self.pending: list = []
        t0 = time.time()
        fig = self.p.figures
        for _ in range(self.n):
            self.start_worker()
            time.sleep(2)  # staggered, as ``ltfm sweep --workers`` starts them
        T = next_kill = deadline = None
        special = sorted(special)
        holds = sum(HOLDS_S[act] for _, act in special)
        chaos_until = 0.9  # no kills once this fraction of the rows is done: the tail finishes in peace
        done = 0
        last_count = 0.0
        work, last_progress = work_kept(self.p.results), t0
        while True:
            now = time.time()
            if now - last_count > 3:
                done, last_count = self.completed(), now
                if (w := work_kept(self.p.results)) > work:
                    work, last_progress = w, now
                if T is None and (T := self.calibrate()) is not None:
                    kill_every, cap = chaos_scale(T, total, self.n, holds)
                    deadline = now + cap
                    next_kill = now + self.rng.uniform(*kill_every)
                    fig.update({"trial time": round(T, 1), "chaos interval": [round(x) for x in kill_every],
                                "cap": round(now - t0 + cap)})
                    self.log(self.p.name, "calibrated", trial_s=round(T, 1),
                             kill_every_s=[round(x) for x in kill_every],
                             cap_s=round(now - t0 + cap))
            if T is None and now - t0 > CALIBRATION_TIMEOUT_S:
                self.p.failures.append(f"{self.p.name}: no trial completed in {CALIBRATION_TIMEOUT_S:.0f} s: the chaos "
                                       "has nothing to scale by")
                fig["stalled"] = True
                break
            if T is not None and now - last_progress > STALL_T * T:
                self.p.failures.append(f"{self.p.name}: no progress for {now - last_progress:.0f} s ({STALL_T:g} trial "
                                       f"times of {T:.0f} s): no checkpoint step gained, no trial finished")
                fig["stalled"] = True
                break
            if deadline is not None and now > deadline:
                fig["hit the cap"] = True
                rate = work_rate(work, self.p.steps_per_trial, now - t0, self.n, T)
                self.log(self.p.name, "cap reached", cap_s=fig["cap"], work_rate=round(rate, 2))
                if rate < MIN_RATE:
                    self.p.failures.append(f"{self.p.name}: at its cap of {fig['cap']} s the sweep had kept "
                                           f"{rate:.2f} of a trial's work per worker per trial time (< {MIN_RATE}): "
                                           "too little progress for the machine's own speed")
                break
            for item in [x for x in self.pending if x[0] <= now]:
                self.pending.remove(item)
                self.undo(item[1], item[2])
            chaos_on = done < chaos_until * total
            if special and done >= special[0][0] * total and not self.pending:
                _, act = special.pop(0)
                getattr(self, act)()
            if chaos_on and next_kill is not None and now >= next_kill:
                self.kill_something()
                next_kill = now + self.rng.uniform(*kill_every)
            if not self.alive() and not self.pending:
                if self.unfinished() and self.count["re-runs of the command"] < 3:
                    self.count["re-runs of the command"] += 1
                    self.log(self.p.name, "every worker ended with the sweep unfinished: the command again")
                    self.start_worker()
                else:
                    break
            check_stop()
            time.sleep(0.5)
        for item in self.pending:  # the cap was reached mid-act
            self.undo(item[1], item[2])
        self.pending = []
        self.stop_workers()
        if not fig.get("hit the cap"):
            for s in special:
                self.p.failures.append(f"{self.p.name}: the act {s[1]} never happened (the sweep ended first)")
        fig["wall time"] = time.time() - t0
        fig["work rate"] = round(work_rate(work_kept(self.p.results), self.p.steps_per_trial, fig["wall time"],
                                           self.n, T), 2) if T else None

    def unfinished(self) -> bool:
        """Whether the study lacks a finished trial for some row (asked of the storage, as ``--status`` does)."""
        from check import study_trials
        return bool(study_trials(self.p)[1])


# ----------------------------------------------------------------------------------------------- main
def mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"soak: error: cannot mount a tmpfs at {path} ({r.stderr.strip()}): the soak fills a results "
              "filesystem of its own and must run as root (or with CAP_SYS_ADMIN)", file=sys.stderr)
        sys.exit(2)


def first_rows(sweep_file: Path, rows: int, folder: Path) -> Path:
    """A copy of a variants sweep file with its first ``rows`` variants (``--rows``), in ``folder``."""
    import yaml

    tree = yaml.safe_load(sweep_file.read_text())
    tree["experiment"] = str((sweep_file.parent / tree["experiment"]).resolve())
    tree["variants"] = dict(list(tree["variants"].items())[:rows])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / sweep_file.name
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def keep_logs(phase: Phase, out: Path) -> None:
    """Copy the phase's worker and trial logs off its tmpfs."""
    dest = out / "logs" / phase.name
    src = phase.results / "sweep-logs"
    if src.exists():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    for db in phase.results.glob("*.db"):  # the SQLite study, for a post-mortem
        shutil.copy2(db, dest / db.name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1, help="the chaos driver's random seed")
    ap.add_argument("--out", default="soak-out", help="where the chaos log, lock log, logs and figures go")
    ap.add_argument("--storages", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--search", action=argparse.BooleanOptionalAction, default=True, help="also soak a search sweep")
    ap.add_argument("--workers", type=int, default=4, help="workers per sweep")
    ap.add_argument("--rows", type=int, default=None,
                    help="only the first N variants of table3-soak.yaml (2 seeds each): a short run while developing "
                         "the soak; its figures do not compare with a full soak's")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="Multi30k folder")
    args = ap.parse_args(argv)
    storages = [s.strip() for s in args.storages.split(",") if s.strip()]
    if not storages or any(s not in ("sqlite", "postgresql") for s in storages):
        print(f"soak: error: --storages {args.storages!r}: use sqlite, postgresql or both", file=sys.stderr)
        return 2
    data = Path(args.data).resolve()
    if not (data / "train.en.gz").exists() and not (data / "train.en").exists():
        print(f"soak: error: no Multi30k at {data}: pass --data FOLDER", file=sys.stderr)
        return 2
    if args.rows is not None and args.rows < 1 or args.workers < 1:
        print("soak: error: --rows and --workers take a positive count", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("soak: error: the soak mounts tmpfs results folders: run it as root (make soak)", file=sys.stderr)
        return 2
    stop_on_signals()
    cleaned: list[str] = []
    try:
        return soak(args, storages, data, cleaned)
    except Stopped as e:
        print(f"soak: stopped by {signal.Signals(e.signum).name}: {', '.join(cleaned) or 'nothing started yet'}; "
              f"the logs so far are in {Path(args.out).resolve()}", file=sys.stderr, flush=True)
        return 128 + e.signum


def soak(args, storages: list[str], data: Path, cleaned: list[str]) -> int:
    """The soak itself (:func:`main` checked its arguments); whatever ends it, the work is cleaned up, and
    ``cleaned`` says what was (a line's words)."""
    from check import check_phase, figures_table

    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = Path(f"/tmp/ltfm-soak-{os.getpid()}")
    log = ChaosLog(out / "chaos.log")
    rng = random.Random(args.seed)
    say(f"seed {args.seed}; output in {out}; work in {work}")
    t_all = time.time()
    phases: list[Phase] = []
    mounts: list[Path] = []
    drivers: list[Driver] = []
    pg = None
    try:
        work.mkdir()
        plan = []
        if "sqlite" in storages:
            plan.append(("sqlite", "table3-soak.yaml", "variants"))
            if args.search:
                plan.append(("sqlite", "search-soak.yaml", "search"))
        if "postgresql" in storages:
            plan.append(("postgresql", "table3-soak.yaml", "variants"))
        for storage, sweep_name, kind in plan:
            check_stop()
            name = f"{storage}-{kind}"
            results = work / name / "results"
            with signals_held():
                mount_tmpfs(results)
                mounts.append(results)
            if storage == "postgresql":
                if pg is None:
                    from pg import start_server
                    with signals_held():
                        pg = start_server()
                    say(f"PostgreSQL server up on 127.0.0.1:{pg.port}, folder {pg.root}")
                url = pg.create_database(f"soak_{args.seed}")
            else:
                url = f"sqlite:///{results / (Path(sweep_name).stem + '.db')}"
            sweep_file = HERE / sweep_name
            if kind == "variants" and args.rows is not None:
                sweep_file = first_rows(sweep_file, args.rows, work / name)
            phase = Phase(name, storage, sweep_file, results, url)
            phases.append(phase)
            lock_log = out / f"locks-{name}.jsonl"
            driver = Driver(phase, rng, log, args.workers, data, lock_log, pg=pg)
            drivers.append(driver)
            from check import planned_total, steps_per_trial
            total = planned_total(phase, data)
            phase.steps_per_trial = steps_per_trial(phase, data)
            special = [(0.10, "stop_past_heartbeat"), (0.30, "fill_disk"), (0.50, "stop_past_heartbeat")]
            if kind == "search":
                special = [(0.25, "stop_past_heartbeat")]
            if storage == "postgresql":
                special.append((0.65, "stop_storage"))
            say(f"{name}: {total} trials planned, {args.workers} workers, storage {storage}")
            driver.run(total, special)
            phase.figures.update(driver.count)
            phase.figures["workers"] = args.workers
            keep_logs(phase, out)
            check_phase(phase, data, lock_log, out)
        check_stop()
    finally:
        running = sum(len(d.alive()) for d in drivers)
        for driver in drivers:
            driver.stop_workers()
        cleaned.append(f"{running} worker{'s' * (running != 1)} stopped")
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.root, ignore_errors=True)
            cleaned.append("the PostgreSQL server stopped and removed")
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], check=False)
        shutil.rmtree(work, ignore_errors=True)
        cleaned.append(f"{work} unmounted and removed")
    wall = time.time() - t_all
    table = figures_table(phases, wall, args.seed)
    (out / "figures.md").write_text(table + "\n")
    (out / "figures.json").write_text(json.dumps({"seed": args.seed, "wall_s": round(wall),
                                                  "phases": {p.name: p.figures for p in phases},
                                                  "failures": [f for p in phases for f in p.failures]}, indent=1))
    print(table)
    failures = [f for p in phases for f in p.failures]
    for f in failures:
        print(f"soak: FAILED: {f}")
    say(f"{'every invariant held' if not failures else f'{len(failures)} invariant(s) broken'}; "
        f"{wall / 60:.1f} min in all")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
