"""The model section of an experiment config, as a typed dataclass (fairseq style), and the schema of a section.

:class:`ModelConfig` holds ``arch`` (which registered architecture is built: model/registry.py) and the
architecture knobs of the paper's Transformer (Vaswani et al., 2017, Table 3 column names in the help strings),
plus two speed switches that change rounding and random draws, not the model. Another architecture's knobs are
its own :class:`Section` dataclass, a config section of its own (``toy.hidden``), kept beside the model section
(:func:`lightning_tfm.model.registry.section`). This module imports nothing of the training layer; the training config
(``training/config.py``) embeds it as ``Config.model`` and lists every section with :func:`section_schema`.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

# The largest sizes a model section takes (the training config's range checks and an architecture's own
# Section.problem read them): far above any model of the paper, below what overflows or cannot be allocated (a
# positional table of MAX_POSITIONS x d_model, an attention map of MAX_POSITIONS squared a head).
MAX_WIDTH = 65536      # an embedding, hidden or head width
MAX_LAYERS = 1000      # stacked layers
MAX_POSITIONS = 65536  # the longest sequence (model.max_positions; BOS or EOS included)

# A type spec (generated from a field's annotation): int, float, str, bool, list, ("choice", a, b, ...)
# or ("optional", spec).
OPT = "optional"


def type_spec(hint) -> Any:
    """A field annotation as a type spec."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return ("choice",) + typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return (OPT, type_spec(inner))
    if origin is list:
        return list
    return hint


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def section_schema(kind: type) -> dict[str, tuple]:
    """{key: (type spec, default, help)} of a section dataclass: what validation, overrides and
    ``ltfm config --keys`` read."""
    hints = typing.get_type_hints(kind)
    return {f.name: (type_spec(hints[f.name]), default_of(f), f.metadata["help"]) for f in dataclasses.fields(kind)}


class Section:
    """Base of a config section dataclass: it remembers which keys were set after it was made (:meth:`given`),
    so that a knob given for an architecture that does not have it is an error (model/registry.py), while
    the defaults it carries are not."""

    def __post_init__(self):
        object.__setattr__(self, "_given", set())

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if "_given" in self.__dict__:
            self._given.add(name)

    def given(self) -> set[str]:
        """The keys set since the section was made (by the YAML, an override, a sweep variant)."""
        return set(self.__dict__.get("_given", ()))

    def problem(self) -> str | None:
        """What is wrong with the values, in one line naming the key and the way out (None: nothing): an
        architecture's section checks its ranges here, and config validation stops on it before any work."""
        return None


@dataclass
class ModelConfig(Section):
    arch: str = field(default="transformer", metadata={
        "help": "architecture to build (model/registry.py): transformer (the knobs below), or another registered "
                "one, whose knobs are its own section"})
    layers: int = field(default=6, metadata={"help": "N: identical layers in the encoder stack and in the decoder "
                                                     "stack (Sec. 3.1)"})
    d_model: int = field(default=512, metadata={"help": "d_model: width of every sublayer output and of the "
                                                        "embeddings (Sec. 3.1)"})
    d_ff: int = field(default=2048, metadata={"help": "d_ff: inner width of the position-wise feed-forward "
                                                      "networks (Sec. 3.3)"})
    heads: int = field(default=8, metadata={"help": "h: parallel attention heads per multi-head attention "
                                                    "(Sec. 3.2.2)"})
    d_k: int = field(default=64, metadata={"help": "d_k: width of each head's queries and keys (Sec. 3.2.2)"})
    d_v: int = field(default=64, metadata={"help": "d_v: width of each head's values (Sec. 3.2.2)"})
    dropout: float = field(default=0.1, metadata={"help": "P_drop: residual dropout on every sublayer output and "
                                                          "on the embedding sums (Sec. 5.4)"})
    attention_dropout: float = field(default=0.0, metadata={
        "help": "dropout on attention weights (not in the paper; fairseq's attention_dropout)"})
    positional: Literal["sinusoidal", "learned"] = field(default="sinusoidal", metadata={
        "help": "positional encoding: the paper's fixed sinusoids (Sec. 3.5) or learned position embeddings "
                "(Table 3 row E)"})
    norm: Literal["post", "pre"] = field(default="post", metadata={
        "help": "post: the paper's LayerNorm(x + Sublayer(x)); pre: x + Sublayer(LayerNorm(x))"})
    max_positions: int = field(default=1024, metadata={
        "help": "longest sequence (learned positions have one vector each)"})
    attention_kernel: Literal["auto", "matmul", "sdpa"] = field(default="auto", metadata={
        "help": "how Eq. 1 is computed: sdpa (torch's fused kernel), matmul, auto (matmul for short sequences "
                "on CPU; model/fast.py)"})
    fast_dropout: bool = field(default=True, metadata={
        "help": "dropout mask drawn as 16-bit lanes on CPU (speed path, model/fast.py); false: torch's dropout"})

