"""Experiment configuration: typed dataclasses, nested YAML, ``dotted.key=value`` overrides.

One schema: the section dataclasses (:class:`~.sections.RunConfig`, :class:`~.sections.DataConfig`,
:class:`~.sections.TrainConfig`, :class:`~.sections.DecodeConfig`, :class:`~.sections.WandbConfig`,
:class:`~.sections.SweepConfig` in training/config/sections.py, and the model's
:class:`~lightning_tfm.model.config.ModelConfig`), gathered in :class:`Config` (``cfg.model.d_model``,
``cfg.train.warmup``); a registered architecture other than the transformer adds its own section (``cfg.toy``,
model/registry.py). A key is one field
(:func:`~lightning_tfm.base.knobs.knob`): its type (``Literal[...]`` for choices, ``X | None`` for optional keys),
its default, its help string and its own check (its range) and, for a Table 3 knob, its column. Coercion, unknown-key
errors, overrides, the range checks (:func:`validate`), :data:`TABLE3_KNOBS`, :func:`flatten`, the run id hash
(training/config/run_id.py) and the YAML dump are all derived from those fields; :data:`SCHEMA` is a generated
``{section: {key: (type spec, default, help)}}`` view of them, never edited by hand. A typo, a wrong type or a
value out of range stops the run before anything is written (exit 2), naming the key.

Code that runs something holds a :class:`Config` and reads it by attribute. What is written to disk or sent
elsewhere is a plain nested dict, section and key order as declared: ``config.yaml``, ``summary["config"]``,
checkpoint ``hyper_parameters["config"]`` (``torch.load(weights_only=True)`` loads it) and W&B's flat config
(:meth:`Config.to_dict`, :func:`flatten`). Code reading such a dict back to run with it converts it with
:meth:`Config.from_dict` (``checked=False`` where it need not be runnable); code only reporting on it (the
report's run records, sweep override dicts) keeps the dict and its flat ``"model.heads"`` keys.
"""
from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ...base import knobs
from ...base.errors import UserError, closest
from ...base.inputs import load_yaml, override_value, read_yaml_text, shown
from ...base.knobs import OPT, check_of, describe, path_check, unhashed
from ...model import registry
from ...model.config import ModelConfig
from .run_id import check_name
from .sections import PLATEAU_KEYS, DataConfig, DecodeConfig, RunConfig, SweepConfig, TrainConfig, WandbConfig


@dataclass
class Config:
    """A whole experiment: one typed section per YAML section, in the order config.yaml lists them."""
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)

    def __post_init__(self):
        #: State, no key (an attribute, no field: not in to_dict, the schema or the run id's hash): what
        #: :func:`validate` last passed, (the values then, whether the data source was checked too), None: nothing.
        self._validated: tuple | None = None

    def __getattr__(self, name: str):
        """``cfg.toy``: the section of a registered architecture (model/registry.py), kept with ``cfg.model``."""
        return registry.section_of(self.__dict__.get("model"), name)

    def to_dict(self) -> dict:
        """Plain nested dict (a copy), sections and keys in declaration order: config.yaml, summaries, checkpoints
        (the chosen architecture's section after the model's: :func:`~lightning_tfm.model.registry.saved_tree`)."""
        tree = dataclasses.asdict(self)
        if self.train.lr_schedule == "noam":  # the plateau keys select nothing: neither saved nor hashed (run ids kept)
            tree["train"] = {k: v for k, v in tree["train"].items() if k not in PLATEAU_KEYS}
        return registry.saved_tree(tree, self.model)

    @classmethod
    def from_dict(cls, tree: dict, checked: bool = True) -> "Config":
        """Defaults <- ``tree`` (a nested dict as :meth:`to_dict` gives; missing keys keep their defaults);
        unknown keys and wrong types are errors; cross-key checks unless ``checked=False``."""
        cfg = cls()
        merge(cfg, tree)
        if checked:
            validate(cfg)
        return cfg


