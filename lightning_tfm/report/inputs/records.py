"""A sweep's runs as :class:`RunRecord` lists, whatever the source, and the readers' parts (a W&B run, the planned
configs, the local source's folders); :func:`lightning_tfm.report.inputs.sources.load_report_data` puts them together:

- local (default): the sweep's Optuna storage (``--storage``, else ``<results_dir>/<sweep name>.db`` when it
  exists) says which trials exist and their state; each trial's run folder (``summary.json``, the metric
  history of :func:`lightning_tfm.training.runs.results.read_metrics`, ``hyps/dev.<tgt>.txt``) gives the numbers. When a
  run folder is not here (workers on other machines), the values the worker recorded in the trial's user
  attributes are used. Run folders of the study that the storage does not know (or no storage at all) are
  read from the results folder.
- W&B (``wandb_path="ENTITY/PROJECT"``): the runs of group = sweep name through W&B's public API: flat config
  keys (``model.heads``, ``run.variant``, ...), summary (``dev_ppl``, ``dev_bleu``, ``params``, ``status``),
  name, job_type, state, and the history (``dev/ppl``, ``train/loss``, ... against ``trainer/global_step``).

Both sources become :class:`RunRecord` lists, and everything after that (the tables, the figures) is the same
code. One record per (variant, seed): the latest trial (or, without a storage, the latest run). A trial's
configuration comes from the sweep's own :func:`lightning_tfm.sweep.trial_config`, never re-derived here. A run
folder another sweep trained on after the trial is read at the trial's budget (:mod:`.budget`); a completed run whose
dev loss or PPL is no number (nan, inf) is :data:`DIVERGED` (:func:`mark_diverged`).

Configs here stay data, not typed :class:`~lightning_tfm.training.config.config.Config` objects: a record holds its
run's config as the flat dict of :func:`~lightning_tfm.training.config.config.flatten` (``rec.config["model.heads"]``),
read from a summary.json's plain nested "config" or W&B's flat config; a report only reads them.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ...base.errors import UserError
from ...training.runs.results import DEV_BLEU, DEV_LOSS, DEV_PPL, TRAIN_LOSS
from ..core.text import first_line

HISTORY_KEYS = (DEV_LOSS, DEV_PPL, DEV_BLEU, TRAIN_LOSS)


WANDB_STEP = "trainer/global_step"


DONE = "completed"


# A run that ended with a dev loss or perplexity that is no number (nan, inf): not a result, never averaged
DIVERGED = "diverged"


# The job type of ``ltfm report``'s run in the sweep's W&B group (:mod:`.publish.wandb_run`): not a training run.
REPORT_JOB_TYPE = "report"

# training.tracking.PIPELINE_CHECK, the tag (not imported from there: it would load Lightning into the report's kernel)
PIPELINE_CHECK = "pipeline-check"


def is_pipeline_check(records) -> bool:
    """The runs are a pipeline check's (``make ablation QUICK=1`` tags them ``pipeline-check``): any run tagged so
    makes its report one (a check's numbers never pass for the sweep's)."""
    def tags(rec) -> list:
        t = (rec.config or {}).get("wandb.tags")
        return [str(x) for x in t] if isinstance(t, (list, tuple)) else [str(t)] if t else []
    return any(PIPELINE_CHECK in tags(r) for r in records)


@dataclass
class RunRecord:
    """One (variant, seed) of a sweep as the report sees it, whatever the source."""
    variant: str
    family: str | None = None
    seed: int | None = None
    status: str = "missing"     # completed | pruned | failed | skipped | running | waiting | missing | diverged | ...
    config: dict = field(default_factory=dict)   # flat dotted keys: model.heads, train.max_steps, ...
    params: int | None = None
    dev_loss: float | None = None
    dev_ppl: float | None = None
    dev_bleu: float | None = None
    steps: int | None = None
    history: list[dict] = field(default_factory=list)  # rows {"step": int, "dev/ppl": float, ...}
    hyps: str | None = None     # dev hypotheses file (local runs)
    run: str | None = None      # run folder (local) or W&B run id
    trial: int | None = None    # Optuna trial number
    note: str | None = None     # why it failed / was skipped
    bleu_signature: str | None = None
    wall_time_s: float | None = None
    started_at: str | None = None   # ISO local time, from summary.json
    finished_at: str | None = None
    host: str | None = None
    precision: str | None = None    # what train.precision resolved to (auto: bf16-mixed or 32), from summary.json
    # what the row's training compute is counted from (.compute): target tokens trained, the vocabulary, the
    # tokens a step was given, the mean source and target sentence lengths of the prepared training corpus
    train_tokens: float | None = None
    vocab_size: int | None = None
    effective_batch_tokens: int | None = None
    src_len: float | None = None
    tgt_len: float | None = None
    # what its run folder holds beyond this sweep's budget when the record is read at that budget (.budget)
    later_attempt: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == DONE


def as_number(x: Any) -> float | None:
    """A source's value as a finite float (a number, or its text), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:
            x = float(x)  # W&B may hand back numbers as strings ("NaN", "Infinity")
        except (TypeError, ValueError):
            return None
    x = float(x)
    return x if math.isfinite(x) else None


