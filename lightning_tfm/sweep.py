"""``ltfm sweep``: Table 3 as one Optuna study, open searches with pruning, many workers, resumable.

Sweep file (YAML, in ``sweeps/``)::

    name: table3-cpu                         # the Optuna study name ([A-Za-z0-9._-])
    experiment: ../experiments/multi30k-cpu.yaml   # base experiment, relative to this file
    metric: dev_loss                         # a summary.json key: dev_loss | dev_ppl | dev_bleu
    direction: minimize                      # default: minimize for loss/ppl, maximize for bleu
    sampler: {type: tpe, seed: 1}            # tpe | random | cmaes | gp | qmc (+ the class's arguments)
    pruner: {type: none}                     # none | median | percentile | hyperband | successive_halving
                                             # | threshold (+ the class's arguments)
    seeds: [1]                               # run.seed of the trials
    overrides: {decode.average_last: 0}      # optional: applied to the experiment of every trial
    heartbeat: {interval: 30, grace: 120, max_retry: 3}   # optional (seconds)
    n_trials: 40                             # space sweeps: trials in the whole study
    variants:                                # EITHER named rows: one trial per variant and seed
      base: {}
      A1: {model.heads: 1, model.d_k: 256, model.d_v: 256}
      big: {family: big, budget: 3, model.d_model: 512}   # budget: factor on train.max_steps
    space:                                   # OR Optuna distributions over dotted keys
      model.heads: {type: categorical, choices: [2, 4, 8]}
      model.dropout: {type: float, low: 0.0, high: 0.3}
      model.d_model: {type: int, low: 128, high: 512, step: 64}

Precedence of a trial's config: experiment < ``overrides`` < command-line ``dotted.key=value`` < the
variant's (or sampled) values < the variant's ``budget`` factor on train.max_steps < seed/bookkeeping.
So ``ltfm sweep sweeps/table3-cpu.yaml train.max_steps=300`` sets the budget of every row (and ``big``,
with ``budget: 3``, gets 900).

Storage: ``--storage URL`` (``sqlite:///path.db``, ``postgresql://user@host/db``, ``mysql+pymysql://...``)
or by default the SQLite file ``<run.results_dir>/<name>.db`` (``results/table3-cpu.db``). Prefer
passwords in ``PGPASSWORD``/``~/.pgpass`` over the URL; a password in the URL is never printed or written to
run folders (trial processes get the URL through the environment; their config holds it masked).

How trials are shared (every ``ltfm sweep`` on the same storage and file joins one study):

- Variants: each worker enqueues the (variant, seed) rows missing from the study as WAITING trials with a
  ``grid_key`` user attribute (variant, seed, budget, hash of the variant's definition) and claims WAITING
  trials of its own keys one at a time with the storage's atomic WAITING -> RUNNING transition (what
  ``study.ask`` does; on SQLite every transaction is made ``BEGIN IMMEDIATE`` so that the check-and-set is
  atomic there too). A different budget (``train.max_steps=...``) makes different keys: new trials, which
  continue the same run folders from their checkpoints.
  Two workers that start together may enqueue a row twice; a claimed trial whose key already belongs to a
  lower-numbered trial that is waiting, running, complete or pruned is closed at once as FAIL with
  ``skip=duplicate`` -- never trained. A key whose trials all crashed is enqueued again by the next worker.
- Space: ``study.ask()`` with the file's sampler and pruner, until ``n_trials`` trials exist; a sampled
  configuration equal to an earlier trial's is closed as a duplicate instead of training the same run.
- Each trial runs ``python -m lightning_tfm train EXPERIMENT ... sweep.trial=N`` as its own process (a
  crash fails one trial); the trial process reports the dev metric at each validation
  (:mod:`lightning_tfm.pruning`). The worker records the run folder, W&B run id and results in the
  trial's user attributes; the objective is ``summary.json[metric]``.
- Heartbeat: the worker records an Optuna heartbeat while its trial runs. A trial whose worker was killed
  is failed by the next worker that starts after the grace period and re-queued by Optuna's
  ``RetryHeartbeatStaleTrialCallback``; run ids are deterministic, so the retry resumes the run from its
  last checkpoint. The trial process dies with its worker (``PR_SET_PDEATHSIG``).
- A row the model cannot build (e.g. an odd d_model) is closed as FAIL with ``skip=unbuildable`` and the
  reason, never a crash.

Trial user attributes (what reports read): ``variant``, ``family``, ``seed``, ``grid_key``, ``max_steps``,
``budget``, ``overrides`` (the variant's or sampled values), ``run_id``, ``run_dir``, ``host``, ``log``,
``planned_params``; after the run ``status``, ``steps``, ``params``, ``dev_loss``, ``dev_ppl``, ``dev_bleu``,
``test_bleu``, ``wall_time_s``, ``wandb_run_id``, ``wandb_project``, ``wandb_mode``; ``skip`` + ``reason``
for rows not run, ``error`` + ``exit_code`` for failures. A variant trial's params are its Table 3 knobs (``DASHBOARD_KNOBS``: fixed values, never
sampled). Study: its metric name is the sweep's metric; user attributes ``ltfm.pruner``, ``ltfm.metric``,
``ltfm.machine.<host>`` (CPU model and cores of each worker). ``optuna-dashboard <storage URL>`` shows all of it.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import config as C
from .errors import UserError
from .redact import mask_url, scrub_text

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
TOP_KEYS = ("name", "description", "experiment", "metric", "direction", "sampler", "pruner", "seeds",
            "overrides", "heartbeat", "n_trials", "variants", "space")
METRICS = {"dev_loss": "minimize", "dev_ppl": "minimize", "dev_bleu": "maximize"}
# Keys a sweep sets itself: a sweep file or the command line may not.
RESERVED = ("run.seed", "run.id", "run.variant", "run.family", "run.study")
VARIANT_META = ("family", "budget")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "gp": "GPSampler",
            "qmc": "QMCSampler"}
PRUNERS = {"none": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
           "hyperband": "HyperbandPruner", "successive_halving": "SuccessiveHalvingPruner",
           "threshold": "ThresholdPruner"}
HEARTBEAT_DEFAULTS = {"interval": 30, "grace": 120, "max_retry": 3}


# ----------------------------------------------------------------------------------------------------------
# Sweep files
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Entry:
    """One trial to run: a variant (or a sampled point) with one seed."""
    name: str
    family: str
    seed: int
    overrides: dict            # the variant's (or sampled) dotted overrides, as written
    budget: float = 1.0
    max_steps: int | None = None  # fixed by the trial that was enqueued (else: from the budget)

    def definition_hash(self) -> str:
        blob = json.dumps({"o": self.overrides, "b": self.budget}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:8]


@dataclass
class Sweep:
    path: Path
    name: str
    experiment: Path
    metric: str
    direction: str
    sampler: dict
    pruner: dict
    seeds: list[int]
    overrides: dict
    heartbeat: dict
    n_trials: int | None
    variants: dict[str, dict] | None = None    # name -> {"family", "budget", "overrides"}
    space: dict[str, dict] | None = None       # dotted key -> distribution spec

    @property
    def mode(self) -> str:
        return "variants" if self.variants is not None else "space"

    def entries(self) -> list[Entry]:
        assert self.variants is not None
        return [Entry(name, v["family"], seed, v["overrides"], v["budget"])
                for name, v in self.variants.items() for seed in self.seeds]


def _err(path, msg: str) -> UserError:
    return UserError(f"sweep file {str(path)!r}: {msg}")


def _check_override(path, where: str, key: str, value: Any) -> Any:
    """A dotted key of the config schema with a value of its type (cross-key checks come per trial)."""
    if not isinstance(key, str) or "." not in key:
        raise _err(path, f"{where}: {key!r} is not a dotted config key such as model.heads")
    if key in RESERVED or key.startswith("sweep."):
        raise _err(path, f"{where}: {key} is set by ltfm sweep (use seeds: for run.seed)")
    try:
        scratch = C.defaults()
        C.set_dotted(scratch, key, value)
    except UserError as e:
        raise _err(path, f"{where}: {e}") from None
    sec, name = key.split(".")
    return scratch[sec][name]


def _mapping(path, where: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(path, f"{where} must be a mapping of dotted.key: value")
    return value


def _plugin_spec(path, what: str, value: Any, table: dict, default: str) -> dict:
    if value is None:
        value = {"type": default}
    if isinstance(value, str):
        value = {"type": value}
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _err(path, f"{what} must be a name or a mapping with type: one of {', '.join(table)}")
    spec = dict(value)
    spec["type"] = spec["type"].lower()
    if spec["type"] not in table:
        raise _err(path, f"{what} type {value['type']!r} is not one of {', '.join(table)}")
    return spec


def build_sampler(spec: dict | None):
    import optuna

    spec = dict(spec or {"type": "tpe"})
    cls = getattr(optuna.samplers, SAMPLERS[spec.pop("type")])
    return cls(**spec)


def build_pruner(spec: dict | None):
    """The Optuna pruner of a sweep file's ``pruner:`` (also used by the trial process)."""
    import optuna

    spec = dict(spec or {"type": "none"})
    cls = getattr(optuna.pruners, PRUNERS[spec.pop("type")])
    return cls(**spec)


