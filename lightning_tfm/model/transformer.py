"""The Transformer encoder-decoder (Section 3, Figure 1) with shared embeddings (Section 3.4): the registry's
``transformer`` (model/registry.py), built from the model section itself (:class:`ModelConfig`)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import KVCache, MemoryCache
from .config import ModelConfig
from .fast import BufferedKVCache, make_dropout
from .incremental import EncoderDecoder
from .layers import DecoderLayer, EncoderLayer
from .positional import LearnedPositions, make_positions
from .registry import register

PAD, BOS, EOS, UNK = 0, 1, 2, 3  # fixed ids of the special tokens in every vocabulary we build


@register("transformer")
class Transformer(EncoderDecoder):
    """Encoder-decoder of "Attention Is All You Need", of the sizes of ``cfg`` (the model section).

    One weight matrix serves as source embedding, target embedding and pre-softmax projection
    (Sec. 3.4); embeddings are multiplied by sqrt(d_model). Dropout is applied to the sums of
    embeddings and positional encodings (Sec. 5.4).

    ``cfg.attention_kernel`` ("auto" | "matmul" | "sdpa") and ``cfg.fast_dropout`` switch the CPU speed paths
    (model/fast.py); they change rounding and random draws, not the model.
    """

    shares_encoder_rows = True  # MemoryCache serves a sentence's beams from one copy of its memory
    ATTENTION = "last decoder layer's encoder-decoder attention, mean over heads"
    ATTENTION_HEADS = True

    @classmethod
    def describe(cls, cfg: ModelConfig) -> str:
        return f"N={cfg.layers} d_model={cfg.d_model} d_ff={cfg.d_ff} heads={cfg.heads}"

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        d_model = cfg.d_model
        self.d_model, self.vocab_size = d_model, vocab_size
        self.attention_kernel = cfg.attention_kernel
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        # fairseq/tensor2tensor: embeddings ~ N(0, d_model^-0.5), so that embed * sqrt(d_model) has unit scale.
        nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
        self.positions = make_positions(cfg.positional, cfg.max_positions, d_model)
        self.dropout = make_dropout(cfg.dropout, cfg.fast_dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        # Pre-norm leaves the residual stream un-normalised: a final LayerNorm on each stack (fairseq).
        self.encoder_norm = nn.LayerNorm(d_model) if cfg.norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if cfg.norm == "pre" else nn.Identity()

    @property
    def max_positions(self) -> int:
        """Longest sequence the positional encodings cover."""
        table = self.positions.table
        return table.num_embeddings if isinstance(self.positions, LearnedPositions) else table.shape[0]

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

    def features(self, src: Tensor, tgt_in: Tensor, need_attention: bool = False):
        """Decoder output states (B, T, d_model) for teacher-forced ``tgt_in``: ``forward`` without ``project``.

        With ``need_attention``: (states, the last decoder layer's encoder-decoder attention probabilities
        (B, heads, T, S), 0 at padded source positions), as the RNN's ``features`` (report/views/attention.py draws
        them); that one attention then takes the plain matmul path (``MultiHeadAttention.keep_weights``), the states are
        the same."""
        memory, src_mask = self.encode(src)
        if not need_attention:
            return self.decode_states(tgt_in, memory, src_mask)
        cross = self.decoder[-1].cross_attn
        cross.keep_weights = True
        try:
            return self.decode_states(tgt_in, memory, src_mask), cross.attention_weights
        finally:
            cross.keep_weights, cross.attention_weights = False, None

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.project(self.features(src, tgt_in))

    def new_cache(self, kv_cache=KVCache, memory_cache=MemoryCache) -> list[dict]:
        """Per decoder layer: {"self": a new ``kv_cache()`` (None: the prefix is recomputed instead),
        "cross": a new ``memory_cache()``} (model/cache.py)."""
        return [{"self": kv_cache() if kv_cache else None, "cross": memory_cache()} for _ in self.decoder]

    # ------------------------------------------------------- the incremental-decoder protocol (incremental.py)
    def reorder_encoder_out(self, encoder_out: tuple[Tensor, Tensor], index: Tensor) -> tuple[Tensor, Tensor]:
        memory, src_mask = encoder_out
        return memory.index_select(0, index), src_mask.index_select(0, index)

    def init_state(self, encoder_out: tuple[Tensor, Tensor]) -> list[dict]:
        """The per-layer caches (:meth:`new_cache`), the keys/values in reused buffers (model/fast.py)."""
        return self.new_cache(BufferedKVCache, MemoryCache)

    def decode_step(self, tokens: Tensor, encoder_out: tuple[Tensor, Tensor], state: list[dict] | None) -> Tensor:
        memory, src_mask = encoder_out
        if state is None:  # the whole prefix; a memory cache of this call only lets beams share memory rows
            cache = None if tokens.shape[0] == memory.shape[0] else self.new_cache(None)
            return self.decode_states(tokens, memory, src_mask, cache)[:, -1]
        return self.decode_states(tokens, memory, src_mask, state, offset=len(state[0]["self"]))[:, -1]

    def reorder_state(self, state: list[dict], index: Tensor, encoder_index: Tensor | None = None) -> None:
        for layer in state:
            layer["self"].reorder(index)
            if encoder_index is not None:
                layer["cross"].reorder(encoder_index)

    # ----------------------------------------------------------------------------------------- accounting
    @classmethod
    def count_parameters(cls, cfg: ModelConfig, vocab_size: int) -> int:
        """Analytic parameter count, written out from Section 3."""
        d, f, hk, hv = cfg.d_model, cfg.d_ff, cfg.heads * cfg.d_k, cfg.heads * cfg.d_v
        attention = d * (2 * hk + hv) + (2 * hk + hv) + hv * d + d
        ffn = d * f + f + f * d + d
        layer_norm = 2 * d
        encoder = cfg.layers * (attention + ffn + 2 * layer_norm)
        decoder = cfg.layers * (2 * attention + ffn + 3 * layer_norm)
        final_norms = 2 * layer_norm if cfg.norm == "pre" else 0
        positions = cfg.max_positions * d if cfg.positional == "learned" else 0
        return vocab_size * d + positions + encoder + decoder + final_norms

    @classmethod
    def train_flops_per_token(cls, cfg: ModelConfig, vocab_size: int, src_len: float, tgt_len: float) -> float:
        """6 x (matmul parameters) x tokens for the projections, the feed-forward layers and the softmax layer,
        plus the attention products QK^T and AV (forward x 3 for training), per target token. The decoder's
        parameters count at the target length, the keys and values of its encoder-decoder attention too (they
        are projected from the source): exact when ``src_len == tgt_len`` (tests/test_model.py)."""
        return _train_flops(cfg.layers, cfg.d_model, cfg.d_ff, cfg.heads * cfg.d_k, cfg.heads * cfg.d_v,
                            vocab_size, 1, src_len, tgt_len) / tgt_len

    @classmethod
    def decode_flops_per_token(cls, cfg: ModelConfig, vocab_size: int, src_len: float, tgt_len: float) -> float:
        """Forward FLOPs of cached decoding (2 x matmul parameters + attention products) per generated token:
        the step's decoder layers and softmax layer, its self-attention over the prefix (on average
        (tgt_len + 1) / 2 positions) and cross-attention over the source; the encoder and the projection of
        its memory into each layer's keys and values (once per sentence) shared out over the tgt_len tokens."""
        N, d, f, V, S, T = cfg.layers, cfg.d_model, cfg.d_ff, vocab_size, src_len, tgt_len
        hk, hv = cfg.heads * cfg.d_k, cfg.heads * cfg.d_v
        attn_params = 2 * d * hk + 2 * d * hv
        encoder = 2 * N * (attn_params + 2 * d * f) * S + 2 * N * (hk + hv) * S * S + 2 * N * d * (hk + hv) * S
        step = 2 * N * (attn_params + d * hk + hv * d + 2 * d * f) + 2 * d * V + 2 * N * (hk + hv) * S
        return encoder / T + step + N * (hk + hv) * (T + 1)


def _train_flops(N, d, f, hk, hv, V, B, S, T) -> float:
    """Training FLOPs of a batch of B sentences of S source and T target tokens: ``hk`` and ``hv`` are the
    concatenated heads' key and value widths (W_Q, W_K: d x hk; W_V: d x hv; W_O: hv x d)."""
    attn_params = 2 * d * hk + 2 * d * hv
    enc = N * (attn_params + 2 * d * f)
    dec = N * (2 * attn_params + 2 * d * f)  # self- and cross-attention
    dense = 6 * (enc * B * S + dec * B * T + d * V * B * T)
    attn = 6 * (hk + hv) * B * N * (S * S + T * T + T * S)  # QK^T and AV, forward x3 for training
    return dense + attn

