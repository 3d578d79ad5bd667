"""The model section of an experiment config, as a typed dataclass (fairseq style).

:class:`ModelConfig` holds the architecture knobs of the paper (Vaswani et al., 2017, Table 3 column names in
the help strings) plus two speed switches that change rounding and random draws, not the model.
:meth:`Transformer.from_config <lightning_tfm.model.transformer.Transformer.from_config>` builds the model
from it. This module imports nothing of the training layer; the training config (``training/config.py``)
embeds it as ``Config.model``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
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
