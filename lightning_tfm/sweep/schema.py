"""The sweep file's schema: a dataclass per section, with help beside each field, as the experiment config has.

:class:`SweepFile` (the top level) with :class:`SamplerSpec`, :class:`PrunerSpec`, :class:`HeartbeatSpec`,
:class:`ReportSpec`, :class:`SettleSpec` (``ltfm sweep --settle``'s settings and caps; both from
:mod:`lightning_tfm.findings.settings`), :class:`BudgetSpec` (what every row gets the same of), :class:`VariantSpec`
(each row of ``variants:``) and :class:`DistributionSpec` (each key of ``space:``). Each field is a
:func:`~lightning_tfm.base.knobs.knob`, as a run config's key is: its annotation is its type, ``metadata["help"]``
its meaning and ``metadata["check"]`` its range (a :class:`~lightning_tfm.base.knobs.Range` for a number, else a
check of the same signature); a field holding keys of its own says where (``metadata["section"]``). :func:`parse`
is the one check of a section's values against them (the sweep file's loader,
:func:`lightning_tfm.sweep.spec.load_sweep`, calls it for each), and :func:`describe_keys` lists them (``ltfm sweep
--keys``, with :func:`~lightning_tfm.base.knobs.key_rows`, as ``ltfm config --keys`` lists a run config's).
"""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

from ..base.errors import UserError
from ..base.inputs import shown
from ..base.knobs import Check, Range, Unfit, coerce, describe, key_rows, knob, type_spec
from ..findings.settings import (  # noqa: F401
    CURVE_FAMILIES,
    DRAWS,
    MAX_DRAWS,
    REPORT_DEFAULTS,
    SEED,
    SETTLE_DEFAULTS,
    SHARE,
    ReportSpec,
    SettleSpec,
)
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
MAX_SEEDS, MAX_TRIALS = 100, 10000  # a row's seeds, a space sweep's trials
SEEDS = f"a non-empty list of at most {MAX_SEEDS} distinct integers (0 to 2**32 - 1), e.g. [1, 2, 3]"
REQUIRED = "(required)"
# The ranges of the numbers several fields take (each field's own: beside it)
DAY = 86400  # seconds: the most a heartbeat's interval, grace or retries take


