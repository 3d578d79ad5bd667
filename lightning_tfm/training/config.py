"""Experiment configuration: typed dataclasses, nested YAML, ``dotted.key=value`` overrides.

One schema: the dataclasses below (:class:`RunConfig`, :class:`DataConfig`, :class:`TrainConfig`,
:class:`DecodeConfig`, :class:`WandbConfig`, :class:`SweepConfig`, and the model's
:class:`~lightning_tfm.model.config.ModelConfig`), gathered in :class:`Config` (``cfg.model.d_model``,
``cfg.train.warmup``); a registered architecture other than the transformer adds its own section (``cfg.toy``,
model/registry.py). Each field has its type (``Literal[...]`` for choices, ``X | None`` for optional keys),
its default and a help string in ``metadata["help"]``. Coercion, unknown-key errors, overrides, :func:`flatten`,
the run id hash (training/run_id.py) and the YAML dump are all derived from those fields; :data:`SCHEMA` is a generated
``{section: {key: (type spec, default, help)}}`` view of them, never edited by hand. A typo or a wrong type
stops the run before anything is written (exit 2), naming the key.

Code that runs something holds a :class:`Config` and reads it by attribute. What is written to disk or sent
elsewhere is a plain nested dict, section and key order as declared: ``config.yaml``, ``summary["config"]``,
checkpoint ``hyper_parameters["config"]`` (``torch.load(weights_only=True)`` loads it) and W&B's flat config
(:meth:`Config.to_dict`, :func:`flatten`). Code reading such a dict back to run with it converts it with
:meth:`Config.from_dict` (``checked=False`` where it need not be runnable); code only reporting on it (the
report's run records, sweep override dicts) keeps the dict and its flat ``"model.heads"`` keys.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..model import registry
from ..model.config import OPT, ModelConfig
from .errors import UserError
from .checks import check_data, check_decode, check_devices, check_labels, check_names, check_ranges
from .inputs import load_yaml, override_value, read_yaml_text, shown
from .run_id import check_name


def _f(default: Any, help: str, factory=None):
    """A config field: its default and its one-line meaning (``metadata["help"]``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class RunConfig:
    name: str = _f("run", "experiment name; part of the run id")
    id: str | None = _f(None, "run folder; default <name>-<config hash> (a sweep trial's: <study>-<variant>-s<seed>-<hash>)")
    results_dir: str = _f("results", "where run folders are written")
    seed: int = _f(1, "random seed of initialisation, dropout and batch order")
    variant: str | None = _f(None, "Table 3 row or sweep variant this run belongs to")
    family: str | None = _f(None, "row family: base, A, B, C, D, E, big, norm, search")
    study: str | None = _f(None, "sweep/study name this run belongs to (its W&B group)")


@dataclass
class DataConfig:
    source: Literal["local", "hub"] = _f("local", "local folder of {split}.{lang}[.gz] files, or the Hugging Face Hub")
    path: str | None = _f(None, "local folder of the corpus files (data.source=local)")
    hub_name: str | None = _f(None, "Hub dataset id, e.g. wmt14 or bentrevett/multi30k")
    hub_config: str | None = _f(None, "Hub dataset configuration, e.g. de-en")
    src_lang: str = _f("en", "language code of the source side, e.g. en (file suffix / Hub column)")
    tgt_lang: str = _f("de", "language code of the target side, e.g. de (file suffix / Hub column)")
    train_split: str = _f("train", "name of the split the model and the BPE vocabulary are trained on")
    dev_split: str = _f("val", "name of the split for dev loss/perplexity and dev BLEU (the paper: newstest2013)")
    test_split: str | None = _f(None, "evaluated at the end when set")
    vocab_size: int = _f(8000, "shared source-target BPE vocabulary size")
    max_tokens_per_sentence: int = _f(256, "training pairs longer than this (in BPE pieces, or than "
                                           "model.max_positions-1) are skipped; dev/test pairs are truncated to it "
                                           "(counts in summary.json)")
    max_train_pairs: int | None = _f(None, "use only the first N training pairs (smoke tests)")
    max_dev_pairs: int | None = _f(None, "use only the first N dev pairs")
    max_test_pairs: int | None = _f(None, "use only the first N test pairs")
    tokenizer_min_frequency: int = _f(2, "BPE merges need at least this many occurrences")
    cache_dir: str | None = _f(None, "where prepared corpora (vocabulary + token ids, `ltfm prepare`) are kept; "
                                     "default: data-cache beside run.results_dir")


@dataclass
class TrainConfig:
    label_smoothing: float = _f(0.1, "epsilon_ls: label smoothing of the cross-entropy targets (Sec. 5.4)")
    batch_tokens: int = _f(4096, "per-device batch: padded source tokens and padded target tokens each at most this")
    batch_tokens_total: int | None = _f(None, "effective batch in tokens per side; sets accumulation from world size")
    accumulate: int = _f(1, "gradient accumulation (ignored when batch_tokens_total is set)")
    max_steps: int = _f(100000, "optimizer steps to train for (the paper: 100k for base, Sec. 5.2)")
    max_time_minutes: float | None = _f(None, "stop training after this much wall time")
    warmup: int = _f(4000, "warmup_steps of the learning-rate schedule (Sec. 5.3, Eq. 3)")
    lr_scale: float = _f(1.0, "factor on d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)")
    lr_schedule: Literal["noam", "plateau"] = _f("noam", "noam: Eq. 3 (warmup, lr_scale); plateau: the recurrent "
                                                 "recipes' constant train.lr, decayed when the dev loss stalls")
    lr: float = _f(2e-4, "plateau: the learning rate until the first decay (joeynmt's IWSLT14 RNN: 2e-4)")
    lr_decay_factor: float = _f(0.7, "plateau: factor on the learning rate at each decay (joeynmt: 0.7)")
    lr_patience: int = _f(8, "plateau: stalled validations (no lower dev loss) let pass; the next decays the rate "
                             "(joeynmt: 8)")
    lr_min: float = _f(0.0, "plateau: the learning rate never decays below this")
    adam_beta1: float = _f(0.9, "Adam's beta_1, decay of the gradient mean (Sec. 5.3: 0.9)")
    adam_beta2: float = _f(0.98, "Adam's beta_2, decay of the squared-gradient mean (Sec. 5.3: 0.98)")
    adam_eps: float = _f(1e-9, "Adam's epsilon added to the update's denominator (Sec. 5.3: 1e-9)")
    clip_norm: float = _f(0.0, "gradient clipping (0: off, as in the paper)")
    precision: Literal["auto", "32", "bf16-mixed", "16-mixed", "bf16-true"] = _f(
        "auto", "Lightning precision; auto: bf16-mixed where the GPU/CPU has native bf16, else 32 (precision.py)")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = _f(
        "auto", "Lightning accelerator the run trains on; auto: a GPU when there is one, else the CPU")
    devices: str = _f("1", "Lightning devices: a count, 'auto' or a list like '0,1'")
    num_nodes: int = _f(1, "machines taking part in a multi-node run (Lightning num_nodes)")
    strategy: Literal["auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"] = _f(
        "auto", "Lightning strategy spreading training over several devices (auto: ddp when there are several)")
    val_every_steps: int = _f(1000, "interval in optimizer steps of the dev loss/perplexity")
    checkpoint_every_steps: int = _f(1000, "checkpoint interval in optimizer steps")
    checkpoint_every_minutes: float | None = _f(None, "checkpoint interval in minutes (instead of steps)")
    checkpoint_every_seconds: float | None = _f(600.0, "also rewrite checkpoints/last.ckpt (what a killed run resumes "
                                                       "from) once this many seconds passed since the last checkpoint, "
                                                       "whichever comes first with the step interval; 0: after every "
                                                       "step; null: the step interval alone")
    keep_checkpoints: int = _f(5, "step checkpoints kept besides last (for averaging)")
    log_every_steps: int = _f(50, "interval in optimizer steps of the training loss/learning-rate log lines")
    num_workers: int = _f(0, "DataLoader worker processes (0: load batches in the training process)")
    compile: bool = _f(False, "torch.compile the model (whether it pays off depends on the machine: time it)")
    fused_loss: bool = _f(True, "pre-softmax projection + smoothed loss computed chunk-wise, gradients eagerly "
                                "(speed path)")
    progress_bar: bool = _f(True, "show Lightning's progress bar on the terminal (off for logs and sweep workers)")
    threads: int | None = _f(None, "torch intra-op threads (default: torch's choice)")
    record_batches: bool = _f(False, "write the dataset indices of every training batch, per rank (debugging, tests)")


@dataclass
class DecodeConfig:
    beam_size: int = _f(4, "beam width of the search (Sec. 6.1: 4); 1 = greedy")
    length_penalty: float = _f(0.6, "alpha of the GNMT length penalty ((5+|Y|)/6)^alpha")
    max_len_a: float = _f(1.0, "maximum output length = a * source length + b")
    max_len_b: int = _f(50, "b of the maximum output length a * source length + b (Sec. 6.1: input length + 50)")
    batch_sentences: int = _f(128, "sentences decoded together in one batch")
    dev_bleu_every_steps: int = _f(0, "dev BLEU during training every N steps (0: only at the end)")
    dev_bleu_subset: int | None = _f(200, "sentences of the dev set used for BLEU during training (None: all)")
    average_last: int = _f(0, "at the end, average the last N checkpoints and evaluate that (0: off)")
    samples: int = _f(8, "sample translations logged at each dev BLEU")


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = _f("offline", "W&B logging mode; the WANDB_MODE environment variable overrides it")
    project: str = _f("lightning_tfm", "W&B project; the WANDB_PROJECT environment variable overrides it")
    entity: str | None = _f(None, "W&B entity (user or team); WANDB_ENTITY overrides it")
    dir: str | None = _f(None, "where wandb writes; default the run folder")
    tags: list[str] = _f(None, "extra W&B tags of the run (the variant and family are added)", factory=list)


@dataclass
class SweepConfig:
    storage: str | None = _f(None, "Optuna storage of the trial, for a trial run by hand (ltfm sweep passes it in the environment, never in the config)")
    study: str | None = _f(None, "set by ltfm sweep: Optuna study the trial belongs to")
    trial: int | None = _f(None, "set by ltfm sweep: trial number to report to")
    metric: str = _f("dev_loss", "metric reported to the study at each validation")


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
# model/config.py), Config's sections then those of the registered architectures (model/registry.py).
SCHEMA: typing.Mapping[str, dict[str, tuple]] = registry.Sections(
    {sec.name: typing.get_type_hints(Config)[sec.name] for sec in dataclasses.fields(Config)})

# The knobs of the paper's Table 3 (plus positions and norm, and the training budget): (paper column, dotted
# config key, CSV column). The report's table columns and the sweep dashboard's Optuna params derive from it.
TABLE3_KNOBS = (("N", "model.layers", "layers"), ("d_model", "model.d_model", "d_model"),
                ("d_ff", "model.d_ff", "d_ff"), ("h", "model.heads", "heads"), ("d_k", "model.d_k", "d_k"),
                ("d_v", "model.d_v", "d_v"), ("P_drop", "model.dropout", "dropout"),
                ("ε_ls", "train.label_smoothing", "label_smoothing"), ("positional", "model.positional", "positional"),
                ("norm", "model.norm", "norm"), ("train steps", "train.max_steps", "train_steps"))

PLATEAU_KEYS = ("lr_schedule", "lr", "lr_decay_factor", "lr_patience", "lr_min")  # train.*; Config.to_dict



def choices(key: str) -> tuple | None:
    """The allowed values of a choice key (``model.norm`` -> ("post", "pre")), None for other keys."""
    sec, name = key.split(".")
    spec = SCHEMA[sec][name][0]
    return spec[1:] if isinstance(spec, tuple) and spec[0] == "choice" else None


def get_dotted(cfg: Config, key: str) -> Any:
    """``get_dotted(cfg, "model.heads")`` = ``cfg.model.heads``, for code that handles keys generically."""
    sec, name = key.split(".")
    return getattr(getattr(cfg, sec), name)


def describe(spec) -> str:
    if isinstance(spec, tuple) and spec[0] == "choice":
        return " | ".join(map(str, spec[1:]))
    if isinstance(spec, tuple) and spec[0] == OPT:
        return describe(spec[1]) + " or null"
    return spec.__name__


def coerce(key: str, value: Any, spec) -> Any:
    """Check ``value`` against ``spec``; ints are accepted for floats, numbers for str choices like precision."""
    if isinstance(spec, tuple) and spec[0] == OPT:
        return None if value is None else coerce(key, value, spec[1])
    if isinstance(spec, tuple) and spec[0] == "choice":
        v = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        if v not in spec[1:]:
            raise UserError(f"{key}={shown(value)} is not one of: {describe(spec)}")
        return v
    if spec is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec is float and isinstance(value, str):
        # PyYAML (YAML 1.1) reads 1e-9 and inf as strings; they are numbers to the user.
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None and not math.isfinite(number):
            raise UserError(f"{key}={value} is not a finite number: give a real value")
        if number is not None:
            return number
    if spec is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if spec is list and isinstance(value, tuple):
        return list(value)
    if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise UserError(f"{key}={shown(value)} has the wrong type: expected {describe(spec)}")
    return value


def did_you_mean(word: str, choices=None) -> str:
    """``"did you mean model.heads? "``: the one of ``choices`` (default: every key) closest to ``word`` (difflib;
    none when two are as close: ``model.d``), else the one ``word`` begins, else ""."""
    choices = list(choices or (f"{sec}.{name}" for sec in SCHEMA for name in SCHEMA[sec]))
    ranked = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in choices), reverse=True)
    (r1, best), (r2, _) = (ranked + [(0.0, "")] * 2)[:2]
    longer = [c for c in choices if c.startswith(word)]
    best = best if r1 >= 0.75 and r1 > r2 else longer[0] if len(longer) == 1 else ""
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
        raise UserError(f"override {shown(text)} is not of the form dotted.key=value")
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


