"""The recurrent baseline: an RNN encoder-decoder with additive attention (Bahdanau et al., 2014), the registry's
``rnn`` (``model.arch: rnn``; its knobs are the section ``rnn.*``: ``ltfm config --keys rnn.``).

For target position i, with E the target embedding (Bahdanau et al., 2014, Sec. 3 and Appendix A):

* annotations h_j = [h->_j; h<-_j]: a bidirectional GRU (or LSTM) over the source embeddings, ``enc_layers``
  stacked, padding skipped (packed sequences), so each direction starts at the sentence's own first or last token;
* s_0 = tanh(W_s [h->_S; h<-_1] + b_s): joeynmt's ``init_hidden: bridge`` over the top encoder layer's two final
  states (Bahdanau's s_0 = tanh(W_s h<-_1) uses the backward one only), the start of every decoder layer;
* e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j), padding masked out, alpha_i = softmax_j(e_ij), c_i = sum_j alpha_ij h_j
  (Eq. 6 and Appendix A.1.2; :func:`additive_attention`); U_a h_j is computed once per sentence, the query
  s_{i-1} is the top decoder layer's state;
* s_i = RNN([E y_{i-1}; c_i], s_{i-1}): the context is fed into the decoder step, ``dec_layers`` stacked;
* the output layer is Bahdanau's deep output (Appendix A.2.2; Eq. 4's g(y_{i-1}, s_i, c_i)):
  t_i = tanh(W_o [s_i; E y_{i-1}; c_i] + b_o), tanh in place of its maxout as Nematus does (Sennrich et al., 2017),
  and t_i of the embedding width, so that the target embedding can be the pre-softmax projection
  (``tied_embeddings``, Press & Wolf, 2017): logits = t_i W^T. :meth:`RNN.features` gives t_i.

Default sizes: joeynmt's IWSLT14 de-en BPE recipe (``configs/iwslt14_deen_bpe.yaml``: GRU, embeddings 620, a
bidirectional encoder of 500 a direction, a decoder of 1000, a bridge, additive attention, hidden dropout 0.2,
separate source and target embeddings, no tied softmax; Adam at 2e-4 with decay 0.7 on a plateau of 8
validations: ``train.lr_schedule: plateau``), the benchmark where its RNN reached 31.8/30.7 BLEU (dev/test)
against its Transformer's 34.5/33.7. The order within a step is the paper's above, not joeynmt's (whose decoder
queries the attention with the new state s_i and feeds the previous step's attention vector back into the RNN,
Luong et al.'s input feeding).

The decoder state of the incremental-decoder protocol (model/incremental.py) is the decoder's hidden state (each
layer's; and its cell state for an LSTM) and the last step's attention weights; the encoder output is the
annotations, their keys U_a h_j, the source mask and s_0. Attention weights for a figure (Bahdanau's Figure 3):
``features(src, tgt_in, need_attention=True)`` returns them for a teacher-forced target (a hypothesis fed back),
and every :meth:`RNN.decode_step` leaves its step's weights in ``state["attention"]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..base.knobs import UNIT, Range, Section, knob
from .config import LAYERS, MAX_POSITIONS, WIDTH
from .incremental import EncoderDecoder
from .registry import register
from .transformer import PAD


@dataclass
class RNNConfig(Section):
    SECTION: ClassVar[str] = "rnn"

    cell: Literal["gru", "lstm"] = knob("gru", "recurrent unit of the encoder and the decoder: gru (Bahdanau's gated "
                                               "unit, joeynmt's recipe) or lstm")
    emb_size: int = knob(620, "width of the source and target embeddings and of the deep output t_i (Bahdanau: 620)",
                         WIDTH)
    enc_hidden: int = knob(500, "encoder state width of each direction; the annotations h_j are twice as wide", WIDTH)
    dec_hidden: int = knob(1000, "decoder state width (s_i); also the d_model the noam schedule would scale by", WIDTH)
    attention_size: int = knob(1000, "width of the alignment model's hidden layer (W_a, U_a: n' in Bahdanau's "
                                     "Appendix A)", WIDTH)
    enc_layers: int = knob(1, "stacked bidirectional encoder layers", LAYERS)
    dec_layers: int = knob(1, "stacked decoder layers (the top one's state is the attention's query)", LAYERS)
    dropout: float = knob(0.2, "dropout on the deep output's input [s_i; E y_{i-1}; c_i] and between stacked layers "
                               "(joeynmt's hidden_dropout)", UNIT)
    emb_dropout: float = knob(0.0, "dropout on the source and target embeddings", UNIT)
    shared_embeddings: bool = knob(False, "one embedding matrix for source and target (the BPE vocabulary is shared)")
    tied_embeddings: bool = knob(False, "the target embedding is also the pre-softmax projection")
    max_positions: int = knob(1024, "longest sequence decoded (BOS or EOS included): sources are cut to it, outputs "
                                    "end before it", Range(1, MAX_POSITIONS))


class EncoderOut(NamedTuple):
    """What :meth:`RNN.encode` gives, one row per sentence (or hypothesis)."""

    annotations: Tensor  # (B, S, 2 enc_hidden): h_j
    keys: Tensor         # (B, S, attention_size): U_a h_j
    mask: Tensor         # (B, S) True at source tokens
    s0: Tensor           # (B, dec_hidden): the bridge's initial decoder state


def additive_attention(query: Tensor, keys: Tensor, values: Tensor, mask: Tensor, v_a: nn.Linear
                       ) -> tuple[Tensor, Tensor]:
    """Bahdanau's alignment model: query (R, A) = W_a s_{i-1}, keys (R, S, A) = U_a h_j, values (R, S, C) = h_j,
    mask (R, S) True at source tokens -> (c_i (R, C), alpha_i (R, S)), with e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j),
    alpha_i = softmax over the unmasked j (padding gets weight 0), c_i = sum_j alpha_ij h_j. The softmax in fp32."""
    energies = v_a(torch.tanh(query.unsqueeze(1) + keys)).squeeze(-1)
    alpha = torch.softmax(energies.float().masked_fill(~mask, float("-inf")), dim=-1)
    context = torch.bmm(alpha.to(values.dtype).unsqueeze(1), values).squeeze(1)
    return context, alpha


def _embedding(vocab_size: int, dim: int) -> nn.Embedding:
    """An embedding ~ N(0, dim^-0.5) (fairseq's), the PAD row zero: logits t_i W^T of unit scale when tied."""
    emb = nn.Embedding(vocab_size, dim, padding_idx=PAD)
    nn.init.normal_(emb.weight, std=dim ** -0.5)
    with torch.no_grad():
        emb.weight[PAD].zero_()
    return emb


def _gates(cell: str) -> int:
    return 3 if cell == "gru" else 4


@register("rnn", RNNConfig)
class RNN(EncoderDecoder):
    """Bahdanau et al.'s encoder-decoder with additive attention, of the sizes of ``cfg`` (the module docstring)."""

    ATTENTION = "additive attention alpha_ij"   # one (T, S) map: no heads

    @classmethod
    def describe(cls, cfg: RNNConfig) -> str:
        return (f"{cfg.cell} emb {cfg.emb_size}, encoder {cfg.enc_layers} x 2 x {cfg.enc_hidden}, decoder "
                f"{cfg.dec_layers} x {cfg.dec_hidden}, attention {cfg.attention_size}")

    def __init__(self, cfg: RNNConfig, vocab_size: int):
        super().__init__()
        E, He, Hd, A = cfg.emb_size, cfg.enc_hidden, cfg.dec_hidden, cfg.attention_size
        self.vocab_size, self.max_positions, self.d_model = vocab_size, cfg.max_positions, Hd
        self.lstm = cfg.cell == "lstm"
        Layer, Cell = (nn.LSTM, nn.LSTMCell) if self.lstm else (nn.GRU, nn.GRUCell)
        self.src_embed = _embedding(vocab_size, E)
        self.tgt_embed = self.src_embed if cfg.shared_embeddings else _embedding(vocab_size, E)
        self.encoder = Layer(E, He, num_layers=cfg.enc_layers, bidirectional=True, batch_first=True,
                             dropout=cfg.dropout if cfg.enc_layers > 1 else 0.0)
        self.bridge = nn.Linear(2 * He, Hd)            # W_s, b_s
        self.query = nn.Linear(Hd, A, bias=False)      # W_a
        self.key = nn.Linear(2 * He, A, bias=False)    # U_a
        self.energy = nn.Linear(A, 1, bias=False)      # v_a
        # one cell a layer, stepped by hand (a one-step call of nn.GRU costs more than its cell)
        self.decoder = nn.ModuleList(Cell(E + 2 * He if i == 0 else Hd, Hd) for i in range(cfg.dec_layers))
        self.deep_output = nn.Linear(Hd + E + 2 * He, E)  # W_o, b_o
        self.out_weight = None if cfg.tied_embeddings else nn.Parameter(torch.empty(vocab_size, E))
        if self.out_weight is not None:
            nn.init.normal_(self.out_weight, std=E ** -0.5)
        self.drop, self.emb_drop = nn.Dropout(cfg.dropout), nn.Dropout(cfg.emb_dropout)

    @property
    def output_weight(self) -> Tensor:
        """The (vocab, emb_size) pre-softmax projection: the target embedding when tied."""
        return self.tgt_embed.weight if self.out_weight is None else self.out_weight

    # ------------------------------------------------------------------------------------------- encoder
    def encode(self, src: Tensor) -> EncoderOut:
        """src (B, S) right-padded ids -> :class:`EncoderOut`."""
        mask = src != PAD
        x = self.emb_drop(self.src_embed(src))
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed, final = self.encoder(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        annotations, _ = pad_packed_sequence(packed, batch_first=True, total_length=src.shape[1])
        h_n = final[0] if self.lstm else final  # (2 enc_layers, B, He): the top layer's forward, then backward
        s0 = torch.tanh(self.bridge(torch.cat([h_n[-2], h_n[-1]], -1)))
        return EncoderOut(annotations, self.key(annotations), mask, s0)

    def reorder_encoder_out(self, encoder_out: EncoderOut, index: Tensor) -> EncoderOut:
        return EncoderOut(*(t.index_select(0, index) for t in encoder_out))

    # ------------------------------------------------------------------------------------------- decoder
    def init_state(self, encoder_out: EncoderOut) -> dict:
        """{"h": (dec_layers, rows, dec_hidden) s_0 in every layer, "c" (LSTM: its cell, s_0 too, as joeynmt's
        bridge), "attention": None until a step}."""
        h = encoder_out.s0.unsqueeze(0).repeat(len(self.decoder), 1, 1)
        return {"h": h, "c": h.clone(), "attention": None} if self.lstm else {"h": h, "attention": None}

    def _step(self, y: Tensor, enc: EncoderOut, state: dict) -> tuple[Tensor, Tensor, Tensor, dict]:
        """One position: y (R, E) the embedded y_{i-1} -> (s_i, c_i, alpha_i, the new state)."""
        context, alpha = additive_attention(self.query(state["h"][-1]), enc.keys, enc.annotations, enc.mask,
                                            self.energy)
        x = torch.cat([y, context.to(y.dtype)], -1)
        hs, cs = [], []
        for i, cell in enumerate(self.decoder):  # dropout between stacked layers, as torch's multi-layer RNNs
            if self.lstm:
                x, c = cell(self.drop(x) if i else x, (state["h"][i], state["c"][i]))
                cs.append(c)
            else:
                x = cell(self.drop(x) if i else x, state["h"][i])
            hs.append(x)
        new = {"h": torch.stack(hs), "c": torch.stack(cs)} if self.lstm else {"h": torch.stack(hs)}
        return x, context, alpha, {**new, "attention": alpha}

    def _output(self, s: Tensor, y: Tensor, context: Tensor) -> Tensor:
        """The deep output t_i = tanh(W_o [s_i; E y_{i-1}; c_i] + b_o)."""
        return torch.tanh(self.deep_output(self.drop(torch.cat([s, y.to(s.dtype), context.to(s.dtype)], -1))))

    def _run(self, tokens: Tensor, enc: EncoderOut, state: dict) -> tuple[Tensor, Tensor, dict]:
        """Feed tokens (R, T) one position at a time from ``state``: (t (R, T, E), alpha (R, T, S), last state)."""
        y = self.emb_drop(self.tgt_embed(tokens))
        outs, contexts, alphas = [], [], []
        for i in range(tokens.shape[1]):
            s, context, alpha, state = self._step(y[:, i], enc, state)
            outs.append(s)
            contexts.append(context)
            alphas.append(alpha)
        t = self._output(torch.stack(outs, 1), y, torch.stack(contexts, 1))
        return t, torch.stack(alphas, 1), state

    def features(self, src: Tensor, tgt_in: Tensor, need_attention: bool = False):
        """Deep outputs t (B, T, emb_size) of a teacher-forced ``tgt_in``; with ``need_attention`` also the
        attention weights alpha (B, T, S) (row i: target position i over the source tokens, 0 at padding)."""
        enc = self.encode(src)
        t, alpha, _ = self._run(tgt_in, enc, self.init_state(enc))
        return (t, alpha) if need_attention else t

    def decode_step(self, tokens: Tensor, encoder_out: EncoderOut, state: dict | None) -> Tensor:
        if state is None:  # the whole prefix, from s_0
            return self._run(tokens, encoder_out, self.init_state(encoder_out))[0][:, -1]
        t, _, new = self._run(tokens, encoder_out, state)
        state.update(new)
        return t[:, -1]

    def reorder_state(self, state: dict, index: Tensor, encoder_index: Tensor | None = None) -> None:
        """The hidden (and cell) states of the kept rows; nothing in the state derives from the encoder output
        but the last attention weights, which are per row too."""
        for key in ("h", "c"):
            if key in state:
                state[key] = state[key].index_select(1, index)
        if state["attention"] is not None:
            state["attention"] = state["attention"].index_select(0, index)

    # ----------------------------------------------------------------------------------------- accounting
    @classmethod
    def count_parameters(cls, cfg: RNNConfig, vocab_size: int) -> int:
        """Analytic parameter count (tests/test_rnn.py checks it against the built model)."""
        E, He, Hd, A, V, G = (cfg.emb_size, cfg.enc_hidden, cfg.dec_hidden, cfg.attention_size, vocab_size,
                              _gates(cfg.cell))

        def rnn(inp: int, hidden: int) -> int:  # torch's layout: W_ih, W_hh, b_ih, b_hh
            return G * (inp * hidden + hidden * hidden + 2 * hidden)

        embeddings = V * E * (1 if cfg.shared_embeddings else 2) + (0 if cfg.tied_embeddings else V * E)
        encoder = 2 * (rnn(E, He) + (cfg.enc_layers - 1) * rnn(2 * He, He))
        decoder = rnn(E + 2 * He, Hd) + (cfg.dec_layers - 1) * rnn(Hd, Hd)
        attention = Hd * A + 2 * He * A + A
        return embeddings + encoder + (2 * He * Hd + Hd) + attention + decoder + (Hd + E + 2 * He) * E + E

    @staticmethod
    def _forward_flops(cfg: RNNConfig, vocab_size: int, src_len: float) -> tuple[float, float]:
        """(forward FLOPs of a sentence's encoder: the recurrent layers, the keys U_a h_j and the bridge; forward
        FLOPs of one decoder position: the query, energies, context, recurrent layers, deep output and the
        pre-softmax projection), as 2 x multiply-adds of the matrix products (biases, gates' elementwise
        products and tanh not counted, as torch's FlopCounterMode does not)."""
        E, He, Hd, A, V, S, G = (cfg.emb_size, cfg.enc_hidden, cfg.dec_hidden, cfg.attention_size, vocab_size,
                                 src_len, _gates(cfg.cell))
        C = 2 * He
        encoder = 2 * 2 * G * S * ((E * He + He * He) + (cfg.enc_layers - 1) * (C * He + He * He))
        encoder += 2 * S * C * A + 2 * C * Hd
        recurrent = 2 * G * ((E + C) * Hd + Hd * Hd + (cfg.dec_layers - 1) * 2 * Hd * Hd)
        step = 2 * Hd * A + 2 * S * A + 2 * S * C + recurrent + 2 * (Hd + E + C) * E + 2 * E * V
        return encoder, step

    @classmethod
    def train_flops_per_token(cls, cfg: RNNConfig, vocab_size: int, src_len: float, tgt_len: float) -> float:
        """3 x the forward FLOPs (:meth:`_forward_flops`: the backward pass costs two products per forward one)
        per target token, the encoder shared out over the ``tgt_len`` tokens. torch's FlopCounterMode counts
        this less the gradient of the encoder's zero initial states, which is never computed
        (tests/test_rnn.py)."""
        encoder, step = cls._forward_flops(cfg, vocab_size, src_len)
        return 3 * (encoder / tgt_len + step)

    @classmethod
    def decode_flops_per_token(cls, cfg: RNNConfig, vocab_size: int, src_len: float, tgt_len: float) -> float:
        """Forward FLOPs of one decoding step per hypothesis, the sentence's encoding shared out over its
        ``tgt_len`` tokens."""
        encoder, step = cls._forward_flops(cfg, vocab_size, src_len)
        return encoder / tgt_len + step
