"""The data behind the report notebooks: runs of a sweep -> Table 3 replica, search tables and figures.

The notebooks (``reports/table3.ipynb``, ``reports/search.ipynb``) stay thin: they call these functions,
and so do the tests.

Sources (:func:`load_report_data`):

- local (default): the sweep's Optuna storage (``--storage``, else ``<results_dir>/<sweep name>.db`` when it
  exists) says which trials exist and their state; each trial's run folder (``summary.json``, the metric
  history of :func:`lightning_tfm.results.read_metrics`, ``hyps/dev.<tgt>.txt``) gives the numbers. When a
  run folder is not here (workers on other machines), the values the worker recorded in the trial's user
  attributes are used. Run folders of the study that the storage does not know (or no storage at all) are
  read from the results folder.
- W&B (``wandb_path="ENTITY/PROJECT"``): the runs of group = sweep name through W&B's public API: flat config
  keys (``model.heads``, ``run.variant``, ...), summary (``dev_ppl``, ``dev_bleu``, ``params``, ``status``),
  name, job_type, state, and the history (``dev/ppl``, ``train/loss``, ... against ``trainer/global_step``).

Both sources become :class:`RunRecord` lists, and everything after that (:func:`build_table`, the figures)
is the same code. One record per (variant, seed): the latest trial (or, without a storage, the latest run).

The table (:func:`build_table`): one row per variant of the sweep file, in the paper's order (base, A1-A4,
B1, B2, C1-C7, D1-D4, E, big), then the sweep's other rows in file order, then runs of variants the file no
longer lists. A variant that is missing, waiting, running, failed, skipped (unbuildable) or pruned keeps its
row with that status; its numbers stay empty (only completed seeds are averaged). Several seeds: mean ±
sample standard deviation. Change (Δ) = the row's value minus its base's, ours against our base and the
paper's against the paper's base; "agrees" = the two changes have the same sign (rows where the paper's
change is 0 are not compared). BLEU differences are tested with sacreBLEU's paired bootstrap resampling
(1000 resamples, sacreBLEU's fixed seed 12345 unless ``SACREBLEU_SEED`` says otherwise) on the dev
hypotheses of the base and the row; with several seeds, the seeds both rows completed are pooled: the test
resamples (sentence, seed) pairs of the concatenated outputs.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from .errors import UserError

# tqdm.auto (imported by optuna and datasets) warns in a kernel without ipywidgets; a report has no progress bars.
warnings.filterwarnings("ignore", message="IProgress not found")

PAPER_ORDER = ("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
               "D1", "D2", "D3", "D4", "E", "big")
# (column header, flat config key): the knob columns of Table 3 (ours), plus positions and norm.
KNOBS = (("N", "model.layers"), ("d_model", "model.d_model"), ("d_ff", "model.d_ff"), ("h", "model.heads"),
         ("d_k", "model.d_k"), ("d_v", "model.d_v"), ("P_drop", "model.dropout"),
         ("ε_ls", "train.label_smoothing"), ("positional", "model.positional"), ("norm", "model.norm"),
         ("train steps", "train.max_steps"))
CSV_KNOBS = {"model.layers": "layers", "model.d_model": "d_model", "model.d_ff": "d_ff", "model.heads": "heads",
             "model.d_k": "d_k", "model.d_v": "d_v", "model.dropout": "dropout",
             "train.label_smoothing": "label_smoothing", "model.positional": "positional", "model.norm": "norm",
             "train.max_steps": "train_steps"}
HISTORY_KEYS = ("dev/loss", "dev/ppl", "dev/bleu", "train/loss")
WANDB_STEP = "trainer/global_step"
SIGNIFICANCE = 0.05
BOOTSTRAP_SAMPLES = 1000
DONE = "completed"


# ----------------------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One (variant, seed) of a sweep as the report sees it, whatever the source."""
    variant: str
    family: str | None = None
    seed: int | None = None
    status: str = "missing"     # completed | pruned | failed | skipped | running | waiting | missing | ...
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

    @property
    def completed(self) -> bool:
        return self.status == DONE


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:
            x = float(x)  # W&B may hand back numbers as strings ("NaN", "Infinity")
        except (TypeError, ValueError):
            return None
    x = float(x)
    return x if math.isfinite(x) else None


def _int(x: Any) -> int | None:
    v = _num(x)
    return int(v) if v is not None else None


def _flatten(cfg: dict) -> dict:
    from .config import flatten
    return flatten({k: v for k, v in (cfg or {}).items() if isinstance(v, dict)})


def record_from_summary(summary: dict, run_dir: str | Path | None = None) -> RunRecord:
    """A run folder's ``summary.json`` (+ its metric history and dev hypotheses when ``run_dir`` is given)."""
    from .results import read_metrics

    cfg = summary.get("config") or {}
    run_cfg = cfg.get("run") or {}
    flat = _flatten(cfg)
    rec = RunRecord(variant=str(run_cfg.get("variant") or summary.get("run_id") or Path(run_dir or "?").name),
                    family=run_cfg.get("family"), seed=_int(run_cfg.get("seed")),
                    status=str(summary.get("status") or "unknown"), config=flat,
                    params=_int(summary.get("params")), dev_loss=_num(summary.get("dev_loss")),
                    dev_ppl=_num(summary.get("dev_ppl")), dev_bleu=_num(summary.get("dev_bleu")),
                    steps=_int(summary.get("steps")), run=str(run_dir) if run_dir else summary.get("run_id"),
                    note=summary.get("error"), bleu_signature=summary.get("bleu_signature"))
    if run_dir is not None:
        rec.history = [{k: v for k, v in row.items() if k == "step" or k in HISTORY_KEYS}
                       for row in read_metrics(run_dir)]
        tgt = (cfg.get("data") or {}).get("tgt_lang")
        hyps = Path(run_dir) / "hyps" / f"dev.{tgt}.txt"
        if tgt and hyps.is_file():
            rec.hyps = str(hyps)
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
        step = _int(row.get(WANDB_STEP, row.get("step")))
        if step is None:
            continue
        dest = by_step.setdefault(step, {"step": step})
        for key in HISTORY_KEYS:
            v = _num(row.get(key))
            if v is not None:
                dest[key] = v
    return RunRecord(variant=str(variant), family=config.get("run.family") or job_type,
                     seed=_int(config.get("run.seed")), status=str(status),
                     config={k: v for k, v in config.items() if "." in k}, params=_int(summary.get("params")),
                     dev_loss=_num(summary.get("dev_loss")), dev_ppl=_num(summary.get("dev_ppl")),
                     dev_bleu=_num(summary.get("dev_bleu")), steps=_int(summary.get("steps")),
                     history=[by_step[s] for s in sorted(by_step) if len(by_step[s]) > 1],
                     run=run_id, bleu_signature=summary.get("bleu_signature"))