def _is_seed(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and SEED.lo <= v <= SEED.hi


def seeds_check(key: str, v: Any) -> str | None:
    """A non-empty list of distinct seeds (integers from 0 to 2**32 - 1, as Lightning's seeding takes them)."""
    if isinstance(v, list) and 0 < len(v) <= MAX_SEEDS and all(map(_is_seed, v)) and len(set(v)) == len(v):
        return None
    return f"{key} must be {SEEDS}, not {shown(v)}"


def text_check(words: str, test: typing.Callable[[str], Any] = bool) -> Check:
    """The check of a text key: a string passing ``test`` (default: not empty), else ``<key> must be <words>, not
    <value>``."""
    def check(key: str, v: Any) -> str | None:
        return None if isinstance(v, str) and test(v) else f"{key} must be {words}, not {shown(v)}"
    return check


def _section(kind, head: str):
    """A field holding a section: its help is the first paragraph of the section class's docstring, on one line."""
    doc = " ".join(kind.__doc__.strip().split("\n\n")[0].split()).rstrip(".")
    return knob(None, doc[0].lower() + doc[1:], factory=kind, section=(kind, head))


# A section with ``EXTRA`` (its other keys' placeholder, type and meaning) passes them on instead of refusing them.
@dataclass
class ConfigKeys:
    """Dotted config keys (``overrides:``), the experiment's values for every trial."""
    EXTRA = ("<section.key>", "the key's type", "any config key (ltfm config --keys): its value in every trial")


@dataclass
class SamplerSpec:
    """The Optuna sampler of a space sweep: a name, or a mapping with type and the class's arguments."""
    type: Literal[tuple(SAMPLERS)] = knob("tpe", "tpe (TPESampler), random, cmaes, gp or qmc")
    seed: int | None = knob(None, "seed of the search: each trial's random state is drawn from it and the trial "
                                  "number (workers propose different points, one worker repeats itself)", SEED)
    EXTRA = ("<argument>", "any", "any argument of the Optuna sampler class, e.g. n_startup_trials: 8 (checked by "
                                  "building it)")


@dataclass
class PrunerSpec:
    """The Optuna pruner trials report their dev metric to: a name, or a mapping with type and arguments."""
    type: Literal[tuple(PRUNERS)] = knob("none", "none, median, percentile, hyperband, successive_halving, threshold "
                                                 "or curve (stops a trial only when its learning curve, extrapolated "
                                                 "to its final step, ends worse than the best completed trial with "
                                                 "confidence: lightning_tfm.sweep.curve_pruner.CurvePruner)")
    # The curve pruner's arguments (given to another type, its class refuses them)
    min_points: int = knob(3, "curve: reports after the warmup the fit needs before a trial can be pruned (and one "
                              "more than the family's parameters)",
                           Range(3, 100000, text="an integer >= 3 (reports; at most 100000)"))
    warmup: int | None = knob(None, "curve: reports up to this update are left out of the fit (null: the trial's "
                                    "train.warmup)", Range(0, STEPS, text=f"null or an integer from 0 to {STEPS} "
                                                                         "(updates)"))
    final_step: int | None = knob(None, "curve: the update the trial's final value is predicted at (null: the "
                                        "trial's train.max_steps)",
                                  Range(1, STEPS, text=f"null or an integer from 1 to {STEPS} (updates)"))
    level: float = knob(0.9, "curve: central share of the bootstrap draws of the predicted final value; pruned when "
                             "its optimistic end is still worse than the best", SHARE)
    bootstraps: int = knob(200, "curve: residual-bootstrap draws of the predicted final value at each report (at "
                                "most 20000 for power, 2000 for the other families)", DRAWS)
    seed: int = knob(0, "curve: seed of the bootstrap (with the trial number: the same reports, the same call)", SEED)
    family: Literal[CURVE_FAMILIES] = knob("power", "curve: the curve fitted to the reports (as report.family)")
    EXTRA = ("<argument>", "any", "any argument of the Optuna pruner class, e.g. min_resource: 500 (checked by "
                                  "building it)")


@dataclass
class HeartbeatSpec:
    """How a trial whose worker died is found and queued again (seconds, retries)."""
    interval: int = knob(30, "seconds between a running trial's heartbeats in the storage",
                         Range(1, DAY, text=f"a positive integer (at most {DAY})"))
    grace: int = knob(120, "seconds without a heartbeat after which a live worker fails the trial and queues its "
                           "retry (longer than interval)", Range(1, DAY, text=f"a positive integer (at most {DAY})"))
    max_retry: int = knob(3, "retries of a trial stopped without keeping work (a killed worker, the out-of-memory "
                             "killer, a full disk)", Range(0, DAY, text=f"a non-negative integer (at most {DAY})"))


@dataclass
class VariantSpec:
    """One row of ``variants:`` (name: mapping): its dotted config overrides and these keys of its own."""
    family: str | None = knob(None, "the row's family in the table (default: its name less trailing digits, A1 -> "
                                    "A)", text_check(f"a name such as A or norm (one line, at most {LABEL_CHARS} "
                                                     "characters)", lambda v: 0 < len(v) <= LABEL_CHARS
                                                     and v.isprintable()))
    budget: float = knob(1.0, "factor on train.max_steps for this row (the paper's big: 3)",
                         Range(0, 1000, lo_open=True, text="a positive factor on train.max_steps (at most 1000)"))
    seeds: list[int] | None = knob(None, "the row's own seeds (default: the sweep's): the base at [1, 2, 3] measures "
                                         "the seed noise", seeds_check)
    experiment: str | None = knob(None, "the row's own experiment YAML, relative to the sweep file (default: the "
                                        "sweep's): a row of another architecture (model.arch), on the same data",
                                  text_check("an experiment YAML (relative to the sweep file)"))
    EXTRA = ("<section.key>", "the key's type", "any config key (ltfm config --keys): the row's value of it")


EQUAL = ("steps", "flops")
# A mean sentence length FLOPs are counted at: a sentence has a piece at least (a tiny one made a row's FLOPs per
# step round to nothing and its steps infinite)
LENGTH = Range(1, MAX_POSITIONS, text=f"a number of tokens from 1 to {MAX_POSITIONS}")


@dataclass
class BudgetSpec:
    """What every row of a variants sweep gets the same of: optimizer steps, or training FLOPs."""
    equal: Literal[EQUAL] = knob("steps", "steps: every row trains train.max_steps (times its budget factor); flops: "
                                          "a row trains the sweep experiment's train.max_steps x its FLOPs per step "
                                          "over the row's (model.arch's train_flops_per_token x target tokens a step), "
                                          "times its budget factor")
    src_len: float | None = knob(None, "flops: the mean source sentence length (tokens) FLOPs are counted at "
                                       "(default: ltfm bench's, the report's default)", LENGTH)
    tgt_len: float | None = knob(None, "flops: the mean target sentence length (tokens) FLOPs are counted at "
                                       "(default: ltfm bench's, the report's default)", LENGTH)


@dataclass
class DistributionSpec:
    """One key of ``space:`` (dotted.key: mapping): the Optuna distribution it is sampled from."""
    type: Literal["categorical", "int", "float"] = knob(REQUIRED, "categorical (choices) or an int or float range "
                                                                  "(low, high, step, log) of the key's type")
    choices: list | None = knob(None, "categorical: the values, each once, plain values of the key's type")
    low: float | None = knob(None, "int/float: the lowest value (a float: any finite number, 1e-5 too)")
    high: float | None = knob(None, "int/float: the highest value, above low")
    step: float | None = knob(None, "int/float: the grid's step, dividing high - low (not with log)")
    log: bool = knob(False, "int/float: sample on a log scale (low > 0, no step)")


@dataclass
class SweepFile:
    """A sweep file's top level (YAML, in sweeps/): a study, its base experiment, and its rows or its space."""
    name: str = knob(REQUIRED, "the Optuna study's name, and the report's",
                     text_check(f"set to at most {LABEL_CHARS} letters, digits, '.', '_' or '-' (it names the "
                                "Optuna study, the report's folder and every trial's run folder)",
                                lambda v: NAME_RE.match(v) and len(v) <= LABEL_CHARS))
    description: str | None = knob(None, "what the sweep is for, in a line (for its reader; nothing reads it)")
    experiment: str = knob(REQUIRED, "the base experiment YAML, relative to the sweep file",
                           text_check("the base experiment YAML (relative to the sweep file)", lambda v: True))
    metric: Literal[tuple(METRICS)] = knob("dev_loss", "the summary.json key the study optimises")
    direction: Literal["minimize", "maximize"] | None = knob(None, "minimize or maximize; default the metric's "
                                                                   "(minimize for loss and PPL, maximize for BLEU)")
    sampler: SamplerSpec = _section(SamplerSpec, "sampler.")
    pruner: PrunerSpec = _section(PrunerSpec, "pruner.")
    seeds: list[int] = knob(None, "run.seed of the trials: every row at each (a space sweep: one)", seeds_check,
                            factory=lambda: [1])
    overrides: dict = knob(None, "dotted config keys applied to every trial's experiment (ltfm config --keys)",
                           factory=dict, section=(ConfigKeys, "overrides."))
    heartbeat: HeartbeatSpec = _section(HeartbeatSpec, "heartbeat.")
    n_trials: int | None = knob(None, "space sweeps: trials in the whole study (default 20)",
                                Range(1, MAX_TRIALS, text=f"a positive integer, at most {MAX_TRIALS}"))
    variants: dict[str, VariantSpec] | None = knob(None, "EITHER named rows ([A-Za-z0-9._-]): one trial per variant "
                                                         "and seed", section=(VariantSpec, "variants.<name>."))
    space: dict[str, DistributionSpec] | None = knob(None, "OR Optuna distributions over dotted config keys",
                                                          section=(DistributionSpec, "space.<section.key>."))
    report: ReportSpec = _section(ReportSpec, "report.")
    settle: SettleSpec = _section(SettleSpec, "settle.")
    budget: BudgetSpec = _section(BudgetSpec, "budget.")


TOP_KEYS = tuple(f.name for f in dataclasses.fields(SweepFile))
HEARTBEAT_DEFAULTS = dataclasses.asdict(HeartbeatSpec())
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


def _want(spec) -> str:
    """What a value of type spec ``spec`` is, in the words of a sweep file's errors."""
    if isinstance(spec, tuple) and spec[0] == "choice":
        return "one of " + ", ".join(map(str, spec[1:]))
    if isinstance(spec, tuple):  # optional
        return _want(spec[1]) + " or null"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}.get(spec,
                                                                                                    describe(spec))


