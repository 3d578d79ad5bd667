"""Evaluation: BLEU, checkpoint loading and averaging, and the ``evaluate`` / ``translate`` / ``average`` commands.

BLEU is sacreBLEU's corpus BLEU on detokenized output, with its signature (Post, 2018). For English->German
we also report the paper-comparable *tokenized* BLEU with compound splitting, computed as tensor2tensor's
``get_ende_bleu.sh`` does (Moses tokenizer, ``##AT##`` hyphen splitting, multi-bleu); it is stored under
its own key, ``bleu_tok_compound_split``, so it is never mistaken for sacreBLEU.
"""
from __future__ import annotations

import copy
import re
import sys
import time
from pathlib import Path

import torch

from . import config as C
from .atomic import atomic_path, write_text
from .decode import Hypothesis, translate_ids
from .errors import UserError
from .model import Transformer

STEP_CKPT = re.compile(r"^step=(\d+)(?:-v\d+)?\.ckpt$")


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


# ------------------------------------------------------------------------------------------ checkpoints
def _torch_load(path: Path) -> dict:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint {path} not found") from None
    except Exception as e:  # truncated file, not a torch file, unsafe pickle
        raise UserError(f"cannot read checkpoint {path} ({e.__class__.__name__}; truncated or damaged?): give "
                        f"another checkpoint written by `ltfm train` or `ltfm average` (--checkpoint PATH, e.g. a "
                        f"checkpoints/step=*.ckpt), or run the same `ltfm train` again: it sets damaged ones aside") from None
    if not isinstance(ck, dict) or not isinstance(ck.get("state_dict"), dict):
        raise UserError(f"{path} is not a Lightning checkpoint (no state_dict): give a checkpoint written by "
                        f"`ltfm train` or `ltfm average`")
    return ck


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a readable checkpoint (truncated, corrupt, not a Lightning checkpoint), or None.

    Checks the zip container and every member's CRC (a truncated or overwritten file fails here without
    unpickling anything), then loads it with ``weights_only=True`` (memory-mapped, so it costs little)."""
    import zipfile

    path = Path(path)
    try:
        if not zipfile.is_zipfile(path):
            return "not a complete zip archive: truncated?"
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            return f"member {bad} fails its CRC check"
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any failure to read is the answer
        return f"{e.__class__.__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}".rstrip(": ")
    if not isinstance(ck, dict) or not isinstance(ck.get("state_dict"), dict):
        return "no state_dict: not a Lightning checkpoint"
    return None


def step_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's ``checkpoints/step=NNNNNN.ckpt`` files, by step."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_CKPT.match(p.name))]
    return sorted(found, key=lambda sp: (sp[0], sp[1].name))


def average_checkpoints(paths: list[str | Path]) -> dict:
    """Mean of every floating-point tensor of the checkpoints' state_dicts (Sec. 6.1: "averaging the last
    5 checkpoints"); other entries are taken from the last checkpoint. Loads one checkpoint at a time.
    Accumulates in float64 and casts back to each tensor's dtype (tensor2tensor's avg_checkpoints sums in
    the checkpoint's dtype; float64 only makes the mean exact to the last bit)."""
    if not paths:
        raise UserError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    last: dict = {}
    for i, path in enumerate(paths):
        sd = _torch_load(Path(path))["state_dict"]
        if i == 0:
            sums = {k: v.to(torch.float64) for k, v in sd.items() if v.is_floating_point()}
            keys = set(sd)
        else:
            if set(sd) != keys:
                raise UserError(f"{path} has other parameters than {paths[0]}: average checkpoints of one run")
            for k in sums:
                if sd[k].shape != sums[k].shape:
                    raise UserError(f"{path}: {k} has shape {tuple(sd[k].shape)}, {paths[0]} has "
                                    f"{tuple(sums[k].shape)}: average checkpoints of one run")
                sums[k] += sd[k].to(torch.float64)
        last = sd
    n = len(paths)
    return {k: (sums[k] / n).to(v.dtype) if k in sums else v for k, v in last.items()}