# {section: {key: (type spec, default, help)}}: a view generated from the dataclasses (the one schema; type specs:
# base/knobs.py), Config's sections then those of the registered architectures (model/registry.py).
SCHEMA: typing.Mapping[str, dict[str, tuple]] = registry.Sections(
    {sec.name: typing.get_type_hints(Config)[sec.name] for sec in dataclasses.fields(Config)})


class Knob(NamedTuple):
    """A knob of the paper's Table 3 (a field with a :class:`~lightning_tfm.base.knobs.Table3` column), as the
    report and the sweep dashboard read it."""
    title: str   # its column's title (the paper's symbol)
    key: str     # its dotted config key
    csv: str     # its column of table3.csv and of the paper's CSV
    tex: str     # its header in table3.tex ("": none of the paper's own columns)
    label: str   # how a row's name shows its value ("{} positions")


def _table3_knobs() -> tuple[Knob, ...]:
    found = []
    for sec in dataclasses.fields(Config):
        for f in dataclasses.fields(typing.get_type_hints(Config)[sec.name]):
            if (t := f.metadata.get("table3")) is not None:
                found.append((t.place, Knob(t.title, f"{sec.name}.{f.name}", t.csv or f.name, t.tex,
                                            t.label or f"{t.title} {{}}")))
    return tuple(k for _, k in sorted(found, key=lambda placed: placed[0]))


# The knobs of the paper's Table 3 (plus positions, norm and the training budget), in their columns' order: the
# fields with a Table3 column (model/config.py, training/config/sections.py). The report's configuration columns, the
# paper's rows (report/table3/paper.py), table3.tex and the sweep dashboard's Optuna params derive from it.
TABLE3_KNOBS = _table3_knobs()

# The keys that do not change what is trained, left out of the run id's hash (run_id.not_hashed): the fields marked
# knob(..., hashed=False), and the sections hashed not at all by their name (wandb, sweep).
NOT_HASHED: frozenset[str] = frozenset().union(
    *(unhashed(sec.name, typing.get_type_hints(Config)[sec.name]) for sec in dataclasses.fields(Config)))


def choices(key: str) -> tuple | None:
    """The allowed values of a choice key (``model.norm`` -> ("post", "pre")), None for other keys."""
    sec, name = key.split(".")
    spec = SCHEMA[sec][name][0]
    return spec[1:] if isinstance(spec, tuple) and spec[0] == "choice" else None


def get_dotted(cfg: Config, key: str) -> Any:
    """``get_dotted(cfg, "model.heads")`` = ``cfg.model.heads``, for code that handles keys generically."""
    sec, name = key.split(".")
    return getattr(getattr(cfg, sec), name)


def coerce(key: str, value: Any, spec) -> Any:
    """``value`` as key ``key``'s type (:func:`~lightning_tfm.base.knobs.coerce`: ints are floats, numbers are text
    for str keys and choices like precision), else the one-line error naming the key."""
    try:
        return knobs.coerce(value, spec)
    except knobs.Unfit as e:
        if e.finite:  # PyYAML (YAML 1.1) reads 1e-9 and inf as strings; they are numbers to the user.
            raise UserError(f"{key}={value} is not a finite number: give a real value") from None
        if isinstance(spec, tuple) and spec[0] == OPT:  # not null: the value's type is the inner one
            spec = spec[1]
        if isinstance(spec, tuple) and spec[0] == "choice":
            raise UserError(f"{key}={shown(value)} is not one of: {describe(spec)}") from None
        raise UserError(f"{key}={shown(value)} has the wrong type: expected {describe(spec)}") from None


def did_you_mean(word: str, choices=None) -> str:
    """``"did you mean model.heads? "``: the one of ``choices`` (default: every key) closest to ``word``
    (:func:`~lightning_tfm.base.errors.closest`), else ""."""
    best = closest(word, choices or (f"{sec}.{name}" for sec in SCHEMA for name in SCHEMA[sec]))
    return f"did you mean {best}? " if best else ""