def _checked(label: str, raw: Any, spec, check: Check | None) -> tuple[Any, str | None]:
    """``raw`` as its field's type (:func:`~lightning_tfm.base.knobs.coerce`, as a sweep file takes it: no number
    as text, every float finite, a number YAML 1.1 reads as text too) and what is wrong with it, in one line
    (None: nothing): its type, then its check (a :class:`Range` says what it allows, another check of any value
    says it all)."""
    try:
        v, typed = coerce(raw, spec, numbers_as_text=False, finite=True), True
    except Unfit:
        v, typed = raw, False
    if isinstance(check, Range):
        return v, None if typed and check(label, v) is None else f"{label} must be {check.words(v)}, not {shown(v)}"
    if check is not None and (not typed or v is not None):
        why = check(label, v)
        return v, why if why is not None or typed else f"{label} must be {_want(spec)}, not {shown(v)}"
    return v, None if typed else f"{label} must be {_want(spec)}, not {shown(v)}"


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
        v, why = _checked(prefix + f.name, value.get(f.name), type_spec(hints[f.name]), f.metadata.get("check"))
        if why is not None:
            raise err(path, why)
        known[f.name] = v
    return known, rest


def describe_keys(prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every key a sweep file may hold, as (key, type, default, help), those starting with ``prefix``: ``ltfm sweep
    --keys``, read off the schema :func:`load_sweep` checks against (so it cannot fall out of date)."""
    rows = [r for r in key_rows(SweepFile) if r[0].startswith(prefix)]
    if not rows:
        raise UserError(f"no sweep-file key starts with {prefix!r}: the top-level keys are {', '.join(TOP_KEYS)}")
    return rows
