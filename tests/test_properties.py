"""Every config key and every sweep-file field at its limits (issue #52, the class): property tests with
``hypothesis`` over the declared schemas, the config sections' fields (:func:`~lightning_tfm.base.knobs.knob`,
their :class:`~lightning_tfm.base.knobs.Range`) and the sweep file's (``sweep/schema.py``). Each value, at a
range's ends and just past them, huge, tiny, negative, NaN, infinite, a long or odd string, a wrong type, is either
accepted and then usable (the resolved config builds its model; its FLOPs and steps are finite) or refused in one
line, exit 2, no traceback: through ``ltfm config FILE key=value`` and ``ltfm sweep FILE --dry-run``, in-process.
Derandomized, so the examples (and the outcome) are the same on every machine, whatever its speed."""
from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_tfm.base.knobs import OPT, Range
from lightning_tfm.sweep import schema
from lightning_tfm.training.config import config

from conftest import SMOKE

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

# ---------------------------------------------------------------------------------------------- the values
ODD_TEXT = ["", " ", "x", "a" * 300, "é" * 200, "line\nbreak", "tab\tthere", "../up", "/abs", "~", "null", "1e5",
            "[1, 2]", "{a: 1}", "#comment", "'quoted'", "\u202e", "x" * 5000]
ODD_NUMBERS = [0, -1, 1, 2, -(2 ** 63), 2 ** 31, 2 ** 63, 10 ** 30, 0.5, -0.0, 1e-300, 5e-324, 1e308, -1e308,
               float("nan"), float("inf"), float("-inf")]
WRONG = [True, False, None, [1, 2], ["a"], {"a": 1}, "x"]


def _edges(check) -> list:
    """A Range's ends, and just past them (an int range's by 1, a float range's by the next float)."""
    if not isinstance(check, Range):
        return []
    lo, hi = check.lo, check.hi
    out = [lo, hi, math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)]
    if float(lo).is_integer() and float(hi).is_integer():
        out += [int(lo), int(hi), int(lo) - 1, int(hi) + 1]
    return out


def values(spec, check=None) -> st.SearchStrategy:
    """Values for a key of type ``spec`` (config's type specs) whose own check is ``check``."""
    base = st.sampled_from(ODD_NUMBERS + WRONG) | st.sampled_from(ODD_TEXT)
    if isinstance(spec, tuple) and spec[0] == OPT:
        return st.none() | values(spec[1], check)
    if isinstance(spec, tuple) and spec[0] == "choice":
        return st.sampled_from(spec[1:]) | base
    if spec is int:
        lo, hi = (int(check.lo), int(check.hi)) if isinstance(check, Range) else (-(2 ** 40), 2 ** 40)
        return st.sampled_from(_edges(check) or [0]) | st.integers(lo, hi) | base
    if spec is float:
        lo, hi = (check.lo, check.hi) if isinstance(check, Range) else (-1e30, 1e30)
        return st.sampled_from(_edges(check) or [0.0]) | st.floats(lo, hi) | base
    if spec is bool:
        return st.booleans() | base
    if spec is list:
        return st.lists(st.sampled_from(ODD_TEXT[:6] + [1, None]), max_size=3) | base
    return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40) | \
        st.sampled_from(ODD_TEXT) | base


def as_override(v) -> str:
    """A value as typed after ``key=`` on the command line (YAML, as the CLI reads it)."""
    if isinstance(v, str):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return {True: ".inf", False: "-.inf"}[v > 0] if not math.isnan(v) else ".nan"
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def _checks() -> dict[str, typing.Any]:
    from lightning_tfm.base.knobs import check_of

    out = {}
    for sec, keys in config.SCHEMA.items():
        section = getattr(config.Config(), sec)
        for name in keys:
            out[f"{sec}.{name}"] = check_of(type(section), name)
    return out


KEYS = sorted(f"{sec}.{name}" for sec, keys in config.SCHEMA.items() for name in keys)
CHECKS = _checks()


@st.composite
def key_and_value(draw):
    key = draw(st.sampled_from(KEYS))
    sec, name = key.split(".")
    return key, draw(values(config.SCHEMA[sec][name][0], CHECKS.get(key)))


def one_line_refusal(p) -> bool:
    return p.returncode == 2 and p.stderr.startswith("ltfm: error: ") and p.stderr.count("\n") == 1 and \
        "Traceback" not in p.stderr


