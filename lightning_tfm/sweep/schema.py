"""The sweep file's schema: a dataclass per section, with help beside each field, as the experiment config has.

:class:`SweepFile` (the top level) with :class:`SamplerSpec`, :class:`PrunerSpec`, :class:`HeartbeatSpec`,
:class:`ReportSpec`, :class:`BudgetSpec` (what every row gets the same of), :class:`VariantSpec` (each row of
``variants:``) and :class:`DistributionSpec` (each key of ``space:``). A field's annotation is its type,
``metadata["help"]`` its meaning, ``metadata["want"]`` and ``metadata["ok"]`` its range. :func:`parse` is the one
check of a section's values against them (the sweep file's loader, :func:`lightning_tfm.sweep.spec.load_sweep`,
calls it for each), and :func:`describe_keys` lists them (``ltfm sweep --keys``).
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from ..base.errors import UserError
from ..base.inputs import shown
from ..model.config import MAX_POSITIONS
from ..training.config.sections import LABEL_CHARS, STEPS
from ..training.runs.results import OBJECTIVES

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The summary.json keys a sweep may optimise, and the direction that is better (results.OBJECTIVES).
METRICS = {key: direction for key, (_, direction) in OBJECTIVES.items()}
# Keys a sweep sets itself: a sweep file or the command line may not.
RESERVED = ("run.seed", "run.id", "run.variant", "run.family", "run.study")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "gp": "GPSampler",
            "qmc": "QMCSampler"}
# Pruner names to classes: curve's is lightning_tfm.sweep.curve_pruner.CurvePruner, the others Optuna's (optuna.pruners)
PRUNERS = {"none": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
           "hyperband": "HyperbandPruner", "successive_halving": "SuccessiveHalvingPruner",
           "threshold": "ThresholdPruner", "curve": "CurvePruner"}
# The curve families the report's verdict can fit (lightning_tfm.sweep.curves.FAMILIES)
CURVE_FAMILIES = ("power", "saturating", "exponential")
# The most bootstrap draws of a family's fit: power refits all draws at once (linear least squares), the others
# refit each draw by nonlinear least squares (about 1 to 2 ms a draw, of every run, at every report or figure):
# their default 200 takes a minute, 100000 took 15 hours. (checked with the family: :func:`draws_problem`)
MAX_DRAWS = {"power": 20000, "saturating": 2000, "exponential": 2000}
MAX_SEEDS, MAX_TRIALS = 100, 10000  # a row's seeds, a space sweep's trials
SEEDS = f"a non-empty list of at most {MAX_SEEDS} distinct integers (0 to 2**32 - 1), e.g. [1, 2, 3]"
REQUIRED = "(required)"


def _is_seed(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 32


def _seed_list(v: Any) -> bool:
    """A non-empty list of distinct seeds (integers from 0 to 2**32 - 1, as Lightning's seeding takes them)."""
    return isinstance(v, list) and 0 < len(v) <= MAX_SEEDS and all(map(_is_seed, v)) and len(set(v)) == len(v)


def _f(default: Any, help: str, want: str | None = None, ok=None, factory=None, section: tuple | None = None):
    """A sweep-file field: its default (:data:`REQUIRED`: none), its meaning, and its range: ``ok`` a test of a
    value of the field's type, ``want`` what the error says the key must be. A ``section`` (a mapping of keys of
    its own) is (the class of its keys, where they sit: ``heartbeat.``, ``variants.<name>.``), checked by the
    class."""
    meta = {"help": help, "want": want, "ok": ok, "section": section}
    return field(default_factory=factory, metadata=meta) if factory else field(default=default, metadata=meta)


def _section(kind, head: str):
    """A field holding a section: its help is the section class's docstring."""
    doc = kind.__doc__.strip().rstrip(".")
    return _f(None, doc[0].lower() + doc[1:], factory=kind, section=(kind, head))


# A section with ``EXTRA`` (its other keys' placeholder, type and meaning) passes them on instead of refusing them.
@dataclass
class ConfigKeys:
    """Dotted config keys (``overrides:``), the experiment's values for every trial."""
    EXTRA = ("<section.key>", "the key's type", "any config key (ltfm config --keys): its value in every trial")


@dataclass
class SamplerSpec:
    """The Optuna sampler of a space sweep: a name, or a mapping with type and the class's arguments."""
    type: Literal[tuple(SAMPLERS)] = _f("tpe", "tpe (TPESampler), random, cmaes, gp or qmc")
    seed: int | None = _f(None, "seed of the search: each trial's random state is drawn from it and the trial "
                                "number (workers propose different points, one worker repeats itself)",
                          "an integer from 0 to 2**32 - 1", _is_seed)
    EXTRA = ("<argument>", "any", "any argument of the Optuna sampler class, e.g. n_startup_trials: 8 (checked by "
                                  "building it)")


@dataclass
class PrunerSpec:
    """The Optuna pruner trials report their dev metric to: a name, or a mapping with type and arguments."""
    type: Literal[tuple(PRUNERS)] = _f("none", "none, median, percentile, hyperband, successive_halving, threshold "
                                               "or curve (stops a trial only when its learning curve, extrapolated "
                                               "to its final step, ends worse than the best completed trial with "
                                               "confidence: lightning_tfm.sweep.curve_pruner.CurvePruner)")
    # The curve pruner's arguments (given to another type, its class refuses them)
    min_points: int = _f(3, "curve: reports after the warmup the fit needs before a trial can be pruned (and one "
                            "more than the family's parameters)", "an integer >= 3 (reports; at most 100000)",
                         lambda v: 3 <= v <= 100000)
    warmup: int | None = _f(None, "curve: reports up to this update are left out of the fit (null: the trial's "
                                  "train.warmup)", f"null or an integer from 0 to {STEPS} (updates)",
                          lambda v: 0 <= v <= STEPS)
    final_step: int | None = _f(None, "curve: the update the trial's final value is predicted at (null: the trial's "
                                      "train.max_steps)", f"null or an integer from 1 to {STEPS} (updates)",
                              lambda v: 1 <= v <= STEPS)
    level: float = _f(0.9, "curve: central share of the bootstrap draws of the predicted final value; pruned when "
                           "its optimistic end is still worse than the best", "a number in (0, 1)",
                      lambda v: 0 < v < 1)
    bootstraps: int = _f(200, "curve: residual-bootstrap draws of the predicted final value at each report (at most "
                              "20000 for power, 2000 for the other families)", "an integer from 20 to 20000",
                         lambda v: 20 <= v <= max(MAX_DRAWS.values()))
    seed: int = _f(0, "curve: seed of the bootstrap (with the trial number: the same reports, the same call)",
                   "an integer from 0 to 2**32 - 1", _is_seed)
    family: Literal[CURVE_FAMILIES] = _f("power", "curve: the curve fitted to the reports (as report.family)")
    EXTRA = ("<argument>", "any", "any argument of the Optuna pruner class, e.g. min_resource: 500 (checked by "
                                  "building it)")


@dataclass
class HeartbeatSpec:
    """How a trial whose worker died is found and queued again (seconds, retries)."""
    interval: int = _f(30, "seconds between a running trial's heartbeats in the storage",
                       "a positive integer (at most 86400)", lambda v: 1 <= v <= 86400)
    grace: int = _f(120, "seconds without a heartbeat after which a live worker fails the trial and queues its "
                         "retry (longer than interval)", "a positive integer (at most 86400)",
                    lambda v: 1 <= v <= 86400)
    max_retry: int = _f(3, "retries of a trial stopped without keeping work (a killed worker, the out-of-memory "
                           "killer, a full disk)", "a non-negative integer (at most 86400)", lambda v: 0 <= v <= 86400)


@dataclass
class ReportSpec:
    """The settings of the report's verdict (the rule: lightning_tfm.report.table3.verdict; the fit: sweep.curves)."""
    k: float = _f(3.0, "the budget multiple the verdict predicts at: a row holds when its predicted gap to the base "
                       "at k x the budget keeps today's sign", "a number >= 1 (budgets; at most 1000)",
                  lambda v: 1 <= v <= 1000)
    min_points: int = _f(3, "validations after the warmup a run's curve fit needs at least (and one more than the "
                            "family's parameters)", "an integer >= 3 (validations; at most 100000)",
                         lambda v: 3 <= v <= 100000)
    level: float = _f(0.8, "the central share of the predicted gap's interval (its size at k x; 80%: the level "
                            "the back-tests support, sweep.curves.EXTRAPOLATION_LEVEL)",
                      "a number in (0, 1)", lambda v: 0 < v < 1)
    bootstraps: int = _f(200, "bootstrap draws of the predicted gap (residual bootstrap of each run's fit, the "
                              "base's seeds resampled; at most 20000 for power, 2000 for the other families)",
                         "an integer from 20 to 20000", lambda v: 20 <= v <= max(MAX_DRAWS.values()))
    seed: int = _f(0, "seed of the bootstrap: the same seed, the same intervals", "an integer from 0 to 2**32 - 1",
                   _is_seed)
    family: Literal[CURVE_FAMILIES] = _f("power", "the curve fitted to each run's dev log-PPL: power (A t^-alpha, "
                                                  "the back-tested best at short budgets), saturating (L_inf + A "
                                                  "t^-alpha) or exponential (L_inf + A exp(-t/tau)); these two need 4 "
                                                  "points and refit by least squares at every draw (slower)")


@dataclass
class VariantSpec:
    """One row of ``variants:`` (name: mapping): its dotted config overrides and these keys of its own."""
    family: str | None = _f(None, "the row's family in the table (default: its name less trailing digits, A1 -> A)",
                            f"a name such as A or norm (one line, at most {LABEL_CHARS} characters)",
                            lambda v: 0 < len(v) <= LABEL_CHARS and v.isprintable())
    budget: float = _f(1.0, "factor on train.max_steps for this row (the paper's big: 3)",
                       "a positive factor on train.max_steps (at most 1000)", lambda v: 0 < v <= 1000)
    seeds: list[int] | None = _f(None, "the row's own seeds (default: the sweep's): the base at [1, 2, 3] measures "
                                       "the seed noise", SEEDS, _seed_list)
    experiment: str | None = _f(None, "the row's own experiment YAML, relative to the sweep file (default: the "
                                      "sweep's): a row of another architecture (model.arch), on the same data",
                                "an experiment YAML (relative to the sweep file)", bool)
    EXTRA = ("<section.key>", "the key's type", "any config key (ltfm config --keys): the row's value of it")


EQUAL = ("steps", "flops")
# A mean sentence length FLOPs are counted at: a sentence has a piece at least (a tiny one made a row's FLOPs per
# step round to nothing and its steps infinite)
LENGTH = f"a number of tokens from 1 to {MAX_POSITIONS}"


@dataclass
class BudgetSpec:
    """What every row of a variants sweep gets the same of: optimizer steps, or training FLOPs."""
    equal: Literal[EQUAL] = _f("steps", "steps: every row trains train.max_steps (times its budget factor); flops: "
                                        "a row trains the sweep experiment's train.max_steps x its FLOPs per step "
                                        "over the row's (model.arch's train_flops_per_token x target tokens a step), "
                                        "times its budget factor")
    src_len: float | None = _f(None, "flops: the mean source sentence length (tokens) FLOPs are counted at "
                                     "(default: ltfm bench's, the report's default)",
                               LENGTH, lambda v: 1 <= v <= MAX_POSITIONS)
    tgt_len: float | None = _f(None, "flops: the mean target sentence length (tokens) FLOPs are counted at "
                                     "(default: ltfm bench's, the report's default)",
                               LENGTH, lambda v: 1 <= v <= MAX_POSITIONS)


@dataclass
class DistributionSpec:
    """One key of ``space:`` (dotted.key: mapping): the Optuna distribution it is sampled from."""
    type: Literal["categorical", "int", "float"] = _f(REQUIRED, "categorical (choices) or an int or float range "
                                                                "(low, high, step, log) of the key's type")
    choices: list | None = _f(None, "categorical: the values, each once, plain values of the key's type")
    low: float | None = _f(None, "int/float: the lowest value (a float: any finite number, 1e-5 too)")
    high: float | None = _f(None, "int/float: the highest value, above low")
    step: float | None = _f(None, "int/float: the grid's step, dividing high - low (not with log)")
    log: bool = _f(False, "int/float: sample on a log scale (low > 0, no step)")


@dataclass
class SweepFile:
    """A sweep file's top level (YAML, in sweeps/): a study, its base experiment, and its rows or its space."""
    name: str = _f(REQUIRED, "the Optuna study's name, and the report's",
                   f"set to at most {LABEL_CHARS} letters, digits, '.', '_' or '-' (it names the Optuna study, the "
                   "report's folder and every trial's run folder)",
                   lambda v: NAME_RE.match(v) and len(v) <= LABEL_CHARS)
    description: str | None = _f(None, "what the sweep is for, in a line (for its reader; nothing reads it)")
    experiment: str = _f(REQUIRED, "the base experiment YAML, relative to the sweep file",
                         "the base experiment YAML (relative to the sweep file)")
    metric: Literal[tuple(METRICS)] = _f("dev_loss", "the summary.json key the study optimises")
    direction: Literal["minimize", "maximize"] | None = _f(None, "minimize or maximize; default the metric's "
                                                                 "(minimize for loss and PPL, maximize for BLEU)")
    sampler: SamplerSpec = _section(SamplerSpec, "sampler.")
    pruner: PrunerSpec = _section(PrunerSpec, "pruner.")
    seeds: list[int] = _f(None, "run.seed of the trials: every row at each (a space sweep: one)", SEEDS, _seed_list,
                          factory=lambda: [1])
    overrides: dict = _f(None, "dotted config keys applied to every trial's experiment (ltfm config --keys)",
                         factory=dict, section=(ConfigKeys, "overrides."))
    heartbeat: HeartbeatSpec = _section(HeartbeatSpec, "heartbeat.")
    n_trials: int | None = _f(None, "space sweeps: trials in the whole study (default 20)",
                              f"a positive integer, at most {MAX_TRIALS}", lambda v: 1 <= v <= MAX_TRIALS)
    variants: dict[str, VariantSpec] | None = _f(None, "EITHER named rows ([A-Za-z0-9._-]): one trial per variant "
                                                       "and seed", section=(VariantSpec, "variants.<name>."))
    space: dict[str, DistributionSpec] | None = _f(None, "OR Optuna distributions over dotted config keys",
                                                        section=(DistributionSpec, "space.<section.key>."))
    report: ReportSpec = _section(ReportSpec, "report.")
    budget: BudgetSpec = _section(BudgetSpec, "budget.")


TOP_KEYS = tuple(f.name for f in dataclasses.fields(SweepFile))
HEARTBEAT_DEFAULTS = dataclasses.asdict(HeartbeatSpec())
REPORT_DEFAULTS = dataclasses.asdict(ReportSpec())  # the report's verdict settings when a file sets none
BUDGET_DEFAULTS = dataclasses.asdict(BudgetSpec())  # equal steps: a file without budget: trains as it always did


def draws_problem(section: str, spec: dict) -> str | None:
    """What is wrong with a section's (``report``, ``pruner``) bootstraps for its family: None, or the line."""
    family, n = spec.get("family", "power"), spec.get("bootstraps", 200)
    if family in MAX_DRAWS and n > MAX_DRAWS[family]:
        return (f"{section}.bootstraps {n} with family {family} must be an integer from 20 to {MAX_DRAWS[family]} "
                f"(each draw refits the curve: ~1-2 ms a draw of every run); power takes up to {MAX_DRAWS['power']}")
    return None


def err(path, msg: str) -> UserError:
    return UserError(f"sweep file {str(path)!r}: {msg}")


def _kind(hint) -> str:
    """A field's type as ``ltfm sweep --keys`` shows it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return _kind(next(a for a in args if a is not type(None))) + " or null"
    if origin is list:
        return f"list of {_kind(args[0])}" if args else "list"
    if origin is dict or hint is dict or dataclasses.is_dataclass(hint):
        return "mapping"
    return hint.__name__


def _typed(v: Any, hint) -> tuple[bool, Any]:
    """Whether ``v`` is of the annotation's type, and ``v`` as that type: an int is a float too, and so is a
    number that YAML 1.1 reads as text (1e-5)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return (True, None) if v is None else _typed(v, next(a for a in args if a is not type(None)))
    if origin is Literal:
        return v in args, v
    if origin is list:
        return isinstance(v, list) and all(_typed(x, args[0])[0] for x in v), v
    if hint is float:
        with_text = v
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                return False, with_text
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return ok, float(v) if ok else with_text
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    return isinstance(v, origin or hint), v


def _want(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return _want(next(a for a in args if a is not type(None))) + " or null"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}.get(hint, _kind(hint))


def parse(path, cls, value: Any, label: str, prefix: str, shape: str | None = None) -> tuple[dict, dict]:
    """The one validation of a section: ``value`` (a mapping; None: every default) against ``cls``'s fields.
    Returns the checked values of the keys given and the keys that are no field (kept for a class with ``EXTRA``:
    config keys, a class's arguments; else an error). Sub-sections (``section`` fields) are left to the caller."""
    fields = dataclasses.fields(cls)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise err(path, f"{label} must be {shape or 'a mapping with ' + ', '.join(f.name for f in fields)}")
    names = {f.name for f in fields}
    rest = {k: v for k, v in value.items() if k not in names}
    if rest and not hasattr(cls, "EXTRA"):
        where = f"{label}: " if prefix else ""
        raise err(path, f"{where}unknown key {shown(next(iter(rest)))}: {label} {'has' if not prefix else 'takes'} "
                         f"{', '.join(f.name for f in fields)}")
    hints = typing.get_type_hints(cls)
    known = {}
    for f in fields:
        if f.metadata.get("section") or (f.name not in value and f.default is not REQUIRED):
            continue
        ok, v = _typed(value.get(f.name), hints[f.name])
        if ok and v is not None and f.metadata["ok"] is not None:
            ok = bool(f.metadata["ok"](v))
        if not ok:
            raise err(path, f"{prefix}{f.name} must be {f.metadata['want'] or _want(hints[f.name])}, not {shown(v)}")
        known[f.name] = v
    return known, rest


def _default(f: dataclasses.Field) -> str:
    v = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if dataclasses.is_dataclass(v):
        return "-"
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def describe_keys(prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every key a sweep file may hold, as (key, type, default, help), those starting with ``prefix``: ``ltfm sweep
    --keys``, read off the schema :func:`load_sweep` checks against (so it cannot fall out of date)."""
    rows: list[tuple[str, str, str, str]] = []

    def add(cls, head: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            rows.append((head + f.name, _kind(hints[f.name]), _default(f), f.metadata["help"]))
            if f.metadata["section"]:
                add(*f.metadata["section"])
        if hasattr(cls, "EXTRA"):
            placeholder, kind, help = cls.EXTRA
            rows.append((head + placeholder, kind, "-", help))

    add(SweepFile, "")
    rows = [r for r in rows if r[0].startswith(prefix)]
    if not rows:
        raise UserError(f"no sweep-file key starts with {prefix!r}: the top-level keys are {', '.join(TOP_KEYS)}")
    return rows