def _check_plugin(path, what: str, spec: dict, builder) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            builder(spec)
    except (TypeError, ValueError) as e:
        raise _err(path, f"{what} {spec['type']}: {str(e).splitlines()[0]}") from None


def _check_distribution(path, key: str, spec: Any) -> dict:
    where = f"space {key}"
    if not isinstance(key, str) or "." not in key:
        raise _err(path, f"space: {key!r} is not a dotted config key such as model.heads")
    if key in RESERVED or key.startswith("sweep."):
        raise _err(path, f"{where}: {key} is set by ltfm sweep")
    if not isinstance(spec, dict) or spec.get("type") not in ("categorical", "int", "float"):
        raise _err(path, f"{where} must be a mapping with type: categorical | int | float")
    spec = dict(spec)
    kind = spec["type"]
    allowed = {"categorical": {"type", "choices"}, "int": {"type", "low", "high", "step", "log"},
               "float": {"type", "low", "high", "step", "log"}}[kind]
    unknown = set(spec) - allowed
    if unknown:
        raise _err(path, f"{where}: unknown field {sorted(unknown)[0]!r}: a {kind} takes {', '.join(sorted(allowed))}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _err(path, f"{where}: choices must be a non-empty list")
        spec["choices"] = [_check_override(path, where, key, c) for c in choices]
        return spec
    for bound in ("low", "high"):
        if bound not in spec:
            raise _err(path, f"{where}: {bound} is missing")
        v = spec[bound]
        if kind == "int" and (not isinstance(v, int) or isinstance(v, bool)):
            raise _err(path, f"{where}: {bound} must be an integer")
        if kind == "float" and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise _err(path, f"{where}: {bound} must be a number")
        _check_override(path, where, key, v)
    if spec["low"] > spec["high"]:
        raise _err(path, f"{where}: low {spec['low']} is above high {spec['high']}")
    if "step" in spec and spec["step"] is not None and not (isinstance(spec["step"], (int, float)) and spec["step"] > 0):
        raise _err(path, f"{where}: step must be a positive number")
    if "log" in spec and not isinstance(spec["log"], bool):
        raise _err(path, f"{where}: log must be true or false")
    return spec


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read and validate a sweep file; every problem is one UserError line naming the file and key."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"sweep file {str(path)!r} not found: give a YAML file such as sweeps/table3-cpu.yaml")
    try:
        tree = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _err(path, f"not valid YAML{where}: fix the syntax") from None
    if not isinstance(tree, dict):
        raise _err(path, "must hold a mapping with name, experiment, metric, ... and variants or space")
    unknown = [k for k in tree if k not in TOP_KEYS]
    if unknown:
        raise _err(path, f"unknown key {unknown[0]!r}: a sweep file has {', '.join(TOP_KEYS)}")
    name = tree.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _err(path, "name must be set to letters, digits, '.', '_' or '-' (it names the Optuna study)")
    exp = tree.get("experiment")
    if not isinstance(exp, str):
        raise _err(path, "experiment must name the base experiment YAML (relative to the sweep file)")
    experiment = (p.parent / exp).resolve()
    if not experiment.is_file():
        raise _err(path, f"experiment {exp!r} not found (looked for {experiment})")
    metric = tree.get("metric", "dev_loss")
    if metric not in METRICS:
        raise _err(path, f"metric {metric!r} is not one of {', '.join(METRICS)}")
    direction = tree.get("direction", METRICS[metric])
    if direction not in ("minimize", "maximize"):
        raise _err(path, f"direction {direction!r} must be minimize or maximize")
    if direction != METRICS[metric]:
        raise _err(path, f"direction {direction} does not fit metric {metric}: it is {METRICS[metric]}d")
    sampler = _plugin_spec(path, "sampler", tree.get("sampler"), SAMPLERS, "tpe")
    _check_plugin(path, "sampler", sampler, build_sampler)
    pruner = _plugin_spec(path, "pruner", tree.get("pruner"), PRUNERS, "none")
    _check_plugin(path, "pruner", pruner, build_pruner)
    seeds = tree.get("seeds", [1])
    seeds = [seeds] if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise _err(path, "seeds must be a non-empty list of distinct integers, e.g. [1, 2, 3]")
    overrides = {k: _check_override(path, "overrides", k, v)
                 for k, v in _mapping(path, "overrides", tree.get("overrides")).items()}
    hb = tree.get("heartbeat") or {}
    if not isinstance(hb, dict) or set(hb) - set(HEARTBEAT_DEFAULTS):
        raise _err(path, f"heartbeat must be a mapping with {', '.join(HEARTBEAT_DEFAULTS)}")
    heartbeat = {**HEARTBEAT_DEFAULTS, **hb}
    for k, v in heartbeat.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "max_retry" else 1):
            raise _err(path, f"heartbeat.{k} must be a {'non-negative' if k == 'max_retry' else 'positive'} integer")
    if heartbeat["grace"] <= heartbeat["interval"]:
        raise _err(path, "heartbeat.grace must be longer than heartbeat.interval")
    has_v, has_s = "variants" in tree, "space" in tree
    if has_v == has_s:
        raise _err(path, "give either variants (named rows) or space (distributions), not both or neither")
    n_trials = tree.get("n_trials")
    if n_trials is not None and (not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 1):
        raise _err(path, "n_trials must be a positive integer")
    sweep = Sweep(p, name, experiment, metric, direction, sampler, pruner, seeds, overrides, heartbeat, n_trials)
    if has_v:
        variants = tree["variants"]
        if not isinstance(variants, dict) or not variants:
            raise _err(path, "variants must be a non-empty mapping of name: {dotted.key: value}")
        sweep.variants = {}
        for vname, body in variants.items():
            if not isinstance(vname, str) or not NAME_RE.match(vname):
                raise _err(path, f"variant name {vname!r} must use letters, digits, '.', '_' or '-'")
            body = _mapping(path, f"variant {vname}", body)
            family = body.get("family", re.sub(r"\d+$", "", vname))
            if not isinstance(family, str) or not family:
                raise _err(path, f"variant {vname}: family must be a name such as A or norm")
            budget = body.get("budget", 1)
            if not isinstance(budget, (int, float)) or isinstance(budget, bool) or budget <= 0:
                raise _err(path, f"variant {vname}: budget must be a positive factor on train.max_steps")
            ov = {k: _check_override(path, f"variant {vname}", k, v) for k, v in body.items() if k not in VARIANT_META}
            sweep.variants[vname] = {"family": family, "budget": float(budget), "overrides": ov}
    else:
        space = tree["space"]
        if not isinstance(space, dict) or not space:
            raise _err(path, "space must be a non-empty mapping of dotted.key: {type: ...}")
        sweep.space = {k: _check_distribution(path, k, v) for k, v in space.items()}
        if len(seeds) != 1:
            raise _err(path, "a space sweep takes one seed (each sampled point is one trial)")
        sweep.n_trials = n_trials or 20
    return sweep


