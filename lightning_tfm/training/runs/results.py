"""What a run's results are, in one place: the metric names it logs, the fields of its ``summary.json``,
and the readers of the local results store (run folders), the source of truth for tables and reports.

Training writes these names (``lit.py``, ``train.py``), and everything that reads results uses them from
here: pruning and the sweep worker (``sweep/``), W&B tracking (``tracking.py``), ``ltfm runs`` and the
reports. Renaming a metric here renames it everywhere; a stray string literal elsewhere is a bug.
"""
from __future__ import annotations

import csv
import json
import math
import typing
from pathlib import Path
from typing import TypedDict

# ------------------------------------------------------------------------------------------ metric names
# History keys: what the LightningModule logs at each step / validation (metrics.csv columns, W&B history).
TRAIN_LOSS = "train/loss"            # label-smoothed loss per target token
TRAIN_NLL = "train/nll"              # negative log-likelihood per target token
TRAIN_LR = "train/lr"
TRAIN_TOKENS_PER_S = "train/tokens_per_s"
DEV_LOSS = "dev/loss"                # per-wordpiece NLL on the dev set: dev/ppl = exp(dev/loss) (Table 3's PPL)
DEV_PPL = "dev/ppl"
DEV_SMOOTHED_LOSS = "dev/smoothed_loss"
DEV_BLEU = "dev/bleu"                # sacreBLEU of beam search on the first decode.dev_bleu_subset sentences
DEV_BLEU_RATIO = "dev/bleu_ratio"
DEV_SAMPLES = "dev/samples"          # W&B table of sample translations

# The fewest training-loss points a run logs (:func:`log_every`): the report's loss panels need a curve.
MIN_LOSS_POINTS = 10


