"""Range checks of the data and decode sections and of ``train.devices``, which :func:`.config.validate` calls
(each section's values on their own; the checks across sections stay there), and :data:`RANGES`, every number
key's allowed range."""
from __future__ import annotations

import os
import re

from ..model.config import MAX_LAYERS, MAX_POSITIONS, MAX_WIDTH
from .errors import UserError
from .inputs import shown

STEPS = 10 ** 9  # an interval or a count of optimizer steps: far beyond any run (the paper's big: 300k)
#: Every number key of the run config (an architecture's own section checks its own: Section.problem) and its
#: (lowest, highest) value, checked by :func:`check_ranges`. The highest is far above any real run, below what
#: allocates a table too large to build (model.max_positions x model.d_model), overflows an int64 inside torch
#: (decode.max_len_b) or runs for ever (train.max_steps, decode.beam_size). Keys whose lower end has its own
#: message are checked in config.validate first; the keys bounded in [0, 1) (model.dropout, train.adam_beta1, ...)
#: and run.seed there alone.
RANGES = {
    "data.vocab_size": (16, 2 ** 20), "data.max_tokens_per_sentence": (1, MAX_POSITIONS),
    "data.max_train_pairs": (1, 10 ** 12), "data.max_dev_pairs": (1, 10 ** 12), "data.max_test_pairs": (1, 10 ** 12),
    "data.tokenizer_min_frequency": (0, 10 ** 9),
    "model.layers": (1, MAX_LAYERS), "model.d_model": (2, MAX_WIDTH), "model.d_ff": (1, MAX_WIDTH),
    "model.heads": (1, 1024), "model.d_k": (1, MAX_WIDTH), "model.d_v": (1, MAX_WIDTH),
    "model.max_positions": (1, MAX_POSITIONS),
    "train.batch_tokens": (1, 2 ** 24), "train.batch_tokens_total": (1, 2 ** 30), "train.accumulate": (1, 10 ** 5),
    "train.max_steps": (1, STEPS), "train.max_time_minutes": (0, 10 ** 7), "train.warmup": (1, STEPS),
    "train.lr_scale": (0, 1000), "train.lr": (0, 10), "train.lr_patience": (0, STEPS), "train.lr_min": (0, 10),
    "train.adam_eps": (0, 1), "train.clip_norm": (0, 10 ** 6), "train.num_nodes": (1, 10 ** 5),
    "train.val_every_steps": (1, STEPS), "train.checkpoint_every_steps": (1, STEPS),
    "train.checkpoint_every_minutes": (0, 10 ** 7), "train.checkpoint_every_seconds": (0, 10 ** 9),
    "train.keep_checkpoints": (0, 10 ** 6), "train.log_every_steps": (1, STEPS), "train.num_workers": (0, 1024),
    "train.threads": (1, 4096),
    "decode.beam_size": (1, 1024), "decode.length_penalty": (-10, 10), "decode.max_len_a": (0, 1000),
    "decode.max_len_b": (0, MAX_POSITIONS), "decode.batch_sentences": (1, 10 ** 6),
    "decode.dev_bleu_every_steps": (0, STEPS), "decode.dev_bleu_subset": (1, STEPS), "decode.average_last": (0, 10 ** 5),
    "decode.samples": (0, 10 ** 4),
    "sweep.trial": (0, 2 ** 31 - 1),
}


#: The most characters of a row's label (run.variant, run.family): one line that the report's table, its export
#: (report/export.py) and W&B show.
LABEL_CHARS = 100


def check_labels(run) -> None:
    """run.variant and run.family (a :class:`.config.RunConfig`): one line of at most :data:`LABEL_CHARS`."""
    for key in ("variant", "family"):
        v = getattr(run, key)
        if v is not None and (len(v) > LABEL_CHARS or not v.isprintable() or not v.strip()):
            raise UserError(f"run.{key}={shown(v)} must be one line of 1 to {LABEL_CHARS} printable characters, not "
                            f"blank (it has {len(v)}): a row's name, as the report shows it")


PATH_KEYS = ("run.results_dir", "data.path", "data.cache_dir", "wandb.dir")
#: parts of the corpus's file names ({split}.{lang}[.gz]) and of the Hub's split and column names
NAME_KEYS = ("data.src_lang", "data.tgt_lang", "data.train_split", "data.dev_split", "data.test_split")