# ----------------------------------------------------------------------------------------------------------
# Trial configurations
# ----------------------------------------------------------------------------------------------------------
def parse_cli_overrides(overrides: list[str] | None) -> dict:
    out = {}
    for text in overrides or []:
        key, value = C.parse_override(text)
        if key in RESERVED or key.startswith("sweep."):
            raise UserError(f"{key} is set by ltfm sweep for each trial: leave it out (seeds come from the sweep file)")
        scratch = C.defaults()
        C.set_dotted(scratch, key, value)  # unknown key / wrong type: one line, exit 2
        out[key] = value
    return out


def trial_overrides(sweep: Sweep, entry: Entry, base: dict, base_steps: int | float) -> dict:
    """A trial's overrides of its experiment: ``base`` (the sweep file's, then the command line's), the
    entry's, its budget as a factor on train.max_steps (``base_steps`` = the experiment's with ``base``),
    and the run.* bookkeeping (seed, variant, family, study)."""
    ov = {**base, **entry.overrides}
    if entry.max_steps is not None:
        ov["train.max_steps"] = entry.max_steps
    elif entry.budget != 1.0:
        ov["train.max_steps"] = max(1, int(round(ov.get("train.max_steps", base_steps) * entry.budget)))
    ov.update({"run.seed": entry.seed, "run.variant": entry.name, "run.family": entry.family,
               "run.study": sweep.name})
    return ov


def trial_config(sweep: Sweep, entry: Entry | None = None, cli_overrides: dict | None = None,
                 checked: bool = True) -> dict:
    """The nested config of one trial (without ``entry``: the sweep's base), as :class:`Plan` builds it.
    ``checked=False`` (not validated) is for the reports: they show rows that cannot be built and need no data.path."""
    base = {**sweep.overrides, **(cli_overrides or {})}
    cfg = C.load_config(sweep.experiment, base, checked=checked)
    if entry is None:
        return cfg
    return C.load_config(sweep.experiment, trial_overrides(sweep, entry, base, cfg["train"]["max_steps"]),
                         checked=checked)


