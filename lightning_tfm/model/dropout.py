"""Residual dropout (Section 5.4): "We apply dropout to the output of each sub-layer [...] and to the sums
of the embeddings and the positional encodings", P_drop = 0.1 for the base model.

A speed path (tests/test_speed_paths.py checks it against the definition). torch's CPU dropout draws one
Mersenne-Twister number per element (``bernoulli_``), measured here at 4.5 to 6 ms for a 128 x 20 x 256
activation: about 10% of a training step at d_model 256. The mask here is drawn as 16-bit lanes of
64-bit random words (a quarter of the generator calls) and compared with a threshold: 1.3 ms for the same
tensor. The drop probability is thereby rounded to a multiple of 1/65536 (0.1 becomes 0.100006), and the
kept activations are scaled by 1 / (1 - that rounded p), so the expectation is exact. On other devices,
and with ``fast=False``, torch's own dropout runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LANES = 65536  # 16-bit lanes: drop probabilities are multiples of 1 / LANES


def rounded_p(p: float) -> float:
    """The drop probability the fast mask realises: p rounded to a multiple of 1/65536."""
    return round(p * LANES) / LANES


def keep_mask(shape, p: float, device="cpu") -> Tensor:
    """Bool mask, True with probability 1 - rounded_p(p) independently per element."""
    n = 1
    for s in shape:
        n *= int(s)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2**63, None)  # all 64 bits
    threshold = -LANES // 2 + round(p * LANES)  # int16 lanes are uniform on [-32768, 32767]
    return (words.view(torch.int16)[:n] >= threshold).view(shape)


class _MaskedScale(torch.autograd.Function):
    """y = x * mask * scale; the backward applies the same mask and scale (as torch's native_dropout)."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x.mul(mask).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True, fast: bool = True, mask: Tensor | None = None) -> Tensor:
    """Inverted dropout of ``x`` with probability ``p`` (identity when not training or p == 0).

    ``mask`` (bool, x's shape) fixes which elements are kept (tests); by default it is drawn with
    :func:`keep_mask` on CPU.
    """
    if not training or p == 0.0:
        return x
    if mask is None and (not fast or x.device.type != "cpu"):
        return F.dropout(x, p, True)
    if mask is None:
        mask = keep_mask(x.shape, p, x.device)
    scale = 1.0 / (1.0 - rounded_p(p))
    return _MaskedScale.apply(x, mask, scale)


class Dropout(nn.Module):
    """nn.Dropout with the fast CPU mask above (``fast=False``: torch's own)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.fast = True

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.fast)

    def extra_repr(self) -> str:
        return f"p={self.p}"