def as_int(x: Any) -> int | None:
    """A source's value as an int (:func:`as_number` truncated), else None."""
    v = as_number(x)
    return int(v) if v is not None else None


def nonfinite(x: Any) -> bool:
    """A number that is not finite (nan, inf; W&B may hand them back as strings "NaN", "Infinity")."""
    if isinstance(x, bool) or x is None:
        return False
    try:
        return not math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def mark_diverged(rec: RunRecord, raw: dict) -> RunRecord:
    """A completed run whose source (``raw``: a summary, a trial's attributes) gives a dev loss or perplexity that
    is no number is :data:`DIVERGED`, with the value in its note: never a row's result, nor a seed of the base's
    noise."""
    bad = next((k for k in ("dev_ppl", "dev_loss") if nonfinite(raw.get(k))), None)
    if bad and rec.status == DONE:
        rec.status, rec.note = DIVERGED, f"{'dev PPL' if bad == 'dev_ppl' else 'dev loss'} {float(raw[bad])} at the end"
    return rec


def wandb_record(config: dict, summary: dict, *, name: str | None = None, job_type: str | None = None,
                 state: str | None = None, run_id: str | None = None, history: Iterable[dict] = ()) -> RunRecord:
    """One W&B run as a record: ``config`` = the run's (flat) config, ``summary`` = its summary metrics,
    ``history`` = rows holding ``trainer/global_step`` (or ``step``) and metric keys. The public API gives
    ``run.config``, ``run.summary_metrics``, ``run.name``, ``run.job_type``, ``run.state``, ``run.id`` and
    ``run.scan_history``; an offline run file read back gives the same fields."""
    config = {k: v for k, v in dict(config or {}).items() if not k.startswith("_")}
    summary = dict(summary or {})
    variant = config.get("run.variant") or (re.sub(r"-s\d+$", "", name) if name else None) or run_id or "?"
    # summary.status is what our training wrote (completed | pruned | failed); a crashed or killed process
    # never wrote it, and W&B's own state says so.
    status = summary.get("status") or {"finished": DONE, "running": "running", "pending": "waiting"}.get(
        str(state).lower(), "failed" if state else "unknown")
    by_step: dict[int, dict] = {}
    for row in history or ():
        step = as_int(row.get(WANDB_STEP, row.get("step")))
        if step is None:
            continue
        dest = by_step.setdefault(step, {"step": step})
        for key in HISTORY_KEYS:
            v = as_number(row.get(key))
            if v is not None:
                dest[key] = v
    rec = RunRecord(variant=str(variant), family=config.get("run.family") or job_type,
                    seed=as_int(config.get("run.seed")), status=str(status),
                    config={k: v for k, v in config.items() if "." in k}, params=as_int(summary.get("params")),
                    dev_loss=as_number(summary.get("dev_loss")), dev_ppl=as_number(summary.get("dev_ppl")),
                    dev_bleu=as_number(summary.get("dev_bleu")), steps=as_int(summary.get("steps")),
                    history=[by_step[s] for s in sorted(by_step) if len(by_step[s]) > 1],
                    run=run_id, bleu_signature=summary.get("bleu_signature"),
                    train_tokens=as_number(summary.get("train_tokens")), vocab_size=as_int(summary.get("vocab_size")))
    return mark_diverged(rec, summary)