class Plan:
    """The resolved sweep: base overrides (file, then command line) and each trial's full overrides."""

    def __init__(self, sweep: Sweep, cli_overrides: list[str] | None):
        self.sweep = sweep
        self.base = {"train.progress_bar": False, **sweep.overrides, **parse_cli_overrides(cli_overrides)}
        self.base_cfg = C.load_config(sweep.experiment, self.base)  # the user's base must be valid: exit 2
        self.results_dir = Path(self.base_cfg["run"]["results_dir"]).absolute()

    def trial_overrides(self, entry: Entry) -> dict:
        return {**trial_overrides(self.sweep, entry, self.base, self.base_cfg["train"]["max_steps"]),
                "run.results_dir": str(self.results_dir)}

    def config(self, entry: Entry) -> dict:
        return C.load_config(self.sweep.experiment, self.trial_overrides(entry))

    def max_steps(self, entry: Entry) -> int:
        ov = self.trial_overrides(entry)
        return int(ov.get("train.max_steps", self.base_cfg["train"]["max_steps"]))

    def grid_key(self, entry: Entry) -> str:
        return f"{entry.name}/seed{entry.seed}/steps{self.max_steps(entry)}/{entry.definition_hash()}"

    def attrs(self, entry: Entry) -> dict:
        return {"grid_key": self.grid_key(entry), "variant": entry.name, "family": entry.family,
                "seed": entry.seed, "max_steps": self.max_steps(entry), "overrides": entry.overrides,
                "budget": entry.budget}


def build_model_params(cfg: dict) -> int:
    """Build the trial's model (on the meta device: no memory, no time) and count its parameters.

    The vocabulary is ``data.vocab_size``; a trained BPE vocabulary may come out slightly smaller.
    """
    import torch

    from .model import Transformer
    with torch.device("meta"):
        model = Transformer.from_config(cfg["model"], cfg["data"]["vocab_size"])
    return model.num_parameters()


def check_buildable(plan: Plan, entry: Entry) -> tuple[dict | None, int | None, str | None]:
    """(config, params, None) or (None, None, reason) for a combination that cannot be built."""
    try:
        cfg = plan.config(entry)
        return cfg, build_model_params(cfg), None
    except UserError as e:
        return None, None, str(e)
    except Exception as e:  # the model constructor refused it
        return None, None, f"model cannot be built: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def yaml_value(v: Any) -> str:
    """A value as ``ltfm``'s ``key=value`` parser (YAML) reads it back exactly: 1e-9 -> 1.0e-09, '1' -> "'1'"."""
    text = yaml.safe_dump(v, default_flow_style=True, width=1 << 30)
    return text[:-len("\n...\n")] if text.endswith("\n...\n") else text.rstrip("\n")


def format_overrides(ov: dict) -> str:
    return " ".join(f"{k}={yaml_value(v)}" for k, v in ov.items()) or "(base)"


# ----------------------------------------------------------------------------------------------------------
# Storage
# ----------------------------------------------------------------------------------------------------------
def default_storage(sweep: Sweep, results_dir: Path) -> str:
    return f"sqlite:///{results_dir / (sweep.name + '.db')}"


def _sqlite_immediate(engine) -> None:
    """Make every SQLite transaction BEGIN IMMEDIATE: the write lock is taken before the first read, so
    Optuna's read-check-write of a trial state (claiming a WAITING trial, failing a stale one) is atomic
    across processes. (SQLite ignores SELECT ... FOR UPDATE, which is what protects it on PostgreSQL/MySQL.)
    This is SQLAlchemy's documented pysqlite recipe; connections are opened with isolation_level=None."""
    from sqlalchemy import event

    @event.listens_for(engine, "begin")
    def _begin(conn):  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _available_driver(parsed) -> str | None:
    """A URL without a driver (``postgresql://``, ``mysql://``) whose SQLAlchemy default DBAPI is not
    installed but another common one is: the drivername to use instead (else None)."""
    import importlib.util

    options = {"postgresql": [("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")],
               "mysql": [("MySQLdb", "mysql+mysqldb"), ("pymysql", "mysql+pymysql")]}.get(parsed.drivername)
    if not options:
        return None
    for module, drivername in options:
        if importlib.util.find_spec(module) is not None:
            return None if drivername == options[0][1] else drivername
    return None


def open_storage(url: str, heartbeat: dict | None = None, for_trial: bool = False, create: bool = True):
    """An Optuna ``RDBStorage`` for ``url``, or a one-line UserError (the password never shown)."""
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    shown = mask_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        raise UserError(f"storage URL {shown!r} is malformed: use sqlite:///path.db, "
                        "postgresql://user@host:port/db or mysql+pymysql://user@host/db") from None
    backend = parsed.get_backend_name()
    default_driver = _available_driver(parsed)
    if default_driver:  # e.g. SQLAlchemy 2.1 reads postgresql:// as psycopg 3; psycopg2 may be what is installed
        url = parsed.set(drivername=default_driver).render_as_string(hide_password=False)
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise UserError(f"storage URL {shown!r} has no database file: use sqlite:///path/to/file.db")
        dbp = Path(db)
        if not create and not dbp.is_file():
            raise UserError(f"no sweep database at {dbp}: run the sweep first (or pass --storage)")
        if not dbp.parent.is_dir():
            raise UserError(f"storage folder {str(dbp.parent)!r} does not exist: create it or choose another path")
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120, "isolation_level": None}}
    elif backend in ("postgresql", "mysql", "mariadb"):
        kwargs["engine_kwargs"] = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    else:
        raise UserError(f"storage URL {shown!r}: {backend!r} is not supported: use sqlite, postgresql or mysql")
    if heartbeat and not for_trial:
        from optuna.storages import RetryHeartbeatStaleTrialCallback
        kwargs.update(heartbeat_interval=heartbeat["interval"], grace_period=heartbeat["grace"],
                      heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                          max_retry=heartbeat["max_retry"], inherit_intermediate_values=True))
    last: Exception | None = None
    for attempt in range(3):  # two workers creating the tables at the same instant: one retries
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, **kwargs)
            if backend == "sqlite":
                _sqlite_immediate(storage.engine)
            return storage
        except ImportError:
            driver = "psycopg2-binary (pip install 'lightning_tfm[postgres]')" if backend == "postgresql" \
                else "a driver such as pymysql (and use mysql+pymysql://)"
            raise UserError(f"storage {shown!r} needs {driver}") from None
        except Exception as e:  # OperationalError (unreachable, refused, bad credentials), schema races
            last = e
            msg = str(e).lower()
            if any(s in msg for s in ("refused", "could not translate", "timeout", "authentication", "password",
                                      "does not exist", "unable to open", "access denied", "unknown database")):
                break
            time.sleep(0.5 + attempt)
    detail = scrub_text(str(getattr(last, "orig", None) or last).strip().splitlines()[0] if str(last).strip() else
                        last.__class__.__name__, url)
    raise UserError(f"cannot open storage {shown}: {detail[:300]}; check the URL, that the server is "
                    "running and reachable, and the credentials")


