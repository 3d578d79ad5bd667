"""What every architecture implements: training's forward pass, and the incremental-decoder protocol beam search
talks to (fairseq's ``FairseqEncoderDecoderModel`` with a ``FairseqIncrementalDecoder``).

Beam search (training/decode.py) encodes a batch once, then feeds one new token per hypothesis and step, carrying a
decoder state between steps; when it re-ranks hypotheses it reorders that state, and when sentences finish it
drops their rows from the state and the encoder output. It never looks inside either: the state and the encoder
output are whatever the architecture makes them (the Transformer's: its per-layer key/value caches, and the
encoder memory with its padding mask).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EncoderDecoder(nn.Module):
    """Base class of a registered architecture (model/registry.py), built as ``cls(cfg, vocab_size)``.

    Attributes every architecture sets: ``vocab_size``; ``d_model``, the width the learning-rate schedule is
    scaled by (``d_model ** -0.5``, Eq. 3); ``max_positions``, the longest sequence (BOS or EOS included) it
    takes (sources are cut to it, outputs end before it); ``shares_encoder_rows`` (see :meth:`decode_step`).

    Training (training/lit.py, training/loss.py): :meth:`features` gives the decoder's output states of a
    teacher-forced target, and the logits are ``features @ output_weight.T`` (:meth:`project`, no bias), which
    the fused loss computes chunk-wise from :attr:`output_weight`.
    """

    vocab_size: int
    d_model: int
    max_positions: int
    #: whether :meth:`decode_step` takes an encoder output with one row per group of consecutive token rows
    shares_encoder_rows: bool = False
    #: What the architecture's attention maps are, as a figure's title says it (None: it gives none). One that
    #: gives them takes ``features(src, tgt_in, need_attention=True)`` and returns ``(states, weights)``, the
    #: weights ``(B, heads, T, S)`` or ``(B, T, S)`` (report/views/attention.py draws them).
    ATTENTION: str | None = None
    #: Whether its attention has several heads worth a figure each (the report's ``*_heads.png``).
    ATTENTION_HEADS: bool = False

    @classmethod
    def describe(cls, cfg) -> str:
        """The architecture's shapes in a few words, of its config section ``cfg`` (``ltfm bench``'s first line):
        by default every field of the section."""
        fields = getattr(cfg, "__dataclass_fields__", {})
        return ", ".join(f"{k} {getattr(cfg, k)}" for k in fields if not k.startswith("_"))

    # ------------------------------------------------------------------------------------------ training
    def features(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S) right-padded source ids, tgt_in (B, T) shifted-right target ids -> (B, T, d) states."""
        raise NotImplementedError

    @property
    def output_weight(self) -> Tensor:
        """The (vocab, d) matrix of the pre-softmax projection."""
        raise NotImplementedError

    def project(self, states: Tensor) -> Tensor:
        """Logits of decoder states: ``states @ output_weight.T``."""
        return F.linear(states, self.output_weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, vocab) of a teacher-forced target."""
        return self.project(self.features(src, tgt_in))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -------------------------------------------------------------------------------- incremental decoding
    def encode(self, src: Tensor) -> Any:
        """The encoder output of src (B, S): anything :meth:`decode_step` and :meth:`reorder_encoder_out`
        take, with B rows."""
        raise NotImplementedError

    def reorder_encoder_out(self, encoder_out: Any, index: Tensor) -> Any:
        """The encoder output's rows ``index`` (in that order): beam search repeats them per beam, or drops
        finished sentences."""
        raise NotImplementedError

    def init_state(self, encoder_out: Any) -> Any:
        """A fresh decoder state (nothing generated yet) for decoding against ``encoder_out``."""
        raise NotImplementedError

    def decode_step(self, tokens: Tensor, encoder_out: Any, state: Any | None) -> Tensor:
        """The decoder's output states (rows, d) at the newest position, before :meth:`project`.

        With a ``state`` (:meth:`init_state`), ``tokens`` (rows, 1) is each row's newest token: the earlier
        ones are in the state, which this step extends. With ``state=None``, ``tokens`` (rows, t) is the whole
        prefix (BOS first), recomputed: the plain path incremental decoding is tested against.
        ``encoder_out`` has ``rows`` rows, or, if :attr:`shares_encoder_rows`, ``rows / k`` rows each serving
        k consecutive token rows (beam search's K beams of a sentence).
        """
        raise NotImplementedError

    def reorder_state(self, state: Any, index: Tensor, encoder_index: Tensor | None = None) -> None:
        """Keep the state's rows ``index`` (in that order; hypotheses re-ranked, expanded or dropped), and
        the parts derived from the encoder output at its rows ``encoder_index`` (None: they stay)."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------- accounting
    @classmethod
    def count_parameters(cls, cfg, vocab_size: int) -> int:
        """The parameter count of ``cls(cfg, vocab_size)``; here by building it on the meta device (no memory,
        no time), an architecture may write its analytic count instead."""
        with torch.device("meta"):
            return cls(cfg, vocab_size).num_parameters()

    @classmethod
    def train_flops_per_token(cls, cfg, vocab_size: int, src_len: float, tgt_len: float) -> float:
        """Model FLOPs of training (forward and backward) per target token, sentences of ``src_len`` source
        and ``tgt_len`` target tokens (``ltfm bench``'s MFU, the report's equal-compute column)."""
        raise NotImplementedError(f"{cls.__name__} has no training FLOPs count")

    @classmethod
    def decode_flops_per_token(cls, cfg, vocab_size: int, src_len: float, tgt_len: float) -> float:
        """Model FLOPs of incremental decoding per generated token and hypothesis, a sentence's encoding
        shared out over its ``tgt_len`` tokens."""
        raise NotImplementedError(f"{cls.__name__} has no decoding FLOPs count")
