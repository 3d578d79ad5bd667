"""Run ids: the folder a config trains in, ``<run.name>-<hash>`` (a sweep trial's ``<study>-<variant>-s<seed>-<hash>``),
and the keys its hash covers, which are also what a run folder's saved config must match to be trained on
(:func:`~.run_folder.reuse_problem`).

What is hashed (:func:`hashed`) is what decides what a run trains, and nothing whose default changes nothing:

* every key of :data:`KEYS_V1` (the keys hashed when this rule was made, frozen with their defaults), at its
  value, default or not, as always: the ids of runs made before stay;
* a newer key only when its value differs from its default: adding a field whose default keeps today's
  behaviour changes no run id (a newer key's default is its neutral value: to change it later, freeze the old one
  in :data:`KEYS_V1`);
* a key of :data:`KEYS_V1` since removed from the schema at its frozen default, where the config would have
  saved it (:func:`was_saved`, the one rule of which keys a saved config holds): the runs trained with it keep
  their ids;
* the local corpus by its content (``data.corpus``, :func:`~.corpus_id.fingerprint`) in place of ``data.path``:
  the same corpus in another folder is the same run, a corpus with one line changed is another. Where the files
  cannot be read (none there yet, a dry run elsewhere), ``data.path`` stands for them as before.

Not hashed (:func:`not_hashed`: the keys marked ``knob(..., hashed=False)``, the sections whose ``HASHED`` is
False; :data:`.config.NOT_HASHED`): the budget, the bookkeeping, the speed paths, the sweep's keys; the paper's
schedule's unused keys and another architecture's section are left out of the saved config itself
(:meth:`.config.Config.to_dict`).

The id before the corpus was identified by its content (``data.path`` hashed in its place: :func:`path_keys`) still
names the folders made then; that rule, like every rule for what an older version wrote, is in
:mod:`lightning_tfm.training.runs.upgrade` (``legacy_id``), which lists the frozen keys above too.

This module reads a config through its methods and fields only: :mod:`.config` imports it (to check the id of
every config it validates), never the other way.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any

from ...base.errors import UserError
from ...base.inputs import shown
from ...base.knobs import unhashed
from ..data.corpus_id import fingerprint

NAME_BYTES = 255  # the longest name of a file or folder (a path component), in bytes, on the usual file systems

#: The keys every run id hashed when new keys stopped being hashed at their defaults, with their defaults then
#: (frozen: never edit; a key is hashed as before wherever the config saves it). The plateau schedule's keys
#: (train.lr_schedule, lr, lr_*) are saved with train.lr_schedule=plateau only; model.arch and an architecture's
#: own section (rnn.*) with another architecture than the transformer, whose knobs are then not saved.
KEYS_V1: dict[str, Any] = {
    "run.name": "run", "run.seed": 1,
    "data.source": "local", "data.path": None, "data.hub_name": None, "data.hub_config": None, "data.src_lang": "en",
    "data.tgt_lang": "de", "data.train_split": "train", "data.dev_split": "val", "data.test_split": None,
    "data.vocab_size": 8000, "data.max_tokens_per_sentence": 256, "data.max_train_pairs": None,
    "data.max_dev_pairs": None, "data.max_test_pairs": None, "data.tokenizer_min_frequency": 2,
    "model.arch": "transformer", "model.layers": 6, "model.d_model": 512, "model.d_ff": 2048, "model.heads": 8,
    "model.d_k": 64, "model.d_v": 64, "model.dropout": 0.1, "model.attention_dropout": 0.0,
    "model.positional": "sinusoidal", "model.norm": "post", "model.max_positions": 1024,
    "train.label_smoothing": 0.1, "train.batch_tokens": 4096, "train.batch_tokens_total": None, "train.accumulate": 1,
    "train.warmup": 4000, "train.lr_scale": 1.0, "train.lr_schedule": "noam", "train.lr": 2e-4,
    "train.lr_decay_factor": 0.7, "train.lr_patience": 8, "train.lr_min": 0.0, "train.adam_beta1": 0.9,
    "train.adam_beta2": 0.98, "train.adam_eps": 1e-9, "train.clip_norm": 0.0, "train.precision": "auto",
    "train.accelerator": "auto", "train.devices": "1", "train.num_nodes": 1, "train.strategy": "auto",
    "train.val_every_steps": 1000, "train.checkpoint_every_steps": 1000, "train.checkpoint_every_minutes": None,
    "train.keep_checkpoints": 5, "train.log_every_steps": 50, "train.compile": False,
    "decode.beam_size": 4, "decode.length_penalty": 0.6, "decode.max_len_a": 1.0, "decode.max_len_b": 50,
    "decode.dev_bleu_every_steps": 0, "decode.dev_bleu_subset": 200, "decode.average_last": 0, "decode.samples": 8,
    "rnn.cell": "gru", "rnn.emb_size": 620, "rnn.enc_hidden": 500, "rnn.dec_hidden": 1000, "rnn.attention_size": 1000,
    "rnn.enc_layers": 1, "rnn.dec_layers": 1, "rnn.dropout": 0.2, "rnn.emb_dropout": 0.0,
    "rnn.shared_embeddings": False, "rnn.tied_embeddings": False, "rnn.max_positions": 1024,
}
_PLATEAU = ("train.lr_schedule", "train.lr", "train.lr_decay_factor", "train.lr_patience", "train.lr_min")
CORPUS_KEY = "data.corpus"  # the corpus's content identity, hashed in place of data.path


def _defaults(cfg) -> dict[str, Any]:
    """{flat key: default} of every field of the config's sections as the schema has them now."""
    out = {}
    for sec in cfg.to_dict():
        section = getattr(cfg, sec, None)
        if dataclasses.is_dataclass(section):
            for f in dataclasses.fields(section):
                out[f"{sec}.{f.name}"] = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return out


