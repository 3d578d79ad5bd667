"""Positional encodings (Section 3.5): the paper's sinusoids, or learned vectors (Table 3 row E)."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoid_table(max_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    return pe.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoids (Sec. 3.5); a buffer, not a parameter."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.shape[0]:
            raise ValueError(f"sequence of {offset + length} positions exceeds "
                             f"model.max_positions={self.table.shape[0]}")
        return self.table[offset:offset + length]


class LearnedPositions(nn.Module):
    """One trained vector per position (Sec. 3.5, "learned positional embeddings"; Table 3 row E)."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.table = nn.Embedding(max_positions, d_model)
        # fairseq's LearnedPositionalEmbedding init: normal(0, d_model^-0.5), like the token embeddings.
        nn.init.normal_(self.table.weight, std=d_model ** -0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.num_embeddings:
            raise ValueError(f"sequence of {offset + length} positions exceeds "
                             f"model.max_positions={self.table.num_embeddings}")
        return self.table.weight[offset:offset + length]


def make_positions(kind: str, max_positions: int, d_model: int) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalPositions(max_positions, d_model)
    if kind == "learned":
        return LearnedPositions(max_positions, d_model)
    raise ValueError(f"model.positional must be 'sinusoidal' or 'learned', got {kind!r}")