@dataclass


class ReportData:
    sweep: Any                      # lightning_tfm.sweep.Sweep
    records: list[RunRecord]
    source: str                     # one line: where the records came from
    planned: dict[str, dict]        # variant -> flat config the sweep file plans (rows without runs)
    study: Any = None               # the Optuna study when read from a storage
    notes: list[str] = field(default_factory=list)
    # read from an export (.export): the paired bootstrap and the run info as the exported report computed them
    bootstrap: tuple | None = None  # (tests, notes, signature) of stats.paired_bootstrap
    run_info: dict | None = None    # table.sweep_run_info

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r.status] = counts.get(r.status, 0) + 1
        states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
        return "\n".join([f"sweep {self.sweep.name} ({self.sweep.path.name}): {states}", f"source: {self.source}",
                          *self.notes])


WANDB_PATH = re.compile(r"^[^/\s]+/[^/\s]+$")


def check_wandb_path(path: str) -> str:
    if not isinstance(path, str) or not WANDB_PATH.match(path):
        raise UserError(f"--from-wandb {path!r} must be ENTITY/PROJECT, e.g. my-team/lightning_tfm")
    return path


def wandb_base_url() -> str:
    """The W&B server the public API talks to (WANDB_BASE_URL, else wandb's settings)."""
    from wandb import env
    from wandb.sdk import wandb_setup
    return env.get_base_url(wandb_setup.singleton().settings.base_url).rstrip("/")


def check_wandb_access(path: str, probe_timeout: float = 10.0) -> None:
    """Before asking the public API anything: the path's form, an API key, and a TCP connection to the
    server (wandb's own client retries for a long time when the network is down)."""
    import socket
    from urllib.parse import urlparse

    from ...base.redact import mask_url
    from ...training.tracking.tracking import has_api_key
    check_wandb_path(path)
    if not has_api_key():
        raise UserError("--from-wandb needs a W&B API key: set WANDB_API_KEY or run `wandb login` "
                        "(or drop --from-wandb to read the local results)")
    url = wandb_base_url()
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=probe_timeout).close()
    except OSError as e:
        raise UserError(f"cannot reach W&B at {mask_url(url)} ({e.strerror or e.__class__.__name__}): --from-wandb "
                        "needs the network (or drop it to read the local results)") from None


def default_results_dir(sweep) -> Path:
    """The results folder the sweep writes to by default (its experiment's run.results_dir, from the cwd)."""
    from ...sweep import trial_config
    return Path(trial_config(sweep, checked=False).run.results_dir).absolute()


def resolve_local(sweep, results_dir: str | Path | None, storage: str | None,
                  options: tuple[str, str] = ("--results", "--storage")) -> tuple[Path, str | None]:
    """(absolute results folder, storage URL or None) of the local source, or a one-line UserError naming
    ``options`` (the command line's results and storage options of this side) when there is nothing to read."""
    from ...base.redact import mask_url
    from ...sweep import default_storage, open_storage

    if results_dir is not None:
        results = Path(results_dir).absolute()
        if not results.is_dir():
            raise UserError(f"results folder {str(results_dir)!r} not found: pass the folder the sweep wrote its "
                            f"run folders to ({options[0]}, the sweep's run.results_dir)")
    else:
        results = default_results_dir(sweep)
    if storage:
        open_storage(storage, create=False)  # malformed / unreachable / no such file: one line, exit 2
        return results, storage
    url = default_storage(sweep, results)
    has_db = (results / f"{sweep.name}.db").is_file()
    if not has_db and not results.is_dir():
        raise UserError(f"no results for sweep {sweep.name!r}: neither {results} nor {mask_url(url)} exists"
                        + (elsewhere_hint(sweep, results, options[0]) or f"; run `ltfm sweep {sweep.path}` first, or "
                           f"pass {options[0]} DIR / {options[1]} URL" + committed_hint(
                               sweep, "--against-export" if options[0].startswith("--against") else "--from-export")))
    return results, (url if has_db else None)


