"""The sweep file: its loading and one validation (:func:`load_sweep`), its rows (:class:`Entry`) and its
search space.

The schema it is checked against is :mod:`.schema` (a dataclass per section, help beside each field:
``ltfm sweep --keys``); the loaded :class:`Sweep` keeps each section as the plain dict that Optuna's attributes
and the reports hold, and reads each experiment once for every trial's config (:meth:`Sweep.experiment_tree`): the
sweep's, and a row's own (``variants.<name>.experiment``, a row of another architecture).

Everything here reads the file alone: no storage, no training. The sampler and pruner specs are turned into
Optuna objects here too (:func:`build_sampler`, :func:`build_pruner`), because checking a file means building
them; the space spec is decoded in one place (:func:`distributions`), which the worker's sampling
(:func:`suggest`), the dry run and the search report share.
"""
from __future__ import annotations

import copy
import dataclasses
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

from ..base.errors import UserError
from ..base.inputs import load_yaml, read_yaml_text, shown
from ..base.knobs import path_check
from ..training.config import config
from ..training.config.sections import LABEL_CHARS
from .schema import (
    BUDGET_DEFAULTS,
    METRICS,
    NAME_RE,
    PRUNERS,
    REPORT_DEFAULTS,
    RESERVED,
    SAMPLERS,
    SETTLE_DEFAULTS,
    BudgetSpec,
    DistributionSpec,
    HeartbeatSpec,
    PrunerSpec,
    ReportSpec,
    SamplerSpec,
    SettleSpec,
    SweepFile,
    VariantSpec,
    draws_problem,
    err,
    parse,
)


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
    """A checked sweep file, each section as a plain dict (what Optuna's attributes and the reports hold)."""
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
    variants: dict[str, dict] | None = None    # name -> {"family", "budget", "overrides", "seeds", "experiment"}
    space: dict[str, dict] | None = None       # dotted key -> distribution spec
    report: dict = field(default_factory=lambda: dict(REPORT_DEFAULTS))  # the report's verdict settings
    budget: dict = field(default_factory=lambda: dict(BUDGET_DEFAULTS))  # equal steps or FLOPs (BudgetSpec)
    settle: dict = field(default_factory=lambda: dict(SETTLE_DEFAULTS))  # --settle's settings and caps (SettleSpec)
    settles: bool = False  # the file has a settle: section (--status shows each row's answer)
    _trees: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def mode(self) -> str:
        return "variants" if self.variants is not None else "space"

    def entries(self) -> list[Entry]:
        assert self.variants is not None
        return [Entry(name, v["family"], seed, v["overrides"], v["budget"])
                for name, v in self.variants.items() for seed in (v.get("seeds") or self.seeds)]

    def experiment_of(self, name: str | None) -> Path:
        """The experiment YAML row ``name`` is built from: its own (``variants.<name>.experiment``), else the
        sweep's (a search point's too)."""
        own = ((self.variants or {}).get(name) or {}).get("experiment") if name is not None else None
        return own or self.experiment

    def experiment_tree(self, path: Path | None = None) -> dict:
        """An experiment's YAML (the sweep's, or a row's own ``path``), read once per sweep: every trial's config
        is derived from it (a copy each time, so that no config shares a list with another)."""
        path = path or self.experiment
        if path not in self._trees:
            self._trees[path] = config.read_yaml(path)
        return copy.deepcopy(self._trees[path])


def _check_override(path, where: str, key: str, value: Any) -> Any:
    """A dotted key of the config schema with a value of its type (cross-key checks come per trial)."""
    if not isinstance(key, str) or "." not in key:
        raise err(path, f"{where}: {shown(key)} is not a dotted config key such as model.heads")
    if key in RESERVED or key.startswith("sweep."):
        raise err(path, f"{where}: {key} is set by ltfm sweep (use seeds: for run.seed)")
    try:
        scratch = config.Config()
        config.set_dotted(scratch, key, value)
        # model.max_positions: 10**20 is refused here, not per trial
        config.check_value(key, config.get_dotted(scratch, key))
    except UserError as e:
        raise err(path, f"{where}: {e}") from None
    return config.get_dotted(scratch, key)


