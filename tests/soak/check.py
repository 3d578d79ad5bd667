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
from lightning_tfm.base.atomic import TMP_MARK  # noqa: E402  (the temporary files: .<name>.tmp-<pid>-<hex>)

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


def steps_per_trial(phase, data: Path) -> float:
    """The mean training budget (train.max_steps) of the sweep's rows (of its base, for a search)."""
    sweep, plan = _plan(phase, data)
    if sweep.mode != "variants":
        return float(plan.base_cfg.train.max_steps)
    entries = sweep.entries()
    return sum(plan.max_steps(e) for e in entries) / max(len(entries), 1)


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


def row_outcomes(labels: dict[str, str], trials, stopped: bool) -> dict[str, list]:
    """Each row ({grid key: label}) of a variants sweep by its COMPLETE trials: ``duplicated`` [(label, n)]
    with more than one; with none, ``unfinished`` when the driver stopped the phase (at its cap) before the
    sweep ended, else ``given up`` (the sweep ended without it: its retries ran out, or it failed). Neither
    is a lost result: a lost result was finished and is gone (:func:`result_problems`)."""
    out = {"duplicated": [], "unfinished": [], "given up": []}
    for key, label in labels.items():
        row = [t for t in trials if t.user_attrs.get("grid_key") == key]
        n = sum(t.state.name == "COMPLETE" for t in row)
        if n > 1:
            out["duplicated"].append((label, n))
        elif n == 0 and stopped:
            out["unfinished"].append(label)
        elif n == 0:
            states = ", ".join(f"{t.number} {t.state.name}" for t in row) or "none"
            out["given up"].append(f"{label} (trials {states})")
    return out


def result_problems(finished, metric: str) -> tuple[list[str], list[str]]:
    """(lost, false completions) among the COMPLETE trials: lost, a result that no longer exists (the run
    folder or its summary gone, or a summary of another training with another value: overwritten); a false
    completion, a trial COMPLETE whose run's summary says it is not."""
    lost, false = [], []
    for t in finished:
        s = _summary(t.user_attrs.get("run_dir"))
        value = (s or {}).get(metric)
        if s is None:
            lost.append(f"trial {t.number} COMPLETE but {t.user_attrs.get('run_dir')}/summary.json is gone: its "
                        "result is lost")
        elif s.get("status") != "completed":
            false.append(f"trial {t.number} COMPLETE but its summary says {s.get('status')}")
        elif not (isinstance(value, float) and math.isfinite(value) and value == t.value):
            lost.append(f"trial {t.number} value {t.value} != summary {metric} {value}: its run folder was "
                        "overwritten")
    return lost, false


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
    duplicates = false_completions = 0
    given_up = []
    metric = sweep.metric
    stopped = bool(fig.get("hit the cap") or fig.get("stalled"))  # the driver ended the phase before the sweep did
    finished = [t for t in trials if t.state.name == "COMPLETE"]
    if sweep.mode == "variants":
        fig["rows x seeds"] = len(sweep.entries())
        labels = {plan.grid_key(e): f"{e.name} seed {e.seed}" for e in sweep.entries()}
        rows = row_outcomes(labels, trials, stopped)
        duplicates += sum(n - 1 for _, n in rows["duplicated"])
        fail.extend(f"{phase.name}: {label}: {n} COMPLETE trials" for label, n in rows["duplicated"])
        unfinished_rows, given_up = rows["unfinished"], rows["given up"]
        unfinished_variants = {e.name for e in sweep.entries() if labels[plan.grid_key(e)] in unfinished_rows}
    else:
        fig["search points"] = int(sweep.n_trials)
        given_up = [u for u in unfinished if "not re-run" in u]
        unfinished_rows = [u for u in unfinished if u not in given_up]
        if not stopped:
            given_up += unfinished_rows
            unfinished_rows = []
        unfinished_variants = set()
        # two finished trials of one search point (a retry and its original) would be a duplicate
        for t in trials:
            if t.state.name in FINISHED:
                earlier = set(t.system_attrs.get("retry_history") or [])
                twice = [o.number for o in trials if o.number in earlier and o.state.name in FINISHED]
                if twice:
                    duplicates += 1
                    fail.append(f"{phase.name}: trial {t.number} and the attempt(s) {twice} it retries all finished")
    fail.extend(f"{phase.name}: {g}: the sweep ended without finishing it" for g in given_up)
    fig["unfinished at the cap"] = len(unfinished_rows)  # not lost, not a failure: the driver stopped the phase
    fig["given up"] = len(given_up)
    lost, false = result_problems(finished, metric)
    false_completions += len(false)
    fail.extend(f"{phase.name}: {x}" for x in lost + false)
    counts, bad = check_folders(phase.results)
    fig.update(counts)
    false_completions += sum("false completion" in b for b in bad)
    fail.extend(f"{phase.name}: {b}" for b in bad)
    acquisitions, overlaps = check_locks(lock_log)
    fig["lock acquisitions"] = acquisitions
    duplicates += len(overlaps)
    fail.extend(f"{phase.name}: two holders of one lock: {o}" for o in overlaps)
    fig["duplicates"], fig["lost results"], fig["false completions"] = duplicates, len(lost), false_completions
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
        absent = [v for v in sweep.variants if not re.search(rf"(^|\n|,){re.escape(v)},", csv)
                  and v not in unfinished_variants]
        if absent:
            fail.append(f"{phase.name}: ltfm report's table3.csv lacks rows {absent}")
    tb = tracebacks(out / "logs" / phase.name)
    fig["tracebacks"] = len(tb)
    fail.extend(f"{phase.name}: {t}" for t in tb)
    for name in ("trials", "retries", "duplicates", "unfinished at the cap", "given up", "lost results",
                 "false completions", "lock acquisitions", "tracebacks"):
        print(f"  {phase.name}: {name}: {fig.get(name)}")


ROWS = ["trial time", "chaos interval", "cap", "trials", "rows x seeds", "search points", "workers", "workers started",
        "worker kills", "trial kills", "stops past the heartbeat", "disk-full episodes", "storage outages", "retries",
        "closed as duplicates", "re-runs of the command", "lock acquisitions", "duplicates", "unfinished at the cap",
        "given up", "lost results", "false completions", "tracebacks", "work rate", "wall time"]


def _cell(row: str, v) -> str:
    if v is None:
        return "-"
    if row == "wall time":
        return f"{v / 60:.1f} min"
    if row == "chaos interval":
        return f"{v[0]}–{v[1]} s"
    if row in ("trial time", "cap"):
        return f"{v:.0f} s"
    return str(v)


def figures_table(phases, wall: float, seed: int) -> str:
    """The figures, one column a phase; below them, a line for each phase that reached its cap. ``trial time``
    is T, the measured time of a trial the chaos and the cap are scaled by; ``work rate``, the work kept in
    trials per worker per T (about 1 without chaos)."""
    head = "| | " + " | ".join(p.name for p in phases) + " |"
    lines = [f"Chaos soak, seed {seed} ({wall / 60:.1f} min in all)", "", head,
             "|---|" + "---:|" * len(phases)]
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(_cell(row, p.figures.get(row)) for p in phases) + " |")
    for p in phases:
        if p.figures.get("hit the cap"):
            lines.append(f"\n{p.name} reached its cap of {p.figures.get('cap')} s with "
                         f"{p.figures.get('unfinished at the cap')} row(s) unfinished (not lost; work rate "
                         f"{p.figures.get('work rate')}).")
    return "\n".join(lines)
