"""Beam search and greedy decoding (Section 6.1 of Vaswani et al., 2017). Pure PyTorch, no Lightning.

The paper: "beam search with a beam size of 4 and length penalty alpha = 0.6 [...] We set the maximum
output length during inference to input length + 50, but terminate early when possible."
The procedure follows tensor2tensor's ``beam_search.py`` (the paper's code):

* the model is any architecture of the registry: beam search talks to it only through the
  incremental-decoder protocol (model/incremental.py: encode once, one decoder step with a state,
  reorder the state and the encoder output);
* every step expands all alive beams of all sentences in ONE decoder step on (sentences x beams) rows,
  with incremental decoding: the decoder state (the Transformer's: each layer's keys/values of earlier
  target positions and its projected encoder memory) holds the prefix, so only the newest position is
  fed (``use_cache=False`` recomputes the whole prefix instead; the tests compare the two). A speed path
  (tests/test_speed_paths.py checks it against the plain one, ``shared_memory=False``): for a model that
  ``shares_encoder_rows``, the encoder output is kept once per sentence, not once per beam, so it is
  never copied, reordered or projected K times; at the first step, where a sentence's K beams are one
  and the same BOS, one row per sentence is decoded;
* the top 2K candidates of each sentence are taken over its K beams x vocabulary; candidates ending in
  EOS become finished hypotheses scored log P(y) / lp(|y|), the best 2K-candidates that do not end in
  EOS stay alive (2K guarantees K of them, since each beam contributes at most one EOS candidate);
* lp is the GNMT length penalty ((5 + |y|) / 6) ** alpha (Wu et al., 2016), where |y| counts the
  generated tokens including the EOS, as tensor2tensor's ``i + 1`` does;
* stopping rule (tensor2tensor's bound): a finished hypothesis is final for its sentence once no alive
  beam can beat it, i.e. once best_finished >= best_alive_log_prob / lp(max length). Log-probabilities
  only fall as a hypothesis grows, and dividing a negative number by the largest penalty it can get
  gives its best possible score, so the returned hypothesis is the one running to the maximum length
  would return. (tensor2tensor compares the bound with the *worst* of its K finished hypotheses because
  it returns all K; we return only the best, so we may stop earlier with the same result.)
* the maximum output length is ``max_len_a * source_length + max_len_b`` tokens (source length counts
  the non-pad source tokens, EOS included, as tensor2tensor's input length does); at that length only
  EOS may be generated (fairseq's rule), so every sentence ends with a finished hypothesis.
* PAD and BOS are never generated (fairseq bans them too; tensor2tensor has no BOS).
* ``min_len`` (fairseq's ``--min-len``; the paper and tensor2tensor have none, default 0): EOS is banned
  while fewer than ``min_len`` tokens have been generated. The maximum length wins where they conflict.
  ``ltfm bench`` uses it to hold every sentence to the same output length.
* beam_size=1 takes the single best token each step: greedy decoding (tensor2tensor also decodes
  greedily at beam size 1).

Sentences that are done are dropped from the batch (fairseq's batch reduction), so a long sentence
does not keep the others' beams computing.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model import BOS, EOS, PAD, EncoderDecoder
from .data.data import pad


@dataclass
class Hypothesis:
    """One output sentence: BPE ids without BOS/EOS, its score and its log-probability."""

    tokens: list[int]
    score: float      # log_prob / length_penalty(len(tokens) + 1, alpha)
    log_prob: float   # sum of the log-probabilities of tokens and the final EOS


def length_penalty(length, alpha: float):
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016; the paper's alpha = 0.6).

    ``length`` counts the generated tokens including the final EOS (tensor2tensor: ``i + 1`` at step
    ``i``). Works on numbers and tensors.
    """
    return ((5.0 + length) / 6.0) ** alpha


def _max_lengths(src: Tensor, max_len_a: float, max_len_b: int, model: EncoderDecoder) -> Tensor:
    """Per sentence: a * (non-pad source tokens) + b, capped so BOS + tokens fit the model's positions."""
    src_len = (src != PAD).sum(1)
    ml = (max_len_a * src_len.double()).floor().long() + int(max_len_b)
    return ml.clamp(min=1, max=model.max_positions - 1)


