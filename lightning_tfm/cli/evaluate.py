"""``ltfm evaluate``, ``translate`` and ``average``: what is done with a run's checkpoint (BLEU on a split or on any
files, stdin translated to stdout, the last N checkpoints averaged into one), and the ``decode.*`` overrides they
take."""
from __future__ import annotations

import argparse
import copy
import math
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.command import Command, say_done
from ..base.errors import UserError
from ..base.memory import keep_freed_memory
from .common import check_outputs

if TYPE_CHECKING:
    from ..training.config.config import Config


def _average_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument("run_dir", help="a run folder written by ltfm train")
    a.add_argument("--last", type=int, default=5, metavar="N", help="how many step checkpoints (default 5)")
    a.add_argument("--out", metavar="FILE", help="the averaged checkpoint (default checkpoints/average.ckpt)")


def average_cli(args) -> int:
    """``ltfm average RUN_DIR [--last N] [--out PATH]``."""
    from ..training.runs.checkpoints import write_average

    if args.out or Path(args.run_dir).is_dir():  # (a run folder that is not there: write_average says so)
        own = Path(args.run_dir) / "checkpoints" / "average.ckpt"  # its own file: replaced, never another run's
        check_outputs([args.out or own], "--out" if args.out else "the averaged checkpoint", replaces=[own])
    out, chosen = write_average(args.run_dir, args.last, args.out)
    note = "" if len(chosen) == args.last else f" (only {len(chosen)} available, {args.last} asked)"
    print(f"averaged {len(chosen)} checkpoints{note}: {', '.join(p.name for p in chosen)} -> {out}")
    run = shlex.quote(str(args.run_dir))
    say_done(str(out), f"ltfm evaluate {run} --checkpoint {'average' if not args.out else shlex.quote(str(out))}")
    return 0


AVERAGE = Command("average", "average the last N checkpoints of a run into one file", _average_arguments,
                  average_cli)


def check_overrides(overrides: list[str] | None) -> dict:
    """The ``decode.*`` (and ``data.*``, e.g. data.path for --split on another machine) overrides of ``evaluate`` and
    ``translate``, read and checked before any work as ``ltfm train`` and ``ltfm config`` check them: a known key,
    its type, its range (:func:`~.config.config.check_value`); {key: value}. A one-line UserError otherwise."""
    from ..training.config import config

    probe, checked = config.Config(), {}
    for text in overrides or []:
        key, value = config.parse_override(text)
        if key.split(".")[0] not in ("decode", "data"):
            raise UserError(f"cannot override {key!r} when decoding: only decode.* and data.* keys apply")
        config.set_dotted(probe, key, value)  # an unknown key, a wrong type
        checked[key] = value = config.get_dotted(probe, key)
        if isinstance(value, float) and not math.isfinite(value):  # as config.validate says it, before the range
            raise UserError(f"{key}={value} is not a finite number: give a real value")
        config.check_value(key, value)  # its range, as the config check of ltfm train
    return checked


def apply_overrides(cfg: Config, overrides: dict) -> Config:
    """A copy of the run's ``cfg`` with ``overrides`` (:func:`check_overrides`) set, and the sections they touch
    checked whole (their rules across keys: decode.max_len_a=0 with decode.max_len_b=0 allows no token)."""
    from ..training.config import config

    cfg = copy.deepcopy(cfg)
    for key, value in overrides.items():
        config.set_dotted(cfg, key, value)
    for section in sorted({key.split(".")[0] for key in overrides}):
        if (why := getattr(cfg, section).problem()) is not None:
            raise UserError(why)
    return cfg


def _write_lines_atomic(path: Path, lines: list[str]) -> None:
    from ..base.atomic import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(line + "\n" for line in lines))


#: How much of a folder's or a file's name a hypotheses file's name keeps (characters; the hash beside it tells them
#: apart): the default name then fits in a folder's 255 bytes whatever the run folder or the source is called
_KEPT = 40


