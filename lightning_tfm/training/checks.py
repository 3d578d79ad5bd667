"""Range checks of the data and decode sections and of ``train.devices``, which :func:`.config.validate` calls
(each section's values on their own; the checks across sections stay there)."""
from __future__ import annotations

import re

from .errors import UserError
from .inputs import shown


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
