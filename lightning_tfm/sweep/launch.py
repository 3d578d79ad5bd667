"""``ltfm sweep SWEEP --workers K|auto``: K workers of one study on this machine, and one progress line.

The launcher starts K ``ltfm sweep`` worker processes on the same storage (each writes its own log,
``<results>/sweep-logs/<name>/worker-<i>.log``) and, while they run, prints one line a person can read
every ``--every`` seconds instead of K interleaved progress bars::

    [table3-cpu 0:42] rows 7/23 done (3 hold, 1 may flip), 2 running, 14 left | big s1 step 900/2040 ppl 41.2 | ...

plus a line whenever a row finishes, with its verdict against the base once the base has finished (the report's
rule, :func:`~.status.row_verdicts`: *holds* or *may flip* at k x the budget, *within noise*, *too few points*;
``finished: C1 seed 1: dev ppl 41.20 (holds: -12% at 3x, bound -9% (80% [-15, -9]))``); the progress line counts
the rows that hold or may flip. ``auto`` is ``--workers-per-gpu`` workers on every CUDA device when there is one
(each worker sees its one GPU through ``CUDA_VISIBLE_DEVICES``; the line shows each GPU's running rows and
utilisation), else one per CPU core with ``train.threads`` = cores / workers (:func:`worker_plan`). Ctrl-C stops
every worker: their trials save a checkpoint and go back to the queue as *stopped* (the line after it names them
with their steps), and the next run of the same command resumes them first.

ETA: every row's work is its planned steps x parameters (a step's cost grows with the parameter count,
the shared embedding/softmax included); the rate is the finished rows' work over their durations, so the
time a running row spends starting (loading, building the model) is never read as slow progress; until a
row finishes the line says "estimating". It corrects itself as rows finish.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
import re
import signal
import subprocess
import sys
import time

from ..base.command import STOPPED_RC
from ..base.errors import UserError
from ..training.runs.results import read_metrics
from .budget import PAST_BUDGET, cut_history
from .plan import Plan, check_buildable
from .process import shielded
from .queue import STOPPED
from .settle import settle_entries
from .spec import Sweep
from .status import row_verdicts, trial_rows
from .storage import STORAGE_ENV
from .worker import GPU_ENV, STOP_PATIENCE_S

DONE = ("complete", "pruned")


# Workers per GPU when --workers is auto on CUDA: a Table 3 row at Multi30k scale is a small model that leaves
# most of a large GPU idle, so several rows share one device. Not yet measured on a GPU: the figure that
# settles it is `make gpu-check`'s (reports/gpu.md).
WORKERS_PER_GPU = 4


@dataclasses.dataclass(frozen=True)
class Slot:
    """One launched worker: the GPU it trains on (None: the CPU), its torch threads and DataLoader workers."""

    index: int
    gpu: str | None
    threads: int
    loader_workers: int


def visible_gpus(environ=os.environ) -> list[str]:
    """The CUDA devices this process may use, as ids for CUDA_VISIBLE_DEVICES (a scheduler's list if it set one)."""
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            given = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            return given[:n] if given else [str(i) for i in range(n)]
    return []


def worker_plan(workers: int | str, gpus: list[str], cores: int, per_gpu: int = WORKERS_PER_GPU) -> list[Slot]:
    """Which device each launched worker trains on, with its share of the CPU.

    No GPU: ``auto`` is one worker per core, each with cores / workers torch threads. GPUs: ``auto`` is
    ``per_gpu`` workers on every device, dealt round-robin (worker i on gpus[i % len(gpus)], so the devices
    fill evenly whatever the count); each worker's share of the cores is split between its torch threads
    (the Python loop that feeds the GPU) and DataLoader workers (collation off that loop)."""
    if per_gpu < 1:
        raise UserError(f"--workers-per-gpu {per_gpu} must be at least 1")
    n = (len(gpus) * per_gpu if gpus else cores) if workers == "auto" else int(workers)
    share = max(1, cores // n)
    if not gpus:
        return [Slot(i, None, share, 0) for i in range(n)]
    loaders = share // 2 if share >= 2 else 0
    return [Slot(i, gpus[i % len(gpus)], max(1, share - loaders), loaders) for i in range(n)]


def worker_overrides(overrides: list[str], slot: Slot) -> list[str]:
    """The overrides a launched worker adds unless the command line set them: its device and its share of
    the cores."""
    given = {o.split("=", 1)[0] for o in overrides}
    extra = {"train.threads": slot.threads}
    if slot.gpu is not None:
        extra.update({"train.accelerator": "gpu", "train.devices": 1, "train.num_workers": slot.loader_workers})
    return [*overrides, *(f"{k}={v}" for k, v in extra.items() if k not in given)]


def worker_env(environ, slot: Slot, storage_url: str) -> dict:
    """A worker's environment: the storage URL (off the command line), and on CUDA the one device it sees."""
    env = {**environ, STORAGE_ENV: storage_url, "PYTHONUNBUFFERED": "1"}
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = env[GPU_ENV] = slot.gpu
    return env


def _duration(t, now: _dt.datetime) -> float:
    if t.datetime_start is None:
        return 0.0
    return max(0.0, ((t.datetime_complete or now) - t.datetime_start).total_seconds())


def _latest(run_dir: str | None, budget: int) -> tuple[int | None, float | None]:
    """(last logged step, last dev perplexity) of a run folder's metrics.csv files up to the trial's ``budget``
    (a folder another sweep trains on past it, :func:`~.budget.cut_history`)."""
    if not run_dir:
        return None, None
    try:
        rows = cut_history(read_metrics(run_dir), budget)[0]
    except Exception:  # noqa: BLE001 - a file being written: try again at the next line
        return None, None
    step = max((r["step"] for r in rows), default=None)
    ppl = next((r["dev/ppl"] for r in reversed(rows) if r.get("dev/ppl") is not None), None)
    return step, ppl


_LOG_STEP = re.compile(r"ltfm: (?:step (\d+)/\d+|training \S+ from step (\d+) to)")


def _log_step(log: str | None) -> int | None:
    """The step a trial's log last reported (its progress lines come every 30 s and at each validation; the
    run's metrics.csv is written less often): None before its training started."""
    if not log:
        return None
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return None
    found = _LOG_STEP.findall(tail)
    return int(found[-1][0] or found[-1][1]) if found else None


def progress(sweep: Sweep, plan: Plan, trials, cost: dict[str, float], now: _dt.datetime | None = None,
             workers: int = 1) -> dict:
    """Where a variants study stands: rows done / failed / running / left, each running row's step and dev
    perplexity, and the time left. ``cost`` maps a grid key to its work (steps x parameters)."""
    now = now or _dt.datetime.now()
    by_key: dict[str, list] = {}
    for t in trials:
        by_key.setdefault(t.user_attrs.get("grid_key"), []).append(t)
    done = failed = stopped = 0
    running, left_work, finished_work, finished_s = [], 0.0, 0.0, 0.0
    # the file's rows, then the trials the settle loop queued (a row's work times their budget multiple)
    entries = sweep.entries() + settle_entries(plan, trials)
    per_row = {e.name: cost.get(plan.grid_key(e), 0.0) for e in sweep.entries()}
    for entry in entries:
        key = plan.grid_key(entry)
        ts = by_key.get(key, [])
        states = {t.state.name.lower() for t in ts}
        work = cost.get(key, per_row.get(entry.name, 0.0) * entry.budget / sweep.variants[entry.name]["budget"])
        steps_planned = plan.max_steps(entry) or 1
        if states & set(DONE):
            done += 1
            took = [_duration(t, now) for t in ts if t.state.name.lower() == "complete"]
            if took and took[-1] > 0:  # a pruned row stopped early: its duration is not its work's
                finished_work += work
                finished_s += took[-1]
        elif "running" in states:
            t = next(t for t in ts if t.state.name.lower() == "running")
            step, ppl = _latest(t.user_attrs.get("run_dir"), t.user_attrs.get("max_steps") or steps_planned)
            logged = _log_step(t.user_attrs.get("log"))
            step = logged if step is None or (logged is not None and logged > step) else step
            frac = min(1.0, (step or 0) / steps_planned)
            left_work += work * (1 - frac)
            running.append({"variant": entry.name, "seed": entry.seed, "step": step, "max_steps": steps_planned,
                            "dev_ppl": ppl, "for_s": _duration(t, now), "gpu": t.user_attrs.get("gpu")})
        elif ts and "waiting" not in states and all(t.user_attrs.get("skip") or t.state.name == "FAIL" for t in ts) \
                and any(t.user_attrs.get("skip") in ("unbuildable", PAST_BUDGET) or t.user_attrs.get("exit_code")
                        for t in ts):
            failed += 1
        else:
            left_work += work
            stopped += any(t.state.name == "WAITING" and t.user_attrs.get("status") == STOPPED for t in ts)
    total = len(entries)
    rate = finished_work / finished_s if finished_s > 0 and finished_work > 0 else None  # work per worker-second
    eta = left_work / (rate * max(1, min(workers, total - done - failed))) if rate else None
    return {"total": total, "done": done, "failed": failed, "running": running, "stopped": stopped,
            "left": total - done - failed - len(running), "eta_s": eta}


def _hms(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def gpu_usage(smi_csv: str) -> dict[str, tuple[int, int]]:
    """{device id: (utilisation %, memory used MiB)} from ``nvidia-smi --query-gpu=index,utilization.gpu,
    memory.used --format=csv,noheader,nounits``; rows it cannot read are left out."""
    out = {}
    for line in smi_csv.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and all(x.isdigit() for x in parts):
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def read_gpu_usage() -> dict[str, tuple[int, int]]:
    """The GPUs' utilisation now, or {} where nvidia-smi is missing or fails."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        p = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        if p.returncode == 0:
            return gpu_usage(p.stdout)
    return {}


def format_gpus(running: list[dict], gpus: list[str], usage: dict[str, tuple[int, int]]) -> str:
    """``GPU 0: 4 rows 87% 21.3 GiB, GPU 1: 3 rows ...``: each device's running rows and, where nvidia-smi
    answers, its utilisation and memory."""
    parts = []
    for g in gpus:
        n = sum(1 for r in running if r.get("gpu") == g)
        u = usage.get(g)
        parts.append(f"GPU {g}: {n} row{'s' if n != 1 else ''}" + (f" {u[0]}% {u[1] / 1024:.1f} GiB" if u else ""))
    return ", ".join(parts)


def format_progress(name: str, p: dict, elapsed_s: float, gpus: list[str] = (),
                    usage: dict[str, tuple[int, int]] | None = None) -> str:
    said = p.get("verdicts") or {}  # verdict -> finished rows (row_verdicts)
    parts = [f"[{name} {_hms(elapsed_s)}] rows {p['done']}/{p['total']} done"
             + (f" ({', '.join(f'{n} {_VERB.get(v, v)}' for v, n in said.items())})" if said else "")
             + (f", {p['failed']} failed" if p["failed"] else "")
             + f", {len(p['running'])} running, {p['left']} left"
             + (f" ({p['stopped']} stopped, resumed first)" if p.get("stopped") else "")]
    if gpus:
        parts.append(format_gpus(p["running"], list(gpus), usage or {}))
    for r in p["running"]:
        step = "starting" if r["step"] is None else f"step {r['step']}/{r['max_steps']}"
        ppl = f" dev ppl {r['dev_ppl']:.1f}" if r["dev_ppl"] is not None else ""
        parts.append(f"{r['variant']} s{r['seed']} {step}{ppl}")
    parts.append("ETA " + ("estimating" if p["eta_s"] is None else _hms(p["eta_s"])))
    return " | ".join(parts)


_VERB = {"holds": "hold"}  # the count's form: "3 hold, 1 may flip"


def format_search_progress(sweep: Sweep, trials, elapsed_s: float) -> str:
    """A space sweep's line: trials finished (completed / pruned / failed) of ``n_trials``, and running."""
    counts: dict[str, int] = {}
    for t in trials:
        if t.user_attrs.get("skip") == "duplicate":
            continue
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    finished = counts.get("complete", 0) + counts.get("pruned", 0) + counts.get("fail", 0)
    return (f"[{sweep.name} {_hms(elapsed_s)}] trials {finished}/{sweep.n_trials} finished "
            f"({counts.get('complete', 0)} completed, {counts.get('pruned', 0)} pruned, "
            f"{counts.get('fail', 0)} failed), "
            f"{counts.get('running', 0)} running")


def row_costs(plan: Plan) -> dict[str, float]:
    """Each row's work: planned steps x parameter count (unbuildable rows: 0)."""
    out = {}
    for entry in plan.sweep.entries():
        _, params, _ = check_buildable(plan, entry)
        out[plan.grid_key(entry)] = float((plan.max_steps(entry) or 1) * (params or 0))
    return out


class _Monitor:
    """What the launcher prints while its workers run: a line per finished trial, and the progress line."""

    def __init__(self, sweep: Sweep, plan: Plan, cost: dict, open_study_fn, started: float, workers: int, say,
                 gpus: list[str] = (), settle: bool = False):
        self.sweep, self.plan, self.cost, self.open_study_fn = sweep, plan, cost, open_study_fn
        self.started, self.workers, self.say, self.gpus = started, workers, say, list(gpus)
        self.study, self.seen, self.last = None, {}, 0.0
        self.curves: dict = {}  # row_verdicts' cache of finished runs' reads, by (run folder, budget)
        self._verdicts: tuple = (None, {})  # (the completed trials they were fitted on, the verdicts)
        self.settle, self._answers, self._facts = settle, (None, {}), {}  # --settle: each row's answer, as verdicts

    def answers(self, trials) -> dict[str, dict]:
        """With --settle, each row's answer (:func:`~.settle.row_answers`), computed again when a trial finished."""
        from .settle import read, row_answers

        done = frozenset(t.number for t in trials if t.state.name == "COMPLETE")
        if self.settle and self._answers[0] != done:
            try:
                self._answers = (done, row_answers(read(self.plan, trials, self._facts)))
            except Exception:  # noqa: BLE001 - a progress line never stops the sweep
                return {}
        return self._answers[1]

    def verdicts(self, trials) -> dict:
        """Each finished row's verdict against the base (:func:`~.status.row_verdicts`); {} when none can be said
        (or the run folders cannot be read now: the next poll tries again)."""
        if self.sweep.mode != "variants":
            return {}
        done = frozenset(t.number for t in trials if t.state.name == "COMPLETE")
        if self._verdicts[0] != done:  # fitted again only when a trial has finished since
            try:
                self._verdicts = (done, row_verdicts(self.sweep, trial_rows(trials), self.curves))
            except Exception:  # noqa: BLE001 - a progress line never stops the sweep
                return {}
        return self._verdicts[1]

    def _trials(self):
        try:
            self.study = self.study or self.open_study_fn()
            return self.study.get_trials(deepcopy=False)
        except Exception:  # noqa: BLE001 - storage busy or not there yet: the next poll reads it
            return None

    def finished_rows(self) -> None:
        trials = self._trials() or ()
        for t in trials:
            state, a = t.state.name.lower(), t.user_attrs
            if state not in (*DONE, "fail") or self.seen.get(t.number) == state:
                continue
            self.seen[t.number] = state
            if (t.datetime_complete is None or t.datetime_complete.timestamp() < self.started
                    or a.get("skip") == "duplicate"):
                continue  # finished before this launch, or a duplicate never trained
            what = (f"dev ppl {a['dev_ppl']:.2f}" if isinstance(a.get("dev_ppl"), float) else
                    a.get("reason") or a.get("error") or state)
            name = a.get("variant") or f"trial {t.number}"
            verdict = self.verdicts(trials).get(name) if state == "complete" else None
            answer = self.answers(trials).get(name) if state == "complete" else None
            said = [*([verdict.text] if verdict else []), *([f"answer: {answer['answer']}"] if answer else [])]
            if said:
                what += f" ({'; '.join(said)})"
            self.say(f"[{self.sweep.name}] {'finished' if state == 'complete' else state}: {name} "
                     f"seed {a.get('seed')}: {what} ({_hms(_duration(t, _dt.datetime.now()))})")

    def progress_line(self, alive: int) -> None:
        trials = self._trials()
        if trials is None:
            return
        elapsed = time.time() - self.started
        if self.sweep.mode == "variants":
            p = progress(self.sweep, self.plan, trials, self.cost, workers=alive)
            said = [v.verdict.verdict for v in self.verdicts(trials).values()]
            p["verdicts"] = {v: said.count(v) for v in ("holds", "may flip") if v in said}
            usage = read_gpu_usage() if self.gpus else {}
            self.say(format_progress(self.sweep.name, p, elapsed, self.gpus, usage))
        else:
            self.say(format_search_progress(self.sweep, trials, elapsed))
        self.last = time.time()


def _stop_workers(procs: list[subprocess.Popen]) -> None:
    """Ctrl-C in a terminal has reached the workers too (one process group); a signal sent to the launcher alone
    has not: after a moment, the workers still running get SIGTERM, which they handle the same way. Each then has
    its trial's time to save a checkpoint (:data:`~.worker.STOP_PATIENCE_S`) before it is killed."""
    deadline = time.time() + 5
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=STOP_PATIENCE_S + 30)
        if p.poll() is None:
            p.kill()


def _say_stopped(sweep: Sweep, open_study_fn, say) -> None:
    """After Ctrl-C: the rows whose trials this launch's workers stopped, at their steps."""
    with contextlib.suppress(Exception):  # the storage gone: the workers' logs say it
        stopped = [t for t in open_study_fn().get_trials(deepcopy=False)
                   if t.state.name == "WAITING" and t.user_attrs.get("status") == STOPPED]
        if stopped:
            rows = ", ".join(f"{t.user_attrs.get('variant')} seed {t.user_attrs.get('seed')} "
                             + (f"at step {t.user_attrs['stopped_at']}" if t.user_attrs.get("stopped_at")
                                else "before its first checkpoint") for t in stopped)
            say(f"[{sweep.name}] stopped: {rows}; the same command resumes them first")


def launch(sweep_file: str, sweep: Sweep, plan: Plan, overrides: list[str], storage_url: str, open_study_fn,
           workers: int | str, every: float = 30.0, out=None, per_gpu: int = WORKERS_PER_GPU,
           status_hint: str | None = None, settle: bool = False) -> int:
    """Start the workers, print progress until they have all exited; returns ``STOPPED_RC`` (130) if any worker
    was stopped (its trials resume when the same command runs again), else 1 if any worker failed.
    ``status_hint``: the ``--status`` command printed when a trial failed (the caller's results folder and storage);
    ``settle``: each worker settles the rows (``--settle``, :mod:`.settle`); a finished row's line has its answer."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    gpus = visible_gpus()
    slots = worker_plan(workers, gpus, cores, per_gpu)
    n = len(slots)
    logs = plan.results_dir / "sweep-logs" / sweep.name
    logs.mkdir(parents=True, exist_ok=True)
    out = out if out is not None else sys.stdout  # the stream of when it runs, not of the import
    say = lambda msg: print(msg, file=out, flush=True)  # noqa: E731
    s0 = slots[0]
    where = (f"{n} worker(s) on {len(gpus)} GPU(s) "
             f"({', '.join(f'GPU {g}: {sum(s.gpu == g for s in slots)}' for g in gpus)}), "
             f"each {s0.threads} thread(s) and {s0.loader_workers} DataLoader worker(s)" if gpus else
             f"{n} worker(s) on {cores} CPU core(s), {s0.threads} thread(s) each")
    say(f"[{sweep.name}] {where}; logs in {logs}/worker-<i>.log")
    cost = row_costs(plan) if sweep.mode == "variants" else {}
    procs = []
    started = time.time()

    def _terminated(signum, frame):  # noqa: ARG001 - `kill` / a batch scheduler: stop like Ctrl-C
        raise KeyboardInterrupt
    previous = {sig: signal.signal(sig, _terminated) for sig in (signal.SIGTERM, signal.SIGUSR1)}  # and SLURM's warning
    try:
        for i, slot in enumerate(slots):
            env = worker_env(os.environ, slot, storage_url)
            fh = open(logs / f"worker-{i}.log", "ab")
            # the storage URL reaches the worker through the environment (never on a command line `ps` shows)
            cmd = [sys.executable, "-m", "lightning_tfm", "sweep", sweep_file, "--storage-from-env",
                   *(["--settle"] if settle else []), *worker_overrides(overrides, slot)]
            procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env), fh))
            if i + 1 < n:
                time.sleep(2)  # staggered: the workers do not all open the storage and load torch at once
        monitor = _Monitor(sweep, plan, cost, open_study_fn, started, n, say, gpus, settle)
        while True:
            alive = [p for p, _ in procs if p.poll() is None]
            monitor.finished_rows()
            if not alive or time.time() - monitor.last >= every:
                monitor.progress_line(len(alive) or n)
            if not alive:
                break
            time.sleep(min(5.0, every))
    except KeyboardInterrupt:
        # shielded before the first line: a second Ctrl-C once that line shows (or while the workers stop, or while
        # their stopped trials are read) is ignored; it had cut the stop short, leaving the workers unwaited for
        with shielded():
            say(f"[{sweep.name}] interrupted: stopping the workers (their trials save a checkpoint and go back to "
                "the queue; run the same command again to resume them)")
            _stop_workers([p for p, _ in procs])
            _say_stopped(sweep, open_study_fn, say)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for _, fh in procs:
            fh.close()
    rcs = [p.returncode for p, _ in procs]
    took = _hms(time.time() - started)
    if STOPPED_RC in rcs:
        # Workers stopped by a signal that this launcher did not get: SIGINT to the process group of a launcher that
        # ignores it (a shell script's background job, `make ... &`: the workers stop on it all the same), or a
        # worker's own SIGTERM. A stop, as Ctrl-C is: never read as finished (a --settle closing its rows).
        say(f"[{sweep.name}] {rcs.count(STOPPED_RC)} of {n} worker(s) were stopped (exit codes {rcs}) after {took}; "
            "run the same command again to resume")
        _say_stopped(sweep, open_study_fn, say)
        return STOPPED_RC
    if any(rcs):
        say(f"[{sweep.name}] workers finished in {took}; some trials failed or a worker stopped (exit codes "
            f"{rcs}): see {logs}/worker-<i>.log and `{status_hint or f'ltfm sweep {sweep_file} --status'}`")
        return 2 if all(rc == 2 for rc in rcs) else 1
    say(f"[{sweep.name}] workers finished in {took}")
    return 0
