"""The model section of an experiment config, as a typed dataclass (fairseq style): :class:`ModelConfig`, a
:class:`~lightning_tfm.base.knobs.Section` of :func:`~lightning_tfm.base.knobs.knob` fields (what a section and a
knob are, their checks and their Table 3 columns: :mod:`lightning_tfm.base.knobs`), and the largest sizes a model
section takes.

:class:`ModelConfig` holds ``arch`` (which registered architecture is built: model/registry.py) and the
architecture knobs of the paper's Transformer (Vaswani et al., 2017, Table 3 column names in the help strings),
plus two speed switches that change rounding and random draws, not the model. Another architecture's knobs are
its own :class:`Section` dataclass, a config section of its own (``toy.hidden``), kept beside the model section
(:func:`lightning_tfm.model.registry.section`). This module imports nothing of the training layer; the training config
(``training/config/config.py``) embeds it as ``Config.model`` and lists every section with
:func:`~lightning_tfm.base.knobs.section_schema`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..base.knobs import UNIT, Range, Section, Table3, knob

# The largest sizes a model section takes (the model's ranges, an architecture's own section's, ``ltfm bench``'s
# settings): far above any model of the paper, below what overflows or cannot be allocated (a positional table of
# MAX_POSITIONS x d_model, an attention map of MAX_POSITIONS squared a head).
MAX_WIDTH = 65536      # an embedding, hidden or head width
MAX_LAYERS = 1000      # stacked layers
MAX_POSITIONS = 65536  # the longest sequence (model.max_positions; BOS or EOS included)

WIDTH, LAYERS = Range(1, MAX_WIDTH), Range(1, MAX_LAYERS)


@dataclass
class ModelConfig(Section):
    SECTION: ClassVar[str] = "model"

    arch: str = knob("transformer", "architecture to build (model/registry.py): transformer (the knobs below), or "
                                    "another registered one, whose knobs are its own section")
    layers: int = knob(6, "N: identical layers in the encoder stack and in the decoder stack (Sec. 3.1)", LAYERS,
                       Table3("N", 1, tex="$N$"))
    d_model: int = knob(512, "d_model: width of every sublayer output and of the embeddings (Sec. 3.1)",
                        Range(2, MAX_WIDTH), Table3("d_model", 2, tex=r"$d_{\mathrm{model}}$"))
    d_ff: int = knob(2048, "d_ff: inner width of the position-wise feed-forward networks (Sec. 3.3)", WIDTH,
                     Table3("d_ff", 3, tex=r"$d_{\mathrm{ff}}$"))
    activation: Literal["relu", "gelu"] = knob(
        "relu", "the feed-forward networks' nonlinearity: relu, the paper's max(0, x W_1 + b_1) (Sec. 3.3, Eq. 2), "
                "or gelu (Hendrycks & Gimpel, 2016), x Phi(x), as in BERT (Devlin et al., 2019) and GPT (Radford et "
                "al., 2018)", table3=Table3("activation", 11, label="{} FFN"))
    heads: int = knob(8, "h: parallel attention heads per multi-head attention (Sec. 3.2.2)", Range(1, 1024),
                      Table3("h", 4, csv="heads", tex="$h$"))
    d_k: int = knob(64, "d_k: width of each head's queries and keys (Sec. 3.2.2)", WIDTH, Table3("d_k", 5, tex="$d_k$"))
    d_v: int = knob(64, "d_v: width of each head's values (Sec. 3.2.2)", WIDTH, Table3("d_v", 6, tex="$d_v$"))
    dropout: float = knob(0.1, "P_drop: residual dropout on every sublayer output and on the embedding sums "
                               "(Sec. 5.4)", UNIT, Table3("P_drop", 7, tex=r"$P_{\mathrm{drop}}$"))
    attention_dropout: float = knob(0.0, "dropout on attention weights (not in the paper; fairseq's "
                                         "attention_dropout)", UNIT)
    positional: Literal["sinusoidal", "learned"] = knob(
        "sinusoidal", "positional encoding: the paper's fixed sinusoids (Sec. 3.5) or learned position embeddings "
                      "(Table 3 row E)", table3=Table3("positional", 9, label="{} positions"))
    norm: Literal["post", "pre"] = knob("post", "post: the paper's LayerNorm(x + Sublayer(x)); pre: x + "
                                                "Sublayer(LayerNorm(x))", table3=Table3("norm", 10, label="{}-norm"))
    max_positions: int = knob(1024, "longest sequence (learned positions have one vector each)",
                              Range(1, MAX_POSITIONS))
    attention_kernel: Literal["auto", "matmul", "sdpa"] = knob(
        "auto", "how Eq. 1 is computed: sdpa (torch's fused kernel), matmul, auto (matmul for short sequences on "
                "CPU; model/fast.py)", hashed=False)
    fast_dropout: bool = knob(True, "dropout mask drawn as 16-bit lanes on CPU (speed path, model/fast.py); false: "
                                    "torch's dropout", hashed=False)

    def __post_init__(self):
        super().__post_init__()
        #: State, no key (an attribute, no field: see Section): the sections of the registered architectures that
        #: have one, by name, each made at its defaults on first use and kept with the model's
        #: (model/registry.py's section(); its keys ``toy.hidden`` are config keys of their own).
        self._sections: dict[str, Section] = {}

    def problem(self) -> str | None:
        if self.d_model % 2:
            return f"model.d_model={self.d_model} must be even (sinusoids come in sin/cos pairs)"
        return super().problem()