def path_tag(path: str | Path) -> str:
    """Eight hex digits that tell one file from another of the same name: a hash of its resolved path."""
    import hashlib

    return hashlib.sha256(str(Path(path).resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:8]


def checkpoint_label(checkpoint: str, run_dir: Path, average_last: int | None = None) -> str:
    """The name of a ``--checkpoint`` in a hypotheses file's name: ``last``, ``best``, ``average`` (the written
    ``checkpoints/average.ckpt``; ``average-last3`` when none is written and the last 3 are averaged in memory), or
    a file's stem (``step=000050``) when the file is one of the run's own. Another run's checkpoint is named with
    its run folder and a hash of its path (``<run>-1a2b3c4d.last``; a file elsewhere: with its folder), so that its
    hypotheses never take the place of the run's own under the same label, nor those of another checkpoint whose
    run folder has the same name (``results/X`` and ``results-quick/X``)."""
    from ..training.runs.checkpoints import own_run, resolve_checkpoint

    if checkpoint == "average" and resolve_checkpoint(run_dir, "average") is None:
        return f"average-last{average_last or 5}"
    if checkpoint in ("last", "best", "average"):
        return checkpoint
    path = Path(checkpoint)
    owner = own_run(path)
    if owner is not None and owner.resolve() == run_dir.resolve():
        return path.stem
    return f"{(owner or path.absolute().parent).name[:_KEPT]}-{path_tag(path)}.{path.stem[:_KEPT]}"


def source_label(src: str) -> str:
    """The name of a ``--src`` file in a hypotheses file's name: its name and a hash of its path (``val.en-1a2b3c4d``),
    so that two sources of the same name in different folders never share a hypotheses file."""
    return f"{Path(src).name.removesuffix('.gz')[:_KEPT]}-{path_tag(src)}"


def _evaluate_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("run_dir", help="a run folder written by ltfm train")
    e.add_argument("--split", metavar="NAME", help="a split of the run's data, e.g. test_2016_flickr (default: "
                   "its test split, else its dev split)")
    e.add_argument("--src", metavar="FILE", help="source sentences, one per line (with --ref)")
    e.add_argument("--ref", metavar="FILE", help="reference translations, line-aligned with --src")
    e.add_argument("--checkpoint", default="last", help="last | best | average | PATH (default last)")
    e.add_argument("--out", metavar="FILE", help="hypotheses file (default: in the run folder)")
    e.add_argument("overrides", nargs="*", help="decode.* (and data.*) overrides, e.g. decode.beam_size=1")


def evaluate_cli(args) -> int:
    """``ltfm evaluate RUN_DIR [--split NAME | --src FILE --ref FILE] [--checkpoint ...] [--out FILE] [decode.k=v]``.

    Without --split/--src the run's test split is used (its dev split if it has none).
    """
    from ..training.data.data import load_split, read_lines
    from ..training.evaluate import decode_dtype, evaluate_texts, format_bleu
    from ..training.runs.checkpoints import load_model

    if args.split and (args.src or args.ref):
        raise UserError("give either --split NAME or --src FILE --ref FILE, not both")
    if bool(args.src) != bool(args.ref):
        raise UserError("--src and --ref go together: give both line-aligned files")
    keep_freed_memory()  # decoding's freed buffers kept for its next batch (base/memory.py)
    overrides = check_overrides(args.overrides)
    reads = [("--src", args.src), ("--ref", args.ref)]
    if args.checkpoint not in ("last", "best", "average"):
        reads.append(("--checkpoint", args.checkpoint))  # the run's own are its owned files
    if args.out:  # before the checkpoint is read (the default name is known once it is)
        check_outputs([args.out], reads=reads)
    average_last = overrides.get("decode.average_last") or None
    model, cfg, tokenizer = load_model(args.run_dir, args.checkpoint, average_last)
    label = checkpoint_label(args.checkpoint, Path(args.run_dir), average_last or cfg.decode.average_last)
    cfg = apply_overrides(cfg, overrides)
    d = cfg.data
    name = source_label(args.src) if args.src else args.split or d.test_split or d.dev_split
    # The beam size is part of the name, so a greedy and a beam run of one checkpoint sit side by side.
    out = Path(args.out or Path(args.run_dir) / "hyps" / f"{name}.{label}.beam{cfg.decode.beam_size}.txt")
    if not args.src and d.source == "local" and d.path:  # the split's files
        reads += [(f"the {name} split's file", Path(d.path) / f"{name}.{lang}{gz}") for lang in (d.src_lang, d.tgt_lang)
                  for gz in ("", ".gz")]
    check_outputs([out], "--out" if args.out else "the hypotheses file (--out FILE names another)",
                  reads=reads)  # before the work
    if args.src:
        src_lines, ref_lines = read_lines(args.src), read_lines(args.ref)
        if len(src_lines) != len(ref_lines):
            raise UserError(f"{args.src} has {len(src_lines)} lines but {args.ref} has {len(ref_lines)}: "
                            f"source and reference must be line-aligned")
        if not src_lines:
            raise UserError(f"{args.src} is empty: give at least one source sentence")
    else:
        # The run's own subset sizes apply to its own splits, so the numbers match its summary.
        limit = d.max_test_pairs if name == d.test_split else d.max_dev_pairs if name == d.dev_split else None
        ds = load_split(cfg, name, limit)
        src_lines, ref_lines = list(ds["src"]), list(ds["tgt"])
    hyps, result = evaluate_texts(model, tokenizer, src_lines, ref_lines, cfg.decode, cfg.data.tgt_lang,
                                  decode_dtype(cfg))
    _write_lines_atomic(out, hyps)
    for line in format_bleu(result):
        print(line)
    d = cfg.decode
    print(f"hypotheses: {out} ({len(hyps)} lines; {name}, checkpoint {label}, beam {d.beam_size}, "
          f"alpha {d.length_penalty}, {result['sentences_per_s']:.1f} sentences/s)")
    return 0


EVALUATE = Command("evaluate", "BLEU of a run's checkpoint on a split or on any files", _evaluate_arguments,
                   evaluate_cli)


def _translate_arguments(tr: argparse.ArgumentParser) -> None:
    tr.add_argument("run_dir", help="a run folder written by ltfm train")
    tr.add_argument("--checkpoint", default="last", help="last | best | average | PATH (default last)")
    tr.add_argument("overrides", nargs="*", help="decode.* overrides, e.g. decode.beam_size=1")


def translate_cli(args) -> int:
    """``ltfm translate RUN_DIR [--checkpoint ...] [decode.k=v]``: stdin -> stdout, one line per line.

    Reads and translates in chunks (line by line when stdin is a terminal); an empty or blank input line
    gives an empty output line, so the line count is kept exactly. Empty stdin is an error.
    """
    from ..training.evaluate import decode_dtype, translate_lines
    from ..training.runs.checkpoints import load_model

    keep_freed_memory()  # decoding's freed buffers kept for its next batch (base/memory.py)
    overrides = check_overrides(args.overrides)
    model, cfg, tokenizer = load_model(args.run_dir, args.checkpoint, overrides.get("decode.average_last") or None)
    cfg = apply_overrides(cfg, overrides)
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


TRANSLATE = Command("translate", "translate stdin to stdout with a run's checkpoint", _translate_arguments,
                    translate_cli)