def read_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    what = f"config file {shown(str(path))}"
    if not p.is_file():
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
    check_names(cfg)  # a NUL or a name over 255 bytes: one line, not resolve()'s ValueError
    d = cfg.data
    if d.path:
        d.path = str(Path(d.path).expanduser().resolve())
    if d.cache_dir:
        d.cache_dir = str(Path(d.cache_dir).expanduser().resolve())


def _check_finite(cfg: Config) -> None:
    """No float key may be inf or nan: ``train.lr_scale=inf`` would train to a NaN loss and call it done."""
    for sec, keys in SCHEMA.items():
        for name, spec in keys.items():
            v = get_dotted(cfg, f"{sec}.{name}")
            if isinstance(v, float) and not math.isfinite(v):
                raise UserError(f"{sec}.{name}={v} is not a finite number: give a real value")


def validate(cfg: Config, data: bool = True) -> None:
    """Cross-key checks: every combination the model cannot build is named here, before any work (the data
    source's only with ``data``: see :func:`has_data`).

    Every key's range is checked here, not where it is first used: a value that only fails inside
    Lightning, the DataLoader or the decoder after training would cost the whole run (and leave a half
    written run folder). A config is validated once: unchanged since it passed, it is not checked again."""
    sections = cfg.model.__dict__.get("_sections", {})  # the architectures' own sections (model/registry.py)
    state = (dataclasses.astuple(cfg), repr([(n, s, sorted(s.given())) for n, s in sorted(sections.items())
                                             if s.given() or s != type(s)()]))  # a section read at its defaults: no change
    if getattr(cfg, "_validated", None) in ((state, True), (state, data)):  # e.g. ltfm train's, then train()'s
        return
    _check_finite(cfg)
    if (why := registry.check(cfg.model)) is not None:  # model.arch, and knobs of another architecture
        raise UserError(why)
    m, t, d, dec = cfg.model, cfg.train, cfg.data, cfg.decode
    check_name(cfg)  # the run id's folder name (training/run_id.py)
    check_labels(cfg.run)
    check_names(cfg)
    if not 0 <= cfg.run.seed < 2 ** 32:  # Lightning's seeding takes no other (and would fail inside the run)
        raise UserError(f"run.seed={cfg.run.seed} must be an integer from 0 to 2**32 - 1")
    if m.d_model % 2:
        raise UserError(f"model.d_model={m.d_model} must be even (sinusoids come in sin/cos pairs)")
    for key in ("model.dropout", "model.attention_dropout", "train.label_smoothing", "train.adam_beta1",
                "train.adam_beta2"):  # probabilities and decay rates (the paper's betas: 0.9 and 0.98)
        if not 0.0 <= get_dotted(cfg, key) < 1.0:
            raise UserError(f"{key}={get_dotted(cfg, key)} must be in [0, 1)")
    if t.batch_tokens_total is not None and t.batch_tokens_total < t.batch_tokens:
        raise UserError(f"train.batch_tokens_total={t.batch_tokens_total} is smaller than "
                        f"train.batch_tokens={t.batch_tokens}: raise it or lower batch_tokens")
    if t.batch_tokens_total is not None and t.accumulate != 1:
        raise UserError("train.accumulate and train.batch_tokens_total both set: accumulation is derived from "
                        "batch_tokens_total; drop train.accumulate")
    if d.vocab_size < 16:
        raise UserError(f"data.vocab_size={d.vocab_size} is too small: use at least 16")
    if d.src_lang == d.tgt_lang:
        raise UserError(f"data.src_lang and data.tgt_lang are both {shown(d.src_lang)}: choose two languages")
    if data and d.source == "local" and not d.path:
        raise UserError("data.path is not set: pass data.path=FOLDER with {split}.{lang}[.gz] files "
                        "(e.g. data.path=../shared/data/multi30k), or data.source=hub")
    if data and d.source == "hub" and not d.hub_name:
        raise UserError("data.hub_name is not set: pass e.g. data.hub_name=wmt14 data.hub_config=de-en")
    for key in ("adam_eps", "lr_scale", "lr"):
        if getattr(t, key) <= 0:
            raise UserError(f"train.{key}={getattr(t, key)} must be positive")
    stray = [f"train.{k}" for k in PLATEAU_KEYS[1:] if getattr(t, k) != SCHEMA["train"][k][1]]
    if stray and t.lr_schedule == "noam":
        raise UserError(f"{', '.join(stray)}: only for train.lr_schedule=plateau (the default is noam, Eq. 3): "
                        f"set it, or drop {'it' if len(stray) == 1 else 'them'}")
    if not 0 < t.lr_decay_factor < 1:
        raise UserError(f"train.lr_decay_factor={t.lr_decay_factor} must be in (0, 1) (joeynmt: 0.7)")
    if t.clip_norm < 0:
        raise UserError(f"train.clip_norm={t.clip_norm} must be 0 (off) or positive")
    for key in ("max_time_minutes", "checkpoint_every_minutes"):
        if getattr(t, key) is not None and getattr(t, key) <= 0:
            raise UserError(f"train.{key}={getattr(t, key)} must be positive (or null for no limit)")
    if t.checkpoint_every_seconds is not None and t.checkpoint_every_seconds < 0:
        raise UserError(f"train.checkpoint_every_seconds={t.checkpoint_every_seconds} must be 0 (after every step), "
                        "positive, or null (the step interval alone)")
    if t.threads is not None and t.threads < 1:
        raise UserError(f"train.threads={t.threads} must be a positive thread count (or null: torch's choice)")
    check_devices(t.devices)
    check_data(d)
    check_decode(dec)
    if not all(isinstance(x, str) for x in cfg.wandb.tags):
        raise UserError(f"wandb.tags={shown(cfg.wandb.tags)} must be a list of strings")
    check_ranges(cfg)  # every number key's range (training/checks.py)
    cfg._validated = (state, data)


def has_data(cfg: Config) -> bool:
    """Whether the config names its data (data.path, or data.hub_name on the Hub): part of the run id."""
    return bool(cfg.data.path if cfg.data.source == "local" else cfg.data.hub_name)


def flatten(cfg: Config | dict) -> dict:
    """{"model": {"heads": 8}} -> {"model.heads": 8}: the paper's knob names as flat keys (W&B columns).
    Takes a :class:`Config` or a nested dict (a summary's "config")."""
    tree = cfg.to_dict() if isinstance(cfg, Config) else cfg
    return {f"{sec}.{k}": v for sec, body in tree.items() for k, v in body.items()}


def saved_yaml(cfg: Config) -> str:
    """The ``config.yaml`` a run keeps (and a sweep trial trains from): the resolved config as plain YAML, with
    secrets masked."""
    from .redact import scrub

    return dump_yaml(scrub(cfg.to_dict()))


def dump_yaml(cfg: Config | dict) -> str:
    return yaml.safe_dump(cfg.to_dict() if isinstance(cfg, Config) else cfg, sort_keys=False)
