"""Multi-head attention (Section 3.2 of Vaswani et al., 2017)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dropout import dropout as fast_dropout

# Attention kernels (speed paths; each is checked against the plain path in tests/test_speed_paths.py):
# "auto": on CPU, Eq. 1 as two batched matrix products with the softmax in fp32 ("matmul") when at most
# MATMUL_MAX_KEYS keys are attended to, torch's fused SDPA otherwise and on other devices.
# Measured here (2-core AMD EPYC, 128 x 4 heads x 20 x 64, bf16 autocast, one thread): forward + backward
# 15 ms for "matmul" against 30 ms for SDPA with an fp32 core and 80 ms for SDPA in bf16; one query over
# 20 cached keys (beam decoding, 512 rows): 6.8 ms against 39 ms (fp32 core, with its casts) and 20 ms
# (bf16). For long sequences SDPA's fused kernel avoids the (T, S) score matrix, so it is kept there.
ATTENTION_KERNEL = "auto"  # "auto" | "matmul" | "sdpa"
MATMUL_MAX_KEYS = 128


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
        if part == slice(None):  # the parameter itself: autocast casts it once per region, a view every call
            return self.in_proj(x)
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
        cache: "KVCache | dict | None" = None,
    ) -> Tensor:
        """Attend from ``query`` (B, T, d_model) to ``memory`` (B, S, d_model), or to itself if None.

        mask: bool, broadcastable to (B, h, T, S), True where attention is allowed.
        causal: masked self-attention of the decoder (Sec. 3.2.3): position i sees positions <= i.
        cache: incremental decoding. For self-attention a :class:`KVCache` of the keys/values of earlier
        target positions; for encoder-decoder attention a dict where the projected memory is stored once.

        Encoder-decoder attention also accepts a memory of B/K rows for a query of B rows (beam search:
        K consecutive query rows per sentence share one memory row, and ``mask`` has the memory's rows);
        the K rows' queries are then attended together against the one copy of the memory.
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
            if memory.shape[0] != query.shape[0]:  # K beams per memory row: (rows*K, T, d) -> (rows, K*T, d)
                if query.shape[0] % memory.shape[0]:
                    raise ValueError(f"query has {query.shape[0]} rows and memory {memory.shape[0]}: "
                                     "the query's must be a whole multiple")
                query_rows = query.reshape(memory.shape[0], -1, query.shape[-1])
            else:
                query_rows = query
            q = self._split_heads(self._project(query_rows, slice(0, hk)), self.d_k)
            if cache is not None and "mem_k" in cache:
                k, v = cache["mem_k"], cache["mem_v"]
            else:
                k, v = self.project_kv(memory)
                if cache is not None:
                    cache["mem_k"], cache["mem_v"] = k, v
        out = scaled_dot_product_attention(q, k, v, mask, causal, self.attention_dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], self.heads * self.d_v)
        return self.out_proj(out)


class KVCache:
    """Keys and values of the earlier target positions of one self-attention layer (incremental decoding).

    ``append`` adds the newest position, ``reorder`` selects rows (beam search re-ranking its hypotheses;
    applied lazily, at the next append). Both work in two reused flat buffers per tensor: each step is one
    ``index_select`` and one ``cat`` written with ``out=`` into a contiguous (rows, h, t, d) prefix.

    A speed path (cached vs uncached decoding, tests/test_speed_paths.py): the plain ``torch.cat`` /
    ``index_select`` allocate fresh tensors every step, and fresh pages fault; measured 115 + 130 ms of an
    800 ms beam-4 batch (128 sentences x 20 tokens, d_model 256). Strided alternatives were slower still:
    Q K^T on a slice of a preallocated (rows, h, max_len, d) buffer 1.7 ms against 0.5 ms contiguous.
    With gradients (not in decoding) the plain ops run, as ``out=`` records none.
    """

    def __init__(self):
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self._index: Tensor | None = None
        self._buffers: dict[tuple[str, int], Tensor] = {}
        self._slot = {"k": 0, "v": 0}

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def reorder(self, index: Tensor) -> None:
        self._index = index if self._index is None else self._index.index_select(0, index)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the newest positions (rows, h, t_new, d); returns all keys and values so far."""
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
            old = torch.index_select(old, 0, self._index, out=self._view(name, slot, (self._index.shape[0], *old.shape[1:]), old))
        slot = 1 - slot
        shape = (new.shape[0], new.shape[1], old.shape[2] + new.shape[2], new.shape[3])
        out = torch.cat([old, new], dim=2, out=self._view(name, slot, shape, new))
        self._slot[name] = slot
        return out


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                                 dropout: float = 0.0, kernel: str | None = None) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (Sec. 3.2.1, Eq. 1).

    d_k and d_v may differ. ``causal`` with a query shorter than the keys (a prefix being extended)
    aligns the queries with the last key positions. ``kernel`` overrides ATTENTION_KERNEL.
    """
    kernel = kernel or ATTENTION_KERNEL
    if causal:
        t, s = q.shape[-2], k.shape[-2]
        tri = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        mask = tri if mask is None else mask & tri
    if kernel == "matmul" or (kernel == "auto" and q.device.type == "cpu" and k.shape[-2] <= MATMUL_MAX_KEYS):
        return matmul_attention(q, k, v, mask, dropout)
    return sdpa_attention(q, k, v, mask, dropout)


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float = 0.0) -> Tensor:
    """Eq. 1 as two batched matrix products in the inputs' dtype, the softmax in fp32 (fast for short
    sequences on CPU, see ATTENTION_KERNEL). A fully masked row gives NaN, as in reference_attention."""
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, -1, dtype=torch.float32).to(v.dtype)
    if dropout > 0.0:
        p = fast_dropout(p, dropout)
    return p @ v


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float = 0.0) -> Tensor:
    """Eq. 1 via torch's fused scaled_dot_product_attention."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_grad_enabled():
        # Measured: torch's CPU flash-attention backward is ~3.5x slower in bf16 than in fp32 (while the
        # forward is equal), so on CPU the attention core runs in fp32 when training; the projections stay
        # bf16. (autocast is switched off around it, or SDPA would cast the inputs straight back to bf16.)
        with torch.autocast("cpu", enabled=False):
            return sdpa_attention(q.float(), k.float(), v.float(), mask, dropout).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Eq. 1 written out, for tests of the fused kernel."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v