def not_hashed(cfg) -> set[str]:
    """The keys of ``cfg``'s sections that do not change what is trained, left out of the run id's hash: those its
    fields mark ``hashed=False`` (the training budget too: re-running with a larger train.max_steps continues the
    run) and the names of the sections hashed not at all (``wandb``, ``sweep``)."""
    return set().union(*(unhashed(sec, type(getattr(cfg, sec))) for sec in cfg.to_dict()))


def was_saved(key: str, flat: dict) -> bool:
    """Whether a config saved as ``flat`` (flat keys) would have saved ``key``: its section is saved, and it is
    neither a transformer knob of another architecture's config (whose model section holds model.arch alone) nor a
    key of the plateau schedule of a noam config (see :data:`KEYS_V1`). The run id's frozen keys
    (:func:`hashed`) and the report's Table 3 knobs (a key newer than a run: its default where it would have been
    saved) read it."""
    sec = key.split(".")[0]
    if not any(k.startswith(sec + ".") for k in flat):
        return False
    if sec == "model" and "model.arch" in flat:  # another architecture: the model section holds model.arch alone
        return key == "model.arch"
    return key not in _PLATEAU or "train.lr_schedule" in flat


def path_keys(cfg) -> dict:
    """The flat keys a run id hashes, ``data.path`` as given (the rule: the module's docstring)."""
    flat = {f"{sec}.{k}": v for sec, body in cfg.to_dict().items() for k, v in body.items()}
    skip = not_hashed(cfg)
    flat = {k: v for k, v in flat.items() if k not in skip and k.split(".")[0] not in skip}
    defaults = _defaults(cfg)
    out = {k: v for k, v in flat.items() if k in KEYS_V1 or k not in defaults or v != defaults[k]}
    out.update({k: v for k, v in KEYS_V1.items() if k not in defaults and k not in flat and was_saved(k, flat)})
    return out