def completed_runs(sweep, folder: Path) -> int:
    """How many run folders directly in ``folder`` are completed runs of ``sweep`` (their summary.json: status
    completed, run.study the sweep's name)."""
    from ...training.runs.results import read_summary

    n = 0
    for d in sorted(folder.iterdir()) if folder.is_dir() else ():
        summary = read_summary(d) if d.is_dir() else None
        if isinstance(summary, dict) and summary.get("status") == "completed" \
                and ((summary.get("config") or {}).get("run") or {}).get("study") == sweep.name:
            n += 1
    return n


def elsewhere_hint(sweep, results: Path, option: str = "--results") -> str:
    """``"; results-quick/ has 14 completed runs of it: ltfm report S.yaml --results results-quick"``: the folders
    beside ``results`` (``make ablation QUICK=1`` writes results-quick/) holding completed runs of ``sweep``, the
    one with the most named with the option that reads it; "" when there is none."""
    import shlex

    results = Path(results).absolute()
    found = sorted(((completed_runs(sweep, d), d) for d in sorted(results.parent.iterdir())
                    if d.is_dir() and d != results and not d.name.startswith(".")), key=lambda x: -x[0]) \
        if results.parent.is_dir() else []
    found = [(n, d) for n, d in found if n]
    if not found:
        return ""
    n, best = found[0]
    shown = Path(os.path.relpath(best)) if not os.path.relpath(best).startswith("..") else best
    others = f" (also {', '.join(f'{d.name}/ {k}' for k, d in found[1:])})" if found[1:] else ""
    return (f"; {shown}/ has {n} completed run(s) of it{others}: ltfm report {shlex.quote(str(sweep.path))} "
            f"{option} {shlex.quote(str(shown))}")


def committed_exports(sweep) -> list[Path]:
    """The export folders of ``sweep`` committed with a checkout (``reports/reference/*/export/<sweep name>.json``,
    of the folder a command runs in and of the checkout the sweep file sits in), the one of the report named as the
    sweep first; each relative to here when below it, as a command line names it."""
    found: list[Path] = []
    for top in (Path("reports/reference"), Path(sweep.path).absolute().parent.parent / "reports" / "reference"):
        for f in sorted(top.glob(f"*/export/{sweep.name}.json")) if top.is_dir() else ():
            folder = f.parent.absolute()
            if folder not in found:
                found.append(folder)
    found.sort(key=lambda d: d.parent.name != sweep.name)
    return [Path(os.path.relpath(d)) if not os.path.relpath(d).startswith("..") else d for d in found]


def committed_hint(sweep, option: str = "--from-export") -> str:
    """``"; or read its committed export: --from-export reports/reference/table3-cpu/export"`` (and the others
    beside it), "" when none is committed (:func:`committed_exports`)."""
    found = committed_exports(sweep)
    if not found:
        return ""
    others = f" (also {', '.join(map(str, found[1:]))})" if found[1:] else ""
    return f"; or read its committed export: {option} {found[0]}{others}"


