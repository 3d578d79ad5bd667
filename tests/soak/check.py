"""The soak's invariants (see soak.py), checked on one sweep after its chaos, and the figures table."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from lightning_tfm.training.atomic import TMP_MARK  # noqa: E402  (the temporary files: .<name>.tmp-<pid>-<hex>)

VERSIONED_CKPT = re.compile(r"-v\d+\.ckpt$")  # what Lightning's ModelCheckpoint names a second file of one name
FINISHED = ("COMPLETE", "PRUNED")


def _plan(phase, data: Path):
    from lightning_tfm.sweep.plan import Plan
    from lightning_tfm.sweep.spec import load_sweep

    sweep = load_sweep(str(phase.sweep_file))
    return sweep, Plan(sweep, [f"data.path={data}", f"run.results_dir={phase.results}"])


def planned_total(phase, data: Path) -> int:
    sweep, _ = _plan(phase, data)
    return len(sweep.entries()) if sweep.mode == "variants" else int(sweep.n_trials)


def _study(phase):
    from lightning_tfm.sweep.spec import load_sweep
    from lightning_tfm.sweep.storage import open_storage, open_study, quiet_optuna

    quiet_optuna()
    sweep = load_sweep(str(phase.sweep_file))
    storage = open_storage(phase.url, create=False)
    return sweep, open_study(sweep, storage, create=False)


def retried_numbers(trials) -> set[int]:
    """Trial numbers that were queued again: every number in a trial's ``retry_history`` (Optuna's retry
    callback, which both a lapsed heartbeat and a worker whose trial was killed use)."""
    return {int(n) for t in trials for n in t.system_attrs.get("retry_history") or []}


def study_trials(phase) -> tuple[list, list[str]]:
    """(the study's trials, what is unfinished): rows without a finished trial, search points not yet
    finished, or failed trials without a retry. An unreachable storage counts as unfinished."""
    try:
        sweep, study = _study(phase)
        trials = study.get_trials(deepcopy=False)
    except Exception as e:  # noqa: BLE001 - the storage is down right now
        return [], [f"storage unreadable: {e.__class__.__name__}"]
    if sweep.mode == "variants":
        done = {t.user_attrs.get("grid_key") for t in trials if t.state.name == "COMPLETE"}
        keys = {t.user_attrs.get("grid_key") for t in trials}
        return trials, sorted(k for k in keys if k not in done)
    retried = retried_numbers(trials)
    finished = [t for t in trials if t.state.name in FINISHED]
    open_ = [f"trial {t.number} {t.state.name}" for t in trials if t.state.name in ("RUNNING", "WAITING")]
    lost = [f"trial {t.number} failed, not re-run" for t in trials if t.state.name == "FAIL"
            and t.number not in retried and t.user_attrs.get("skip") != "duplicate"]
    short = [] if len(finished) >= int(sweep.n_trials) else [f"{len(finished)} of {sweep.n_trials} points finished"]
    return trials, open_ + lost + short


def _summary(run_dir: str | None) -> dict | None:
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, TypeError, ValueError):
        return None


def check_locks(lock_log: Path) -> tuple[int, list[str]]:
    """(acquisitions, overlaps): an acquisition of a run's lock while another process held it, i.e. the
    previous holder had neither released it nor ended (as the acquirer saw it)."""
    events = defaultdict(list)
    if lock_log.exists():
        for line in lock_log.read_text().splitlines():
            with_ = json.loads(line)
            events[with_["run"]].append(with_)
    acquisitions, overlaps = 0, []
    for run, evs in events.items():
        evs.sort(key=lambda e: e["t"])
        holder = None  # the last acquisition not yet followed by its release
        for e in evs:
            if e["event"] == "release":
                if holder is not None and holder["pid"] == e["pid"]:
                    holder = None
                continue
            acquisitions += 1
            if holder is not None and holder["pid"] != e["pid"]:
                # the holder never released: the acquirer must have seen it dead
                if not (e.get("prev_pid") == holder["pid"] and e.get("prev_alive") is False):
                    overlaps.append(f"{run}: pid {e['pid']} acquired at {e['t']:.1f} while pid {holder['pid']} "
                                    f"(acquired {holder['t']:.1f}) had not released it")
            holder = e
    return acquisitions, overlaps


def check_folders(results: Path) -> tuple[dict, list[str]]:
    """Run folders: -v1 checkpoints, leftover temporary files, completed summaries short of their budget."""
    bad, counts = [], {"run folders": 0}
    for summary in sorted(results.glob("*/summary.json")):
        run = summary.parent
        counts["run folders"] += 1
        for p in run.rglob("*"):
            if "wandb" in p.relative_to(run).parts[:1]:
                continue  # W&B's own offline files
            if VERSIONED_CKPT.search(p.name):
                bad.append(f"{run.name}: versioned checkpoint {p.relative_to(run)}")
            if TMP_MARK in p.name:
                bad.append(f"{run.name}: leftover temporary file {p.relative_to(run)}")
        s = _summary(str(run)) or {}
        budget = ((s.get("config") or {}).get("train") or {}).get("max_steps")
        if s.get("status") == "completed" and (budget is None or (s.get("steps") or 0) < budget):
            bad.append(f"{run.name}: false completion: completed at step {s.get('steps')} of {budget}")
    return counts, bad


def tracebacks(logs: Path) -> list[str]:
    found = []
    for log in sorted(logs.rglob("*.log")):
        text = log.read_text(errors="replace")
        n = text.count("Traceback (most recent call last)")
        if n:
            found.append(f"{log.relative_to(logs)}: {n} traceback(s)")
    return found


def check_phase(phase, data: Path, lock_log: Path, out: Path) -> None:
    """Every invariant of one sweep: failures appended to ``phase.failures``, counts to ``phase.figures``."""
    from check import study_trials as _st  # the same function the driver used (a script's module is __main__)

    fig, fail = phase.figures, phase.failures
    sweep, plan = _plan(phase, data)
    trials, unfinished = _st(phase)
    fig["trials"] = len(trials)
    retried = retried_numbers(trials)
    fig["retries"] = len(retried)
    fig["closed as duplicates"] = sum(t.user_attrs.get("skip") == "duplicate" for t in trials)  # never trained
    duplicates = lost = false_completions = 0
    metric = sweep.metric
    finished = [t for t in trials if t.state.name == "COMPLETE"]
    if sweep.mode == "variants":
        fig["rows x seeds"] = len(sweep.entries())
        for entry in sweep.entries():
            key = plan.grid_key(entry)
            complete = [t for t in finished if t.user_attrs.get("grid_key") == key]
            if len(complete) != 1:
                fail.append(f"{phase.name}: {entry.name} seed {entry.seed}: {len(complete)} COMPLETE trials")
                duplicates += max(0, len(complete) - 1)
                lost += len(complete) == 0
    else:
        fig["search points"] = int(sweep.n_trials)
        for u in unfinished:
            fail.append(f"{phase.name}: {u}")
        lost += sum("not re-run" in u for u in unfinished)
        # two finished trials of one search point (a retry and its original) would be a duplicate
        for t in trials:
            if t.state.name in FINISHED:
                earlier = set(t.system_attrs.get("retry_history") or [])
                twice = [o.number for o in trials if o.number in earlier and o.state.name in FINISHED]
                if twice:
                    duplicates += 1
                    fail.append(f"{phase.name}: trial {t.number} and the attempt(s) {twice} it retries all finished")
    for t in finished:  # the study's value is the run folder's
        s = _summary(t.user_attrs.get("run_dir"))
        value = (s or {}).get(metric)
        if s is None or s.get("status") != "completed":
            false_completions += 1
            fail.append(f"{phase.name}: trial {t.number} COMPLETE but its summary says {(s or {}).get('status')}")
        elif not (isinstance(value, float) and math.isfinite(value) and value == t.value):
            lost += 1
            fail.append(f"{phase.name}: trial {t.number} value {t.value} != summary {metric} {value}")
    counts, bad = check_folders(phase.results)
    fig.update(counts)
    false_completions += sum("false completion" in b for b in bad)
    fail.extend(f"{phase.name}: {b}" for b in bad)
    acquisitions, overlaps = check_locks(lock_log)
    fig["lock acquisitions"] = acquisitions
    duplicates += len(overlaps)
    fail.extend(f"{phase.name}: two holders of one lock: {o}" for o in overlaps)
    fig["duplicates"], fig["lost results"], fig["false completions"] = duplicates, lost, false_completions
    # what a person would look at: ltfm runs, ltfm report
    env_py = [sys.executable, "-m", "lightning_tfm"]
    runs = subprocess.run([*env_py, "runs", str(phase.results)], capture_output=True, text=True, cwd=ROOT)
    missing = [t.user_attrs.get("run_id") for t in finished if t.user_attrs.get("run_id") not in runs.stdout]
    if runs.returncode != 0 or missing:
        fail.append(f"{phase.name}: ltfm runs (exit {runs.returncode}) misses {missing}")
    report_out = out / f"report-{phase.name}"
    rep = subprocess.run([*env_py, "report", str(phase.sweep_file), "--results", str(phase.results), "--storage",
                          phase.url, "--out", str(report_out)], capture_output=True, text=True, cwd=ROOT)
    (out / f"report-{phase.name}.log").write_text(rep.stdout + rep.stderr)
    if rep.returncode != 0:
        fail.append(f"{phase.name}: ltfm report exit {rep.returncode}: {(rep.stderr.strip().splitlines() or [''])[-1]}")
    elif sweep.mode == "variants":
        csv = (report_out / "table3.csv").read_text()
        absent = [v for v in sweep.variants if not re.search(rf"(^|\n|,){re.escape(v)},", csv)]
        if absent:
            fail.append(f"{phase.name}: ltfm report's table3.csv lacks rows {absent}")
    tb = tracebacks(out / "logs" / phase.name)
    fig["tracebacks"] = len(tb)
    fail.extend(f"{phase.name}: {t}" for t in tb)
    for name in ("trials", "retries", "duplicates", "lost results", "false completions", "lock acquisitions",
                 "tracebacks"):
        print(f"  {phase.name}: {name}: {fig.get(name)}")


ROWS = ["trials", "rows x seeds", "search points", "workers", "workers started", "worker kills", "trial kills",
        "stops past the heartbeat", "disk-full episodes", "storage outages", "retries", "closed as duplicates",
        "re-runs of the command",
        "lock acquisitions", "duplicates", "lost results", "false completions", "tracebacks", "wall time"]


def figures_table(phases, wall: float, seed: int) -> str:
    head = "| | " + " | ".join(p.name for p in phases) + " |"
    lines = [f"Chaos soak, seed {seed} ({wall / 60:.1f} min in all)", "", head,
             "|---|" + "---:|" * len(phases)]
    for row in ROWS:
        cells = []
        for p in phases:
            v = p.figures.get(row)
            cells.append("-" if v is None else f"{v / 60:.1f} min" if row == "wall time" else str(v))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
