"""The handlers of ``ltfm evaluate``, ``ltfm translate`` and ``ltfm average``: arguments in, one line per
user error (:class:`UserError`), the library functions of :mod:`.evaluate` and :mod:`.checkpoints` underneath.
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

from . import config
from .atomic import write_text
from .checkpoints import load_model, write_average
from .errors import UserError
from .evaluate import decode_dtype, evaluate_texts, format_bleu, translate_lines


def average_cli(args) -> int:
    """``ltfm average RUN_DIR [--last N] [--out PATH]``."""
    check_out_file(args.out)
    out, chosen = write_average(args.run_dir, args.last, args.out)
    note = "" if len(chosen) == args.last else f" (only {len(chosen)} available, {args.last} asked)"
    print(f"averaged {len(chosen)} checkpoints{note}: {', '.join(p.name for p in chosen)} -> {out}")
    return 0


def apply_overrides(cfg: config.Config, overrides: list[str] | None) -> config.Config:
    """``decode.*`` (and ``data.*``, e.g. data.path for --split on another machine) overrides."""
    cfg = copy.deepcopy(cfg)
    for text in overrides or []:
        key, value = config.parse_override(text)
        if key.split(".")[0] not in ("decode", "data"):
            raise UserError(f"cannot override {key!r} when decoding: only decode.* and data.* keys apply")
        config.set_dotted(cfg, key, value)
    if cfg.decode.beam_size < 1:
        raise UserError(f"decode.beam_size={cfg.decode.beam_size} must be at least 1")
    if cfg.decode.batch_sentences < 1:
        raise UserError(f"decode.batch_sentences={cfg.decode.batch_sentences} must be at least 1")
    return cfg


def _average_last_override(overrides: list[str] | None) -> int | None:
    for text in overrides or []:
        key, value = config.parse_override(text)
        if key == "decode.average_last":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"decode.average_last={value!r} must be 0 (no averaging) or the number of last "
                                "checkpoints to average, e.g. 5")
            return value or None
    return None


def _write_lines_atomic(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(line + "\n" for line in lines))


def check_out_file(out: str | None) -> None:
    """``--out`` must name a file that can be written: checked before any work, so a decode of the whole test
    set is never lost to a bad path at the end."""
    if not out:
        return
    path = Path(out)
    if path.is_dir():
        raise UserError(f"--out {out} is a folder: give a file path, e.g. {path / 'out.txt'}")
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"--out {out}: {probe} is a file, not a folder: give a path in a folder")
    if not os.access(probe, os.W_OK):
        raise UserError(f"--out {out}: the folder {probe} is not writable: give a path you can write")


def evaluate_cli(args) -> int:
    """``ltfm evaluate RUN_DIR [--split NAME | --src FILE --ref FILE] [--checkpoint ...] [--out FILE] [decode.k=v]``.

    Without --split/--src the run's test split is used (its dev split if it has none).
    """
    from .data import load_split, read_lines

    if args.split and (args.src or args.ref):
        raise UserError("give either --split NAME or --src FILE --ref FILE, not both")
    if bool(args.src) != bool(args.ref):
        raise UserError("--src and --ref go together: give both line-aligned files")
    check_out_file(args.out)
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
        d = cfg.data
        name = args.split or d.test_split or d.dev_split
        # The run's own subset sizes apply to its own splits, so the numbers match its summary.
        limit = d.max_test_pairs if name == d.test_split else d.max_dev_pairs if name == d.dev_split else None
        ds = load_split(cfg, name, limit)
        src_lines, ref_lines = list(ds["src"]), list(ds["tgt"])
    label = args.checkpoint if args.checkpoint in ("last", "best", "average") else Path(args.checkpoint).stem
    # The beam size is part of the name, so a greedy and a beam run of one checkpoint sit side by side.
    default_out = Path(args.run_dir) / "hyps" / f"{name}.{label}.beam{cfg.decode.beam_size}.txt"
    out = Path(args.out) if args.out else default_out
    hyps, result = evaluate_texts(model, tokenizer, src_lines, ref_lines, cfg.decode, cfg.data.tgt_lang,
                                  decode_dtype(cfg))
    _write_lines_atomic(out, hyps)
    for line in format_bleu(result):
        print(line)
    d = cfg.decode
    print(f"hypotheses: {out} ({len(hyps)} lines; {name}, checkpoint {label}, beam {d.beam_size}, "
          f"alpha {d.length_penalty}, {result['sentences_per_s']:.1f} sentences/s)")
    return 0


def translate_cli(args) -> int:
    """``ltfm translate RUN_DIR [--checkpoint ...] [decode.k=v]``: stdin -> stdout, one line per line.

    Reads and translates in chunks (line by line when stdin is a terminal); an empty or blank input line
    gives an empty output line, so the line count is kept exactly. Empty stdin is an error.
    """
    model, cfg, tokenizer = load_model(args.run_dir, args.checkpoint, _average_last_override(args.overrides))
    cfg = apply_overrides(cfg, args.overrides)
    dtype = decode_dtype(cfg)
    chunk = 1 if sys.stdin.isatty() else max(8 * cfg.decode.batch_sentences, 1)
    total, buf = 0, []

    def flush():
        texts, _ = translate_lines(model, tokenizer, buf, cfg.decode, dtype)
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
