"""The sweep file: its checks (:func:`load_sweep`), its rows (:class:`Entry`) and its search space.

Everything here reads the file alone: no storage, no training. The sampler and pruner specs are turned into
Optuna objects here too (:func:`build_sampler`, :func:`build_pruner`), because checking a file means building
them; the space spec is decoded in one place (:func:`distributions`), which the worker's sampling
(:func:`suggest`), the dry run and the search report share.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..training import config
from ..training.errors import UserError
from ..training.inputs import load_yaml, read_yaml_text, shown
from ..training.results import OBJECTIVES

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
TOP_KEYS = ("name", "description", "experiment", "metric", "direction", "sampler", "pruner", "seeds",
            "overrides", "heartbeat", "n_trials", "variants", "space", "report")
# The summary.json keys a sweep may optimise, and the direction that is better (results.OBJECTIVES).
METRICS = {key: direction for key, (_, direction) in OBJECTIVES.items()}
# Keys a sweep sets itself: a sweep file or the command line may not.
RESERVED = ("run.seed", "run.id", "run.variant", "run.family", "run.study")
VARIANT_META = ("family", "budget", "seeds")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "gp": "GPSampler",
            "qmc": "QMCSampler"}
PRUNERS = {"none": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
           "hyperband": "HyperbandPruner", "successive_halving": "SuccessiveHalvingPruner",
           "threshold": "ThresholdPruner"}
HEARTBEAT_DEFAULTS = {"interval": 30, "grace": 120, "max_retry": 3}
# The sweep file's ``report:`` section: the thresholds of the report's budget verdict
# (lightning_tfm.report.verdict, where the rule is written out). last_fraction: the share of the budget, at its
# end, over which a finding keeps its sign and its gap is extrapolated; horizon: a closing gap that would cross
# within this many budgets makes the row "still moving"; min_points: the validations that window needs at least.
REPORT_DEFAULTS = {"last_fraction": 1 / 3, "horizon": 2.0, "min_points": 2}


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
    report: dict = field(default_factory=lambda: dict(REPORT_DEFAULTS))  # the report's verdict thresholds

    @property
    def mode(self) -> str:
        return "variants" if self.variants is not None else "space"

    def entries(self) -> list[Entry]:
        assert self.variants is not None
        return [Entry(name, v["family"], seed, v["overrides"], v["budget"])
                for name, v in self.variants.items() for seed in (v.get("seeds") or self.seeds)]


def _err(path, msg: str) -> UserError:
    return UserError(f"sweep file {str(path)!r}: {msg}")


def _check_override(path, where: str, key: str, value: Any) -> Any:
    """A dotted key of the config schema with a value of its type (cross-key checks come per trial)."""
    if not isinstance(key, str) or "." not in key:
        raise _err(path, f"{where}: {shown(key)} is not a dotted config key such as model.heads")
    if key in RESERVED or key.startswith("sweep."):
        raise _err(path, f"{where}: {key} is set by ltfm sweep (use seeds: for run.seed)")
    try:
        scratch = config.Config()
        config.set_dotted(scratch, key, value)
    except UserError as e:
        raise _err(path, f"{where}: {e}") from None
    return config.get_dotted(scratch, key)


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
        raise _err(path, f"{what} type {shown(value['type'])} is not one of {', '.join(table)}")
    for k, v in spec.items():  # Optuna takes NaN and infinity silently (a NaN threshold never prunes)
        if isinstance(v, float) and not math.isfinite(v):
            raise _err(path, f"{what} {spec['type']}: {k}={v} is not a finite number")
    if "seed" in spec and spec["seed"] is not None and not _is_seed(spec["seed"]):
        raise _err(path, f"{what} {spec['type']}: seed must be an integer from 0 to 2**32 - 1, not {shown(spec['seed'])}")
    return spec


def _is_seed(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 32


def _seed_list(v: Any) -> bool:
    """A non-empty list of distinct seeds (integers from 0 to 2**32 - 1, as Lightning's seeding takes them)."""
    return isinstance(v, list) and bool(v) and all(map(_is_seed, v)) and len(set(v)) == len(v)


def build_sampler(spec: dict | None):
    """The Optuna sampler of a sweep file's ``sampler:``. A seeded one (but QMC) draws its random state anew for
    every trial from the seed and the trial number (:class:`~.seeding.PerTrialSeed`): workers that share the
    study do not propose the same points, and one worker's search is reproducible."""
    import optuna

    spec = dict(spec or {"type": "tpe"})
    kind = spec.pop("type")
    cls = getattr(optuna.samplers, SAMPLERS[kind])
    if spec.get("seed") is not None and kind != "qmc":
        from .seeding import PerTrialSeed
        seed = spec.pop("seed")
        return PerTrialSeed(cls, spec, seed)
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
    except (TypeError, ValueError, OverflowError) as e:
        raise _err(path, f"{what} {spec['type']}: {str(e).splitlines()[0] if str(e) else e.__class__.__name__}") from None


def _number(path, where: str, name: str, v: Any, integer: bool) -> int | float:
    """A bound or step of an int or float distribution: an integer (int), or a finite number (float; a string
    such as 1e-5, which YAML 1.1 reads as text, counts as one)."""
    if isinstance(v, str) and not integer:
        try:
            v = float(v)
        except ValueError:
            pass
    if integer and (not isinstance(v, int) or isinstance(v, bool)):
        raise _err(path, f"{where}: {name} must be an integer, not {shown(v)}")
    if not integer and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
        raise _err(path, f"{where}: {name} must be a finite number, not {shown(v)}")
    return v


def _check_distribution(path, key: str, spec: Any) -> dict:
    """One entry of ``space:``, checked whole (the type fits the key; low < high; log needs low > 0 and no step;
    step positive and dividing high - low; choices distinct plain values of the key's type), so that Optuna
    never refuses it later."""
    if not isinstance(key, str) or "." not in key:
        raise _err(path, f"space: {shown(key)} is not a dotted config key such as model.heads")
    where = f"space {key}"
    if key in RESERVED or key.startswith("sweep."):
        raise _err(path, f"{where}: {key} is set by ltfm sweep")
    if not isinstance(spec, dict) or spec.get("type") not in ("categorical", "int", "float"):
        raise _err(path, f"{where} must be a mapping with type: categorical | int | float")
    spec = dict(spec)
    kind = spec["type"]
    allowed = {"categorical": {"type", "choices"}, "int": {"type", "low", "high", "step", "log"},
               "float": {"type", "low", "high", "step", "log"}}[kind]
    unknown = sorted(map(str, set(spec) - allowed))
    if unknown:
        raise _err(path, f"{where}: unknown field {shown(unknown[0])}: a {kind} takes {', '.join(sorted(allowed))}")
    sec, _, name = key.partition(".")
    if name not in config.SCHEMA.get(sec, {}):
        _check_override(path, where, key, None)  # an unknown key: its one line
    base = config.SCHEMA[sec][name][0]
    base = base[1] if isinstance(base, tuple) and base[0] == config.OPT else base
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _err(path, f"{where}: choices must be a non-empty list")
        odd = [c for c in choices if c is not None and not isinstance(c, (bool, int, float, str))]
        if odd:
            raise _err(path, f"{where}: choice {shown(odd[0])} is not a plain value (number, string, bool, null)")
        spec["choices"] = [_check_override(path, where, key, c) for c in choices]
        if len(set(map(repr, spec["choices"]))) != len(spec["choices"]):
            raise _err(path, f"{where}: choices repeat a value: list each once")
        return spec
    if base not in (int, float) or (kind == "float" and base is int):
        want = "type: int or categorical" if base is int else "type: categorical with choices"
        kind_text = "an int" if kind == "int" else "a float"
        raise _err(path, f"{where}: {key} takes {config.describe(base)} values, not {kind_text} range: use {want}")
    integer = kind == "int"
    for bound in ("low", "high"):
        if bound not in spec:
            raise _err(path, f"{where}: {bound} is missing")
        spec[bound] = _number(path, where, bound, spec[bound], integer)
        _check_override(path, where, key, spec[bound])
    low, high = spec["low"], spec["high"]
    if low >= high:
        raise _err(path, f"{where}: low {low} must be below high {high} (one value: set it in overrides)")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise _err(path, f"{where}: log must be true or false, not {shown(log)}")
    if log and low <= 0:
        raise _err(path, f"{where}: log: true needs low > 0, not {low}: raise low or drop log")
    step = spec.get("step")
    if step is not None:
        step = spec["step"] = _number(path, where, "step", step, integer)
        if step <= 0:
            raise _err(path, f"{where}: step must be positive, not {step}")
        if log and (kind == "float" or step != 1):
            raise _err(path, f"{where}: a log range takes no step: drop step or log")
        from decimal import Decimal
        if (Decimal(str(high)) - Decimal(str(low))) % Decimal(str(step)):
            raise _err(path, f"{where}: high - low ({high} - {low}) is not a multiple of step {step}: "
                             "adjust high or step")
    return spec


def _check_report(path, value: Any) -> dict:
    """The ``report:`` section: known keys, each in its range (see :data:`REPORT_DEFAULTS`)."""
    if value is None:
        return dict(REPORT_DEFAULTS)
    if not isinstance(value, dict):
        raise _err(path, f"report must be a mapping with {', '.join(REPORT_DEFAULTS)}")
    unknown = [k for k in value if k not in REPORT_DEFAULTS]
    if unknown:
        raise _err(path, f"report: unknown key {shown(unknown[0])}: report takes {', '.join(REPORT_DEFAULTS)}")
    out = {**REPORT_DEFAULTS, **value}
    for k, v in out.items():
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if k == "last_fraction" and not (number and 0 < v <= 1):
            raise _err(path, f"report.last_fraction must be a number in (0, 1], the share of the budget at its end, "
                             f"not {shown(v)}")
        if k == "horizon" and not (number and v >= 1):
            raise _err(path, f"report.horizon must be a number >= 1 (budgets), not {shown(v)}")
        if k == "min_points" and not (isinstance(v, int) and not isinstance(v, bool) and v >= 2):
            raise _err(path, f"report.min_points must be an integer >= 2 (validations), not {shown(v)}")
    return {"last_fraction": float(out["last_fraction"]), "horizon": float(out["horizon"]),
            "min_points": out["min_points"]}


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read and validate a sweep file; every problem is one UserError line naming the file and key."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"sweep file {str(path)!r} not found: give a YAML file such as sweeps/table3-cpu.yaml")
    try:
        tree = load_yaml(read_yaml_text(p, f"sweep file {shown(str(path))}"), f"sweep file {shown(str(path))}")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _err(path, f"not valid YAML{where}: fix the syntax") from None
    if not isinstance(tree, dict):
        raise _err(path, "must hold a mapping with name, experiment, metric, ... and variants or space")
    unknown = [k for k in tree if k not in TOP_KEYS]
    if unknown:
        raise _err(path, f"unknown key {shown(unknown[0])}: a sweep file has {', '.join(TOP_KEYS)}")
    name = tree.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _err(path, "name must be set to letters, digits, '.', '_' or '-' (it names the Optuna study)")
    exp = tree.get("experiment")
    if not isinstance(exp, str):
        raise _err(path, "experiment must name the base experiment YAML (relative to the sweep file)")
    experiment = (p.parent / exp).resolve()
    if not experiment.is_file():
        raise _err(path, f"experiment {shown(exp)} not found (looked for {experiment})")
    metric = tree.get("metric", "dev_loss")
    if not isinstance(metric, str) or metric not in METRICS:
        raise _err(path, f"metric {shown(metric)} is not one of {', '.join(METRICS)}")
    direction = tree.get("direction", METRICS[metric])
    if direction not in ("minimize", "maximize"):
        raise _err(path, f"direction {shown(direction)} must be minimize or maximize")
    if direction != METRICS[metric]:
        raise _err(path, f"direction {direction} does not fit metric {metric}: it is {METRICS[metric]}d")
    sampler = _plugin_spec(path, "sampler", tree.get("sampler"), SAMPLERS, "tpe")
    _check_plugin(path, "sampler", sampler, build_sampler)
    pruner = _plugin_spec(path, "pruner", tree.get("pruner"), PRUNERS, "none")
    _check_plugin(path, "pruner", pruner, build_pruner)
    seeds = tree.get("seeds", [1])
    seeds = [seeds] if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if not _seed_list(seeds):
        raise _err(path, "seeds must be a non-empty list of distinct integers (0 to 2**32 - 1), e.g. [1, 2, 3]")
    overrides = {k: _check_override(path, "overrides", k, v)
                 for k, v in _mapping(path, "overrides", tree.get("overrides")).items()}
    hb = tree.get("heartbeat") or {}
    if not isinstance(hb, dict) or set(hb) - set(HEARTBEAT_DEFAULTS):
        raise _err(path, f"heartbeat must be a mapping with {', '.join(HEARTBEAT_DEFAULTS)}")
    heartbeat = {**HEARTBEAT_DEFAULTS, **hb}
    for k, v in heartbeat.items():  # seconds (at most a day), and retries
        if not isinstance(v, int) or isinstance(v, bool) or not (0 if k == "max_retry" else 1) <= v <= 86400:
            raise _err(path, f"heartbeat.{k} must be a {'non-negative' if k == 'max_retry' else 'positive'} integer "
                             "(at most 86400)")
    if heartbeat["grace"] <= heartbeat["interval"]:
        raise _err(path, "heartbeat.grace must be longer than heartbeat.interval")
    has_v, has_s = "variants" in tree, "space" in tree
    if has_v == has_s:
        raise _err(path, "give either variants (named rows) or space (distributions), not both or neither")
    n_trials = tree.get("n_trials")
    if n_trials is not None and (not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 1):
        raise _err(path, "n_trials must be a positive integer")
    sweep = Sweep(p, name, experiment, metric, direction, sampler, pruner, seeds, overrides, heartbeat, n_trials)
    sweep.report = _check_report(path, tree.get("report"))
    if has_v:
        variants = tree["variants"]
        if not isinstance(variants, dict) or not variants:
            raise _err(path, "variants must be a non-empty mapping of name: {dotted.key: value}")
        sweep.variants = {}
        for vname, body in variants.items():
            if not isinstance(vname, str) or not NAME_RE.match(vname):
                raise _err(path, f"variant name {shown(vname)} must use letters, digits, '.', '_' or '-'")
            body = _mapping(path, f"variant {vname}", body)
            family = body.get("family", re.sub(r"\d+$", "", vname))
            if not isinstance(family, str) or not family:
                raise _err(path, f"variant {vname}: family must be a name such as A or norm")
            budget = body.get("budget", 1)
            if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 0 < budget <= 1000:
                raise _err(path, f"variant {vname}: budget must be a positive factor on train.max_steps (at most 1000)")
            vseeds = body.get("seeds")  # a row's own seeds (e.g. the base at 3 seeds for the noise), else the sweep's
            if vseeds is not None and not _seed_list(vseeds):
                raise _err(path, f"variant {vname}: seeds must be a non-empty list of distinct integers (0 to 2**32 - 1), "
                                 "e.g. [1, 2, 3]")
            ov = {k: _check_override(path, f"variant {vname}", k, v) for k, v in body.items() if k not in VARIANT_META}
            sweep.variants[vname] = {"family": family, "budget": float(budget), "overrides": ov, "seeds": vseeds}
    else:
        space = tree["space"]
        if not isinstance(space, dict) or not space:
            raise _err(path, "space must be a non-empty mapping of dotted.key: {type: ...}")
        sweep.space = {k: _check_distribution(path, k, v) for k, v in space.items()}
        if len(seeds) != 1:
            raise _err(path, "a space sweep takes one seed (each sampled point is one trial)")
        sweep.n_trials = n_trials or 20
    return sweep


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