def usable(cfg) -> str | None:
    """Why an accepted config is not usable (its model does not build on the meta device; its parameters, FLOPs
    per step or steps are not finite), or None."""
    from lightning_tfm.bench.speed import DEFAULTS
    from lightning_tfm.sweep.plan import build_model_params, flops_per_step

    try:
        params = build_model_params(cfg)
        fps = flops_per_step(cfg, (float(DEFAULTS["src_len"]), float(DEFAULTS["tgt_len"])))
    except Exception as e:  # noqa: BLE001 - what the property looks for
        return f"{e.__class__.__name__}: {e}"
    if not (params > 0 and math.isfinite(fps) and fps > 0 and math.isfinite(fps * cfg.train.max_steps)):
        return f"params {params}, FLOPs per step {fps}, steps {cfg.train.max_steps}"
    return None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-corpus")
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text("".join(f"{split} {lang} {i}\n" for i in range(5)))
    return folder


def test_every_config_key_at_its_limits_is_usable_or_one_line(tiny, tmp_path_factory, ltfm_here):
    results = tmp_path_factory.mktemp("prop-results")
    fixed = [f"data.path={tiny}", f"run.results_dir={results}"]

    @PROPERTY
    @given(st.lists(key_and_value(), min_size=1, max_size=3))
    def check(pairs):
        given_ = [f"{key}={as_override(value)}" for key, value in pairs]
        args = given_ + [f for f in fixed if not any(f.startswith(key + "=") for key, _ in pairs)]
        p = ltfm_here("config", SMOKE, *args)
        if p.returncode == 0:
            why = usable(config.load_config(SMOKE, args))
            assert why is None, f"{given_}: accepted, but {why}"
        else:
            assert one_line_refusal(p), f"{given_}: exit {p.returncode}: {p.stderr[-1500:]}"

    check()