def write_average(run_dir: str | Path, last: int = 5, out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Average the run's last ``last`` step checkpoints into ``out`` (default ``checkpoints/average.ckpt``).

    ``checkpoints/last.ckpt`` joins the candidates when it is newer than every step checkpoint (a run
    stopped by time). The written file is a Lightning checkpoint like the others (the newest averaged
    checkpoint with its state_dict replaced, without optimizer state), so it loads the same way.
    Returns (written path, averaged paths).
    """
    run_dir = Path(run_dir)
    if last < 1:
        raise UserError(f"asked to average the last {last} checkpoints: give at least 1 "
                        f"(ltfm average --last N, decode.average_last=N)")
    if not run_dir.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist: give a folder written by `ltfm train`")
    cands = []
    for step, path in step_checkpoints(run_dir):  # an unreadable one (full disk, kill) is left out, said once
        why = checkpoint_problem(path)
        if why is None:
            cands.append((step, path))
        else:
            print(f"ltfm: warning: skipping unreadable {path} ({why})", file=sys.stderr)
    last_ckpt = run_dir / "checkpoints" / "last.ckpt"
    if last_ckpt.is_file():
        why = checkpoint_problem(last_ckpt)
        if why is not None:
            print(f"ltfm: warning: skipping unreadable {last_ckpt} ({why})", file=sys.stderr)
        else:
            step = int(_torch_load(last_ckpt).get("global_step", -1))
            if not cands or step > cands[-1][0]:
                cands.append((step, last_ckpt))
    if not cands:
        raise UserError(f"run folder {run_dir} has no checkpoints to average (checkpoints/step=*.ckpt): "
                        f"train it first with `ltfm train CONFIG`")
    chosen = [p for _, p in cands[-last:]]
    state = average_checkpoints(chosen)
    ck = _torch_load(chosen[-1])
    for key in ("optimizer_states", "lr_schedulers"):
        ck.pop(key, None)
    ck["state_dict"] = state
    ck["averaged_from"] = [p.name for p in chosen]
    out = Path(out) if out else run_dir / "checkpoints" / "average.ckpt"
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        torch.save(ck, tmp)
    return out, chosen


def average_cli(args) -> int:
    """``ltfm average RUN_DIR [--last N] [--out PATH]``."""
    out, chosen = write_average(args.run_dir, args.last, args.out)
    note = "" if len(chosen) == args.last else f" (only {len(chosen)} available, {args.last} asked)"
    print(f"averaged {len(chosen)} checkpoints{note}: {', '.join(p.name for p in chosen)} -> {out}")
    return 0


def resolve_checkpoint(run_dir: str | Path, checkpoint: str = "last", average_last: int | None = None) -> Path:
    """Path of ``last`` | ``best`` | ``average`` (written if missing) | a file path."""
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    if checkpoint not in ("last", "best", "average"):
        p = Path(checkpoint)
        if not p.is_file():
            raise UserError(f"checkpoint {checkpoint!r} not found: give last, best, average or a .ckpt file")
        return p
    if not ckpt_dir.is_dir() or not any(ckpt_dir.glob("*.ckpt")):
        raise UserError(f"run folder {run_dir} has no checkpoints (checkpoints/*.ckpt): train it first with "
                        f"`ltfm train CONFIG`, or pass --checkpoint PATH")
    if checkpoint == "last":
        p = ckpt_dir / "last.ckpt"
        if not p.is_file():
            raise UserError(f"run folder {run_dir} has no checkpoints/last.ckpt: pass --checkpoint best, average or PATH")
        return p
    if checkpoint == "best":
        p = ckpt_dir / "best.ckpt"
        if not p.is_file():
            raise UserError(f"run folder {run_dir} records no best checkpoint (checkpoints/best.ckpt, lowest dev "
                            f"loss): use --checkpoint last or average")
        return p
    p = ckpt_dir / "average.ckpt"
    if not p.is_file():
        n = average_last or 5
        print(f"ltfm: writing {p} (average of the last {n} checkpoints)", file=sys.stderr)
        write_average(run_dir, n, p)
    return p


def load_model(run_dir: str | Path, checkpoint: str = "last", average_last: int | None = None):
    """(model in eval mode on CPU, nested config, tokenizer) of a run folder's checkpoint.

    ``checkpoint``: ``last``, ``best`` (lowest dev loss), ``average`` (``checkpoints/average.ckpt``, written
    from the last ``average_last`` (default: the run's decode.average_last, else 5) checkpoints when
    missing), or a path. The config is the checkpoint's own (``hyper_parameters.config``), else the run's
    config.yaml. A checkpoint of another vocabulary than the run's tokenizer is refused.
    """
    from .data import load_tokenizer

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist: give a folder written by `ltfm train`")
    cfg_path = run_dir / "config.yaml"
    run_cfg = C.load_config(cfg_path) if cfg_path.is_file() else None
    if average_last is None and run_cfg is not None:
        average_last = run_cfg["decode"]["average_last"] or None
    path = resolve_checkpoint(run_dir, checkpoint, average_last)
    ck = _torch_load(path)
    hp = ck.get("hyper_parameters") or {}
    cfg = copy.deepcopy(hp.get("config") or run_cfg)
    if cfg is None:
        raise UserError(f"{path} holds no config and {cfg_path} is missing: give a run folder written by `ltfm train`")
    state = {k[len("model."):]: v for k, v in ck["state_dict"].items() if k.startswith("model.")}
    if "embed.weight" not in state:
        raise UserError(f"{path} is not a lightning_tfm checkpoint (no model.embed.weight)")
    tokenizer = load_tokenizer(run_dir)
    vocab = int(hp.get("vocab_size") or state["embed.weight"].shape[0])
    if vocab != tokenizer.get_vocab_size() or state["embed.weight"].shape[0] != vocab:
        raise UserError(f"checkpoint {path} has a vocabulary of {vocab} entries but {run_dir / 'tokenizer.json'} has "
                        f"{tokenizer.get_vocab_size()}: it belongs to another run; give a checkpoint of this run")
    model = Transformer.from_config(cfg["model"], vocab)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"checkpoint {path} does not fit its model config ({str(e).splitlines()[0]})") from None
    return model.eval(), cfg, tokenizer


# ---------------------------------------------------------------------------------------------- decoding
def decode_dtype(cfg: dict) -> torch.dtype | None:
    """bf16 autocast when the run trained in bf16 (train.precision bf16-* or auto resolving to it) and this
    device runs bf16 natively, else the model's fp32."""
    from .precision import decode_dtype as _dtype

    return _dtype(str(cfg["train"]["precision"]), cfg["train"]["accelerator"])


def translate_lines(model: Transformer, tokenizer, lines: list[str], decode_cfg: dict,
                    dtype: torch.dtype | None = None) -> tuple[list[str], list[Hypothesis]]:
    """Detokenized translations (one line each: newlines inside a hypothesis become spaces) and hypotheses."""
    from .data import decode_ids, encode_lines

    device = next(model.parameters()).device
    hyps = translate_ids(model, encode_lines(tokenizer, lines), beam_size=decode_cfg["beam_size"],
                         alpha=decode_cfg["length_penalty"], max_len_a=decode_cfg["max_len_a"],
                         max_len_b=decode_cfg["max_len_b"], batch_sentences=decode_cfg["batch_sentences"],
                         device=device, dtype=dtype)
    texts = [decode_ids(tokenizer, h.tokens).replace("\r", " ").replace("\n", " ") for h in hyps]
    return texts, hyps


def evaluate_texts(model: Transformer, tokenizer, src_lines: list[str], ref_lines: list[str], decode_cfg: dict,
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
                  beam_size=decode_cfg["beam_size"], length_penalty=decode_cfg["length_penalty"])
    return hyps, result


def apply_overrides(cfg: dict, overrides: list[str] | None) -> dict:
    """``decode.*`` (and ``data.*``, e.g. data.path for --split on another machine) overrides."""
    cfg = copy.deepcopy(cfg)
    for text in overrides or []:
        key, value = C.parse_override(text)
        if key.split(".")[0] not in ("decode", "data"):
            raise UserError(f"cannot override {key!r} when decoding: only decode.* and data.* keys apply")
        C.set_dotted(cfg, key, value)
    if cfg["decode"]["beam_size"] < 1:
        raise UserError(f"decode.beam_size={cfg['decode']['beam_size']} must be at least 1")
    if cfg["decode"]["batch_sentences"] < 1:
        raise UserError(f"decode.batch_sentences={cfg['decode']['batch_sentences']} must be at least 1")
    return cfg


def _average_last_override(overrides: list[str] | None) -> int | None:
    for text in overrides or []:
        key, value = C.parse_override(text)
        if key == "decode.average_last":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"decode.average_last={value!r} must be 0 (no averaging) or the number of last "
                                "checkpoints to average, e.g. 5")
            return value or None
    return None


def _write_lines_atomic(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(line + "\n" for line in lines))


def evaluate_cli(args) -> int:
    """``ltfm evaluate RUN_DIR [--split NAME | --src FILE --ref FILE] [--checkpoint ...] [--out FILE] [decode.k=v]``.

    Without --split/--src the run's test split is used (its dev split if it has none).
    """
    from .data import load_split, read_lines

    if args.split and (args.src or args.ref):
        raise UserError("give either --split NAME or --src FILE --ref FILE, not both")
    if bool(args.src) != bool(args.ref):
        raise UserError("--src and --ref go together: give both line-aligned files")
    model, cfg, tokenizer = load_model(args.run_dir, args.checkpoint, _average_last_override(args.overrides))
    cfg = apply_overrides(cfg, args.overrides)
    if args.src:
        src_lines, ref_lines = read_lines(args.src), read_lines(args.ref)
        if len(src_lines) != len(ref_lines):
            raise UserError(f"{args.src} has {len(src_lines)} lines but {args.ref} has {len(ref_lines)}: "
                            f"source and reference must be line-aligned")
        if not src_lines:
            raise UserError(f"{args.src} is empty: give at least one source sentence")
        name = Path(args.src).name.removesuffix(".gz")
    else:
        d = cfg["data"]
        name = args.split or d["test_split"] or d["dev_split"]
        # The run's own subset sizes apply to its own splits, so the numbers match its summary.
        limit = d["max_test_pairs"] if name == d["test_split"] else d["max_dev_pairs"] if name == d["dev_split"] else None
        ds = load_split(cfg, name, limit)
        src_lines, ref_lines = list(ds["src"]), list(ds["tgt"])
    label = args.checkpoint if args.checkpoint in ("last", "best", "average") else Path(args.checkpoint).stem
    # The beam size is part of the name, so a greedy and a beam run of one checkpoint sit side by side.
    default_out = Path(args.run_dir) / "hyps" / f"{name}.{label}.beam{cfg['decode']['beam_size']}.txt"
    out = Path(args.out) if args.out else default_out
    hyps, result = evaluate_texts(model, tokenizer, src_lines, ref_lines, cfg["decode"], cfg["data"]["tgt_lang"],
                                  decode_dtype(cfg))
    _write_lines_atomic(out, hyps)
    for line in format_bleu(result):
        print(line)
    d = cfg["decode"]
    print(f"hypotheses: {out} ({len(hyps)} lines; {name}, checkpoint {label}, beam {d['beam_size']}, "
          f"alpha {d['length_penalty']}, {result['sentences_per_s']:.1f} sentences/s)")
    return 0


def translate_cli(args) -> int:
    """``ltfm translate RUN_DIR [--checkpoint ...] [decode.k=v]``: stdin -> stdout, one line per line.

    Reads and translates in chunks (line by line when stdin is a terminal); an empty or blank input line
    gives an empty output line, so the line count is kept exactly. Empty stdin is an error.
    """
    model, cfg, tokenizer = load_model(args.run_dir, args.checkpoint, _average_last_override(args.overrides))
    cfg = apply_overrides(cfg, args.overrides)
    dtype = decode_dtype(cfg)
    chunk = 1 if sys.stdin.isatty() else max(8 * cfg["decode"]["batch_sentences"], 1)
    total, buf = 0, []

    def flush():
        texts, _ = translate_lines(model, tokenizer, buf, cfg["decode"], dtype)
        sys.stdout.write("".join(t + "\n" for t in texts))
        sys.stdout.flush()
        buf.clear()

    for raw in sys.stdin.buffer:
        buf.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        total += 1
        if len(buf) >= chunk:
            flush()
    if buf:
        flush()
    if total == 0:
        raise UserError("no input on stdin: pipe source sentences, one per line (e.g. ltfm translate RUN < file.en)")
    return 0