# ----------------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------------
@dataclass
class ReportData:
    sweep: Any                      # lightning_tfm.sweep.Sweep
    records: list[RunRecord]
    source: str                     # one line: where the records came from
    planned: dict[str, dict]        # variant -> flat config the sweep file plans (rows without runs)
    study: Any = None               # the Optuna study when read from a storage
    notes: list[str] = field(default_factory=list)

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

    from .tracking import has_api_key
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
        raise UserError(f"cannot reach W&B at {url} ({e.strerror or e.__class__.__name__}): --from-wandb needs the "
                        "network (or drop it to read the local results)") from None


def sweep_config(sweep, variant_overrides: dict | None = None, budget: float = 1.0) -> dict:
    """The nested config the sweep file gives a trial (experiment <- sweep overrides <- the variant's), not
    validated: a report must show a row that cannot be built, and needs no data.path to find its results."""
    from . import config as C

    cfg = C.defaults()
    tree = C.read_yaml(sweep.experiment)
    C.merge(cfg, tree)
    if "name" not in (tree.get("run") or {}):
        cfg["run"]["name"] = Path(sweep.experiment).stem
    for key, value in {**sweep.overrides, **(variant_overrides or {})}.items():
        C.set_dotted(cfg, key, value)
    if budget != 1.0:
        cfg["train"]["max_steps"] = max(1, int(round(cfg["train"]["max_steps"] * budget)))
    return cfg


def default_results_dir(sweep) -> Path:
    """The results folder the sweep writes to by default (its experiment's run.results_dir, from the cwd)."""
    return Path(sweep_config(sweep)["run"]["results_dir"]).absolute()


def resolve_local(sweep, results_dir: str | Path | None, storage: str | None) -> tuple[Path, str | None]:
    """(absolute results folder, storage URL or None) of the local source, or a one-line UserError when
    there is nothing to read."""
    from .redact import mask_url
    from .sweep import default_storage, open_storage

    if results_dir is not None:
        results = Path(results_dir).absolute()
        if not results.is_dir():
            raise UserError(f"results folder {str(results_dir)!r} not found: pass the folder the sweep wrote its "
                            "run folders to (--results, the sweep's run.results_dir)")
    else:
        results = default_results_dir(sweep)
    if storage:
        open_storage(storage, create=False)  # malformed / unreachable / no such file: one line, exit 2
        return results, storage
    url = default_storage(sweep, results)
    has_db = (results / f"{sweep.name}.db").is_file()
    if not has_db and not results.is_dir():
        raise UserError(f"no results for sweep {sweep.name!r}: neither {results} nor {mask_url(url)} exists; run "
                        f"`ltfm sweep {sweep.path}` first, or pass --results DIR / --storage URL")
    return results, (url if has_db else None)


def load_report_data(sweep_file: str | Path, results_dir: str | Path | None = None, storage: str | None = None,
                     wandb_path: str | None = None) -> ReportData:
    """Everything the notebooks show, from the local results (+ Optuna storage) or from W&B."""
    from .sweep import _quiet_optuna, load_sweep

    _quiet_optuna()
    sweep = load_sweep(sweep_file)
    if wandb_path:
        check_wandb_access(wandb_path)
        records = latest_per_key(fetch_wandb_records(wandb_path, sweep.name))
        return ReportData(sweep, records, f"W&B {wandb_path}, group {sweep.name}", planned_configs(sweep, records))
    results, url = resolve_local(sweep, results_dir, storage)
    return collect_local(sweep, results, url)


def planned_configs(sweep, records: list[RunRecord] | None = None) -> dict[str, dict]:
    """variant -> the flat config of its trial, for rows without a run: the completed base run's config with
    the variant's overrides (so command-line overrides of the sweep are included), else the sweep file's."""
    from .config import flatten

    if sweep.mode != "variants":
        return {}
    base = next((r for r in records or [] if r.variant == "base" and r.completed and r.config), None)
    base_budget = (sweep.variants.get("base") or {}).get("budget", 1.0)
    out = {}
    for name, v in sweep.variants.items():
        try:
            flat = flatten(sweep_config(sweep, v["overrides"], v["budget"]))
        except UserError:
            flat = {}
        if base is not None:
            flat = {**flat, **base.config, **v["overrides"]}
            steps = base.config.get("train.max_steps")
            if isinstance(steps, int) and v["budget"] != base_budget:
                flat["train.max_steps"] = max(1, int(round(steps / base_budget * v["budget"])))
        out[name] = flat
    return out


_TRIAL_STATUS = {"COMPLETE": DONE, "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
                 "WAITING": "waiting"}