def set_dotted(cfg: Config, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) != 2 or parts[0] not in SCHEMA:
        raise UserError(f"unknown config key {shown(key)}: {did_you_mean(key)}keys look like section.name with "
                        f"section one of {', '.join(SCHEMA)}")
    sec, name = parts
    if name not in SCHEMA[sec]:
        raise UserError(f"unknown config key {shown(key)}: {did_you_mean(key)}{sec} has {', '.join(SCHEMA[sec])}")
    setattr(getattr(cfg, sec), name, coerce(key, value, SCHEMA[sec][name][0]))


def parse_override(text: str) -> tuple[str, Any]:
    """``model.heads=4`` -> ("model.heads", 4): the value as typed, read as YAML (numbers, booleans, null, lists;
    a str key's plain value is its text, and nothing is dropped as a comment: :func:`.inputs.override_value`)."""
    if "=" not in text:
        raise UserError(f"override {shown(text)} is not of the form ", "dotted.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    spec = SCHEMA.get(key.split(".")[0], {}).get(key.split(".", 1)[-1], (None,))[0]
    return key, override_value(key, raw, text=spec is str or spec == (OPT, str))


def merge(cfg: Config, tree: dict) -> None:
    for sec, body in tree.items():
        if sec not in SCHEMA:
            raise UserError(f"unknown config section {shown(sec)}: {did_you_mean(str(sec), SCHEMA)}use one of "
                            f"{', '.join(SCHEMA)}")
        if not isinstance(body, dict):
            raise UserError(f"config section {shown(sec)} must be a mapping of keys to values")
        for name, value in body.items():
            set_dotted(cfg, f"{sec}.{name}", value)


def is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False, not an error, for what is no path at all (a name over 255 bytes, a NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def read_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    what = f"config file {shown(str(path))}"
    if not is_file(p):
        raise UserError(f"{what} not found: give a YAML file such as experiments/multi30k-smoke.yaml")
    try:
        tree = load_yaml(read_yaml_text(p, what), what) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise UserError(f"{what} is not valid YAML{where}: fix the syntax") from None
    if not isinstance(tree, dict):
        raise UserError(f"{what} must hold a mapping of sections (model:, train:, ...)")
    return tree


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None,
                checked: bool = True, data: bool = True, tree: dict | None = None) -> Config:
    """Defaults <- YAML file <- overrides; validated unless ``checked=False`` (a report reading configs it
    need not run), the data source too unless ``data=False`` (a dry run or a status table, which read no data).
    ``overrides`` is a list of "k=v" or a {dotted: value} dict; ``tree``: the file, read before (once a sweep)."""
    cfg = Config()
    if path is not None:
        tree = read_yaml(path) if tree is None else tree
        merge(cfg, tree)
        if "run" not in tree or "name" not in (tree.get("run") or {}):
            cfg.run.name = Path(path).stem
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides or [])
    for key, value in items:
        set_dotted(cfg, key, value)
    resolve_paths(cfg)
    if checked:
        validate(cfg, data=data)
    return cfg


def resolve_paths(cfg: Config) -> None:
    """data.path (and data.cache_dir) as absolute paths, before the run id is computed: ``small``,
    ``./small`` and ``/abs/small`` are one run, whatever folder the command runs from."""
    d = cfg.data
    for key in ("path", "cache_dir"):
        if (why := path_check(f"data.{key}", getattr(d, key))) is not None:  # a NUL: one line, not resolve()'s error
            raise UserError(why)
        if getattr(d, key):
            setattr(d, key, str(Path(getattr(d, key)).expanduser().resolve()))


def _check_finite(cfg: Config) -> None:
    """No float key may be inf or nan: ``train.lr_scale=inf`` would train to a NaN loss and call it done."""
    for sec, keys in SCHEMA.items():
        for name, spec in keys.items():
            v = get_dotted(cfg, f"{sec}.{name}")
            if isinstance(v, float) and not math.isfinite(v):
                raise UserError(f"{sec}.{name}={v} is not a finite number: give a real value")


