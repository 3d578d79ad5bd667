"""Caches for incremental decoding: each decoding step feeds only the newest target position.

Not in the paper (its decoder is defined on whole sequences); tensor2tensor and fairseq decode this way.
The decoder's outputs are those of recomputing the whole prefix (tests/test_model.py). The Transformer builds
them (``Transformer.new_cache``; its decoding state, ``Transformer.init_state``, takes
:class:`~lightning_tfm.model.fast.BufferedKVCache`, the fast self-attention cache); :class:`MemoryCache` also
serves a sentence's beams from one copy of its encoder memory.
"""
from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values (rows, h, t, d) of the earlier target positions of one self-attention layer."""

    def __init__(self):
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the newest positions (rows, h, t_new, d); returns all keys and values so far."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (in that order) for the next step."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class MemoryCache:
    """The keys and values of one encoder-decoder attention layer: projected from the encoder memory at
    the first step (they do not change while the target grows), stored contiguously since every step
    reads them (the attention kernels would otherwise copy the transposed views at every step)."""

    def __init__(self):
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def keys_values(self, attention, memory: Tensor) -> tuple[Tensor, Tensor]:
        """K = memory W^K and V = memory W^V of ``attention`` (a MultiHeadAttention), computed once."""
        if self.k is None:
            self.k, self.v = (t.contiguous() for t in attention.project_kv(memory))
        return self.k, self.v

    def queries(self, query: Tensor, memory_rows: int) -> Tensor:
        """The query rows (B, T, d_model) as attended against the ``memory_rows`` cached rows.

        One query row per memory row, or k consecutive ones (beam search's K beams of a sentence sharing its
        memory, a speed path: the memory is then never copied, reordered or projected K times): the k rows'
        queries, (rows*k, T, d_model), are attended as the k*T positions of one row, (rows, k*T, d_model),
        against the sentence's one copy of the memory. Encoder-decoder attention has no causal mask, so each
        query position still sees exactly its sentence's memory (tests/test_speed_paths.py).
        """
        if query.shape[0] % memory_rows:
            raise ValueError(f"query has {query.shape[0]} rows and memory {memory_rows}: "
                             "the query's must be a whole multiple")
        return query.reshape(memory_rows, -1, query.shape[-1])

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (in that order) for the next step."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