def record_from_trial(trial, results_dir: Path) -> RunRecord:
    """An Optuna trial of ``ltfm sweep``: state from the trial, numbers from its run folder (or, when the
    folder is elsewhere, from the results the worker recorded in the trial's user attributes)."""
    a = trial.user_attrs
    status = _TRIAL_STATUS.get(trial.state.name, trial.state.name.lower())
    note = a.get("reason") or a.get("error")
    if a.get("skip") == "unbuildable":
        status = "skipped"
    run_dir = None
    for candidate in (a.get("run_dir"), results_dir / a["run_id"] if a.get("run_id") else None):
        if candidate and (Path(candidate) / "summary.json").is_file():
            run_dir = Path(candidate)
            break
    summary = None
    if run_dir is not None:
        from .results import read_summary
        summary = read_summary(run_dir)
    if summary is not None:
        rec = record_from_summary(summary, run_dir)
    else:
        rec = RunRecord(variant=str(a.get("variant")), params=_int(a.get("params") or a.get("planned_params")),
                        dev_loss=_num(a.get("dev_loss")), dev_ppl=_num(a.get("dev_ppl")),
                        dev_bleu=_num(a.get("dev_bleu")), steps=_int(a.get("steps")), run=a.get("run_dir"))
    rec.variant = str(a.get("variant") or rec.variant)
    rec.family = a.get("family") or rec.family
    rec.seed = _int(a.get("seed")) if a.get("seed") is not None else rec.seed
    if a.get("max_steps") is not None:
        rec.config.setdefault("train.max_steps", a["max_steps"])
    for key, value in (trial.params or {}).items():  # a search trial's sampled values
        rec.config.setdefault(key, value)
    if status == DONE and rec.status not in (DONE, "unknown"):
        status = rec.status  # the trial says complete but its folder says otherwise: show the folder's word
    rec.status, rec.trial = status, trial.number
    rec.note = note or (rec.note if status != DONE else None)
    return rec


def collect_local(sweep, results_dir: Path, storage_url: str | None) -> ReportData:
    from .results import read_summary
    from .redact import mask_url
    from .sweep import open_storage, open_study

    records: list[RunRecord] = []
    study = None
    notes = []
    if storage_url:
        study = open_study(sweep, open_storage(storage_url, create=False), create=False)
        trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("skip") != "duplicate"
                  and t.user_attrs.get("variant")]
        trials.sort(key=lambda t: t.number)
        by_key: dict[tuple, Any] = {}
        for t in trials:  # the latest trial of each (variant, seed) stands for it
            by_key[(t.user_attrs["variant"], _int(t.user_attrs.get("seed")))] = t
        records = [record_from_trial(t, results_dir) for t in sorted(by_key.values(), key=lambda t: t.number)]
    known = {(r.variant, r.seed) for r in records}
    known_dirs = {str(Path(r.run).resolve()) for r in records if r.run and Path(r.run).is_dir()}
    extra = []
    if results_dir.is_dir():
        for d in sorted(results_dir.iterdir()):
            summary = read_summary(d) if d.is_dir() else None
            if not isinstance(summary, dict) or str(d.resolve()) in known_dirs:
                continue
            run_cfg = (summary.get("config") or {}).get("run") or {}
            if run_cfg.get("study") != sweep.name:
                continue
            extra.append((str(summary.get("started_at") or ""), d.name, record_from_summary(summary, d)))
    extra.sort(key=lambda x: (x[0], x[1]))
    chosen: dict[tuple, RunRecord] = {}
    for _, _, rec in extra:  # without a trial: the latest run of each (variant, seed)
        if (rec.variant, rec.seed) not in known:
            chosen[(rec.variant, rec.seed)] = rec
    if chosen and study is not None:
        notes.append(f"{len(chosen)} run folder(s) of study {sweep.name} have no trial in the storage; shown from "
                     "their summary.json")
    records += list(chosen.values())
    source = f"results {results_dir}" + (f", Optuna storage {mask_url(storage_url)}" if storage_url else
                                          " (no Optuna storage found: run folders only)")
    return ReportData(sweep, records, source, planned_configs(sweep, records), study, notes)


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
        return [wandb_record(dict(run.config), dict(run.summary_metrics), name=run.name, job_type=run.job_type,
                             state=run.state, run_id=run.id, history=_wandb_history(run)) for run in runs]
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - no network, bad key, no such project: one line
        from .tracking import scrub
        first = scrub(str(e)).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise UserError(f"cannot read W&B project {path!r} ({e.__class__.__name__}: {first}); check ENTITY/PROJECT, "
                        "the API key and the network") from None


# ----------------------------------------------------------------------------------------------------------
# The paper
# ----------------------------------------------------------------------------------------------------------
def load_paper() -> dict[str, dict]:
    """The paper's Table 3 (lightning_tfm/resources/paper_table3.csv): name -> row with numbers parsed."""
    text = resources.files("lightning_tfm").joinpath("resources/paper_table3.csv").read_text()
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        parsed = dict(row)
        for key in ("dev_ppl", "dev_bleu", "params_m", "dropout", "label_smoothing"):
            parsed[key] = float(row[key]) if row[key] else None
        for key in ("layers", "d_model", "d_ff", "heads", "d_k", "d_v", "train_steps"):
            parsed[key] = int(row[key]) if row[key] else None
        out[row["name"]] = parsed
    return out


# ----------------------------------------------------------------------------------------------------------
# Table 3
# ----------------------------------------------------------------------------------------------------------
def ordered_variants(sweep, records: list[RunRecord]) -> list[str]:
    """Paper rows in the paper's order, then the sweep's other rows in file order, then runs of variants
    the sweep file does not list (sorted)."""
    listed = list(sweep.variants or {})
    paper = [v for v in PAPER_ORDER if v in listed]
    others = [v for v in listed if v not in PAPER_ORDER]
    rank = {v: i for i, v in enumerate(PAPER_ORDER)}
    stray = sorted({r.variant for r in records} - set(listed), key=lambda v: (rank.get(v, len(rank)), v))
    return paper + others + stray


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _sign(x: float | None) -> int | None:
    if x is None:
        return None
    return (x > 0) - (x < 0)


def _agrees(ours: float | None, paper: float | None) -> bool | None:
    """Same direction of change against the base; None when either is unknown or the paper's is 0."""
    if ours is None or paper is None or _sign(paper) == 0:
        return None
    return _sign(ours) == _sign(paper)


