"""Encoder and decoder layers (Section 3.1) and the position-wise feed-forward network (Section 3.3)."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .config import ModelConfig
from .fast import make_dropout


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2  (Sec. 3.3, Eq. 2), inner width d_ff; with ``model.activation: gelu``,
    GELU(x W_1 + b_1) W_2 + b_2, GELU(x) = x Phi(x) with Phi the standard normal CDF (Hendrycks & Gimpel, 2016), as
    BERT's (Devlin et al., 2019) and GPT's (Radford et al., 2018) feed-forward layers (torch's exact erf form)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_model, d_ff = cfg.d_model, cfg.d_ff
        self.activation = F.gelu if cfg.activation == "gelu" else F.relu
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        for w in (self.w_1, self.w_2):
            nn.init.xavier_uniform_(w.weight)
            nn.init.zeros_(w.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class Residual(nn.Module):
    """A sublayer wrapped in dropout, a residual connection and layer normalization (Sec. 3.1, 5.4).

    norm="post" (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    norm="pre" (Wang et al., 2019; fairseq's normalize_before): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = make_dropout(cfg.dropout, cfg.fast_dropout)
        self.pre = cfg.norm == "pre"

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each a residual sublayer (Sec. 3.1, "Encoder")."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.sub_attn = Residual(cfg)
        self.sub_ffn = Residual(cfg)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sub_attn(x, lambda y: self.self_attn(y, mask=src_mask))
        return self.sub_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Sec. 3.1, "Decoder")."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.sub_self = Residual(cfg)
        self.sub_cross = Residual(cfg)
        self.sub_ffn = Residual(cfg)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor, cache: dict | None = None) -> Tensor:
        """``cache`` (incremental decoding, model/cache.py): {"self": KVCache or None, "cross": MemoryCache}."""
        cache = cache or {}
        y = self.sub_self(y, lambda z: self.self_attn(z, causal=True, cache=cache.get("self")))
        y = self.sub_cross(y, lambda z: self.cross_attn(z, memory, mask=src_mask, cache=cache.get("cross")))
        return self.sub_ffn(y, self.ffn)
