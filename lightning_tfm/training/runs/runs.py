"""The local results store as a terminal table, for ``ltfm runs`` (:mod:`lightning_tfm.cli.runs`; for users who are
not at the dashboard).

The results folder is the source of truth; each run folder's ``summary.json`` is read as it is.

Status: the summary's ``status`` (``completed`` | ``stopped`` | ``failed`` | ``running``), with refinements:

- ``stale``: the summary says ``running`` but records the ``pid`` and ``host`` of its process, the host
  is this machine and that process no longer exists (killed worker, crash). A running summary without
  pid/host, or from another host, stays ``running`` -- we cannot tell from here.
- ``unreadable``: ``summary.json`` exists but is not valid JSON or not a summary (wrong types; the
  ``error`` key says why); ``no summary``: a run folder (it has a ``config.yaml``) whose ``summary.json``
  was never written.
- ``failed (completed before)``: a continuation (larger ``train.max_steps``) failed; the run's earlier
  completed results are kept in ``summary.json``'s ``attempts`` and shown in the other columns.
- ``stopped at N``: a signal stopped the run at step N (SIGTERM, Ctrl-C; the same command resumes it); its dev
  perplexity is that of its last validation, shown with that step (``12.34 @100``).

A results folder that does not exist (``results/`` before any training, when ``make ablation QUICK=1`` wrote
``results-quick/``) is an error that names the folders beside it that hold runs (:func:`results_folders_near`);
``ltfm runs RUN --wandb`` finds the run folder of a run id there too (:func:`find_run`).
"""
from __future__ import annotations

import difflib
import math
import os
import shlex
import socket
from pathlib import Path
from typing import Any

from ...base.errors import UserError
from .results import RESULT_FIELDS, latest_completed, load_summary

# Row keys (also the --json keys and the accepted --sort keys).
ROW_KEYS = ("id", "variant", "family", "study", "arch", "precision", *RESULT_FIELDS, "validated_at", "wandb_run_id",
            "wandb_mode", "attempts", "error", "path")
# (header, row key) of the terminal table.
COLUMNS = (("id", "id"), ("variant", "variant"), ("arch", "arch"), ("precision", "precision"), ("status", "status"),
           ("params", "params"), ("dev_ppl", "dev_ppl"), ("dev_bleu", "dev_bleu"), ("test_bleu", "test_bleu"),
           ("wall time", "wall_time_s"))
SORT_ALIASES = {"wall_time": "wall_time_s", "wall": "wall_time_s", "time": "wall_time_s", "ppl": "dev_ppl",
                "bleu": "dev_bleu", "run_id": "id", "name": "id"}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _status(summary: dict) -> str:
    status = str(summary.get("status") or "unknown")
    if status == "running":
        pid, host = summary.get("pid"), summary.get("host")
        if isinstance(pid, int) and host == socket.gethostname() and not _pid_alive(pid):
            return "stale"
    return status


def _default_arch() -> str:
    """model.arch's default: what a summary written before the key existed built (imported only then: the model
    package loads torch)."""
    from ...model.config import ModelConfig

    return ModelConfig.arch


def _row(run_dir: Path) -> dict | None:
    summary_path = run_dir / "summary.json"
    row: dict[str, Any] = {k: None for k in ROW_KEYS}
    row["id"], row["path"] = run_dir.name, str(run_dir)
    if not summary_path.is_file():
        if not (run_dir / "config.yaml").is_file():
            return None  # not a run folder (e.g. a wandb dir, a sweep database)
        row["status"] = "no summary"
        return row
    summary, problem = load_summary(run_dir)
    if summary is None:
        row["status"] = "unreadable"
        row["error"] = f"summary.json {problem}"
        return row
    cfg = summary.get("config") or {}
    run_cfg = cfg.get("run") or {}
    row.update({k: summary.get(k) for k in ROW_KEYS if k in summary and k not in ("id", "path", "status")})
    row["id"] = summary.get("run_id") or run_dir.name
    for key in ("variant", "family", "study"):
        row[key] = row.get(key) or run_cfg.get(key)
    if "model" in cfg:  # the architecture built (model.arch)
        row["arch"] = (cfg.get("model") or {}).get("arch") or _default_arch()
    row["status"] = _status(summary)
    validation = summary.get("last_validation")
    if row["status"] == "stopped":
        row["status"] = f"stopped at {summary['steps']}" if isinstance(summary.get("steps"), int) else "stopped"
        if isinstance(validation, dict) and row.get("dev_ppl") is None and latest_completed(summary) is None:
            row.update(dev_ppl=validation.get("dev_ppl"), dev_loss=validation.get("dev_loss"),
                       validated_at=validation.get("step"))
    row["attempts"] = len(summary.get("attempts") or []) + 1
    earlier = latest_completed(summary)
    if earlier is not None and earlier is not summary:
        # A continuation that failed keeps the run's earlier completed results: show them, and say so.
        row["status"] = f"{row['status']} (completed before)"
        for key in ROW_KEYS:
            if key not in ("id", "path", "status", "variant", "family", "study", "arch") and row.get(key) is None:
                row[key] = earlier.get(key)
    return row


def is_run_folder(path: Path) -> bool:
    """A folder ``ltfm train`` made: it holds a ``summary.json`` or a ``config.yaml``."""
    return (path / "summary.json").is_file() or (path / "config.yaml").is_file()