# ----------------------------------------------------------------------------------------------------------
# Study and trials
# ----------------------------------------------------------------------------------------------------------
def quiet_optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def distributions(space: dict) -> dict:
    """The sweep file's ``space`` specs (checked by :func:`load_sweep`) as Optuna distributions."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for key, d in space.items():
        if d["type"] == "categorical":
            out[key] = CategoricalDistribution(d["choices"])
        elif d["type"] == "int":
            out[key] = IntDistribution(d["low"], d["high"], step=d.get("step") or 1, log=d.get("log", False))
        else:
            out[key] = FloatDistribution(float(d["low"]), float(d["high"]), step=d.get("step"), log=d.get("log", False))
    return out


def suggest(trial, space: dict) -> dict:
    """Sample every key of ``space`` in ``trial`` (through Optuna's public ``suggest_*``): key -> value."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    params = {}
    for key, dist in distributions(space).items():
        if isinstance(dist, CategoricalDistribution):
            params[key] = trial.suggest_categorical(key, dist.choices)
        elif isinstance(dist, IntDistribution):
            params[key] = trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            params[key] = trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)
    return params


def machine_description() -> str:
    """This machine as a report names it: CPU model and the cores this process may use."""
    import platform

    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or platform.processor() or platform.machine() or 'unknown CPU'}, {cores} cores"


def open_study(sweep: Sweep, storage, create: bool = True):
    """The sweep's study. ``create``: a worker joining it, which names the metric for optuna-dashboard (instead
    of "Objective 0") and records its machine as the study attribute ``ltfm.machine.<host>`` (the report's
    headline)."""
    import optuna

    sampler, pruner = build_sampler(sweep.sampler), build_pruner(sweep.pruner)
    if create:
        study = optuna.create_study(storage=storage, study_name=sweep.name, direction=sweep.direction,
                                    sampler=sampler, pruner=pruner, load_if_exists=True)
        if study.metric_names != [sweep.metric]:
            with warnings.catch_warnings():  # experimental since Optuna 3.2, and what the dashboard reads
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                _retry(study.set_metric_names, [sweep.metric])
        _retry(study.set_user_attr, f"ltfm.machine.{socket.gethostname()}", machine_description())
    else:
        try:
            study = optuna.load_study(study_name=sweep.name, storage=storage, sampler=sampler, pruner=pruner)
        except KeyError:
            raise UserError(f"no study {sweep.name!r} in the storage: run `ltfm sweep {sweep.path}` first") from None
    if study.direction.name.lower() != sweep.direction:
        raise UserError(f"study {sweep.name!r} in this storage {study.direction.name.lower()}s, but the sweep file "
                        f"says {sweep.direction}: use another --storage or fix the sweep file")
    return study


def _retry(fn, *args, attempts: int = 5, **kw):
    """Storage calls under heavy contention can fail transiently; try again a few times."""
    import optuna
    for i in range(attempts):
        try:
            return fn(*args, **kw)
        except optuna.exceptions.StorageInternalError:
            if i == attempts - 1:
                raise
            time.sleep(0.5 * (i + 1))


def enqueue_missing(study, plan: Plan) -> int:
    """Enqueue every (variant, seed) row that has no live trial yet; returns how many were added."""
    from optuna.trial import TrialState, create_trial

    by_key: dict[str, list] = {}
    for t in study.get_trials(deepcopy=False):
        by_key.setdefault(t.user_attrs.get("grid_key"), []).append(t)
    added = 0
    space = dashboard_space(plan)
    # Longest rows first (stable, so the paper's order holds within a budget): with several workers a
    # row trained for 3x the steps overlaps the short ones instead of running alone at the end. Measured
    # on 2 cores, fp32, `make ablation`: queued last, `big` alone took the final ~30 of 66 minutes.
    for entry in sorted(plan.sweep.entries(), key=lambda e: -e.budget):
        trials = by_key.get(plan.grid_key(entry), [])
        if any(t.state != TrialState.FAIL for t in trials):
            continue  # waiting, running, complete or pruned somewhere
        if any(t.user_attrs.get("skip") == "unbuildable" for t in trials):
            continue  # will not build now either
        params, dists = dashboard_params(plan, entry, space)
        # study.enqueue_trial, with the row's knobs as the trial's params (enqueue_trial's own params are
        # only applied by suggest_* calls, which these trials never make)
        _retry(study.add_trial, create_trial(state=TrialState.WAITING, params=params, distributions=dists,
                                             user_attrs=plan.attrs(entry)))
        added += 1
    return added


# The Table 3 knobs each variant trial carries as its Optuna params (flat config keys, as in W&B), so that
# optuna-dashboard's trials table, parallel coordinates and Hyperparameter Importance show them. Nothing
# samples them: they describe the row.
DASHBOARD_KNOBS = ("model.layers", "model.d_model", "model.d_ff", "model.heads", "model.d_k", "model.d_v",
                   "model.dropout", "train.label_smoothing", "model.positional", "model.norm")
