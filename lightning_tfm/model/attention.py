"""Multi-head attention (Section 3.2 of Vaswani et al., 2017)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)  (Sec. 3.2.2).

    ``heads``, ``d_k`` and ``d_v`` are independent (Table 3 rows A and B): W^Q, W^K map d_model to
    heads*d_k, W^V maps d_model to heads*d_v, and W^O maps heads*d_v back to d_model.

    The three input projections live in one matrix ``in_proj`` (rows: Q | K | V) so that
    self-attention is a single matrix product (``fused=True``); ``fused=False`` runs the same weights
    as three products, which the tests use to check the fused path.
    """

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, attention_dropout: float = 0.0):
        super().__init__()
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.in_proj = nn.Linear(d_model, heads * (2 * d_k + d_v))
        self.out_proj = nn.Linear(heads * d_v, d_model)  # W^O
        self.attention_dropout = attention_dropout
        self.fused = True
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
        return F.linear(x, self.in_proj.weight[part], self.in_proj.bias[part])

    def _split_heads(self, x: Tensor, d: int) -> Tensor:  # (B, T, h*d) -> (B, h, T, d)
        return x.view(x.shape[0], x.shape[1], self.heads, d).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """K = memory W^K, V = memory W^V, split into heads (cached once per sentence when decoding)."""
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
        cache: dict | None = None,
    ) -> Tensor:
        """Attend from ``query`` (B, T, d_model) to ``memory`` (B, S, d_model), or to itself if None.

        mask: bool, broadcastable to (B, h, T, S), True where attention is allowed.
        causal: masked self-attention of the decoder (Sec. 3.2.3): position i sees positions <= i.
        cache: incremental decoding. For self-attention, keys/values of earlier target positions are
        appended under "k"/"v"; for encoder-decoder attention the projected memory is stored once.
        """
        hk = self.heads * self.d_k
        if memory is None:  # self-attention
            if self.fused:
                q, k, v = self._project(query, slice(None)).split([hk, hk, self.heads * self.d_v], dim=-1)
            else:
                q, k, v = (self._project(query, slice(s, s + n)) for s, n in self._slices())
            q, k, v = self._split_heads(q, self.d_k), self._split_heads(k, self.d_k), self._split_heads(v, self.d_v)
            if cache is not None:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
                # With a cache, queries are the newest positions; every cached key is in their past.
                causal = causal and q.shape[2] > 1
        else:  # encoder-decoder attention
            q = self._split_heads(self._project(query, slice(0, hk)), self.d_k)
            if cache is not None and "mem_k" in cache:
                k, v = cache["mem_k"], cache["mem_v"]
            else:
                k, v = self.project_kv(memory)
                if cache is not None:
                    cache["mem_k"], cache["mem_v"] = k, v
        out = scaled_dot_product_attention(
            q, k, v, mask, causal, self.attention_dropout if self.training else 0.0
        )
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], self.heads * self.d_v)
        return self.out_proj(out)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                                 dropout: float = 0.0) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (Sec. 3.2.1, Eq. 1), via torch's fused SDPA.

    d_k and d_v may differ, which SDPA supports. ``causal`` with a query shorter than the keys
    (a prefix being extended) aligns the queries with the last key positions.
    """
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # Measured: torch's CPU flash-attention backward is ~3.5x slower in bf16 than in fp32 (while the
        # forward is equal), so on CPU the attention core runs in fp32; the projections stay bf16.
        # (autocast is switched off around it, or SDPA would cast the inputs straight back to bf16.)
        with torch.autocast("cpu", enabled=False):
            return scaled_dot_product_attention(q.float(), k.float(), v.float(), mask, causal, dropout).to(q.dtype)
    if causal:
        t, s = q.shape[-2], k.shape[-2]
        tri = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        mask = tri if mask is None else mask & tri
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Eq. 1 written out, for tests of the fused kernel."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v
