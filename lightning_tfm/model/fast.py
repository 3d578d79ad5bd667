"""The model's CPU speed paths, in one place; none changes what the paper's model computes.

Each is switched by an argument and checked against the plain path it replaces in
tests/test_speed_paths.py (timings: reports/timing.md):

* attention kernel (config ``model.attention_kernel``): Eq. 1 as two
  batched matrix products with the softmax in fp32 (:func:`matmul_attention`) instead of torch's fused
  SDPA, for short sequences on CPU, where SDPA's per-call overhead and its casts dominate; its softmax is
  :class:`ScaledSoftmax` (whole-tensor operations: torch's CPU softmax goes row by row, slow over short rows). For long
  sequences SDPA's fused kernel avoids the (T, S) score matrix, so "auto" keeps it there;
* SDPA's core in fp32 when training in bf16 on CPU (:func:`sdpa_in_fp32`): torch's CPU flash-attention
  backward is much slower in bf16 than in fp32 while its forward is not;
* reused key/value buffers for incremental decoding (:class:`BufferedKVCache` instead of the plain
  :class:`~lightning_tfm.model.cache.KVCache`; ``Transformer.init_state``, beam search's state, takes it);
* a cheaper dropout mask (config ``model.fast_dropout``):
  :class:`FastDropout` instead of ``nn.Dropout``, the mask written in the activations' dtype (:func:`keep_mask_as`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import KVCache

# ----------------------------------------------------------------------------------------- attention kernel
ATTENTION_KERNELS = ("auto", "matmul", "sdpa")
MATMUL_MAX_KEYS = 128  # "auto": the matmul kernel on CPU up to this many keys, SDPA beyond


def attention_path(kernel: str, device: str, keys: int) -> str:
    """"matmul" (:func:`matmul_attention`) or "sdpa" (torch's fused kernels) for ``kernel`` ("auto" | "matmul" |
    "sdpa") on a ``device`` type with ``keys`` keys. "auto" takes the matmul path only for short sequences on
    CPU; on CUDA SDPA dispatches to its flash or memory-efficient kernels."""
    return "matmul" if kernel == "matmul" or (kernel == "auto" and device == "cpu" and keys <= MATMUL_MAX_KEYS) \
        else "sdpa"


def use_matmul(kernel: str, q: Tensor, k: Tensor) -> bool:
    """Whether attention of ``q`` over ``k`` takes :func:`matmul_attention` (else torch's SDPA)."""
    return attention_path(kernel, q.device.type, k.shape[-2]) == "matmul"


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float = 0.0) -> Tensor:
    """Eq. 1 as two batched matrix products in the inputs' dtype, the softmax in fp32 (:func:`attention_probs`). A
    fully masked row gives NaN, as in reference_attention. Attention dropout uses the fast mask below."""
    p = attention_probs(q, k, mask).to(v.dtype)
    if dropout > 0.0:
        p = fast_dropout(p, dropout)
    return p @ v


def attention_probs(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) in fp32, 0 where ``mask`` is False (a fully masked row: NaN). The product is cast to
    fp32 and masked in place, and the scale goes inside :class:`ScaledSoftmax`, so that the (B, h, T, S) scores are
    passed over few times, each of which autograd would repeat in the backward."""
    scores = (q @ k.transpose(-2, -1)).float()
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    return ScaledSoftmax.apply(scores, 1.0 / math.sqrt(q.shape[-1]))


class ScaledSoftmax(torch.autograd.Function):
    """softmax(scale * x) over the last dimension (scale > 0), as whole-tensor operations: torch's CPU softmax works
    row by row, and over rows as short as a sentence's keys its forward and backward took ~4x the time of these
    (fp32, 400 x 15 x 15: 2.3 ms against 0.57 ms, reports/timing.md). A row of -inf gives NaN, as torch's does."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        e = (x - x.amax(-1, keepdim=True)).mul_(scale).exp_()
        p = e.div_(e.sum(-1, keepdim=True))
        ctx.save_for_backward(p)
        ctx.scale = scale
        return p

    @staticmethod
    def backward(ctx, grad: Tensor):
        (p,) = ctx.saved_tensors
        return (grad - (grad * p).sum(-1, keepdim=True)).mul_(p).mul_(ctx.scale), None  # torch's order of operations