# Categorical knobs get every allowed value as choices (config.SCHEMA's), the same in every study: Optuna
# refuses a parameter whose categorical choices differ between the trials of one study.
DASHBOARD_CHOICES = {"model.positional": ("sinusoidal", "learned"), "model.norm": ("post", "pre")}


def _knob_value(plan: Plan, entry: Entry, key: str) -> Any:
    ov = plan.trial_overrides(entry)
    sec, name = key.split(".")
    return ov.get(key, plan.base_cfg[sec].get(name))


def dashboard_space(plan: Plan) -> dict:
    """One distribution per knob spanning the values of the plan's rows: identical for every trial the plan
    enqueues (Optuna's importance evaluators need one search space)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    for key in DASHBOARD_KNOBS:
        if key in DASHBOARD_CHOICES:
            space[key] = CategoricalDistribution(DASHBOARD_CHOICES[key])
            continue
        values = [_knob_value(plan, e, key) for e in plan.sweep.entries()]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            continue
        if all(isinstance(v, int) for v in values):
            space[key] = IntDistribution(min(values), max(values))
        else:
            space[key] = FloatDistribution(float(min(values)), float(max(values)))
    return space


def dashboard_params(plan: Plan, entry: Entry, space: dict) -> tuple[dict, dict]:
    params, dists = {}, {}
    for key, dist in space.items():
        value = _knob_value(plan, entry, key)
        if value is None or (key in DASHBOARD_CHOICES and value not in DASHBOARD_CHOICES[key]):
            continue
        params[key] = float(value) if dist.__class__.__name__ == "FloatDistribution" else value
        dists[key] = dist
    return params, dists


def claim_waiting(study, storage, study_id: int, keys: set[str] | None = None):
    """Atomically move one WAITING trial to RUNNING (as ``study.ask`` does), or None if none is left.

    With ``keys``, only trials of those grid keys: a worker runs its own plan's rows (its budget, its variant
    definitions), and leaves rows enqueued by workers with another plan to them."""
    import optuna
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if keys is not None and t.user_attrs.get("grid_key") not in keys:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        try:
            if _retry(storage.set_trial_state_values, trial_id, state=TrialState.RUNNING):
                return optuna.trial.Trial(study, trial_id), trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def duplicate_of(study, number: int, key: str):
    """The lower-numbered live (waiting/running/complete/pruned) trial holding ``key``, if any."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False):
        if t.number < number and t.user_attrs.get("grid_key") == key and t.state != TrialState.FAIL:
            return t
    return None


class Heartbeat:
    """Record the Optuna heartbeat of a trial every ``interval`` seconds while its process runs."""

    def __init__(self, storage, trial_id: int, interval: int):
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as e:  # transient database trouble: try again at the next beat
                print(f"ltfm: warning: heartbeat of trial id {self.trial_id} failed ({e.__class__.__name__})",
                      file=sys.stderr)
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self.storage.record_heartbeat(self.trial_id)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _death_signal():
    """A preexec_fn making the trial process get SIGKILL when its worker dies (Linux ``PR_SET_PDEATHSIG``),
    so that a killed worker leaves no orphan training that would race the retried trial. ``prctl`` is looked
    up here, in the parent: between fork and exec the child only calls it (no imports, no locks)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG


_TERMINATED = threading.Event()


def _on_sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM (``kill``, a batch system's preemption) ends a worker like Ctrl-C: its trial is stopped and
    recorded as interrupted, and the next ``ltfm sweep`` resumes it from its checkpoint."""
    _TERMINATED.set()
    raise KeyboardInterrupt


def _log_error_line(log: Path) -> str | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("ltfm: error:"):
            return line[len("ltfm: error:"):].strip()
    for line in reversed(lines):
        if line.strip() and not line.startswith(" "):
            return line.strip()[:300]
    return None


RESULT_ATTRS = ("status", "steps", "params", "dev_loss", "dev_ppl", "dev_bleu", "test_bleu", "wall_time_s",
                "wandb_run_id", "wandb_project", "wandb_mode")