def log_every(log_every_steps: int, max_steps: int) -> int:
    """How often a run logs TRAIN_LOSS (and the other per-step metrics), in optimizer steps: ``train.log_every_steps``,
    shortened for a run too short to log :data:`MIN_LOSS_POINTS` points at it (a pipeline check's 20 steps at the
    default 50 would log none)."""
    return max(1, min(log_every_steps, max_steps // MIN_LOSS_POINTS))


# The summary.json keys a sweep may optimise, with the history key reported at each validation (pruning)
# and the direction that is better.
OBJECTIVES: dict[str, tuple[str, str]] = {
    "dev_loss": (DEV_LOSS, "minimize"),
    "dev_ppl": (DEV_PPL, "minimize"),
    "dev_bleu": (DEV_BLEU, "maximize"),
}


def history_key(summary_key: str) -> str:
    """The logged (history) key of an objective: ``dev_loss`` -> ``dev/loss``."""
    return OBJECTIVES[summary_key][0]


# ----------------------------------------------------------------------------------------- summary.json
class Summary(TypedDict, total=False):
    """``<run>/summary.json``: written by ``train.train`` at the start of each attempt (status ``running``) and
    at its end. Every field may be missing or null (a run that failed early has few)."""
    run_id: str
    status: str                  # running | completed | pruned | stopped (a signal) | failed (| interrupted)
    error: str                   # one line, when failed or stopped (what stopped it)
    run_dir: str
    host: str
    pid: int
    attempt: str                 # the sweep worker's token for this attempt (ATTEMPT_ENV), when a worker started it
    config: dict                 # the resolved config, secrets masked
    started_at: str
    finished_at: str
    params: int
    vocab_size: int
    world_size: int
    accumulate: int
    effective_batch_tokens: int
    precision: str               # what train.precision resolved to, Lightning's full name (PRECISION_NAMES)
    train_pairs: int
    skipped_train_pairs: int
    data_cache: str              # the prepared corpus the run trained on, and its hash
    data_cache_hash: str
    corpus: str | None           # the corpus's content identity, hashed in the run id (corpus_id.fingerprint)
    length_limit: int            # longest sentence (pieces) trained on; longer dev/test pairs are truncated
    truncated_dev_pairs: int
    truncated_test_pairs: int
    steps: int
    epochs: int
    train_tokens: int | float
    dev_loss: int | float        # the last validation's DEV_LOSS (a completed or pruned run's)
    dev_ppl: int | float
    last_validation: dict        # a stopped run's last validation: {"step", "dev_loss", "dev_ppl"}
    dev_bleu: int | float        # beam search on the whole dev set at the end
    test_bleu: int | float
    dev_bleu_ratio: int | float  # hypothesis/reference length ratio
    test_bleu_ratio: int | float
    dev_bleu_tok_compound_split: int | float   # German target: t2t's tokenized BLEU, comparable to the paper's
    test_bleu_tok_compound_split: int | float
    bleu_signature: str
    bleu_checkpoint: str         # "last" or "average of last N"
    decode: dict                 # beam_size, length_penalty, max_len_a, max_len_b
    dev_bleu_history: list       # [step, dev BLEU on the subset] during training
    wall_time_s: int | float     # over all attempts
    train_time_s: int | float
    tokens_per_s: int | float
    wandb_run_id: str
    wandb_project: str
    wandb_mode: str
    attempts: list               # earlier attempts (their summaries without config), oldest first


# Lightning's short precision names and the full ones they stand for: a summary records the full name ("32-true",
# "bf16-mixed", "16-mixed"); a summary written before it did ("32") reads as the full name (:func:`load_summary`;
# :mod:`.upgrade`, rule 5).
PRECISION_NAMES = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}


def precision_name(precision):
    """Lightning's full name of a precision (``"32"`` -> ``"32-true"``, ``"bf16"`` -> ``"bf16-mixed"``); a full
    name, or a name Lightning may add later, as it is; None stays None."""
    if precision is None:
        return None
    return PRECISION_NAMES.get(str(precision), str(precision))


# The results every consumer shows or copies (runs table, sweep trial attributes, W&B run summary).
RESULT_FIELDS = ("status", "steps", "params", "dev_loss", "dev_ppl", "dev_bleu", "test_bleu", "train_tokens",
                 "wall_time_s", "tokens_per_s")
WANDB_FIELDS = ("wandb_run_id", "wandb_project", "wandb_mode")


def _field_types() -> dict[str, tuple[type, ...]]:
    out = {}
    for name, hint in typing.get_type_hints(Summary).items():
        args = typing.get_args(hint)
        types = args if args and typing.get_origin(hint) is not list else (typing.get_origin(hint) or hint,)
        out[name] = tuple(typing.get_origin(t) or t for t in types)
    return out


# Field -> the types a reader may rely on (None is always allowed). A file that breaks one of them
# (hand-edited, from another tool, truncated) is reported as unreadable, never half-used.
_TYPES: dict[str, tuple[type, ...]] = _field_types()

# A sweep worker gives each trial process it starts a fresh token in this variable, and the process writes it in its
# summary.json ("attempt"): how the worker tells the summary of the attempt it started from one an earlier attempt
# left (the pid would not: pids are reused after a restart, and a sweep resumed in a new container or on another
# host sharing the results folder can give its trial the pid of the killed attempt).
ATTEMPT_ENV = "LTFM_TRIAL_ATTEMPT"

# The words of the error a second `ltfm train` of a run prints (exit 2) while another process trains it;
# a sweep worker reads them in the trial's log to tell "already running" from a failure.
RUN_LOCKED = "is already being trained by"


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
    if problem:
        return None, problem
    for part in (summary, *(summary.get("attempts") or [])):  # an older summary's "32" as its full name (upgrade.py, 5)
        if part.get("precision") is not None:
            part["precision"] = precision_name(part["precision"])
    return summary, None


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


def last_validation(run_dir: str | Path, upto: int | None = None) -> dict | None:
    """The run's last validation up to optimizer step ``upto`` (all when None), from its metric history
    (:func:`read_metrics`, every attempt's): ``{"step", "dev_loss", "dev_ppl"}``, or None when it has none. Lightning
    logs a validation at ``global_step - 1``; ``step`` is the optimizer step it validated."""
    found = None
    for row in read_metrics(run_dir):
        step = int(row["step"]) + 1
        if DEV_LOSS in row and (upto is None or step <= upto):
            found = {"step": step, "dev_loss": row[DEV_LOSS],
                     "dev_ppl": row.get(DEV_PPL, math.exp(min(row[DEV_LOSS], 50.0)))}
    return found


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


def in_results(path: str | None, results_dir) -> str | None:
    """``path`` as written into reports and status tables: relative to the results folder when it is inside
    it (a run folder is its run id), so a copied report names no folder of the machine that wrote it."""
    if not path:
        return path
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path(results_dir).resolve()))
    except ValueError:
        return str(path)


def storage_in_results(url: str, results_dir) -> str:
    """A storage URL as shown in written files: a SQLite file inside the results folder by its name there,
    any other URL with its password masked."""
    from ...base.redact import mask_url

    prefix = "sqlite:///"
    if url.startswith(prefix):
        shown = in_results(url[len(prefix):], results_dir)
        if shown != url[len(prefix):]:
            return f"{shown} (SQLite, in the results folder)"
    return mask_url(url)