# ------------------------------------------------------------------------------------------- the sweep file
def _hint_values(hint) -> st.SearchStrategy:
    """Values for a sweep-file field of annotation ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
        inner = next(a for a in args if a is not type(None))
        return st.none() | _hint_values(inner)
    if origin is typing.Literal:
        return st.sampled_from(args) | st.sampled_from(ODD_TEXT[:4] + WRONG)
    if origin is list:
        return st.lists(st.sampled_from([1, 2, 0, -1, 2 ** 32, 2 ** 40, 1.5, "a", None, True]), max_size=4) | \
            st.sampled_from(WRONG + [[], [1, 1]])
    if origin is dict or hint is dict or dataclasses.is_dataclass(hint):
        return st.sampled_from(WRONG + [{}, 5, "x"])
    if hint is int:
        return st.integers(-(2 ** 40), 2 ** 40) | st.sampled_from(ODD_NUMBERS + WRONG)
    if hint is float:
        return st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(ODD_NUMBERS + WRONG + ["1e-5", "x"])
    if hint is bool:
        return st.booleans() | st.sampled_from(WRONG + [0, 1])
    return st.sampled_from(ODD_TEXT + WRONG + ODD_NUMBERS[:4]) | st.text(max_size=30)


def _fields(cls) -> list[tuple[str, typing.Any]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]


# (where in the file, the section class): each field of each section, set in a file that is good without it
SECTIONS = [((), schema.SweepFile), (("sampler",), schema.SamplerSpec), (("pruner",), schema.PrunerSpec),
            (("heartbeat",), schema.HeartbeatSpec), (("report",), schema.ReportSpec), (("budget",), schema.BudgetSpec),
            (("variants", "wide"), schema.VariantSpec), (("space", "model.dropout"), schema.DistributionSpec)]
# Arguments of the Optuna classes a sampler or pruner passes on (schema: EXTRA), as a file may give them
EXTRA = {"sampler": ["n_startup_trials", "gamma", "n_ei_candidates", "multivariate", "prior_weight", "scramble",
                     "qmc_type", "sigma0"],
         "pruner": ["n_startup_trials", "n_warmup_steps", "interval_steps", "min_resource", "max_resource",
                    "reduction_factor", "percentile", "upper", "lower", "n_min_trials"]}
TYPES = {"sampler": list(schema.SAMPLERS), "pruner": list(schema.PRUNERS)}


def good_file(space: bool) -> dict:
    """A sweep file that passes: a variants sweep (a FLOPs budget) or a space sweep."""
    top = {"name": "p", "experiment": str(SMOKE), "seeds": [1], "overrides": {"train.max_steps": 20}}
    if space:
        return {**top, "n_trials": 2, "space": {"model.dropout": {"type": "float", "low": 0.0, "high": 0.3},
                                                "model.heads": {"type": "categorical", "choices": [2, 4]}}}
    return {**top, "budget": {"equal": "flops"}, "variants": {"base": {}, "wide": {"model.d_ff": 256}}}


def _edit(draw, tree: dict) -> str:
    """One field, one Optuna argument, or one config key of a row, of the overrides or of the space, of ``tree``
    set to an odd value; returns what was set."""
    space = "space" in tree
    what = draw(st.sampled_from(["field", "field", "field", "plugin", "row key", "override", "space key"]))
    if what == "field":
        where, cls = draw(st.sampled_from([(w, c) for w, c in SECTIONS if not w or w[0] in
                                           ("sampler", "pruner", "heartbeat", "report", "budget",
                                            "space" if space else "variants")]))
        name, hint = draw(st.sampled_from(_fields(cls)))
        if not where and name in ("variants", "space"):
            name = "seeds"
        node = tree
        for part in where:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
        if where == ("budget",) and name != "equal":
            node["equal"] = "flops"
        node[name] = draw(_hint_values(hint))
        return f"{'.'.join(where + (name,))}={node[name]!r}"
    if what == "plugin":
        section = draw(st.sampled_from(["sampler", "pruner"]))
        arg = draw(st.sampled_from(EXTRA[section]))
        tree[section] = {"type": draw(st.sampled_from(TYPES[section])),
                         arg: draw(st.sampled_from(ODD_NUMBERS + WRONG + ODD_TEXT[:3] + [0.5, 3, 10]))}
        return f"{section}={tree[section]!r}"
    key, value = draw(key_and_value())
    if key in schema.RESERVED or key.startswith("sweep."):
        key = "model.dropout"
    if what == "space key" and space:
        spec = draw(st.sampled_from([{"type": "categorical", "choices": [value]},
                                     {"type": "int", "low": value, "high": 8},
                                     {"type": "float", "low": 0.0, "high": value}]))
        tree["space"][key] = spec
        return f"space.{key}={spec!r}"
    if what == "row key" and not space:
        tree["variants"]["wide"][key] = value
        return f"variants.wide.{key}={value!r}"
    tree.setdefault("overrides", {})[key] = value
    return f"overrides.{key}={value!r}"


@st.composite
def sweep_edit(draw):
    """(a sweep file that passes (:func:`good_file`) with one to three edits (:func:`_edit`), what was set)."""
    tree = good_file(space=draw(st.booleans()))
    done = [_edit(draw, tree) for _ in range(draw(st.integers(1, 3)))]
    return tree, "; ".join(done)


def test_every_sweep_file_field_at_its_limits_is_usable_or_one_line(tiny, tmp_path_factory, ltfm_here):
    folder = tmp_path_factory.mktemp("prop-sweep")
    fixed = [f"data.path={tiny}", f"run.results_dir={folder / 'results'}"]

    @PROPERTY
    @given(sweep_edit())
    def check(edit):
        tree, what = edit
        sweep_file = folder / "p.yaml"
        try:
            sweep_file.write_text(yaml.safe_dump(tree, allow_unicode=True))
        except (yaml.YAMLError, UnicodeEncodeError):
            return
        p = ltfm_here("sweep", sweep_file, "--dry-run", "--json", *fixed)
        if p.returncode == 0:
            rows = json.loads(p.stdout)
            for r in rows:
                if r["skipped"]:
                    continue
                assert isinstance(r["max_steps"], int) and r["max_steps"] >= 1, f"{what}: {r}"
                assert r["train_flops"] is not None and math.isfinite(r["train_flops"]), f"{what}: {r}"
                assert r["params"] and r["params"] > 0, f"{what}: {r}"
        else:
            assert one_line_refusal(p), f"{what}: exit {p.returncode}: {p.stderr[-1500:]}"
        assert not (folder / "results").exists() or not any((folder / "results").iterdir()), what

    check()


@pytest.mark.parametrize("command", [["config"], ["train"], ["prepare"]])
def test_an_explicit_null_data_path_is_refused_in_one_line(tmp_path, ltfm_here, command):
    """Found by the property above: ``data.path=null`` printed "data.path=../shared/data/multi30k (no data.path
    given; that folder exists)" before refusing "data.path is not set" (the default was taken, then the null),
    in a folder beside which the default corpus exists."""
    default = tmp_path / "shared" / "data" / "multi30k"
    default.mkdir(parents=True)
    (default / "train.en").write_text("a\n")
    (tmp_path / "work").mkdir()
    p = ltfm_here(*command, SMOKE, "data.path=null", cwd=tmp_path / "work")
    assert one_line_refusal(p) and "data.path is not set" in p.stderr, p.stderr
