"""Reading the local results store (run folders): the source of truth for reports and tables."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

# The words of the error a second `ltfm train` of a run prints (exit 2) while another process trains it;
# a sweep worker reads them in the trial's log to tell "already running" from a failure.
RUN_LOCKED = "is already being trained by"

# summary.json fields and the types a reader may rely on (None is always allowed). A file that breaks
# one of them (hand-edited, from another tool, truncated) is reported as unreadable, never half-used.
_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "status": (str,), "error": (str,), "run_dir": (str,), "host": (str,), "config": (dict,),
    "steps": (int,), "epochs": (int,), "pid": (int,), "params": (int,), "vocab_size": (int,), "world_size": (int,),
    "train_tokens": (int, float), "dev_loss": (int, float), "dev_ppl": (int, float), "dev_bleu": (int, float),
    "test_bleu": (int, float), "wall_time_s": (int, float), "train_time_s": (int, float),
    "tokens_per_s": (int, float), "attempts": (list,),
}


def summary_problem(summary) -> str | None:
    """Why ``summary`` (parsed summary.json) cannot be used, or None when it can."""
    if not isinstance(summary, dict):
        return f"holds a JSON {type(summary).__name__}, not an object"
    for key, types in _TYPES.items():
        v = summary.get(key)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            return f"{key} is {v!r}, not a {' or '.join(t.__name__ for t in types)}"
    if not all(isinstance(a, dict) for a in summary.get("attempts") or []):
        return "attempts is not a list of objects"
    cfg = summary.get("config")
    if cfg is not None and not all(isinstance(v, dict) for v in cfg.values()):
        return "config is not a mapping of sections"
    return None


def load_summary(run_dir: str | Path) -> tuple[dict | None, str | None]:
    """(summary, problem) of a run folder: (dict, None) when readable, (None, None) when there is no
    summary.json, (None, "why") when it is there but unusable (truncated, not an object, wrong types)."""
    path = Path(run_dir) / "summary.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as e:
        return None, f"cannot be read ({e.__class__.__name__})"
    try:
        summary = json.loads(text)
    except ValueError:
        return None, "is not valid JSON (truncated?)"
    problem = summary_problem(summary)
    return (None, problem) if problem else (summary, None)


def read_summary(run_dir: str | Path) -> dict | None:
    """The run's summary.json as a dict, or None when it is missing or unusable (see :func:`load_summary`)."""
    return load_summary(run_dir)[0]


def latest_completed(summary: dict) -> dict | None:
    """The summary itself when completed, else the newest completed earlier attempt (``attempts``), or None."""
    if summary.get("status") == "completed":
        return summary
    for attempt in reversed(summary.get("attempts") or []):
        if attempt.get("status") == "completed":
            return attempt
    return None


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The metric history of a run as rows {"step": int, key: float, ...}, merged over resumed attempts.

    Each attempt of a run (the first training and every resume) writes its own Lightning CSVLogger file
    ``logs/version_N/metrics.csv``; a later attempt's value wins for the same step and key.
    """
    by_step: dict[int, dict] = {}
    files = sorted(Path(run_dir).glob("logs/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1]))
    for path in files:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                try:  # a row cut short by a full disk or a killed process is skipped, not fatal
                    step = int(float(row.pop("step")))
                except (TypeError, ValueError):
                    continue
                dest = by_step.setdefault(step, {"step": step})
                for key, value in row.items():
                    if key is not None and isinstance(value, str) and value:
                        try:
                            v = float(value)
                        except ValueError:
                            continue
                        if not math.isnan(v):
                            dest[key] = v
    return [by_step[s] for s in sorted(by_step)]