def topk_rows(x: Tensor, k: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)`` (values descending) for wide rows, in two stages: the maximum of every block of
    ``block`` columns, the ``k`` best blocks, then the best ``k`` of their columns. The k largest values lie
    in the k blocks with the largest maxima (a value outside them is beaten by k block maxima), so the
    values are exactly torch.topk's; among equal values the chosen columns may differ.

    A speed path (tests/test_speed_paths.py): torch's CPU topk walks each row serially, so for beam x
    vocabulary rows two stages over block maxima are faster.
    """
    rows, width = x.shape
    nb = width // block
    if nb <= k:
        return x.topk(k, dim=1)
    main = x[:, :nb * block].view(rows, nb, block)
    _, best_blocks = main.amax(-1).topk(k, dim=1)
    cand = main.gather(1, best_blocks[:, :, None].expand(rows, k, block)).view(rows, k * block)
    values, j = cand.topk(k, dim=1)
    index = best_blocks.gather(1, j // block) * block + j % block
    if nb * block < width:  # the columns after the last whole block
        tail_v, tail_j = x[:, nb * block:].topk(min(k, width - nb * block), dim=1)
        values, j = torch.cat([values, tail_v], 1).topk(k, dim=1)
        index = torch.cat([index, tail_j + nb * block], 1).gather(1, j)
    return values, index


class _VocabBuffers:
    """Logits and log-probability buffers reused at every decoding step (their first ``rows`` rows).

    A speed path (tests/test_speed_paths.py): fresh (rows x V) tensors at every step are fresh pages from
    the allocator (above glibc's mmap threshold at beam x vocabulary sizes) and cost page faults on every
    step, which dominated projection + log-softmax + top-k.
    """

    def __init__(self, rows: int, weight: Tensor):
        self.weight_t = weight.t()
        shape, device = (rows, weight.shape[0]), weight.device
        self.logits = torch.empty(shape, dtype=weight.dtype, device=device)
        # log_softmax(dtype=float32) would cast into a fresh tensor: the cast gets its own buffer
        self.logits32 = self.logits if weight.dtype == torch.float32 else torch.empty(shape, device=device)
        self.lprobs = torch.empty(shape, dtype=torch.float32, device=device)

    def log_probs(self, states: Tensor) -> Tensor:
        """log_softmax(states W^T) in fp32 (Sec. 3.4's pre-softmax projection, then the softmax)."""
        n = states.shape[0]
        logits, logits32, lprobs = self.logits[:n], self.logits32[:n], self.lprobs[:n]
        torch.mm(states.to(self.weight_t.dtype), self.weight_t, out=logits)
        if logits32 is not logits:
            logits32.copy_(logits)
        return torch.log_softmax(logits32, -1, out=lprobs)


# torch.no_grad rather than torch.inference_mode: under inference mode autocast does not cache its bf16
# copies of the weights, and recasts every weight (the 8000 x 256 embedding too) at every decoding step.
@torch.no_grad()
def beam_search(model: EncoderDecoder, src: Tensor, beam_size: int = 4, alpha: float = 0.6, max_len_a: float = 1.0,
                max_len_b: int = 50, use_cache: bool = True, min_len: int = 0,
                shared_memory: bool = True) -> list[Hypothesis]:
    """Best hypothesis per sentence of ``src`` (B, S) (right-padded ids, EOS-terminated as in training).

    Runs under ``torch.no_grad()``; the model should be in eval mode (``translate_ids`` sees to it).
    ``shared_memory=False`` (the encoder output repeated for every beam) is the plain path the shared one is
    tested against; a model that does not ``shares_encoder_rows`` always takes it.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    B, K, device = src.shape[0], beam_size, src.device
    n_cand = 1 if K == 1 else 2 * K
    n_row = min(n_cand, model.vocab_size)  # candidates taken from each beam's row
    ml = _max_lengths(src, max_len_a, max_len_b, model)
    ml_min, ml_max = torch.stack([ml.min(), ml.max()]).tolist()
    width = ml_max + 2  # BOS + up to max length tokens + EOS

    shared_memory = shared_memory and model.shares_encoder_rows
    encoder_out = model.encode(src)  # once per sentence; its K beams share it (rows: sentence-major)
    if not shared_memory:
        encoder_out = model.reorder_encoder_out(encoder_out, torch.arange(B, device=device).repeat_interleave(K))
    neg_inf = torch.tensor(float("-inf"), device=device)

    # Per original sentence: the best finished hypothesis so far.
    best_score = torch.full((B,), float("-inf"), device=device)
    best_lp = torch.zeros(B, device=device)
    best_len = torch.zeros(B, dtype=torch.long, device=device)
    best_tokens = torch.full((B, width), PAD, dtype=torch.long, device=device)

    # Alive state of the sentences still being decoded (rows: sentence-major, K beams each).
    orig = torch.arange(B, device=device)
    tokens = torch.full((B * K, width), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = BOS
    alive_lp = torch.full((B, K), float("-inf"), device=device)
    alive_lp[:, 0] = 0.0  # only the first beam is live at the start (tensor2tensor's initial_log_probs)
    state = model.init_state(encoder_out) if use_cache else None
    # The pre-softmax projection in the decoding dtype (autocast's, else the model's), into reused buffers.
    weight = model.output_weight
    compute = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else weight.dtype
    vocab = _VocabBuffers(B * K, weight.to(compute))

    for t in range(width - 1):  # t = tokens generated so far by every alive hypothesis
        n = orig.shape[0]
        # Rows fed per sentence: at the first step its K beams are the same BOS with only the first alive,
        # so (with the shared encoder output) one row per sentence is decoded; the state grows to K rows after.
        rk = 1 if (t == 0 and shared_memory and n_row >= n_cand) else K
        fed = tokens if rk == K else tokens[::K]
        states = model.decode_step(fed[:, t:t + 1] if use_cache else fed[:, :t + 1], encoder_out, state)
        # Candidates: each row's top n_cand tokens first (the sentence's best n_cand over K x V are among
        # them), so no K x V table is built. Log-probabilities are normalised over the whole vocabulary
        # in fp32 before PAD/BOS are banned, like fairseq's lprobs[:, pad] = -inf.
        lprobs = vocab.log_probs(states)
        lprobs[:, PAD] = float("-inf")
        lprobs[:, BOS] = float("-inf")
        at_max = t >= ml  # (n,) these sentences may only end now: EOS is their only candidate
        any_max = t >= ml_min  # known on the host: no device sync
        if any_max:
            rows = at_max.repeat_interleave(rk).unsqueeze(1)
            eos_lp = lprobs[:, EOS].clone()  # before the min_len ban: the maximum length wins
        if t < min_len:  # fairseq's --min-len: no EOS before min_len tokens
            lprobs[:, EOS] = float("-inf")
        row_lp, row_tok = topk_rows(lprobs, n_row)
        if any_max:  # masked writes rather than boolean indexing, which would wait for the device
            only_eos = torch.full_like(row_lp, float("-inf"))
            only_eos[:, 0] = eos_lp
            row_lp = torch.where(rows, only_eos, row_lp)
            row_tok = torch.where(rows & (torch.arange(n_row, device=device) == 0), EOS, row_tok)

        cand = (alive_lp[:, :rk].unsqueeze(2) + row_lp.view(n, rk, n_row)).view(n, rk * n_row)
        top_lp, top_j = cand.topk(n_cand, dim=1)
        beam, tok = top_j // n_row, row_tok.view(n, rk * n_row).gather(1, top_j)
        is_eos = tok == EOS

        # Finished candidates: keep the best per sentence if it beats the best so far.
        fin = torch.where(is_eos, top_lp / length_penalty(t + 1, alpha), neg_inf)
        fin_best, fin_j = fin.max(1)
        # Masked writes over every alive sentence: no device sync to ask which ones improved.
        improved = fin_best > best_score[orig]
        fin_j = fin_j.unsqueeze(1)
        fin_row = torch.arange(n, device=device) * K + beam.gather(1, fin_j).squeeze(1)
        best_score[orig] = torch.where(improved, fin_best, best_score[orig])
        best_lp[orig] = torch.where(improved, top_lp.gather(1, fin_j).squeeze(1), best_lp[orig])
        best_len[orig] = torch.where(improved, t, best_len[orig])
        best_tokens[orig] = torch.where(improved.unsqueeze(1), tokens.index_select(0, fin_row), best_tokens[orig])

        # Alive: the best K candidates that do not end in EOS.
        alive_lp, j = top_lp.masked_fill(is_eos, float("-inf")).topk(K, dim=1)
        new_beam, new_tok = beam.gather(1, j), tok.gather(1, j)
        index = (torch.arange(n, device=device) * K).unsqueeze(1) + new_beam  # (n, K) source rows
        cache_index = index if rk == K else (torch.arange(n, device=device) * rk).unsqueeze(1) + new_beam

        # Done: nothing alive can beat the best finished hypothesis (see the module docstring).
        lp_hi = length_penalty(ml.float() + 1, alpha).clamp(min=length_penalty(t + 2.0, alpha))
        done = (best_score[orig] >= alive_lp[:, 0] / lp_hi) | at_max
        n_done = int(done.sum())  # the step's one wait for the device
        if n_done == n:
            break
        if n_done:  # drop finished sentences from every per-row tensor and from the cache
            keep = (~done).nonzero().squeeze(1)
            orig, ml, alive_lp = orig[keep], ml[keep], alive_lp[keep]
            ml_min = int(ml.min())
            new_tok, index, cache_index = new_tok[keep], index[keep], cache_index[keep]
            flat = index.view(-1)
            mem_rows = keep if shared_memory else flat
            encoder_out = model.reorder_encoder_out(encoder_out, mem_rows)
            if use_cache:  # rows of dropped sentences go away, from the parts derived from the encoder too
                model.reorder_state(state, cache_index.view(-1), encoder_index=mem_rows)
        else:
            flat = index.view(-1)
            if use_cache:
                # Beams are only re-ranked within their sentence: the parts derived from the encoder stay
                # (with shared_memory=False its rows are identical within a sentence, so they may stay too).
                model.reorder_state(state, cache_index.view(-1))
        tokens = tokens.index_select(0, flat)
        tokens[:, t + 1] = new_tok.view(-1)

    out_tokens, lens = best_tokens.tolist(), best_len.tolist()
    scores, lps = best_score.tolist(), best_lp.tolist()
    return [Hypothesis(out_tokens[b][1:lens[b] + 1], scores[b], lps[b]) for b in range(B)]


def greedy_decode(model: EncoderDecoder, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50,
                  alpha: float = 0.6) -> list[Hypothesis]:
    """Greedy decoding written out plainly (one sentence at a time, whole prefix recomputed each step).

    An independent reference for ``beam_search(beam_size=1)``: same banned tokens (PAD, BOS), same
    maximum length, same score definition.
    """
    out = []
    limit = model.max_positions - 1
    for row in src:
        s = row[row != PAD].unsqueeze(0)
        max_len = min(int(math.floor(max_len_a * s.shape[1])) + int(max_len_b), limit)
        encoder_out = model.encode(s)
        ys, log_prob = [BOS], 0.0
        while True:
            states = model.decode_step(torch.tensor([ys], device=src.device), encoder_out, None)
            lprobs = model.project(states)[0].float().log_softmax(-1)
            lprobs[PAD] = lprobs[BOS] = float("-inf")
            if len(ys) - 1 >= max_len:
                nxt = EOS
            else:
                nxt = int(lprobs.argmax())
            log_prob += float(lprobs[nxt])
            if nxt == EOS:
                break
            ys.append(nxt)
        out.append(Hypothesis(ys[1:], log_prob / length_penalty(len(ys), alpha), log_prob))
    return out


def translate_ids(model: EncoderDecoder, src_ids: list[list[int]], beam_size: int = 4, alpha: float = 0.6,
                  max_len_a: float = 1.0, max_len_b: int = 50, batch_sentences: int = 128, device="cpu",
                  dtype: torch.dtype | None = torch.bfloat16, use_cache: bool = True, min_len: int = 0
                  ) -> list[Hypothesis]:
    """Decode many sentences (BPE ids without BOS/EOS); results in input order.

    Sentences are sorted by length (longest first, as fairseq and tensor2tensor batch) and decoded
    ``batch_sentences`` at a time. EOS is appended to each source, as in training (``data.collate``).
    An empty source gives an empty hypothesis without decoding. ``dtype=torch.bfloat16`` runs under
    autocast (scores and log-softmax stay in fp32); None decodes in the model's own precision.
    """
    results: list[Hypothesis | None] = [None] * len(src_ids)
    limit = model.max_positions
    todo = []
    for i, ids in enumerate(src_ids):
        if len(ids) == 0:
            results[i] = Hypothesis([], 0.0, 0.0)
        else:
            todo.append(i)
    todo.sort(key=lambda i: -len(src_ids[i]))
    device = torch.device(device)
    was_training = model.training
    model.eval()
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext())
    try:
        with torch.no_grad(), autocast:  # no_grad, not inference_mode: see beam_search
            for start in range(0, len(todo), batch_sentences):
                chunk = todo[start:start + batch_sentences]
                # Sources longer than the positions the model has are cut (they could not be encoded).
                src = pad([list(src_ids[i][:limit - 1]) + [EOS] for i in chunk], device)
                hyps = beam_search(model, src, beam_size, alpha, max_len_a, max_len_b, use_cache=use_cache,
                                   min_len=min_len)
                for i, h in zip(chunk, hyps):
                    results[i] = h
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]