def hashed(cfg, corpus: str | None = None) -> dict:
    """The flat keys that say what a run trains: its run id's hash, and what a run folder's saved config must match
    to be trained on (:func:`~.run_folder.reuse_problem`). The local corpus is ``data.corpus``, its content
    identity (``corpus``, else the files' :func:`~.corpus_id.fingerprint`), in place of ``data.path`` where there
    is one."""
    keys = path_keys(cfg)
    corpus = corpus or fingerprint(cfg.data)
    if corpus and cfg.data.source == "local":
        keys.pop("data.path", None)
        keys[CORPUS_KEY] = corpus
    return keys


def compared(there, asked, there_corpus: str | None = None) -> tuple[dict, dict]:
    """:func:`hashed` of a run folder's saved config (its corpus as recorded, ``there_corpus``, else as its files
    are now) and of the one asked for, made comparable: where one side's corpus cannot be identified by its
    content (its files gone or unreadable, nothing recorded), both sides' folders (``data.path``) are compared."""
    a, b = hashed(there, there_corpus), hashed(asked)
    if (CORPUS_KEY in a) != (CORPUS_KEY in b):
        a, b = path_keys(there), path_keys(asked)
    return a, b


def digest(keys: dict) -> str:
    """The 8 hex digits that end a run id: the SHA-1 of ``keys`` as sorted JSON."""
    return hashlib.sha1(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:8]


def config_hash(cfg) -> str:
    """The hash that ends a run id: of :func:`hashed` (the corpus by its content)."""
    return digest(hashed(cfg))


def named(cfg, tail: str) -> str:
    """The run id of ``cfg`` ending in the hash ``tail`` (:func:`run_id`'s rule)."""
    if cfg.run.id or not (cfg.run.study and cfg.run.variant):
        return cfg.run.id or f"{cfg.run.name}-{tail}"
    study, variant = _trial(cfg)
    return f"{study}-{variant}-s{cfg.run.seed}-{tail}"


def run_id(cfg) -> str:
    """``run.id``; else a sweep trial's ``<study>-<variant>-s<seed>-<hash>`` (other characters than letters, digits,
    '.', '_', '-' made '_'); else ``<run.name>-<hash>``. Same config, same hash (:func:`config_hash`), same folder
    (a folder of an older id: :func:`~..runs.upgrade.legacy_id`)."""
    return named(cfg, config_hash(cfg))


def _trial(cfg) -> tuple[str, str]:
    """run.study and run.variant as a trial's run id holds them (:func:`run_id`)."""
    return tuple(re.sub(r"[^A-Za-z0-9._-]", "_", x).lstrip(".-") or "_" for x in (cfg.run.study, cfg.run.variant))


def check_run_id(rid: str, cfg=None) -> None:
    """A run id names one folder inside run.results_dir: no path separators, no '.' or '..'."""
    if not rid or rid in (".", "..") or any(c in rid for c in "/\\\0") or rid.startswith("~") or rid != rid.strip():
        raise UserError(f"run id {shown(rid)} must name a folder inside run.results_dir (no '/', '\\', '..' or "
                        "leading '~'): set run.id (or run.name) to a plain name such as base-1")
    size = len(os.fsencode(rid))  # the bytes of the folder's name, as the file system counts them
    if size > NAME_BYTES:
        key, own = (("run.id", rid) if cfg is None or cfg.run.id else ("run.name", cfg.run.name)
                    if not (cfg.run.study and cfg.run.variant) else ("run.study and run.variant", "".join(_trial(cfg))))
        raise UserError(f"run id {shown(rid[:40] + '...')} is {size} bytes, over the {NAME_BYTES} of a folder name: "
                        f"shorten {key} (at most {NAME_BYTES - size + len(os.fsencode(own))} bytes)")


def check_name(cfg) -> None:
    """The config's run id makes one folder name (:func:`check_run_id`), checked without reading its corpus: every
    hash has 8 digits."""
    check_run_id(named(cfg, "0" * 8), cfg)