def _mapping(path, where: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise err(path, f"{where} must be a mapping of dotted.key: value")
    return value


def _plugin_spec(path, what: str, value: Any, cls) -> dict:
    """``sampler:`` or ``pruner:`` (a name, or a mapping with type and the class's arguments) as a dict, the type
    in lower case; the arguments are checked by building the Optuna object (:func:`_check_plugin`)."""
    table = SAMPLERS if cls is SamplerSpec else PRUNERS
    value = {"type": value} if isinstance(value, str) else ({} if value is None else value)
    if not isinstance(value, dict) or not isinstance(value.get("type", ""), str):
        raise err(path, f"{what} must be a name or a mapping with type: one of {', '.join(table)}")
    spec = {**value, "type": value.get("type", cls.type).lower()}
    for k, v in spec.items():  # Optuna takes NaN and infinity silently (a NaN threshold never prunes)
        if isinstance(v, float) and not math.isfinite(v):
            raise err(path, f"{what} {spec['type']}: {k}={v} is not a finite number")
    parse(path, cls, spec, what, f"{what} ")
    return spec


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
    kind = spec.pop("type")
    if kind == "curve":  # ours: a trial stopped when its extrapolated curve is worse with confidence
        from .curve_pruner import CurvePruner
        return CurvePruner(**spec)
    cls = getattr(optuna.pruners, PRUNERS[kind])
    return cls(**spec)


def _check_plugin(path, what: str, spec: dict, builder) -> None:
    """``sampler:`` or ``pruner:`` checked by building it and using it on a throwaway study in memory
    (:func:`_exercise`): Optuna checks many arguments only when it samples or prunes (TPE's gamma, n_ei_candidates;
    Hyperband's resources), which would otherwise fail the first trial with a traceback. One line naming the
    arguments given, else nothing."""
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    stage = "built"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            builder(spec)
            stage = "used"
            _exercise(what, spec, builder)
    except ImportError as e:
        raise err(path, f"{what} {spec['type']}: it needs the package {e.name or str(e)} (pip install "
                        f"{e.name or '...'}), or choose another {what}") from None
    except Exception as e:  # noqa: BLE001 - whatever the class raises on the arguments given is theirs
        why = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        args = ", ".join(f"{k}={shown(v)}" for k, v in spec.items() if k != "type") or "its defaults"
        cls = (SAMPLERS if what == "sampler" else PRUNERS)[spec["type"]]
        raise err(path, f"{what} {spec['type']}: {why} ({e.__class__.__name__} when {stage}, with {args}): fix "
                        f"the arguments ({'optuna.samplers' if what == 'sampler' else 'optuna.pruners'}.{cls})"
                  ) from None
    finally:
        optuna.logging.set_verbosity(level)


def _exercise(what: str, spec: dict, builder) -> None:
    """Build ``spec`` and use it as a sweep does: a sampler draws a float, an int and a categorical parameter past
    its startup trials (lowered to 2 here, so that its model is used); a pruner judges trials reporting at each
    step. Raises what the class raises."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {"f": FloatDistribution(1e-3, 1.0, log=True), "i": IntDistribution(1, 8),
             "c": CategoricalDistribution(["a", "b"])}
    if what == "pruner":
        pruner = builder(spec)
        if spec["type"] in ("none", "curve"):  # curve: ours, its arguments are the schema's (PrunerSpec)
            return
        study = optuna.create_study(pruner=pruner)
        for k in range(4):
            trial = study.ask(space)
            for step in range(1, 5):
                trial.report(float(k) + 1.0 / step, step)
                trial.should_prune()
            study.tell(trial, float(k))
        return
    import inspect

    startup = spec.get("n_startup_trials", 3)
    takes = "n_startup_trials" in inspect.signature(getattr(optuna.samplers, SAMPLERS[spec["type"]])).parameters
    lowered = {**spec, "n_startup_trials": 2} if takes and isinstance(startup, int) and not isinstance(startup, bool) \
        and startup > 2 else spec
    study = optuna.create_study(sampler=builder(lowered))
    for k in range(4):
        study.add_trial(optuna.trial.create_trial(params={"f": 0.01 * (k + 1), "i": k + 1, "c": "ab"[k % 2]},
                                                  distributions=space, value=float(k % 3)))
    for _ in range(2):
        study.tell(trial := study.ask(space), 1.0)
        del trial


def _number(path, where: str, name: str, v: Any, integer: bool) -> int | float:
    """A bound or step of an int or float distribution: an integer (int), or a finite number (float; a string
    such as 1e-5, which YAML 1.1 reads as text, counts as one)."""
    if isinstance(v, str) and not integer:
        try:
            v = float(v)
        except ValueError:
            pass
    if integer and (not isinstance(v, int) or isinstance(v, bool)):
        raise err(path, f"{where}: {name} must be an integer, not {shown(v)}")
    if not integer and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
        raise err(path, f"{where}: {name} must be a finite number, not {shown(v)}")
    return v


MAX_GRID = 10 ** 9  # the most values a stepped range of ``space:`` holds


def _check_distribution(path, key: str, spec: Any) -> dict:
    """One entry of ``space:``, checked whole (the type fits the key; low < high; log needs low > 0 and no step;
    step positive and dividing high - low; choices distinct plain values of the key's type), so that Optuna
    never refuses it later."""
    if not isinstance(key, str) or "." not in key:
        raise err(path, f"space: {shown(key)} is not a dotted config key such as model.heads")
    where = f"space {key}"
    if key in RESERVED or key.startswith("sweep."):
        raise err(path, f"{where}: {key} is set by ltfm sweep")
    if not isinstance(spec, dict) or spec.get("type") not in ("categorical", "int", "float"):
        raise err(path, f"{where} must be a mapping with type: categorical | int | float")
    spec = dict(spec)
    kind = spec["type"]
    fields = {f.name for f in dataclasses.fields(DistributionSpec)}  # a range takes all but choices
    allowed = {"type", "choices"} if kind == "categorical" else fields - {"choices"}
    unknown = sorted(map(str, set(spec) - allowed))
    if unknown:
        raise err(path, f"{where}: unknown field {shown(unknown[0])}: a {kind} takes {', '.join(sorted(allowed))}")
    sec, _, name = key.partition(".")
    if name not in config.SCHEMA.get(sec, {}):
        _check_override(path, where, key, None)  # an unknown key: its one line
    base = config.SCHEMA[sec][name][0]
    base = base[1] if isinstance(base, tuple) and base[0] == config.OPT else base
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise err(path, f"{where}: choices must be a non-empty list")
        odd = [c for c in choices if c is not None and not isinstance(c, (bool, int, float, str))]
        if odd:
            raise err(path, f"{where}: choice {shown(odd[0])} is not a plain value (number, string, bool, null)")
        spec["choices"] = [_check_override(path, where, key, c) for c in choices]
        if len(set(map(repr, spec["choices"]))) != len(spec["choices"]):
            raise err(path, f"{where}: choices repeat a value: list each once")
        return spec
    if base not in (int, float) or (kind == "float" and base is int):
        want = "type: int or categorical" if base is int else "type: categorical with choices"
        kind_text = "an int" if kind == "int" else "a float"
        raise err(path, f"{where}: {key} takes {config.describe(base)} values, not {kind_text} range: use {want}")
    integer = kind == "int"
    for bound in ("low", "high"):
        if bound not in spec:
            raise err(path, f"{where}: {bound} is missing")
        spec[bound] = _number(path, where, bound, spec[bound], integer)
        _check_override(path, where, key, spec[bound])
    low, high = spec["low"], spec["high"]
    if low >= high:
        raise err(path, f"{where}: low {low} must be below high {high} (one value: set it in overrides)")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise err(path, f"{where}: log must be true or false, not {shown(log)}")
    if log and low <= 0:
        raise err(path, f"{where}: log: true needs low > 0, not {low}: raise low or drop log")
    step = spec.get("step")
    if step is not None:
        step = spec["step"] = _number(path, where, "step", step, integer)
        if step <= 0:
            raise err(path, f"{where}: step must be positive, not {step}")
        if log and (kind == "float" or step != 1):
            raise err(path, f"{where}: a log range takes no step: drop step or log")
        if (high - low) / step > MAX_GRID:  # also what Decimal's remainder below cannot take
            raise err(path, f"{where}: step {step} makes more than {MAX_GRID:.0e} values from {low} to {high}: raise "
                            "step, or drop it for a continuous range")
        from decimal import Decimal
        if (Decimal(str(high)) - Decimal(str(low))) % Decimal(str(step)):
            raise err(path, f"{where}: high - low ({high} - {low}) is not a multiple of step {step}: "
                             "adjust high or step")
    return spec


def _experiment_file(path, where: str, given: str) -> Path:
    """The experiment YAML a sweep file names (``where``: the row's prefix, "" for the sweep's), relative to the sweep
    file, as an absolute path; one line when it is no file (or no path at all: a NUL, a name over 255 bytes)."""
    if (why := path_check("experiment", given)) is not None:
        raise err(path, f"{where}{why}")
    experiment = (Path(path).parent / given).absolute()
    try:
        experiment, found = experiment.resolve(), experiment.resolve().is_file()
    except OSError:
        found = False
    if not found:
        raise err(path, f"{where}experiment {shown(given)} not found (looked for {experiment})")
    return experiment


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read and validate a sweep file against its schema (:class:`SweepFile` and its sections); every problem is
    one UserError line naming the file and key."""
    p = Path(path)
    if not config.is_file(p):
        raise UserError(f"sweep file {str(path)!r} not found: give a YAML file such as sweeps/table3-cpu.yaml")
    try:
        tree = load_yaml(read_yaml_text(p, f"sweep file {shown(str(path))}"), f"sweep file {shown(str(path))}")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise err(path, f"not valid YAML{where}: fix the syntax") from None
    if isinstance(tree, dict) and isinstance(tree.get("seeds"), int) and not isinstance(tree["seeds"], bool):
        tree = {**tree, "seeds": [tree["seeds"]]}  # one seed
    top, _ = parse(path, SweepFile, tree, "a sweep file", "",
                   "a mapping with name, experiment, metric, ... and variants or space")
    experiment = _experiment_file(path, "", top["experiment"])
    metric = top.get("metric", SweepFile.metric)
    direction = top.get("direction") or METRICS[metric]
    if direction != METRICS[metric]:
        raise err(path, f"direction {direction} does not fit metric {metric}: it is {METRICS[metric]}d")
    sampler = _plugin_spec(path, "sampler", tree.get("sampler"), SamplerSpec)
    _check_plugin(path, "sampler", sampler, build_sampler)
    pruner = _plugin_spec(path, "pruner", tree.get("pruner"), PrunerSpec)
    _check_plugin(path, "pruner", pruner, build_pruner)
    seeds = top.get("seeds") or SweepFile().seeds
    overrides = {k: _check_override(path, "overrides", k, v)
                 for k, v in _mapping(path, "overrides", tree.get("overrides")).items()}
    heartbeat = HeartbeatSpec(**parse(path, HeartbeatSpec, tree.get("heartbeat"), "heartbeat", "heartbeat.")[0])
    if heartbeat.grace <= heartbeat.interval:
        raise err(path, "heartbeat.grace must be longer than heartbeat.interval")
    has_v, has_s = "variants" in tree, "space" in tree
    if has_v == has_s:
        raise err(path, "give either variants (named rows) or space (distributions), not both or neither")
    report = ReportSpec(**parse(path, ReportSpec, tree.get("report"), "report", "report.")[0])
    for section, spec in (("report", dataclasses.asdict(report)), ("pruner", pruner)):
        if (why := draws_problem(section, spec)) is not None:
            raise err(path, why)
    budget = BudgetSpec(**parse(path, BudgetSpec, tree.get("budget"), "budget", "budget.")[0])
    settle = SettleSpec(**parse(path, SettleSpec, tree.get("settle"), "settle", "settle.")[0])
    sweep = Sweep(p, top["name"], experiment, metric, direction, sampler, pruner, seeds, overrides,
                  dataclasses.asdict(heartbeat), top.get("n_trials"), report=dataclasses.asdict(report),
                  budget=dataclasses.asdict(budget), settle=dataclasses.asdict(settle), settles="settle" in tree)
    if has_v:
        variants = tree["variants"]
        if not isinstance(variants, dict) or not variants:
            raise err(path, "variants must be a non-empty mapping of name: {dotted.key: value}")
        sweep.variants = {vname: _variant(path, vname, body, budget.equal) for vname, body in variants.items()}
    else:
        if "settle" in tree:
            raise err(path, "settle: is for variants sweeps (it settles each row against the base): drop it")
        if budget.equal != "steps":
            raise err(path, f"budget.equal: {budget.equal} is for variants sweeps (a space sweep's points train "
                            "train.max_steps each): drop it")
        space = tree["space"]
        if not isinstance(space, dict) or not space:
            raise err(path, "space must be a non-empty mapping of dotted.key: {type: ...}")
        sweep.space = {k: _check_distribution(path, k, v) for k, v in space.items()}
        if len(seeds) != 1:
            raise err(path, "a space sweep takes one seed (each sampled point is one trial)")
        sweep.n_trials = sweep.n_trials or 20
    return sweep


def with_settle(sweep: Sweep, given: dict) -> Sweep:
    """``sweep`` with the command line's ``settle.KEY=VALUE`` (``given``: {KEY: value as YAML reads it}) over its
    file's ``settle:`` section, checked as the file's are (one line naming the key, exit 2)."""
    if not given:
        return sweep
    if sweep.mode != "variants":
        raise err(sweep.path, "settle.* is for variants sweeps (it settles each row against the base): drop it")
    settle = SettleSpec(**{**sweep.settle, **parse(sweep.path, SettleSpec, given, "settle", "settle.")[0]})
    return dataclasses.replace(sweep, settle=dataclasses.asdict(settle), settles=True)


def _variant(path, vname: Any, body: Any, equal: str = "steps") -> dict:
    """One row of ``variants:`` (:class:`VariantSpec` and its dotted config keys) as the dict a :class:`Sweep` holds;
    its own experiment (if it names one) as an absolute path, relative to the sweep file as the sweep's is."""
    if not isinstance(vname, str) or not NAME_RE.match(vname) or len(vname) > LABEL_CHARS:
        # at most LABEL_CHARS: the report's row label; with the sweep's name (as long at most), a trial's run id
        # <study>-<variant>-s<seed>-<hash> and its log file trial-<number>-<variant>-s<seed>.log stay far below
        # the 255 bytes of a file name
        raise err(path, f"variant name {shown(vname)} must be at most {LABEL_CHARS} letters, digits, '.', '_' or '-'")
    where = f"variant {vname}"
    known, rest = parse(path, VariantSpec, body, where, f"{where}: ", "a mapping of dotted.key: value")
    family = known.get("family") or re.sub(r"\d+$", "", vname)
    if not family:
        raise err(path, f"{where}: family must be a name such as A or norm")
    experiment = None
    if known.get("experiment") is not None:
        experiment = _experiment_file(path, f"{where}: ", known["experiment"])
    if equal == "flops" and "train.max_steps" in rest:
        raise err(path, f"{where}: train.max_steps is set by budget.equal: flops (the sweep experiment's steps x "
                        "its FLOPs per step over the row's): drop it, or give the row a budget factor")
    # a row's own seeds (e.g. the base at 3 seeds for the noise), else the sweep's
    return {"family": family, "budget": known.get("budget", VariantSpec.budget),
            "overrides": {k: _check_override(path, where, k, v) for k, v in rest.items()}, "seeds": known.get("seeds"),
            "experiment": experiment}


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