class Worker:
    """One ``ltfm sweep`` process: joins the study, claims trials, runs them, records the results."""

    def __init__(self, sweep: Sweep, plan: Plan, storage_url: str, storage, study, out=sys.stdout):
        self.sweep, self.plan, self.url, self.storage, self.study = sweep, plan, storage_url, storage, study
        self.study_id = storage.get_study_id_from_name(sweep.name)
        self.out = out
        self.logs = plan.results_dir / "sweep-logs" / sweep.name
        self.counts = {"completed": 0, "pruned": 0, "failed": 0, "skipped": 0}
        self.keys = {plan.grid_key(e) for e in sweep.entries()} if sweep.mode == "variants" else None
        self._last_input_error: str | None = None

    def say(self, msg: str) -> None:
        print(f"[{self.sweep.name}] {msg}", file=self.out, flush=True)

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, n_trials: int | None) -> int:
        from optuna.storages import fail_stale_trials

        if self.sweep.mode == "variants":
            added = enqueue_missing(self.study, self.plan)
            if added:
                self.say(f"queued {added} trial(s)")
        trained = 0
        while n_trials is None or trained < n_trials:
            _retry(fail_stale_trials, self.study)  # trials of dead workers -> FAIL + a WAITING retry
            if self.sweep.mode == "variants":
                claimed = claim_waiting(self.study, self.storage, self.study_id, self.keys)
                if claimed is None:
                    break
                trial, trial_id = claimed
                entry = self._entry_of(trial)
            else:
                if self._space_full():
                    break
                trial = _retry(self.study.ask)
                trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
                entry = self._sample(trial)
            trained += self.run_trial(trial, trial_id, entry)
        self._final_message()
        return 1 if self.counts["failed"] else 0

    def _entry_of(self, trial) -> Entry:
        a = trial.user_attrs
        return Entry(a["variant"], a["family"], int(a["seed"]), dict(a.get("overrides") or {}),
                     float(a.get("budget", 1.0)), a.get("max_steps"))

    def _space_full(self) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        return sum(1 for t in trials if t.user_attrs.get("skip") != "duplicate") >= (self.sweep.n_trials or 0)

    def _sample(self, trial) -> Entry:
        params = suggest(trial, self.sweep.space)
        entry = Entry(f"search-{trial.number:04d}", "search", self.sweep.seeds[0], params)
        if "grid_key" not in trial.user_attrs:  # a retried trial keeps its original name and key
            for k, v in self.plan.attrs(entry).items():
                if k != "grid_key":
                    trial.set_user_attr(k, v)
            trial.set_user_attr("grid_key", f"search/seed{entry.seed}/steps{self.plan.max_steps(entry)}/"
                                            f"{entry.definition_hash()}")
        else:
            entry.name = trial.user_attrs.get("variant", entry.name)
        return entry

    # -- one trial -----------------------------------------------------------------------------------------
    def _close(self, trial, state, values=None, **attrs) -> None:
        for k, v in attrs.items():
            if v is not None:
                _retry(trial.set_user_attr, k, v)
        _retry(self.study.tell, trial.number, values, state=state, skip_if_finished=True)

    def run_trial(self, trial, trial_id: int, entry: Entry) -> int:
        """Run one claimed trial; returns 1 if a training process was started."""
        from optuna.trial import TrialState

        with Heartbeat(self.storage, trial_id, self.sweep.heartbeat["interval"]):
            label = f"trial {trial.number} {entry.name} seed {entry.seed}"
            key = trial.user_attrs.get("grid_key")
            dup = duplicate_of(self.study, trial.number, key)
            if dup is not None:
                self.say(f"{label}: duplicate of trial {dup.number}, not run")
                self._close(trial, TrialState.FAIL, skip="duplicate", reason=f"duplicate of trial {dup.number}")
                return 0
            cfg, params, reason = check_buildable(self.plan, entry)
            if reason is not None:
                self.counts["skipped"] += 1
                self.say(f"{label}: skipped: {reason}")
                self._close(trial, TrialState.FAIL, skip="unbuildable", reason=reason)
                return 0
            return self._train(trial, entry, cfg, params, label)

    def _train(self, trial, entry: Entry, cfg: dict, params: int, label: str) -> int:
        from optuna.trial import TrialState

        rid = C.run_id(cfg)
        run_dir = self.plan.results_dir / rid
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"trial-{trial.number:04d}-{entry.name}-s{entry.seed}.log"
        for k, v in {"run_id": rid, "run_dir": str(run_dir), "host": socket.gethostname(), "log": str(log),
                     "planned_params": params}.items():
            _retry(trial.set_user_attr, k, v)
        overrides = self.plan.trial_overrides(entry)
        overrides.update({"sweep.storage": mask_url(self.url), "sweep.study": self.sweep.name,
                          "sweep.trial": trial.number, "sweep.metric": self.sweep.metric})
        cmd = [sys.executable, "-m", "lightning_tfm", "train", str(self.sweep.experiment),
               *[f"{k}={yaml_value(v)}" for k, v in overrides.items()]]
        from .pruning import STORAGE_ENV
        env = {**os.environ, STORAGE_ENV: self.url, "PYTHONUNBUFFERED": "1"}
        self.say(f"{label}: training {rid} (log {log})")
        started = time.time()
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    preexec_fn=_death_signal())
            try:
                rc = proc.wait()
            except BaseException:  # Ctrl-C: the trial process got SIGINT too; let it save its summary
                if _TERMINATED.is_set() and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)  # SIGTERM reached this worker alone: stop the trial the same way
                with contextlib.suppress(Exception):
                    proc.wait(timeout=30)
                if proc.poll() is None:
                    proc.kill()
                self._close(trial, TrialState.FAIL, reason="interrupted", status="interrupted")
                raise
        from .results import RUN_LOCKED, read_summary
        if rc == 2 and RUN_LOCKED in (_log_error_line(log) or ""):
            # Another process (a `ltfm train` by hand, a worker of another sweep) trains this very run:
            # not this trial's failure, and not an input error that would stop the worker.
            self.counts["skipped"] += 1
            reason = scrub_text(_log_error_line(log) or "", self.url)
            self.say(f"{label}: already running elsewhere: {reason}")
            self._close(trial, TrialState.FAIL, skip="running", reason=reason)
            return 1
        summary = read_summary(run_dir) or {}
        if rc != 0 and summary.get("pid") not in (None, proc.pid):
            summary = {}  # left by an earlier attempt: this process died before writing its own
        # (rc 0 with an older pid: the run was already completed, and `ltfm train` returned its summary)
        results = {k: summary.get(k) for k in RESULT_ATTRS}
        results = {k: v for k, v in results.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        status = summary.get("status")
        if status == "completed" and rc != 0:
            status = None
        value = summary.get(self.sweep.metric)
        took = f"{time.time() - started:.0f} s"
        if status == "completed" and isinstance(value, (int, float)) and math.isfinite(value):
            self.counts["completed"] += 1
            self._last_input_error = None
            self.say(f"{label}: completed {self.sweep.metric}={value:.4g} ({took})")
            self._close(trial, TrialState.COMPLETE, [float(value)], **results)
        elif status == "pruned":
            self.counts["pruned"] += 1
            self._last_input_error = None
            self.say(f"{label}: pruned at step {summary.get('steps')} ({took})")
            self._close(trial, TrialState.PRUNED, **results)
        else:
            self.counts["failed"] += 1
            if status == "completed":
                error = f"summary.json has no finite {self.sweep.metric}"
            else:
                error = (_log_error_line(log) if rc == 2 else None) or summary.get("error") or \
                    _log_error_line(log) or f"exit code {rc}"
            error = scrub_text(error, self.url)
            self.say(f"{label}: failed: {error} ({took}; log {log})")
            self._close(trial, TrialState.FAIL, error=error, exit_code=rc, **results)
            if rc == 2:  # an input error (data, results folder): if it repeats, every trial would fail
                if error == self._last_input_error:
                    raise UserError(f"{error} (two trials in a row failed this way; see {log})")
                self._last_input_error = error
        return 1

    def _final_message(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        running = [t.number for t in trials if t.state == TrialState.RUNNING]
        waiting = [t.number for t in trials if t.state == TrialState.WAITING]
        c = self.counts
        msg = (f"worker done: {c['completed']} completed, {c['pruned']} pruned, {c['failed']} failed, "
               f"{c['skipped']} skipped")
        if running:
            msg += (f"; trial(s) {', '.join(map(str, running))} still running in other workers (a trial whose "
                    f"worker died is re-run by the next `ltfm sweep` started {self.sweep.heartbeat['grace']} s "
                    "after its last heartbeat)")
        if waiting:
            msg += f"; {len(waiting)} waiting"
        self.say(msg)


# ----------------------------------------------------------------------------------------------------------
# Dry run and status
# ----------------------------------------------------------------------------------------------------------
def dry_run(sweep: Sweep, plan: Plan, n_trials: int | None) -> list[dict]:
    """Every trial's name, overrides and parameter count, without training or touching any storage."""
    rows = []
    if sweep.mode == "variants":
        entries = sweep.entries()
    else:  # show the kind of points the space yields: random draws from it
        import optuna
        quiet_optuna()
        seed = sweep.sampler.get("seed", 0)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction=sweep.direction)
        entries = []
        for i in range(n_trials or sweep.n_trials or 10):
            trial = study.ask()
            params = suggest(trial, sweep.space)
            entries.append(Entry(f"search-{i:04d}", "search", sweep.seeds[0], params))
    for entry in entries:
        _, params, reason = check_buildable(plan, entry)
        rows.append({"name": entry.name, "family": entry.family, "seed": entry.seed, "overrides": entry.overrides,
                     "max_steps": plan.max_steps(entry), "params": params, "skipped": reason})
    return rows


def _duration(t) -> float | None:
    if t.datetime_start is None:
        return None
    end = t.datetime_complete or _dt.datetime.now()
    return (end - t.datetime_start).total_seconds()


def status_rows(study) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        state = t.state.name.lower()
        if a.get("skip"):
            state = "skipped" if a["skip"] == "unbuildable" else "duplicate"
        steps = a.get("steps")
        if steps is None and t.intermediate_values:
            steps = max(t.intermediate_values)
        rows.append({"number": t.number, "variant": a.get("variant"), "family": a.get("family"),
                     "seed": a.get("seed"), "state": state, "value": t.value, "steps": steps,
                     "duration_s": _duration(t), "run_dir": a.get("run_dir"), "wandb_run_id": a.get("wandb_run_id"),
                     "note": a.get("reason") or a.get("error")})
    return rows


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def format_status(sweep: Sweep, rows: list[dict], storage_shown: str) -> str:
    head = ("#", "variant", "seed", "state", sweep.metric, "steps", "duration", "run folder", "note")
    table = [head]
    for r in rows:
        table.append((str(r["number"]), r["variant"] or "-", str(r["seed"] if r["seed"] is not None else "-"),
                      r["state"], f"{r['value']:.4f}" if isinstance(r["value"], float) else "-",
                      str(r["steps"] if r["steps"] is not None else "-"), _fmt_duration(r["duration_s"]),
                      r["run_dir"] or "-", (r["note"] or "")[:80]))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    lines.append(f"study {sweep.name} in {storage_shown}: {summary}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------
def _check_local_data(cfg: dict) -> None:
    d = cfg["data"]
    if d["source"] != "local":
        return
    from .data import split_file
    for split in (d["train_split"], d["dev_split"], d["test_split"]):
        if split:
            for lang in (d["src_lang"], d["tgt_lang"]):
                split_file(d["path"], split, lang)


def _corpus_line(cfg: dict) -> str:
    from .corpus import status
    try:
        folder, ready = status(cfg)
    except UserError as e:
        return f"prepared corpus: cannot tell ({e})"
    return (f"prepared corpus: {folder} " + ("exists (every trial maps it)" if ready else
            "does not exist yet (built once before the first trial, or now with `ltfm prepare`)"))


def sweep_cli(args) -> int:
    """``ltfm sweep SWEEP.yaml [--storage URL] [--n-trials N] [--dry-run] [--json] [--status] [k=v ...]``"""
    if args.n_trials is not None and args.n_trials < 1:
        raise UserError(f"--n-trials {args.n_trials} must be at least 1")
    sweep = load_sweep(args.sweep_file)
    plan = Plan(sweep, args.overrides)
    if args.dry_run:
        rows = dry_run(sweep, plan, args.n_trials)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print(_corpus_line(plan.base_cfg))
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                what = f"{r['params']:>12,} params" if r["params"] is not None else f"skipped: {r['skipped']}"
                print(f"{r['name']:<{width}}  seed {r['seed']}  {what}  steps {r['max_steps']}  "
                      f"{format_overrides(r['overrides'])}")
        return 0
    quiet_optuna()
    url = args.storage or default_storage(sweep, plan.results_dir)
    if args.status:
        storage = open_storage(url, create=False)
        study = open_study(sweep, storage, create=False)
        rows = status_rows(study)
        print(json.dumps(rows, indent=1, default=str) if args.json else format_status(sweep, rows, mask_url(url)))
        return 0
    # A given --storage is checked first (fails fast, writes nothing here); the default SQLite file is only
    # created once the data and the results folder are known to be fine.
    storage = open_storage(url, heartbeat=sweep.heartbeat) if args.storage else None
    _check_local_data(plan.base_cfg)
    try:
        (plan.results_dir / "sweep-logs").mkdir(parents=True, exist_ok=True)
    except OSError:
        raise UserError(f"results folder {str(plan.results_dir)!r} is not writable: set run.results_dir to a "
                        "folder you can write") from None
    from .corpus import prepare
    prepare(plan.base_cfg)  # one vocabulary and one set of ids for every trial, built before any trial starts
    storage = storage or open_storage(url, heartbeat=sweep.heartbeat)
    study = _retry(open_study, sweep, storage)
    _retry(study.set_user_attr, "ltfm.pruner", sweep.pruner)
    _retry(study.set_user_attr, "ltfm.metric", sweep.metric)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    worker = Worker(sweep, plan, url, storage, study)
    worker.say(f"study {sweep.name} in {mask_url(url)}; results in {plan.results_dir}")
    return worker.run(args.n_trials)
