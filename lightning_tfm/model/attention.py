"""Multi-head attention (Section 3.2 of Vaswani et al., 2017)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import fast
from .cache import KVCache, MemoryCache
from .config import ModelConfig


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    (Sec. 3.2.2).

    ``heads``, ``d_k`` and ``d_v`` are independent (Table 3 rows A and B): W^Q, W^K map d_model to
    heads*d_k, W^V maps d_model to heads*d_v, and W^O maps heads*d_v back to d_model.

    Its sizes are those of the model section ``cfg`` (:class:`~lightning_tfm.model.config.ModelConfig`:
    ``d_model``, ``heads``, ``d_k``, ``d_v``, ``attention_dropout``, ``attention_kernel``).

    The three input projections live in one matrix ``in_proj`` (rows: Q | K | V) so that
    self-attention is a single matrix product (``fused=True``); ``fused=False`` runs the same weights
    as three products, which the tests use to check the fused path. ``kernel`` chooses how Eq. 1 is
    computed (:func:`scaled_dot_product_attention`).

    ``keep_weights`` (False by default) makes it keep its attention probabilities softmax(Q K^T / sqrt(d_k)),
    (B, h, T, S) in fp32, in ``attention_weights``: Eq. 1 then takes the plain matmul path
    (:func:`attention_with_weights`; the fused kernels give no weights). ``Transformer.features(...,
    need_attention=True)`` sets it on one layer for one call.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_model, heads, d_k, d_v, kernel = cfg.d_model, cfg.heads, cfg.d_k, cfg.d_v, cfg.attention_kernel
        if kernel not in fast.ATTENTION_KERNELS:
            raise ValueError(f"attention kernel must be one of {', '.join(fast.ATTENTION_KERNELS)}, got {kernel!r}")
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.in_proj = nn.Linear(d_model, heads * (2 * d_k + d_v))
        self.out_proj = nn.Linear(heads * d_v, d_model)  # W^O
        self.attention_dropout = cfg.attention_dropout
        self.kernel = kernel
        self.fused = True
        self.keep_weights = False
        self.attention_weights: Tensor | None = None
        # Xavier-uniform per projection, as fairseq/tensor2tensor initialise each W separately.
        for start, size in self._slices():
            nn.init.xavier_uniform_(self.in_proj.weight[start:start + size])
        nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _slices(self):
        hk, hv = self.heads * self.d_k, self.heads * self.d_v
        return [(0, hk), (hk, hk), (2 * hk, hv)]

    def _project(self, x: Tensor, part: slice) -> Tensor:
        if part == slice(None):  # the parameter itself: autocast casts it once per region, a view every call
            return self.in_proj(x)
        return F.linear(x, self.in_proj.weight[part], self.in_proj.bias[part])

    def _split_heads(self, x: Tensor, d: int) -> Tensor:  # (B, T, h*d) -> (B, h, T, d)
        return x.view(x.shape[0], x.shape[1], self.heads, d).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """K = memory W^K, V = memory W^V, split into heads."""
        hk = self.heads * self.d_k
        if self.fused:
            kv = self._project(memory, slice(hk, None))
            k, v = kv.split([hk, self.heads * self.d_v], dim=-1)
        else:
            k = self._project(memory, slice(hk, 2 * hk))
            v = self._project(memory, slice(2 * hk, None))
        return self._split_heads(k, self.d_k), self._split_heads(v, self.d_v)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | MemoryCache | None = None,
    ) -> Tensor:
        """Attend from ``query`` (B, T, d_model) to ``memory`` (B, S, d_model), or to itself if None.

        mask: bool, broadcastable to (B, h, T, S), True where attention is allowed.
        causal: masked self-attention of the decoder (Sec. 3.2.3): position i sees positions <= i.
        cache: incremental decoding (model/cache.py). For self-attention a :class:`KVCache` of the
        keys/values of earlier target positions; for encoder-decoder attention a :class:`MemoryCache`
        holding the projected memory (and saying which query rows attend to which memory row).
        """
        hk = self.heads * self.d_k
        if memory is None:  # self-attention
            if self.fused:
                q, k, v = self._project(query, slice(None)).split([hk, hk, self.heads * self.d_v], dim=-1)
            else:
                q, k, v = (self._project(query, slice(s, s + n)) for s, n in self._slices())
            q, k, v = self._split_heads(q, self.d_k), self._split_heads(k, self.d_k), self._split_heads(v, self.d_v)
            if cache is not None:
                k, v = cache.append(k, v)
                # With a cache, queries are the newest positions; every cached key is in their past.
                causal = causal and q.shape[2] > 1
        else:  # encoder-decoder attention
            if cache is None:
                k, v = self.project_kv(memory)
                rows = query
            else:
                k, v = cache.keys_values(self, memory)
                rows = cache.queries(query, k.shape[0])
            q = self._split_heads(self._project(rows, slice(0, hk)), self.d_k)
        dropout = self.attention_dropout if self.training else 0.0
        if self.keep_weights:
            out, self.attention_weights = attention_with_weights(q, k, v, causal_mask(q, k, mask) if causal else mask,
                                                                 dropout)
        else:
            out = scaled_dot_product_attention(q, k, v, mask, causal, dropout, self.kernel)
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], self.heads * self.d_v)
        return self.out_proj(out)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                                 dropout: float = 0.0, kernel: str = "auto") -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (Sec. 3.2.1, Eq. 1).

    d_k and d_v may differ. ``causal`` with a query shorter than the keys (a prefix being extended)
    aligns the queries with the last key positions. ``kernel``: "sdpa" is torch's fused kernel,
    "matmul" and "auto" (matmul for short sequences on CPU) are speed paths, see model/fast.py.
    """
    if fast.use_matmul(kernel, q, k):
        return fast.matmul_attention(q, k, v, causal_mask(q, k, mask) if causal else mask, dropout)
    return sdpa_attention(q, k, v, mask, dropout, causal)


def attention_with_weights(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float = 0.0
                           ) -> tuple[Tensor, Tensor]:
    """Eq. 1 as :func:`~lightning_tfm.model.fast.matmul_attention` computes it (the same products, so the same
    output), and its probabilities softmax(Q K^T / sqrt(d_k)) (B, h, T, S) in fp32, before attention dropout:
    0 where ``mask`` is False, each unmasked row summing to 1."""
    p = fast.attention_probs(q, k, mask)
    kept = p.to(v.dtype)
    return (fast.fast_dropout(kept, dropout) if dropout > 0.0 else kept) @ v, p


def causal_mask(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """``mask`` and the causal triangle, the queries aligned with the last keys."""
    t, s = q.shape[-2], k.shape[-2]
    tri = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
    return tri if mask is None else mask & tri


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float = 0.0,
                   causal: bool = False) -> Tensor:
    """Eq. 1 via torch's fused scaled_dot_product_attention. The decoder's self-attention in training
    (causal, queries = keys, no other mask) goes as ``is_causal`` with no mask tensor: on CUDA that is what
    lets SDPA choose its flash kernel; an explicit mask leaves it the memory-efficient one."""
    is_causal = causal and mask is None and q.shape[-2] == k.shape[-2]
    if causal and not is_causal:
        mask = causal_mask(q, k, mask)
    if fast.sdpa_in_fp32(q):
        # autocast is switched off around it, or SDPA would cast the inputs straight back to bf16
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                  dropout_p=dropout, is_causal=is_causal).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Eq. 1 written out, for tests of the kernels."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v
