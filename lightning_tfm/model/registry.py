"""The architectures ``model.arch`` chooses from, and the one place a model is built (fairseq's
``register_model``).

An architecture is a class implementing :class:`~lightning_tfm.model.incremental.EncoderDecoder` (what training,
beam search and the reports use), registered under a name::

    @dataclass
    class ToyConfig(Section):
        hidden: int = field(default=64, metadata={"help": "width of the embeddings and the GRU state"})

    @register("toy", ToyConfig)
    class Toy(EncoderDecoder):
        def __init__(self, cfg: ToyConfig, vocab_size: int): ...

``model.arch: toy`` then builds ``Toy(section(cfg.model, "toy"), vocab)``, and the section's keys are config keys
of their own (``toy.hidden=32``; ``ltfm config --keys toy.`` lists them). The transformer's knobs are the model
section itself (``model.heads``), so that its configs, run ids and experiment files predate the registry
unchanged: ``model.arch: transformer`` is left out of a saved config and of the run id's hash, and so is every
other architecture's section. A knob given for an architecture that does not have it is an error
(:func:`check`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Callable

from ..base.knobs import Section, section_schema
from .config import ModelConfig
from .incremental import EncoderDecoder

DEFAULT_ARCH = "transformer"


@dataclass(frozen=True)
class Architecture:
    """A registry entry: the class built for ``model.arch: name`` and its config section (None: the model
    section's own knobs, the transformer's)."""

    name: str
    cls: type[EncoderDecoder]
    section: type[Section] | None


ARCHITECTURES: dict[str, Architecture] = {}


def register(name: str, section: type[Section] | None = None) -> Callable[[type], type]:
    """Class decorator: ``model.arch: name`` builds the class, as ``cls(cfg, vocab_size)`` with ``cfg`` its
    ``section`` (a :class:`~lightning_tfm.base.knobs.Section` dataclass whose fields are the section
    ``name``'s keys; None: the model section, :class:`ModelConfig`)."""
    if section is not None and not (dataclasses.is_dataclass(section) and issubclass(section, Section)):
        raise TypeError(f"the section of architecture {name!r} must be a dataclass deriving from "
                        f"lightning_tfm.base.knobs.Section, got {section!r}")

    def add(cls: type) -> type:
        if not issubclass(cls, EncoderDecoder):
            raise TypeError(f"architecture {name!r}: {cls.__name__} must derive from "
                            "lightning_tfm.model.incremental.EncoderDecoder")
        if section is not None and not section.SECTION:
            section.SECTION = name  # its keys' head in the messages of its checks (Section.problem)
        ARCHITECTURES[name] = Architecture(name, cls, section)
        return cls
    return add


def entry(cfg: ModelConfig) -> Architecture:
    """The registry entry ``cfg.arch`` names; ValueError listing the registered names for another name."""
    if cfg.arch not in ARCHITECTURES:
        raise ValueError(f"model.arch={cfg.arch!r} is not a registered architecture: use one of "
                         f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[cfg.arch]


def section(cfg: ModelConfig, name: str) -> Section:
    """The config of architecture ``name``: the model section itself for the transformer (any architecture
    without a section of its own), else its section, made with its defaults on first use and kept with ``cfg``."""
    kind = ARCHITECTURES[name].section if name in ARCHITECTURES else None
    if kind is None:
        return cfg
    if name not in cfg._sections:
        cfg._sections[name] = kind()
    return cfg._sections[name]


def made_sections(cfg: ModelConfig) -> dict[str, Section]:
    """The architectures' own sections made so far with ``cfg`` (:func:`section`), by name (a copy)."""
    return dict(cfg._sections)


def arch_config(cfg: ModelConfig) -> Section:
    """The config the chosen architecture is built from (:func:`section` of ``cfg.arch``)."""
    return section(cfg, entry(cfg).name)


def build_model(cfg: ModelConfig, vocab_size: int) -> EncoderDecoder:
    """The model ``cfg.arch`` names, with a vocabulary of ``vocab_size`` (the only place models are built)."""
    return entry(cfg).cls(arch_config(cfg), vocab_size)


def train_flops_per_step(cfg: ModelConfig, vocab_size: int, lengths: tuple[float, float], tokens: float) -> float:
    """Training FLOPs of one optimizer step of ``tokens`` target tokens (the one home of the count ``ltfm bench``,
    the sweep's equal-FLOPs budgets and the reports use): the chosen architecture's own ``train_flops_per_token`` at
    ``vocab_size`` and ``lengths`` (source, target tokens a sentence) x ``tokens``. NotImplementedError for an
    architecture that counts no FLOPs (:class:`~lightning_tfm.model.incremental.EncoderDecoder`'s default)."""
    return entry(cfg).cls.train_flops_per_token(arch_config(cfg), vocab_size, *lengths) * tokens


def count_parameters(cfg: ModelConfig, vocab_size: int) -> int:
    """The chosen architecture's parameter count (its own analytic count where it has one)."""
    return entry(cfg).cls.count_parameters(arch_config(cfg), vocab_size)


# ------------------------------------------------------------------------------------- config sections
def check(cfg: ModelConfig) -> str | None:
    """What is wrong with the architecture choice, in one line naming the key and the way out, else None:
    an unregistered ``model.arch``, a value its section refuses (:meth:`Section.problem`), a transformer knob
    (``model.heads``) given with another architecture, or a key of another architecture's section given.
    (The transformer's knobs, the model section's own: ``ModelConfig.problem``, with the config's other sections.)"""
    if cfg.arch not in ARCHITECTURES:
        return (f"model.arch={cfg.arch!r} is not a registered architecture: use one of "
                f"{', '.join(ARCHITECTURES)}")
    own = ARCHITECTURES[cfg.arch].section
    if own is not None:
        why = section(cfg, cfg.arch).problem()
        if why is not None:
            return why
        stray = [f"model.{k}" for k in sorted(cfg.given() - {"arch"})]
        if stray:
            which, them = (f"{stray[0]} does", "it") if len(stray) == 1 else (f"{', '.join(stray)} do", "them")
            return (f"{which} not apply to model.arch={cfg.arch} (transformer knobs): drop {them}; "
                    f"{cfg.arch}'s knobs are {cfg.arch}.*")
    for name, other in cfg._sections.items():
        if name != cfg.arch and other.given():
            keys = ", ".join(f"{name}.{k}" for k in sorted(other.given()))
            return (f"{keys} {'do' if ',' in keys else 'does'} not apply to model.arch={cfg.arch} (knobs of "
                    f"architecture {name}): drop {'them' if ',' in keys else 'it'}, or set model.arch={name}")
    return None


def saved_tree(tree: dict, cfg: ModelConfig) -> dict:
    """A config's nested dict (``Config.to_dict``) as it is saved and hashed: for the transformer, the model
    section without ``arch`` (as before the registry: same config.yaml, same run id); for another architecture,
    the model section holds only ``arch`` and the architecture's section follows it."""
    if cfg.arch == DEFAULT_ARCH:
        return {**tree, "model": {k: v for k, v in tree["model"].items() if k != "arch"}}
    own = ARCHITECTURES[cfg.arch].section is not None if cfg.arch in ARCHITECTURES else False
    out = {}
    for sec, body in tree.items():
        out[sec] = {"arch": cfg.arch} if sec == "model" and own else body
        if sec == "model" and own:
            out[cfg.arch] = dataclasses.asdict(section(cfg, cfg.arch))
    return out


def section_of(cfg: ModelConfig | None, name: str) -> Section:
    """``cfg.<name>`` of a whole config: the section of architecture ``name``; AttributeError for any other
    name (``Config.__getattr__``)."""
    if cfg is None or name not in ARCHITECTURES or ARCHITECTURES[name].section is None:
        raise AttributeError(name)
    return section(cfg, name)


def arch_help(help: str) -> str:
    """``model.arch``'s help with the architectures registered now: derived, so a new one is named there."""
    return f"{help}; registered: {' | '.join(ARCHITECTURES)}"


class Sections(Mapping):
    """{section: {key: (type spec, default, help)}}: the ``fixed`` sections ({name: dataclass}), then the section
    of every registered architecture that has one, as registered now (a test may register one); the model
    section's ``arch`` names the registered architectures in its help (:func:`arch_help`)."""

    def __init__(self, fixed: dict[str, type]):
        self._fixed = fixed
        self._schemas: dict[type, dict] = {}

    def _kinds(self) -> dict[str, type]:
        return {**self._fixed, **{n: a.section for n, a in ARCHITECTURES.items()
                                  if a.section is not None and n not in self._fixed}}

    def __getitem__(self, sec: str) -> dict[str, tuple]:
        kind = self._kinds()[sec]
        if kind not in self._schemas:
            self._schemas[kind] = section_schema(kind)
        schema = self._schemas[kind]
        if kind is ModelConfig:
            spec, default, help = schema["arch"]
            return {**schema, "arch": (spec, default, arch_help(help))}
        return schema

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds())

    def __len__(self) -> int:
        return len(self._kinds())