def _status(variant: str, recs: list[RunRecord], seeds: list[int]) -> str:
    if not recs:
        return "missing (no run)"
    done = [r for r in recs if r.completed]
    if len(done) == len(recs) and len(recs) >= len(seeds):
        return DONE if len(recs) == 1 else f"{DONE} ({len(recs)} seeds)"
    parts = []
    for r in sorted(recs, key=lambda r: (r.seed is None, r.seed or 0)):
        if r.completed:
            continue
        what = r.status
        if r.status == "pruned" and r.steps is not None:
            what += f" at step {r.steps}"
        if r.note:
            what += f": {r.note}"
        parts.append((f"seed {r.seed} " if len(seeds) > 1 or len(recs) > 1 else "") + what)
    missing = [s for s in seeds if s not in {r.seed for r in recs}]
    parts += [f"seed {s} missing" for s in missing] if len(seeds) > 1 else []
    head = f"{len(done)}/{max(len(seeds), len(recs))} seeds {DONE}; " if done else ""
    return head + "; ".join(parts)


def build_table(data: ReportData, bootstrap: bool = True) -> dict:
    """The Table 3 replica as ``{"rows": [...], "summary": {...}, "notes": [...]}`` (see the module docstring)."""
    paper = load_paper()
    pbase = paper["base"]
    sweep = data.sweep
    seeds = list(sweep.seeds)
    by_variant: dict[str, list[RunRecord]] = {}
    for r in data.records:
        by_variant.setdefault(r.variant, []).append(r)

    def agg(variant: str) -> dict:
        done = [r for r in by_variant.get(variant, []) if r.completed]
        ppl, ppl_sd = _mean_std([r.dev_ppl for r in done if r.dev_ppl is not None])
        bleu, bleu_sd = _mean_std([r.dev_bleu for r in done if r.dev_bleu is not None])
        params = [r.params for r in by_variant.get(variant, []) if r.params is not None]
        return {"ppl": ppl, "ppl_sd": ppl_sd, "bleu": bleu, "bleu_sd": bleu_sd, "n_done": len(done),
                "params": params[0] if params else None}

    base = agg("base") if "base" in by_variant else None
    variants = ordered_variants(sweep, data.records)
    tests, test_notes, test_signature = (paired_bootstrap(by_variant, variants) if bootstrap else ({}, [], None))
    rows = []
    for v in variants:
        recs = by_variant.get(v, [])
        a = agg(v)
        cfg = {**data.planned.get(v, {}), **next((r.config for r in recs if r.config), {})}
        p = paper.get(v)
        row: dict[str, Any] = {"variant": v, "family": next((r.family for r in recs if r.family), None)
                               or ((sweep.variants or {}).get(v) or {}).get("family"),
                               "in_paper": p is not None}
        for _, key in KNOBS:
            row[key] = cfg.get(key)
        row.update(seeds_completed=a["n_done"], seeds_total=max(len(seeds), len(recs)),
                   dev_ppl=a["ppl"], dev_ppl_std=a["ppl_sd"], dev_bleu=a["bleu"], dev_bleu_std=a["bleu_sd"],
                   params=a["params"],
                   paper_dev_ppl=p["dev_ppl"] if p else None, paper_dev_bleu=p["dev_bleu"] if p else None,
                   paper_params_m=p["params_m"] if p else None)
        is_base = v == "base"
        row["delta_ppl"] = (a["ppl"] - base["ppl"]) if (not is_base and base and a["ppl"] is not None
                                                       and base["ppl"] is not None) else None
        row["delta_bleu"] = (a["bleu"] - base["bleu"]) if (not is_base and base and a["bleu"] is not None
                                                          and base["bleu"] is not None) else None
        row["paper_delta_ppl"] = (p["dev_ppl"] - pbase["dev_ppl"]) if (p and not is_base) else None
        row["paper_delta_bleu"] = (p["dev_bleu"] - pbase["dev_bleu"]) if (p and not is_base) else None
        row["ppl_agrees"] = _agrees(row["delta_ppl"], row["paper_delta_ppl"])
        row["bleu_agrees"] = _agrees(row["delta_bleu"], row["paper_delta_bleu"])
        t = tests.get(v)
        row["bleu_p_value"] = t["p_value"] if t else None
        row["bleu_significant"] = (t["p_value"] < SIGNIFICANCE) if t else None
        row["bleu_test_seeds"] = t["seeds"] if t else None
        row["status"] = _status(v, recs, seeds)
        rows.append(row)
    summary = agreement_summary(rows)
    notes = list(test_notes)
    signatures = sorted({r.bleu_signature for r in data.records if r.bleu_signature})
    return {"sweep": sweep.name, "experiment": sweep.experiment.name, "seeds": seeds, "rows": rows,
            "summary": summary, "notes": notes, "bleu_signatures": signatures, "test_signature": test_signature,
            "has_base": base is not None and base["n_done"] > 0}