def validate(cfg: Config, data: bool = True) -> None:
    """Every key's value, before any work: each section's own checks (:meth:`~.sections.Section.problem`: its
    fields' ranges, then its rules across its keys; the chosen architecture's section too), then the checks across
    sections (the run id; the data source's only with ``data``: see :func:`has_data`).

    Every key's range is checked here, not where it is first used: a value that only fails inside
    Lightning, the DataLoader or the decoder after training would cost the whole run (and leave a half
    written run folder). A config is validated once: unchanged since it passed, it is not checked again."""
    sections = registry.made_sections(cfg.model)  # the architectures' own sections (model/registry.py)
    # a section read at its defaults: no change
    state = (dataclasses.astuple(cfg), repr([(n, s, sorted(s.given())) for n, s in sorted(sections.items())
                                             if s.given() or s != type(s)()]))
    if cfg._validated in ((state, True), (state, data)):  # e.g. ltfm train's, then train()'s
        return
    _check_finite(cfg)
    if (why := registry.check(cfg.model)) is not None:  # model.arch, and knobs of another architecture
        raise UserError(why)
    check_name(cfg)  # the run id's folder name (training/config/run_id.py)
    for sec in dataclasses.fields(Config):
        if (why := getattr(cfg, sec.name).problem()) is not None:
            raise UserError(why)
    d = cfg.data
    if data and d.source == "local" and not d.path:
        raise UserError("data.path is not set: pass data.path=FOLDER with {split}.{lang}[.gz] files "
                        "(e.g. data.path=../shared/data/multi30k), or data.source=hub")
    if data and d.source == "hub" and not d.hub_name:
        raise UserError("data.hub_name is not set: pass e.g. data.hub_name=wmt14 data.hub_config=de-en")
    cfg._validated = (state, data)


def check_data_folder(cfg: Config) -> None:
    """A local corpus's data.path is a folder: else one line naming it, the closest existing folder and the way out
    (:func:`~..data.corpus_id.folder_problem`). Checked by the commands that read the data (``ltfm config``,
    ``train``, ``prepare``) before anything heavy runs, not by :func:`validate`: a config that reads no data (a
    report's, a dry run's) may name a folder of another machine."""
    from ..data.corpus_id import folder_problem

    if cfg.data.source == "local" and cfg.data.path and (why := folder_problem(cfg.data.path)) is not None:
        raise UserError(why)


def check_value(key: str, value: Any) -> None:
    """``key``'s value on its own (its field's check: a number within its range): one line naming the key and the
    range. A sweep file's values are checked with it when it is loaded, before any trial."""
    sec, name = key.split(".")
    check = check_of(getattr(Config(), sec), name)
    if check is not None and (why := check(key, value)) is not None:
        raise UserError(why)


def has_data(cfg: Config) -> bool:
    """Whether the config names its data (data.path, or data.hub_name on the Hub): part of the run id."""
    return bool(cfg.data.path if cfg.data.source == "local" else cfg.data.hub_name)


def flatten(cfg: Config | dict) -> dict:
    """{"model": {"heads": 8}} -> {"model.heads": 8}: the paper's knob names as flat keys (W&B columns).
    Takes a :class:`Config` or a nested dict (a summary's "config")."""
    tree = cfg.to_dict() if isinstance(cfg, Config) else cfg
    return {f"{sec}.{k}": v for sec, body in tree.items() for k, v in body.items()}


def unflatten(flat: dict) -> dict:
    """{"model.heads": 8} -> {"model": {"heads": 8}}: :func:`flatten`'s inverse (an export's flat config as the
    nested dict :meth:`Config.from_dict` takes)."""
    tree: dict = {}
    for key, value in flat.items():
        sec, name = key.split(".", 1)
        tree.setdefault(sec, {})[name] = value
    return tree


def saved_yaml(cfg: Config) -> str:
    """The ``config.yaml`` a run keeps (and a sweep trial trains from): the resolved config as plain YAML, with
    secrets masked."""
    from ...base.redact import scrub

    return dump_yaml(scrub(cfg.to_dict()))


def dump_yaml(cfg: Config | dict) -> str:
    return yaml.safe_dump(cfg.to_dict() if isinstance(cfg, Config) else cfg, sort_keys=False)