def results_folders_near(folder: str | os.PathLike, limit: int = 200) -> list[tuple[Path, int]]:
    """The folders beside ``folder`` (in its parent, hidden ones aside, the first ``limit`` by name) that hold
    run folders, with their number of runs: those named ``results*`` first, then by number of runs."""
    parent = Path(folder).parent
    try:
        siblings = sorted(d for d in parent.iterdir() if d.is_dir() and not d.name.startswith("."))[:limit]
    except OSError:
        return []
    found = []
    for d in siblings:
        if d.name == Path(folder).name:
            continue
        try:
            count = sum(1 for child in d.iterdir() if child.is_dir() and is_run_folder(child))
        except OSError:
            continue
        if count:
            found.append((d, count))
    return sorted(found, key=lambda dc: (not dc[0].name.startswith("results"), -dc[1], dc[0].name))


def results_hint(folder: str | os.PathLike) -> str:
    """``"results-quick/ holds 21 runs: ltfm runs results-quick"`` for the folders beside ``folder`` that hold
    runs, or "" when none does."""
    near = results_folders_near(folder)
    if not near:
        return ""
    (first, count), rest = near[0], near[1:3]
    hint = f"{first}/ holds {count} run{'s' * (count != 1)}: ltfm runs {shlex.quote(str(first))}"
    if rest:
        hint += f" (also {', '.join(f'{d}/: {n}' for d, n in rest)})"
    return hint


def list_runs(results_dir: str | os.PathLike) -> list[dict]:
    """One row per run folder of ``results_dir`` (keys ``ROW_KEYS``), in folder-name order."""
    root = Path(results_dir)
    if not root.is_dir():
        hint = results_hint(root)
        if hint:
            missing = f"no {results_dir}/ here" if len(root.parts) == 1 else f"no folder {results_dir}"
            raise UserError(f"{missing}; {hint}")
        raise UserError(f"results folder {str(results_dir)!r} not found: pass the folder that holds the run "
                        "folders (run.results_dir, default 'results')")
    rows = [_row(d) for d in sorted(root.iterdir()) if d.is_dir()]
    return [r for r in rows if r is not None]


def find_run(name: str, results_dir: str | os.PathLike = "results") -> Path:
    """The folder of ``name``: a folder (a run folder, or any folder whose W&B run is in its ``wandb/``), else
    the run ``name`` of ``results_dir``, else of a folder beside it that holds runs (``results-quick/``)."""
    path = Path(name)
    if path.is_dir():
        if not is_run_folder(path) and not (path / "wandb").is_dir() and any(
                child.is_dir() and is_run_folder(child) for child in path.iterdir()):
            raise UserError(f"{name} is a results folder, not a run: ltfm runs {shlex.quote(name)} lists its runs; "
                            "give one of them")
        return path
    if len(path.parts) == 1 and name not in (".", ".."):
        for folder in [Path(results_dir), *(d for d, _ in results_folders_near(results_dir))]:
            if (folder / name).is_dir():
                return folder / name
    raise UserError(f"no run {name!r}: give a run folder or the id of a run in {results_dir}/ "
                    f"(ltfm runs {shlex.quote(str(results_dir))} lists them)")


def sort_key(name: str) -> tuple[str, bool]:
    """``--sort`` value -> (row key, descending). A leading ``-`` sorts descending: ``--sort=-dev_bleu``."""
    descending = name.startswith("-")
    key = name.lstrip("-").strip().replace(" ", "_")
    key = SORT_ALIASES.get(key, key)
    if key not in ROW_KEYS or key == "path":
        keys = [k for k in ROW_KEYS if k != "path"]
        close = difflib.get_close_matches(key.lower(), [*keys, *SORT_ALIASES], n=1)
        guess = f"did you mean {SORT_ALIASES.get(close[0], close[0])}? " if close else ""
        raise UserError(f"unknown sort column {name!r}: {guess}sortable columns are {', '.join(keys)} (a leading "
                        "- sorts descending: --sort=-dev_bleu)")
    return key, descending


def sort_rows(rows: list[dict], sort: str | None) -> list[dict]:
    """Rows sorted by one key; runs without that value always come last."""
    if not sort:
        return list(rows)
    key, descending = sort_key(sort)
    present = [r for r in rows if r.get(key) is not None]
    missing = [r for r in rows if r.get(key) is None]
    numeric = all(isinstance(r[key], (int, float)) for r in present)
    present.sort(key=(lambda r: r[key]) if numeric else (lambda r: str(r[key])), reverse=descending)
    return present + missing


def _fmt_params(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return str(int(n))


def _fmt_num(x: Any, digits: int) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}f}"


def _fmt_time(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _cell(key: str, value: Any) -> str:
    if key == "params":
        return _fmt_params(value)
    if key in ("dev_ppl",):
        return _fmt_num(value, 2)
    if key in ("dev_bleu", "test_bleu"):
        return _fmt_num(value, 1)
    if key == "wall_time_s":
        return _fmt_time(value)
    return "-" if value is None else str(value)


def format_table(rows: list[dict], sort: str | None = None) -> str:
    """A plain-text table: id, variant, arch, precision, status, params, dev_ppl, dev_bleu, test_bleu, wall time."""
    rows = sort_rows(rows, sort)
    header = [h for h, _ in COLUMNS]
    body = [[_cell(k, r.get(k)) + (f" @{r['validated_at']}" if k == "dev_ppl" and r.get("validated_at") else "")
             for _, k in COLUMNS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    numeric = {"params", "dev_ppl", "dev_bleu", "test_bleu", "wall time"}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if h in numeric else c.ljust(w)
                         for c, w, h in zip(cells, widths, header)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])

