"""The Transformer encoder-decoder (Section 3, Figure 1) with shared embeddings (Section 3.4)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import KVCache, MemoryCache
from .config import ModelConfig
from .fast import make_dropout
from .layers import DecoderLayer, EncoderLayer
from .positional import make_positions

PAD, BOS, EOS, UNK = 0, 1, 2, 3  # fixed ids of the special tokens in every vocabulary we build


class Transformer(nn.Module):
    """Encoder-decoder of "Attention Is All You Need".

    One weight matrix serves as source embedding, target embedding and pre-softmax projection
    (Sec. 3.4); embeddings are multiplied by sqrt(d_model). Dropout is applied to the sums of
    embeddings and positional encodings (Sec. 5.4).

    ``attention_kernel`` ("auto" | "matmul" | "sdpa") and ``fast_dropout`` switch the CPU speed paths
    (model/fast.py); they change rounding and random draws, not the model.
    """

    def __init__(self, vocab_size: int, layers: int = 6, d_model: int = 512, d_ff: int = 2048, heads: int = 8,
                 d_k: int = 64, d_v: int = 64, dropout: float = 0.1, positional: str = "sinusoidal",
                 norm: str = "post", max_positions: int = 1024, attention_dropout: float = 0.0,
                 attention_kernel: str = "auto", fast_dropout: bool = True):
        super().__init__()
        self.d_model, self.vocab_size = d_model, vocab_size
        self.attention_kernel = attention_kernel
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        # fairseq/tensor2tensor: embeddings ~ N(0, d_model^-0.5), so that embed * sqrt(d_model) has unit scale.
        nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
        self.positions = make_positions(positional, max_positions, d_model)
        self.dropout = make_dropout(dropout, fast_dropout)
        args = (d_model, d_ff, heads, d_k, d_v, dropout, norm, attention_dropout, attention_kernel, fast_dropout)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args) for _ in range(layers))
        # Pre-norm leaves the residual stream un-normalised: a final LayerNorm on each stack (fairseq).
        self.encoder_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    @classmethod
    def from_config(cls, cfg: ModelConfig, vocab_size: int) -> "Transformer":
        """The model of an experiment's ``model`` section (:class:`ModelConfig`)."""
        return cls(vocab_size, layers=cfg.layers, d_model=cfg.d_model, d_ff=cfg.d_ff, heads=cfg.heads, d_k=cfg.d_k,
                   d_v=cfg.d_v, dropout=cfg.dropout, positional=cfg.positional, norm=cfg.norm,
                   max_positions=cfg.max_positions, attention_dropout=cfg.attention_dropout,
                   attention_kernel=cfg.attention_kernel, fast_dropout=cfg.fast_dropout)

    def set_fused(self, fused: bool) -> None:
        """Fused (one matrix product for Q, K, V) or unfused input projections; same weights."""
        for m in self.modules():
            if hasattr(m, "fused"):
                m.fused = fused

    def embed_tokens(self, tokens: Tensor, offset: int = 0) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.d_model)
        return self.dropout(x + self.positions(tokens.shape[1], offset).to(x.dtype))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids, right-padded -> memory (B, S, d_model) and key mask (B, 1, 1, S)."""
        src_mask = (src != PAD)[:, None, None, :]
        x = self.embed_tokens(src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: list | None = None,
               offset: int = 0) -> Tensor:
        """tgt_in (B, T) shifted-right target ids -> logits (B, T, vocab).

        With ``cache`` (:meth:`new_cache`), only the new positions are fed, starting at ``offset``.
        """
        return self.project(self.decode_states(tgt_in, memory, src_mask, cache, offset))

    def decode_states(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: list | None = None,
                      offset: int = 0) -> Tensor:
        """The decoder's output (B, T, d_model), before the pre-softmax projection."""
        y = self.embed_tokens(tgt_in, offset)
        for i, layer in enumerate(self.decoder):
            y = layer(y, memory, src_mask, None if cache is None else cache[i])
        return self.decoder_norm(y)

    def project(self, states: Tensor) -> Tensor:
        """Pre-softmax linear transformation with the shared embedding matrix (Sec. 3.4)."""
        # F.linear on the parameter itself lets autocast cast it once per autocast region (a transposed
        # view would be cast again at every call, i.e. every decoding step)
        return F.linear(states, self.embed.weight)

    @property
    def output_weight(self) -> Tensor:
        """The (vocab, d_model) matrix of :meth:`project` (for the fused loss, training/loss.py)."""
        return self.embed.weight

    def features(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Decoder output states (B, T, d_model) for teacher-forced ``tgt_in``: ``forward`` without ``project``."""
        memory, src_mask = self.encode(src)
        return self.decode_states(tgt_in, memory, src_mask)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.project(self.features(src, tgt_in))

    def new_cache(self, kv_cache=KVCache, memory_cache=MemoryCache) -> list[dict]:
        """Per decoder layer: {"self": a new ``kv_cache()`` (None: the prefix is recomputed instead),
        "cross": a new ``memory_cache()``} (model/cache.py; decode.py passes its faster kinds)."""
        return [{"self": kv_cache() if kv_cache else None, "cross": memory_cache()} for _ in self.decoder]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def count_parameters(vocab_size: int, layers: int, d_model: int, d_ff: int, heads: int, d_k: int, d_v: int,
                     positional: str = "sinusoidal", norm: str = "post", max_positions: int = 1024, **_) -> int:
    """Analytic parameter count of :class:`Transformer`, written out from Section 3."""
    attention = d_model * heads * (2 * d_k + d_v) + heads * (2 * d_k + d_v) + heads * d_v * d_model + d_model
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    layer_norm = 2 * d_model
    encoder = layers * (attention + ffn + 2 * layer_norm)
    decoder = layers * (2 * attention + ffn + 3 * layer_norm)
    final_norms = 2 * layer_norm if norm == "pre" else 0
    positions = max_positions * d_model if positional == "learned" else 0
    return vocab_size * d_model + positions + encoder + decoder + final_norms