def planned_configs(sweep, records: list[RunRecord] | None = None) -> dict[str, dict]:
    """variant -> the flat config of its trial, for rows without a run: the sweep's own trial config
    (:func:`lightning_tfm.sweep.trial_config`), and when a base run completed, with the command-line overrides
    given to the sweep included: a row of the sweep's experiment gets its trial overrides on that run's config, a
    row of its own experiment (``variants.<name>.experiment``: another architecture) its trial config from that
    experiment with the keys the base run's config changed from the sweep's plan of it (:func:`_cli_of`)."""
    from ...sweep import Entry, trial_config, trial_overrides
    from ...training.config.config import flatten

    if sweep.mode != "variants":
        return {}
    base = next((r for r in records or [] if r.variant == "base" and r.completed and r.config), None)
    base_budget = (sweep.variants.get("base") or {}).get("budget", 1.0)
    out = {}
    for name, v in sweep.variants.items():
        entry = Entry(name, v["family"], sweep.seeds[0], v["overrides"], v["budget"])
        try:
            flat = flatten(trial_config(sweep, entry, checked=False))
        except UserError:
            flat = {}
        if base is not None and sweep.experiment_of(name) != sweep.experiment:
            try:
                flat = flatten(trial_config(sweep, entry, _cli_of(sweep, base, base_budget), checked=False))
            except UserError:
                pass
        elif base is not None:
            steps = base.config.get("train.max_steps")
            # the base run's train.max_steps already carries the base's budget: apply the variant's relative to it
            relative = v["budget"] / base_budget if isinstance(steps, int) else 1.0
            flat = {**flat, **trial_overrides(sweep, dataclasses.replace(entry, budget=relative), base.config, steps)}
        out[name] = flat
    return out


def _cli_of(sweep, base: RunRecord, base_budget: float) -> dict:
    """The command-line overrides a completed base run shows: the keys of its config (run.* bookkeeping aside) that
    differ from the sweep's own plan of the base row, its train.max_steps without the base's budget factor."""
    from ...sweep import Entry, trial_config
    from ...training.config.config import flatten

    v = sweep.variants["base"]
    plan = flatten(trial_config(sweep, Entry("base", v["family"], sweep.seeds[0], v["overrides"], v["budget"]),
                                checked=False))
    cli = {k: x for k, x in base.config.items() if not k.startswith("run.") and k in plan and plan[k] != x}
    if isinstance(cli.get("train.max_steps"), int):
        cli["train.max_steps"] = max(1, round(cli["train.max_steps"] / base_budget))
    return cli


def latest_per_key(records: list[RunRecord]) -> list[RunRecord]:
    """One record per (variant, seed): the last one given (W&B lists runs oldest first)."""
    chosen: dict[tuple, RunRecord] = {}
    for r in records:
        chosen.pop((r.variant, r.seed), None)
        chosen[(r.variant, r.seed)] = r
    return list(chosen.values())


def _wandb_history(run) -> list[dict]:
    rows: list[dict] = []
    for key in HISTORY_KEYS:
        rows.extend(run.scan_history(keys=[WANDB_STEP, key], page_size=1000))
    return rows


def fetch_wandb_records(path: str, group: str, timeout: int = 20) -> list[RunRecord]:
    """The runs of W&B project ``path`` in group ``group`` (oldest first) as records; network and API
    errors become one-line UserErrors."""
    check_wandb_access(path)
    try:
        import wandb

        api = wandb.Api(timeout=timeout)
        runs = list(api.runs(path, filters={"group": group}, order="+created_at", per_page=100, lazy=False))
        runs = [run for run in runs if run.job_type != REPORT_JOB_TYPE]  # the group's report run is no row
        return [wandb_record(dict(run.config), dict(run.summary_metrics), name=run.name, job_type=run.job_type,
                             state=run.state, run_id=run.id, history=_wandb_history(run)) for run in runs]
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - no network, bad key, no such project: one line
        from ...base.redact import scrub
        first = first_line(scrub(str(e)))
        raise UserError(f"cannot read W&B project {path!r} ({e.__class__.__name__}: {first}); check ENTITY/PROJECT, "
                        "the API key and the network") from None