def check_names(cfg) -> None:
    """Paths the file system takes (no NUL, at most 255 bytes a name, 4096 in all), plain names for the corpus's
    file names, a W&B project name W&B takes: one line naming the key (else a traceback, or a run stopped at its
    W&B init)."""
    for key in PATH_KEYS + NAME_KEYS + ("wandb.project",):
        sec, name = key.split(".")
        v = getattr(getattr(cfg, sec), name)
        raw = os.fsencode(v) if isinstance(v, str) else b""
        if key in PATH_KEYS and (b"\0" in raw or len(raw) > 4096 or any(len(p) > 255 for p in raw.split(b"/"))):
            raise UserError(f"{key}={shown(v)} is not a path the file system takes: no NUL character, at most 255 "
                            "bytes a folder or file name, 4096 in all")
        if key in NAME_KEYS and v is not None and (not v or len(v) > LABEL_CHARS or not v.isprintable()
                                                   or any(c in v for c in "/\\")):
            raise UserError(f"{key}={shown(v)} must be a plain name of at most {LABEL_CHARS} characters, no '/', '\\' "
                            "or control characters (it names the corpus's files, {split}.{lang})")
        if key == "wandb.project" and (not v or len(v) > 128 or not v.isprintable() or any(c in v for c in "/\\#?%:")):
            raise UserError(f"wandb.project={shown(v)} must be at most 128 characters, none of / \\ # ? % : (W&B's "
                            "rule)")


def check_range(key: str, v) -> None:
    """``key``'s value ``v`` within its range of :data:`RANGES` (a null, or a key without one, passes): one line
    naming the key and the range. (A sweep file's values are checked with it when it is loaded.)"""
    lo, hi = RANGES.get(key, (None, None))
    if lo is None or v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or lo <= v <= hi:
        return
    what = "a positive integer" if lo == 1 and isinstance(v, int) else "0 or more" if lo == 0 else f"{lo} or more"
    raise UserError(f"{key}={v} must be {what}, at most {hi}")


def check_ranges(cfg) -> None:
    """Every key of :data:`RANGES` of a config within its range (:func:`check_range`)."""
    for key in RANGES:
        sec, name = key.split(".")
        check_range(key, getattr(getattr(cfg, sec), name))


def check_devices(devices: str) -> None:
    """Lightning's devices syntax: a count (-1 = all), ``auto``, or a list of device indices ``0,1``."""
    text = devices.strip()
    if text == "auto" or re.fullmatch(r"-1|[1-9][0-9]*", text):
        return
    ids = [x.strip() for x in text.strip("[]").split(",") if x.strip()]
    if ids and all(x.isdigit() for x in ids) and len(set(ids)) == len(ids) and ("," in text or text.startswith("[")):
        return
    raise UserError(f"train.devices={shown(devices)} is not a device count (1, 2, ... or -1 for all), 'auto' or a "
                    "list of device indices like '0,1'")


def check_data(d) -> None:
    """The data section's counts (a :class:`.config.DataConfig`)."""
    if d.max_tokens_per_sentence < 1:
        raise UserError(f"data.max_tokens_per_sentence={d.max_tokens_per_sentence} must be a positive integer")
    if d.tokenizer_min_frequency < 0:
        raise UserError(f"data.tokenizer_min_frequency={d.tokenizer_min_frequency} must be 0 or more")
    for key in ("max_train_pairs", "max_dev_pairs", "max_test_pairs"):
        if getattr(d, key) is not None and getattr(d, key) < 1:
            raise UserError(f"data.{key}={getattr(d, key)} must be a positive count (or null for all)")


def check_decode(dec) -> None:
    """The decode section's sizes and intervals (a :class:`.config.DecodeConfig`)."""
    for key in ("beam_size", "batch_sentences"):
        if getattr(dec, key) < 1:
            raise UserError(f"decode.{key}={getattr(dec, key)} must be at least 1")
    if dec.max_len_a < 0 or dec.max_len_b < 0 or dec.max_len_a == 0 and dec.max_len_b == 0:
        raise UserError(f"decode.max_len_a={dec.max_len_a} and decode.max_len_b={dec.max_len_b} must be 0 "
                        "or more and allow at least one token (the paper: a=1, b=50)")
    for key in ("dev_bleu_every_steps", "samples"):
        if getattr(dec, key) < 0:
            raise UserError(f"decode.{key}={getattr(dec, key)} must be 0 (off) or more")
    if dec.average_last < 0:
        raise UserError(f"decode.average_last={dec.average_last} must be 0 (no averaging) or the number of "
                        "last checkpoints to average, e.g. 5")
    if dec.dev_bleu_subset is not None and dec.dev_bleu_subset < 1:
        raise UserError(f"decode.dev_bleu_subset={dec.dev_bleu_subset} must be a positive count (or null: all)")
