"""The soak's chaos and limits in units of the work (see soak.py): the trial time T it measures, the kill
interval and the cap it derives from T, and the progress it asks for (work kept, in training steps).

One seed then gives comparable chaos on a fast and a slow machine, or beside a CPU-heavy job: T is measured in
each phase from its first CALIBRATION_TRIALS trials completed in one attempt (the study's start and end times,
with every worker running, before any kill). The holds (a stop past the heartbeat, a full disk, a database
outage) stay in seconds: they are set against the sweep's own grace and patience, not against the work.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

CALIBRATION_TRIALS = 2
KILL_EVERY = (0.7, 1.4)  # x T between two kills
CAP_ROUNDS = 3.0  # the phase's cap: this many times its chaos-free time (ceil(trials / workers) x T), plus the holds
STALL_T = 5.0  # no checkpoint step gained and no trial finished in this many T: the sweep stopped progressing
MIN_RATE = 0.1  # at the cap, less than this fraction of a trial's work kept per worker per T: not the machine
CALIBRATION_TIMEOUT_S = 1800.0  # no trial completed in this long: nothing to scale the chaos by (a failure)

GRACE_S = 20  # the soak sweeps' heartbeat grace
# How long each special act holds (s): a stop past the heartbeat grace, a full disk, the database down
HOLDS_S = {"stop_past_heartbeat": GRACE_S + 15, "fill_disk": 30, "stop_storage": 20}


def chaos_scale(T: float, total: int, workers: int, holds: float) -> tuple[tuple[float, float], float]:
    """(the range of seconds between two kills, the phase's cap in seconds from now) for a trial time ``T``:
    kills every KILL_EVERY x T; the cap CAP_ROUNDS x the chaos-free time of ``total`` trials by ``workers``
    (ceil(total / workers) rounds of T) plus the ``holds`` of the special acts."""
    rounds = -(-total // workers)
    return (KILL_EVERY[0] * T, KILL_EVERY[1] * T), CAP_ROUNDS * rounds * T + holds


def work_rate(work_steps: int, steps_per_trial: float, elapsed: float, workers: int, T: float) -> float:
    """Work kept (``work_steps``, :func:`work_kept`) in trials per worker per trial time ``T``: about 1
    for a sweep without chaos, lower for what kills cost; 0 for a sweep that keeps nothing."""
    return (work_steps / steps_per_trial) / max(elapsed * workers / T, 1e-9)


STEP_NAME = re.compile(r"^step=(\d+)(?:-v\d+)?\.ckpt$")


def trial_time(trials, n: int) -> float | None:
    """The trial time T the soak scales its chaos by: the mean of the first ``n`` trials (by end time) that
    COMPLETEd in one attempt (no retry history), from the study's start and end times (claim to record, with
    every worker running); None until there are ``n``."""
    clean = sorted((t for t in trials if t.state.name == "COMPLETE" and not t.system_attrs.get("retry_history")
                    and t.datetime_start and t.datetime_complete), key=lambda t: t.datetime_complete)[:n]
    if len(clean) < n or n < 1:
        return None
    return sum((t.datetime_complete - t.datetime_start).total_seconds() for t in clean) / n


def work_kept(results: Path) -> int:
    """The sweep's work kept, in training steps: for each run folder, its budget once finished (the summary's
    steps), else its newest step checkpoint's step (by name: nothing is read). A checkpoint written or a trial
    finished makes it grow: the progress the soak asks for."""
    total = 0
    for run in results.iterdir() if results.is_dir() else ():
        s = _summary(run)
        if s.get("status") in ("completed", "pruned") and isinstance(s.get("steps"), int):
            total += s["steps"]
            continue
        steps = [int(m.group(1)) for p in (run / "checkpoints").glob("step=*.ckpt") if (m := STEP_NAME.match(p.name))]
        total += max(steps, default=0)
    return total


def _summary(run: Path) -> dict:
    try:
        return json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
