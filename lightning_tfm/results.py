"""Reading the local results store (run folders): the source of truth for reports and tables."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path


def read_summary(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / "summary.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
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
                step = int(float(row.pop("step")))
                dest = by_step.setdefault(step, {"step": step})
                for key, value in row.items():
                    if value not in ("", None):
                        v = float(value)
                        if not math.isnan(v):
                            dest[key] = v
    return [by_step[s] for s in sorted(by_step)]