def agreement_summary(rows: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for metric in ("ppl", "bleu"):
        judged = [r for r in rows if r[f"{metric}_agrees"] is not None]
        out[metric] = (sum(1 for r in judged if r[f"{metric}_agrees"]), len(judged))
    both = [r for r in rows if r["ppl_agrees"] is not None and r["bleu_agrees"] is not None]
    out["both"] = (sum(1 for r in both if r["ppl_agrees"] and r["bleu_agrees"]), len(both))
    out["not_compared"] = [(r["variant"], r["status"]) for r in rows
                           if r["variant"] != "base" and r["in_paper"] and r["seeds_completed"] == 0]
    return out


# ----------------------------------------------------------------------------------------------------------
# Paired bootstrap (sacreBLEU)
# ----------------------------------------------------------------------------------------------------------
_REFS_CACHE: dict[tuple, list[str]] = {}


def dev_references(config: dict) -> list[str]:
    """The dev references a run was scored against: its config's dev split, first data.max_dev_pairs."""
    from .data import load_split

    key = tuple(config.get(k) for k in ("data.source", "data.path", "data.hub_name", "data.hub_config",
                                        "data.dev_split", "data.src_lang", "data.tgt_lang", "data.max_dev_pairs"))
    if key not in _REFS_CACHE:
        nested: dict[str, dict] = {}
        for k, v in config.items():
            sec, name = k.split(".", 1)
            nested.setdefault(sec, {})[name] = v
        ds = load_split(nested, nested["data"]["dev_split"], nested["data"].get("max_dev_pairs"))
        _REFS_CACHE[key] = list(ds["tgt"])
    return _REFS_CACHE[key]


def paired_bootstrap(by_variant: dict[str, list[RunRecord]], variants: list[str]) -> tuple[dict, list[str], str | None]:
    """sacreBLEU's paired bootstrap resampling of every row's dev BLEU against the base's.

    Returns ({variant: {"p_value", "seeds", "score", "base_score"}}, notes, the test's signature)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from .data import read_lines

    notes: list[str] = []
    base = {r.seed: r for r in by_variant.get("base", []) if r.completed and r.hyps}
    if not base:
        if any(r.completed for recs in by_variant.values() for r in recs):
            notes.append("paired bootstrap not computed: it needs the dev hypotheses files of a completed base "
                         "run (local results only)")
        return {}, notes, None
    out: dict[str, dict] = {}
    signature = None
    for v in variants:
        if v == "base":
            continue
        recs = {r.seed: r for r in by_variant.get(v, []) if r.completed and r.hyps}
        seeds = sorted(set(base) & set(recs), key=lambda s: (s is None, s or 0))
        if not seeds:
            continue
        try:
            hb, hv, refs = [], [], []
            for s in seeds:
                ref = dev_references(recs[s].config)
                b, h = read_lines(base[s].hyps), read_lines(recs[s].hyps)
                if not (len(b) == len(h) == len(ref)):
                    raise UserError(f"{v} seed {s}: {len(h)} hypotheses, base {len(b)}, references {len(ref)}")
                hb += b
                hv += h
                refs += ref
            tgt = str(recs[seeds[0]].config.get("data.tgt_lang") or "")
            metric = BLEU(trg_lang=tgt if tgt == "zh" else "")  # as lightning_tfm.evaluate.bleu scores
            test = PairedTest([("base", hb), (v, hv)], {"BLEU": metric}, references=[refs], test_type="bs",
                              n_samples=BOOTSTRAP_SAMPLES)
            sigs, scores = test()
            res = scores["BLEU"][1]
            signature = str(sigs["BLEU"])
            out[v] = {"p_value": float(res.p_value), "seeds": seeds, "score": float(res.score),
                      "base_score": float(scores["BLEU"][0].score)}
        except Exception as e:  # noqa: BLE001 - e.g. Hub references offline: the table stands without the test
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else e.__class__.__name__
            notes.append(f"paired bootstrap for {v} not computed: {first}")
    return out, notes, signature


# ----------------------------------------------------------------------------------------------------------
# Writing the table
# ----------------------------------------------------------------------------------------------------------
def _f(x: Any, digits: int, sign: bool = False) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return str(x)


def _knob(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def _params_m(n: int | None) -> str:
    if n is None:
        return ""
    m = n / 1e6
    return f"{m:.2f}" if m < 10 else f"{m:.1f}"


def _mstd(mean, sd, digits) -> str:
    if mean is None:
        return ""
    return _f(mean, digits) + (f" ± {sd:.{digits}f}" if sd is not None else "")


def _yes(x: bool | None) -> str:
    return "" if x is None else ("yes" if x else "no")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


MD_COLUMNS = ("row", *[h for h, _ in KNOBS], "dev PPL ours", "dev PPL paper", "ΔPPL ours", "ΔPPL paper",
              "PPL agrees", "dev BLEU ours", "dev BLEU paper", "ΔBLEU ours", "ΔBLEU paper", "BLEU agrees",
              "params ours (M)", "params paper (M)", "status")


def table_cells(row: dict) -> list[str]:
    sig = "*" if row["bleu_significant"] else ""
    return [row["variant"], *[_knob(row[key]) for _, key in KNOBS],
            _mstd(row["dev_ppl"], row["dev_ppl_std"], 2), _f(row["paper_dev_ppl"], 2),
            _f(row["delta_ppl"], 2, sign=True), _f(row["paper_delta_ppl"], 2, sign=True), _yes(row["ppl_agrees"]),
            _mstd(row["dev_bleu"], row["dev_bleu_std"], 2), _f(row["paper_dev_bleu"], 1),
            _f(row["delta_bleu"], 2, sign=True) + sig, _f(row["paper_delta_bleu"], 1, sign=True),
            _yes(row["bleu_agrees"]), _params_m(row["params"]),
            ("" if row["paper_params_m"] is None else f"{row['paper_params_m']:g}"), row["status"]]


def _fraction(pair: tuple[int, int]) -> str:
    k, n = pair
    return f"{k}/{n} rows ({100 * k / n:.0f}%)" if n else "no rows"


def agreement_line(table: dict) -> str:
    s = table["summary"]
    return (f"Direction agrees with the paper: dev PPL {_fraction(s['ppl'])}, dev BLEU {_fraction(s['bleu'])}, "
            f"both {_fraction(s['both'])}.")


def table_markdown(table: dict) -> str:
    """table3.md: a title, the table (ours beside the paper's), then agreement and notes."""
    seeds = table["seeds"]
    lines = [f"# Table 3 replica: sweep `{table['sweep']}`", "",
             f"Base experiment `{table['experiment']}`; seed{'s' if len(seeds) > 1 else ''} "
             f"{', '.join(map(str, seeds))}"
             + ("; ours = mean ± standard deviation over the completed seeds" if len(seeds) > 1 else "") + ". "
             "Paper = Vaswani et al. (2017), Table 3 (newstest2013). Δ = change against the same side's base row; "
             "\"agrees\" = our change has the paper's sign. Absolute values are not comparable across corpora, "
             "model sizes and BLEU tokenizations: compare the directions.", ""]
    lines.append("| " + " | ".join(MD_COLUMNS) + " |")
    lines.append("|" + "|".join("---" if i == 0 or c in ("positional", "norm", "status") else "--:"
                                for i, c in enumerate(MD_COLUMNS)) + "|")
    for row in table["rows"]:
        lines.append("| " + " | ".join(_cell(c) for c in table_cells(row)) + " |")
    lines += ["", agreement_line(table)]
    s = table["summary"]
    if not table["has_base"]:
        lines.append("No completed base row: no change against the base can be computed.")
    if s["not_compared"]:
        lines.append("Not compared (no completed run): "
                     + ", ".join(f"{v} ({st.split()[0].rstrip(':;')})" for v, st in s["not_compared"]) + ".")
    if table["test_signature"]:
        lines.append(f"\\* ΔBLEU significant at p < {SIGNIFICANCE} (sacreBLEU paired bootstrap resampling against "
                     f"base on the dev hypotheses; {table['test_signature']}).")
    for sig in table["bleu_signatures"]:
        lines.append(f"Our dev BLEU: sacreBLEU `{sig}`.")
    lines += table["notes"]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("variant", "family", "in_paper", *CSV_KNOBS.values(), "seeds_completed", "seeds_total",
               "dev_ppl", "dev_ppl_std", "paper_dev_ppl", "delta_ppl", "paper_delta_ppl", "ppl_agrees",
               "dev_bleu", "dev_bleu_std", "paper_dev_bleu", "delta_bleu", "paper_delta_bleu", "bleu_agrees",
               "bleu_p_value", "bleu_significant", "params", "paper_params_m", "status")


def table_csv(table: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for row in table["rows"]:
        out = []
        for col in CSV_COLUMNS:
            value = row[{v: k for k, v in CSV_KNOBS.items()}.get(col, col)]
            if isinstance(value, float):
                value = f"{value:.6g}"
            out.append("" if value is None else value)
        w.writerow(out)
    return buf.getvalue()


def write_text(path: Path, text: str) -> Path:
    from .atomic import write_text as atomic_write_text
    return atomic_write_text(path, text)


def write_table(table: dict, out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return (write_text(out / "table3.md", table_markdown(table)), write_text(out / "table3.csv", table_csv(table)))


# ----------------------------------------------------------------------------------------------------------
# Figures (matplotlib's object API: no pyplot, no display needed)
# ----------------------------------------------------------------------------------------------------------
def _figure(nrows: int, ncols: int, width: float, height: float):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, path: str | Path) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return str(path)


def _series(rec: RunRecord, key: str) -> tuple[list[int], list[float]]:
    pts = [(row["step"], row[key]) for row in rec.history if key in row]
    return [p[0] for p in pts], [p[1] for p in pts]


def _label(rec: RunRecord, many_seeds: bool) -> str:
    return f"{rec.variant} s{rec.seed}" if many_seeds else rec.variant


PAPER_FAMILIES = ("A", "B", "C", "D", "E", "big")
OTHER = "other rows"


def _variant_family(data: ReportData, v: str) -> str | None:
    recs = [r for r in data.records if r.variant == v]
    return next((r.family for r in recs if r.family), None) or ((data.sweep.variants or {}).get(v) or {}).get("family")


def _panel_of(data: ReportData, v: str) -> str | None:
    """The dev-perplexity panel of a row: its paper family (A-E, big), none for base and pre-norm rows
    (they have their own figure), else the panel of other rows."""
    fam = _variant_family(data, v)
    if v == "base" or fam in ("base", "norm", "search"):
        return None
    return fam if fam in PAPER_FAMILIES else OTHER


def _set_yscale(ax) -> None:
    ys = [y for line in ax.lines for y in line.get_ydata() if y > 0]
    if ys and max(ys) / min(ys) > 5:  # the first evaluations of a short run are far above the rest
        ax.set_yscale("log")


def plot_dev_ppl_by_family(data: ReportData, path: str | Path) -> str:
    """Dev perplexity against step, one panel per row family (A-E, big, then other rows), with the base in
    every panel; rows without a curve are named in their panel's title with their status."""
    variants = ordered_variants(data.sweep, data.records)
    panels: list[str] = []
    for v in variants:
        p = _panel_of(data, v)
        if p is not None and p not in panels:
            panels.append(p)
    panels.sort(key=lambda p: PAPER_FAMILIES.index(p) if p in PAPER_FAMILIES else len(PAPER_FAMILIES))
    panels = panels or ["base"]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = _figure(nrows, ncols, 4.6 * ncols, 3.4 * nrows)
    many = len(data.sweep.seeds) > 1
    for i, panel in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        members = ["base"] + [v for v in variants if _panel_of(data, v) == panel]
        no_curve = []
        for j, v in enumerate(members):
            recs = [r for r in data.records if r.variant == v]
            drawn = False
            for r in sorted(recs, key=lambda r: (r.seed is None, r.seed or 0)):
                xs, ys = _series(r, "dev/ppl")
                if xs:
                    ax.plot(xs, ys, marker=".", color="black" if v == "base" else f"C{j % 10}",
                            label=_label(r, many), linewidth=1.2)
                    drawn = True
            if not drawn and v in variants:
                no_curve.append(f"{v} ({recs[0].status if recs else 'missing'})")
        _set_yscale(ax)
        ax.set_xlabel("step")
        ax.set_ylabel("dev perplexity")
        title = {"base": "base", OTHER: OTHER, "big": "big"}.get(panel, f"family {panel}")
        if no_curve:
            import textwrap
            title += "\n" + textwrap.fill("no curve: " + ", ".join(no_curve), 62)
        ax.set_title(title, fontsize=8)
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    fig.suptitle(f"{data.sweep.name}: dev perplexity against step", fontsize=10)
    return _save(fig, path)


def plot_bleu_vs_params(table: dict, path: str | Path) -> str:
    """Dev BLEU against parameter count, ours and the paper's (rows of this sweep)."""
    fig, axes = _figure(1, 2, 10, 4)
    ours, paper = axes[0]
    pbase = load_paper()["base"]
    for row in table["rows"]:
        if row["dev_bleu"] is not None and row["params"] is not None:
            x = row["params"] / 1e6
            ours.errorbar([x], [row["dev_bleu"]], yerr=[row["dev_bleu_std"]] if row["dev_bleu_std"] else None,
                          fmt="o", color="black" if row["variant"] == "base" else "C0", capsize=3)
            ours.annotate(row["variant"], (x, row["dev_bleu"]), textcoords="offset points", xytext=(4, 3), fontsize=7)
        if row["paper_dev_bleu"] is not None:
            given = row["paper_params_m"] is not None
            x = row["paper_params_m"] if given else pbase["params_m"]  # blank in the paper: the base's size
            paper.plot([x], [row["paper_dev_bleu"]], "o", color="black" if row["variant"] == "base" else "C1",
                       fillstyle="full" if given else "none")
            paper.annotate(row["variant"], (x, row["paper_dev_bleu"]), textcoords="offset points", xytext=(4, 3),
                           fontsize=7)
    ours.set_title(f"ours ({table['sweep']})", fontsize=9)
    paper.set_title("paper, Table 3 (hollow: count not given, drawn at the base's)", fontsize=9)
    for ax in (ours, paper):
        ax.set_xlabel("parameters (M)")
        ax.set_ylabel("dev BLEU")
        ax.grid(True, alpha=0.3)
    if not ours.lines and not ours.collections:
        ours.text(0.5, 0.5, "no completed run", ha="center", va="center", transform=ours.transAxes)
    if not paper.lines:
        paper.text(0.5, 0.5, "no row of the paper in this sweep", ha="center", va="center", transform=paper.transAxes)
    return _save(fig, path)


def plot_norm_curves(data: ReportData, path: str | Path) -> str:
    """Pre-norm against post-norm: train loss (all steps and the first steps) and dev perplexity."""
    post = [r for r in data.records if r.variant == "base"]
    pre = [r for r in data.records if r.config.get("model.norm") == "pre" and r.variant != "base"]
    pre += [r for r in data.records if _variant_family(data, r.variant) == "norm" and r not in pre
            and r.variant != "base"]
    fig, axes = _figure(1, 3, 14, 3.8)
    full, first, dev = axes[0]
    many = len(data.sweep.seeds) > 1
    last = max([row["step"] for r in post + pre for row in r.history] or [0])
    early = max(last // 10, 1)
    for i, r in enumerate(post + pre):
        color = "black" if r.variant == "base" else f"C{i % 10}"
        kind = "post" if r.variant == "base" else r.config.get("model.norm", "?")
        label = f"{_label(r, many)} ({kind}-norm)"
        xs, ys = _series(r, "train/loss")
        full.plot(xs, ys, color=color, label=label, linewidth=1)
        pts = [(x, y) for x, y in zip(xs, ys) if x <= early]
        if len(pts) < 5:
            pts = list(zip(xs, ys))[:5]
        first.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=color, label=label, linewidth=1)
        xs, ys = _series(r, "dev/ppl")
        dev.plot(xs, ys, marker=".", color=color, label=label, linewidth=1)
    full.set_title("train loss", fontsize=9)
    first.set_title("train loss, first steps", fontsize=9)
    dev.set_title("dev perplexity", fontsize=9)
    _set_yscale(dev)
    for ax, ylabel in ((full, "train loss"), (first, "train loss"), (dev, "dev perplexity")):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    missing = []
    if not post or not any(r.history for r in post):
        missing.append("no base (post-norm) curve")
    if not pre:
        missing.append("no pre-norm row in this sweep")
    elif not any(r.history for r in pre):
        missing.append("pre-norm rows: " + ", ".join(f"{r.variant} ({r.status})" for r in pre))
    fig.suptitle(f"{data.sweep.name}: pre-norm against post-norm" + (f" ({'; '.join(missing)})" if missing else ""),
                 fontsize=10)
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------------------
# Search studies
# ----------------------------------------------------------------------------------------------------------
def _distribution(spec: dict):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    if spec["type"] == "categorical":
        return CategoricalDistribution(spec["choices"])
    if spec["type"] == "int":
        return IntDistribution(spec["low"], spec["high"], step=spec.get("step") or 1, log=spec.get("log", False))
    return FloatDistribution(float(spec["low"]), float(spec["high"]), step=spec.get("step"), log=spec.get("log", False))


_METRIC_HISTORY = {"dev_loss": "dev/loss", "dev_ppl": "dev/ppl", "dev_bleu": "dev/bleu"}


def search_study(data: ReportData):
    """The search's Optuna study: the storage's own, or (W&B, run folders only) one rebuilt in memory from
    the records with the sweep file's distributions, so the same Optuna plots work."""
    import optuna
    from optuna.trial import TrialState, create_trial

    if data.study is not None:
        return data.study
    sweep = data.sweep
    study = optuna.create_study(study_name=sweep.name, direction=sweep.direction)
    states = {DONE: TrialState.COMPLETE, "pruned": TrialState.PRUNED, "running": TrialState.RUNNING,
              "waiting": TrialState.WAITING}
    dists = {k: _distribution(spec) for k, spec in (sweep.space or {}).items()}
    for r in sorted(data.records, key=lambda r: r.variant):
        params = {k: r.config[k] for k in dists if k in r.config}
        if set(params) != set(dists):
            data.notes.append(f"{r.variant}: not all searched keys in its config; left out of the Optuna plots")
            continue
        state = states.get(r.status, TrialState.FAIL)
        value = getattr(r, sweep.metric) if state == TrialState.COMPLETE else None
        if state == TrialState.COMPLETE and value is None:
            state = TrialState.FAIL
        key = _METRIC_HISTORY[sweep.metric]
        inter = {row["step"]: row[key] for row in r.history if key in row}
        try:
            study.add_trial(create_trial(state=state, value=value, params=params, distributions=dists,
                                         intermediate_values=inter, user_attrs={"variant": r.variant, "run": r.run}))
        except ValueError as e:
            data.notes.append(f"{r.variant}: left out of the Optuna plots ({e})")
    return study


def search_rows(data: ReportData, study) -> list[dict]:
    """One row per trial (every state, never dropped): number, variant, state, value, params, steps, run."""
    by_trial = {r.trial: r for r in data.records if r.trial is not None}
    by_variant = {r.variant: r for r in data.records}
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        rec = by_trial.get(t.number) or by_variant.get(a.get("variant"))
        state = t.state.name.lower()
        if a.get("skip"):
            state = "skipped" if a["skip"] == "unbuildable" else "duplicate"
        rows.append({"trial": t.number, "variant": a.get("variant") or (rec.variant if rec else None), "state": state,
                     "value": t.value, "params": dict(t.params), "steps": (rec.steps if rec else None) or
                     (max(t.intermediate_values) if t.intermediate_values else None),
                     "dev_ppl": rec.dev_ppl if rec else None, "dev_bleu": rec.dev_bleu if rec else None,
                     "run": (rec.run if rec else None) or a.get("run_dir") or a.get("run"),
                     "note": a.get("reason") or a.get("error") or (rec.note if rec else None)})
    return rows


def _param(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else _knob(x)


def search_markdown(data: ReportData, study, rows: list[dict]) -> str:
    sweep = data.sweep
    keys = list(sweep.space or {})
    head = ["trial", "variant", "state", sweep.metric, *keys, "steps", "dev PPL", "dev BLEU", "note"]
    lines = [f"# Search `{sweep.name}`", "",
             f"Base experiment `{sweep.experiment.name}`; {sweep.direction} {sweep.metric}; sampler "
             f"{sweep.sampler.get('type')}, pruner {sweep.pruner.get('type')}; {len(rows)} trial(s).", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [str(r["trial"]), r["variant"] or "", r["state"], _f(r["value"], 4),
                 *[_param(r["params"].get(k)) for k in keys],
                 _knob(r["steps"]), _f(r["dev_ppl"], 2), _f(r["dev_bleu"], 2), (r["note"] or "")[:80]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    if done:
        best = (min if sweep.direction == "minimize" else max)(done, key=lambda r: (r["value"], r["trial"]))
        lines += ["", f"Best: trial {best['trial']} ({best['variant']}), {sweep.metric} {best['value']:.4f}, "
                      + ", ".join(f"{k}={_param(best['params'].get(k))}" for k in keys) + "."]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines.append("States: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials") + ".")
    lines += data.notes
    return "\n".join(lines) + "\n"


def search_csv(data: ReportData, rows: list[dict]) -> str:
    keys = list(data.sweep.space or {})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["trial", "variant", "state", data.sweep.metric, *keys, "steps", "dev_ppl", "dev_bleu", "run", "note"])
    for r in rows:
        w.writerow([r["trial"], r["variant"] or "", r["state"], "" if r["value"] is None else f"{r['value']:.6g}",
                    *["" if r["params"].get(k) is None else r["params"][k] for k in keys],
                    "" if r["steps"] is None else r["steps"], "" if r["dev_ppl"] is None else f"{r['dev_ppl']:.6g}",
                    "" if r["dev_bleu"] is None else f"{r['dev_bleu']:.6g}", r["run"] or "", r["note"] or ""])
    return buf.getvalue()


def write_search(data: ReportData, study, rows: list[dict], out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return (write_text(out / "search.md", search_markdown(data, study, rows)),
            write_text(out / "search.csv", search_csv(data, rows)))


def _pyplot():
    import matplotlib
    import matplotlib.pyplot as plt
    if matplotlib.get_backend().lower() != "agg":
        plt.switch_backend("Agg")
    return plt


def _placeholder(path: str | Path, title: str, message: str) -> str:
    fig, axes = _figure(1, 1, 6, 3.5)
    ax = axes[0][0]
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return _save(fig, path)


def _optuna_plot(fn, study, path, **kw) -> str:
    import warnings

    import matplotlib
    import optuna
    plt = _pyplot()
    with matplotlib.rc_context(), warnings.catch_warnings():  # optuna applies a global style: undo it after
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = fn(study, **kw)
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        fig.set_size_inches(8, 4.5)
        fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight")
        plt.close(fig)
    return str(path)


def plot_optimization_history(study, path: str | Path) -> str:
    from optuna.trial import TrialState
    from optuna.visualization.matplotlib import plot_optimization_history as plot
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return _placeholder(path, "optimization history", "no completed trial yet")
    return _optuna_plot(plot, study, path)


def plot_param_importances(study, path: str | Path) -> str:
    """Optuna's parameter importances (its default evaluator, PED-ANOVA: deterministic, numpy only)."""
    from optuna.trial import TrialState
    from optuna.visualization.matplotlib import plot_param_importances as plot
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varied = {k for t in done for k in t.params if len({repr(u.params.get(k)) for u in done}) > 1}
    if len(done) < 2 or not varied:
        return _placeholder(path, "parameter importances",
                            f"needs at least 2 completed trials that differ ({len(done)} completed)")
    return _optuna_plot(plot, study, path)


def plot_intermediate_values(study, path: str | Path) -> str:
    from optuna.visualization.matplotlib import plot_intermediate_values as plot
    if not any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        return _placeholder(path, "intermediate values", "no trial reported a dev metric yet")
    return _optuna_plot(plot, study, path)

