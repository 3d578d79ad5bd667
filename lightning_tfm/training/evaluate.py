"""Evaluation: BLEU and the decoding wrappers that produce what it scores, and a run's final evaluation.

BLEU is sacreBLEU's corpus BLEU on detokenized output, with its signature (Post, 2018). For English->German
we also report the paper-comparable *tokenized* BLEU with compound splitting, computed as tensor2tensor's
``get_ende_bleu.sh`` does (Moses tokenizer, ``##AT##`` hyphen splitting, multi-bleu); it is stored under
its own key, ``bleu_tok_compound_split``, so it is never mistaken for sacreBLEU.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from ..base import atomic
from ..base.errors import UserError
from ..model import Transformer
from .config.config import Config, DecodeConfig
from .decode import Hypothesis, translate_ids
from .runs.checkpoints import load_model, step_checkpoints, write_average


# ------------------------------------------------------------------------------------------------ BLEU
# ------------------------------------------------------------------------------------------------ BLEU
def bleu(hyps: list[str], refs: list[str], tgt_lang: str) -> dict:
    """Corpus BLEU of detokenized hypotheses against one reference each.

    Returns ``score``, ``signature`` (sacreBLEU's, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|...``), ``bp``,
    ``ratio`` (hypothesis length / reference length, in sacreBLEU's tokens), ``sys_len``, ``ref_len``; for a
    German target also ``bleu_tok_compound_split`` (see :func:`tokenized_bleu_compound_split`).
    """
    from sacrebleu.metrics import BLEU

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    # sacreBLEU's default 13a tokenizer, as its command line uses; Chinese gets its own (as sacreBLEU's -l *-zh).
    metric = BLEU(trg_lang=tgt_lang if tgt_lang == "zh" else "")
    res = metric.corpus_score(list(hyps), [list(refs)])
    out = {"score": float(res.score), "signature": str(metric.get_signature()), "bp": float(res.bp),
           "ratio": float(res.ratio), "sys_len": int(res.sys_len), "ref_len": int(res.ref_len)}
    if tgt_lang == "de":
        out["bleu_tok_compound_split"] = tokenized_bleu_compound_split(hyps, refs, tgt_lang)
    return out


_ATAT = re.compile(r"(\S)-(\S)")


def tokenize_compound_split(lines: list[str], lang: str = "de") -> list[str]:
    """tensor2tensor's ``get_ende_bleu.sh`` preprocessing, in Python.

    The script runs Moses ``tokenizer.perl -l de`` (which escapes ``&'"<>`` etc.; later versions of the
    script run ``replace-unicode-punctuation.perl`` first, and so do we), then
    ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` and ``multi-bleu.perl``. We use sacremoses, the
    Python port of those Moses scripts, and the same regular expression (Python's ``re.sub`` scans left
    to right without overlap exactly like Perl's ``s///g``). The script reads already-tokenized gold
    references; we put the references through the same steps as the hypotheses.
    """
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm = MosesPunctNormalizer(lang=lang)
    tok = MosesTokenizer(lang=lang)
    out = []
    for line in lines:
        t = tok.tokenize(norm.replace_unicode_punct(line), return_str=True, escape=True)
        out.append(_ATAT.sub(r"\1 ##AT##-##AT## \2", t))
    return out


def tokenized_bleu_compound_split(hyps: list[str], refs: list[str], lang: str = "de") -> float:
    """Tokenized, compound-split BLEU comparable to the paper's Table 2/3 numbers (not sacreBLEU).

    multi-bleu.perl is case-sensitive, splits on whitespace, has no smoothing and uses the closest
    reference length for the brevity penalty; sacreBLEU with ``tokenize="none"`` and
    ``smooth_method="none"`` computes exactly that on the pre-tokenized text.
    """
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return float(metric.corpus_score(tokenize_compound_split(hyps, lang),
                                     [tokenize_compound_split(refs, lang)]).score)


def format_bleu(result: dict) -> list[str]:
    """Human-readable lines: sacreBLEU with signature and length ratio, then the tokenized score if any."""
    lines = [f"sacreBLEU = {result['score']:.2f}  {result['signature']}",
             f"length ratio = {result['ratio']:.3f} (hyp_len {result['sys_len']} / ref_len {result['ref_len']}), "
             f"BP = {result['bp']:.3f}"]
    if "bleu_tok_compound_split" in result:
        lines.append(f"tokenized BLEU with compound splitting (tensor2tensor get_ende_bleu.sh; paper-comparable, "
                     f"NOT sacreBLEU) = {result['bleu_tok_compound_split']:.2f}")
    return lines


# ---------------------------------------------------------------------------------------------- decoding
# ---------------------------------------------------------------------------------------------- decoding
def decode_dtype(cfg: Config) -> torch.dtype | None:
    """bf16 autocast when the run trained in bf16 (train.precision bf16-* or auto resolving to it) and this
    device runs bf16 natively, else the model's fp32."""
    from .precision import decode_dtype as _dtype

    return _dtype(str(cfg.train.precision), cfg.train.accelerator)


def translate_lines(model: Transformer, tokenizer, lines: list[str], decode_cfg: DecodeConfig,
                    dtype: torch.dtype | None = None) -> tuple[list[str], list[Hypothesis]]:
    """Detokenized translations (one line each: newlines inside a hypothesis become spaces) and hypotheses."""
    from .data.data import decode_ids, encode_lines

    device = next(model.parameters()).device
    hyps = translate_ids(model, encode_lines(tokenizer, lines), beam_size=decode_cfg.beam_size,
                         alpha=decode_cfg.length_penalty, max_len_a=decode_cfg.max_len_a,
                         max_len_b=decode_cfg.max_len_b, batch_sentences=decode_cfg.batch_sentences,
                         device=device, dtype=dtype)
    texts = [decode_ids(tokenizer, h.tokens).replace("\r", " ").replace("\n", " ") for h in hyps]
    return texts, hyps


def evaluate_texts(model: Transformer, tokenizer, src_lines: list[str], ref_lines: list[str], decode_cfg: DecodeConfig,
                   tgt_lang: str, dtype: torch.dtype | None = None) -> tuple[list[str], dict]:
    """Translate ``src_lines`` with the ``decode`` settings and score against ``ref_lines``.

    Returns (hypotheses, :func:`bleu` dict plus ``sentences_per_s`` and the decode settings used). The
    model's train/eval mode is restored afterwards, so the training loop can call this for dev BLEU.
    """
    if len(src_lines) != len(ref_lines):
        raise UserError(f"{len(src_lines)} source lines but {len(ref_lines)} reference lines: give line-aligned files")
    if not src_lines:
        raise UserError("no sentences to evaluate: give a non-empty source file")
    start = time.perf_counter()
    hyps, _ = translate_lines(model, tokenizer, src_lines, decode_cfg, dtype)
    elapsed = time.perf_counter() - start
    result = bleu(hyps, ref_lines, tgt_lang)
    result.update(sentences=len(hyps), sentences_per_s=len(hyps) / max(elapsed, 1e-9),
                  beam_size=decode_cfg.beam_size, length_penalty=decode_cfg.length_penalty)
    return hyps, result


def final_evaluation(cfg: Config, model, corpus, run_dir: Path) -> dict:
    """Dev and test BLEU at the end of training (Sec. 6.1-6.2: beam search, sacreBLEU), hypotheses files.

    With ``decode.average_last`` = N > 0 the average of the checkpoints of the last N steps, the final one included,
    is evaluated (the paper's final models, Table 2); otherwise the final weights (the paper's Table 3 used no
    averaging).
    """
    out: dict = {}
    n_avg = cfg.decode.average_last
    checkpoint = "last"
    if n_avg and len(step_checkpoints(run_dir)) >= 2:
        _, chosen = write_average(run_dir, n_avg)  # kept beside the others: the checkpoint the BLEU belongs to
        model, _, _ = load_model(run_dir, "average", average_last=n_avg)
        checkpoint = f"average of last {len(chosen)}"
        out["bleu_checkpoint_path"] = str(run_dir / "checkpoints" / "average.ckpt")
    else:
        out["bleu_checkpoint_path"] = str(run_dir / "checkpoints" / "last.ckpt")
    model.eval()
    hyp_dir = run_dir / "hyps"
    hyp_dir.mkdir(exist_ok=True)
    d = cfg.data
    splits = [("dev", corpus.dev_raw)] + ([("test", corpus.test_raw)] if corpus.test_raw is not None else [])
    for name, ds in splits:
        hyps, result = evaluate_texts(model, corpus.tokenizer, list(ds["src"]), list(ds["tgt"]), cfg.decode,
                                      d.tgt_lang, decode_dtype(cfg))
        atomic.write_text(hyp_dir / f"{name}.{d.tgt_lang}.txt", "\n".join(hyps) + "\n")
        out[f"{name}_bleu"] = round(result["score"], 2)
        out[f"{name}_bleu_ratio"] = round(result["ratio"], 4)
        out[f"{name}_decode_sentences_per_s"] = round(result["sentences_per_s"], 1)
        if "bleu_tok_compound_split" in result:
            out[f"{name}_bleu_tok_compound_split"] = round(result["bleu_tok_compound_split"], 2)
        out["bleu_signature"] = result["signature"]
    out["bleu_checkpoint"] = checkpoint
    out["decode"] = {k: getattr(cfg.decode, k) for k in ("beam_size", "length_penalty", "max_len_a", "max_len_b")}
    return out