def sdpa_in_fp32(q: Tensor) -> bool:
    """SDPA's core runs in fp32 (the projections stay bf16) when training in bf16 on CPU: torch's CPU
    flash-attention backward is several times slower in bf16 than in fp32, while the forward is not."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_grad_enabled()


# ------------------------------------------------------------------------------------------- KV buffers
class BufferedKVCache(KVCache):
    """:class:`KVCache` working in two reused flat buffers per tensor.

    The plain ``torch.cat`` / ``index_select`` allocate fresh tensors at every decoding step, and fresh
    pages fault. Here each step is one ``index_select`` and one ``cat`` written with ``out=`` into a
    contiguous (rows, h, t, d) prefix of a buffer; ``reorder`` is applied lazily, at the next append, so
    two reorders compose into one selection. (Strided alternatives, e.g. Q K^T on a slice of a
    preallocated (rows, h, max_len, d) buffer, were slower than contiguous.) With gradients (not in
    decoding) the plain ops run, as ``out=`` records none.
    """

    def __init__(self):
        super().__init__()
        self._index: Tensor | None = None
        self._buffers: dict[tuple[str, int], Tensor] = {}
        self._slot = {"k": 0, "v": 0}

    def reorder(self, index: Tensor) -> None:
        self._index = index if self._index is None else self._index.index_select(0, index)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = self._extend("k", self.k, k)
        self.v = self._extend("v", self.v, v)
        self._index = None
        return self.k, self.v

    def _view(self, name: str, slot: int, shape, like: Tensor) -> Tensor:
        n = math.prod(shape)
        buf = self._buffers.get((name, slot))
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(2 * n, dtype=like.dtype, device=like.device)  # room to grow a few steps
            self._buffers[(name, slot)] = buf
        return buf[:n].view(shape)

    def _extend(self, name: str, old: Tensor | None, new: Tensor) -> Tensor:
        if old is None:
            return new.contiguous()
        if torch.is_grad_enabled() and (old.requires_grad or new.requires_grad):  # out= records no gradient
            if self._index is not None:
                old = old.index_select(0, self._index)
            return torch.cat([old, new], dim=2)
        slot = self._slot[name]  # the buffer ``old`` lives in (or 0 for the first, fresh tensor)
        if self._index is not None:
            slot = 1 - slot
            shape = (self._index.shape[0], *old.shape[1:])
            old = torch.index_select(old, 0, self._index, out=self._view(name, slot, shape, old))
        slot = 1 - slot
        shape = (new.shape[0], new.shape[1], old.shape[2] + new.shape[2], new.shape[3])
        out = torch.cat([old, new], dim=2, out=self._view(name, slot, shape, new))
        self._slot[name] = slot
        return out


# ----------------------------------------------------------------------------------------- dropout mask
# torch's CPU dropout draws one Mersenne-Twister number per element (``bernoulli_``), a noticeable part of
# a training step at small d_model. The mask here is drawn as 16-bit lanes of 64-bit random words (a
# quarter of the generator calls) and compared with a threshold. The drop probability is thereby rounded
# to a multiple of 1/65536 (0.1 becomes 0.100006), and the kept activations are scaled by
# 1 / (1 - that rounded p), so the expectation is exact. On other devices torch's own dropout runs.
LANES = 65536  # 16-bit lanes: drop probabilities are multiples of 1 / LANES


def rounded_p(p: float) -> float:
    """The drop probability the fast mask realises: p rounded to a multiple of 1/65536."""
    return round(p * LANES) / LANES


def _words(n: int, device) -> Tensor:
    """``n`` uniform int16 lanes, drawn as (n + 3) // 4 random 64-bit words (all 64 bits)."""
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2**63, None)
    return words.view(torch.int16)[:n]


def _threshold(p: float) -> int:
    return -LANES // 2 + round(p * LANES)  # int16 lanes are uniform on [-32768, 32767]


def keep_mask(shape, p: float, device="cpu") -> Tensor:
    """Bool mask, True with probability 1 - rounded_p(p) independently per element."""
    n = math.prod(int(s) for s in shape)
    return (_words(n, device) >= _threshold(p)).view(shape)


def keep_mask_as(shape, p: float, dtype: torch.dtype, device="cpu") -> Tensor:
    """:func:`keep_mask` (the same draws, so the same mask for the same random state) as 1 and 0 in ``dtype``: the
    comparison writes ``dtype`` at once (``torch.ge(..., out=)``), and a multiplication by it is a vectorised
    same-dtype product, where a bool mask takes torch's slow mixed-dtype path (~5x the time per element)."""
    n = math.prod(int(s) for s in shape)
    return torch.ge(_words(n, device), _threshold(p), out=torch.empty(n, dtype=dtype, device=device)).view(shape)


class _MaskedScale(torch.autograd.Function):
    """y = x * mask * scale; the backward applies the same mask and scale (as torch's native_dropout). ``mask``: 1
    and 0 in x's dtype (a product by 1 or 0 is exact, so the result is that of a bool mask)."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x.mul(mask).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).mul_(ctx.scale), None, None


def fast_dropout(x: Tensor, p: float, training: bool = True, mask: Tensor | None = None) -> Tensor:
    """Inverted dropout of ``x`` with probability ``p`` (identity when not training or p == 0).

    ``mask`` (bool, x's shape) fixes which elements are kept (tests); by default it is drawn with
    :func:`keep_mask_as` on CPU, and torch's own dropout runs on other devices and under torch.compile (which cannot
    trace the int16 view of the random words: ``train.compile`` with dropout failed before).
    """
    if not training or p == 0.0:
        return x
    if mask is None and (x.device.type != "cpu" or torch.compiler.is_compiling()):
        return F.dropout(x, p, True)  # torch.compile cannot trace the int16 view of the random words
    mask = keep_mask_as(x.shape, p, x.dtype, x.device) if mask is None else mask.to(x.dtype)
    return _MaskedScale.apply(x, mask, 1.0 / (1.0 - rounded_p(p)))


class FastDropout(nn.Module):
    """``nn.Dropout`` with the fast CPU mask above."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return fast_dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def make_dropout(p: float, fast: bool = True) -> nn.Module:
    """Dropout of probability ``p``: :class:`FastDropout`, or torch's ``nn.Dropout`` (``fast=False``)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return FastDropout(p) if fast else nn.Dropout(p)
