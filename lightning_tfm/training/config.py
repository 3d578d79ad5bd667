"""Experiment configuration: nested YAML, typed defaults, ``dotted.key=value`` overrides.

Every key a config may hold is declared in ``SCHEMA`` with its type and default, so a typo or a wrong
type stops the run before anything is written (exit 2), naming the key.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

# A type spec is: int, float, str, bool, list, ("choice", a, b, ...), or ("optional", spec).
OPT = "optional"


def choice(*values):
    return ("choice",) + values


def optional(spec):
    return (OPT, spec)


# (type, default, help). Section names follow the product: model.* and train.label_smoothing are the
# paper's Table 3 knobs under their paper names.
SCHEMA: dict[str, dict[str, tuple]] = {
    "run": {
        "name": (str, "run", "experiment name; part of the run id"),
        "id": (optional(str), None, "run folder name; default <name>-<hash of the config>, so the same command resumes"),
        "results_dir": (str, "results", "where run folders are written"),
        "seed": (int, 1, "random seed"),
        "variant": (optional(str), None, "Table 3 row or sweep variant this run belongs to"),
        "family": (optional(str), None, "row family: base, A, B, C, D, E, big, norm, search"),
        "study": (optional(str), None, "sweep/study name (W&B group)"),
    },
    "data": {
        "source": (choice("local", "hub"), "local", "local folder of {split}.{lang}[.gz] files, or the Hugging Face Hub"),
        "path": (optional(str), None, "local folder (data.source=local)"),
        "hub_name": (optional(str), None, "Hub dataset id, e.g. wmt14 or bentrevett/multi30k"),
        "hub_config": (optional(str), None, "Hub dataset configuration, e.g. de-en"),
        "src_lang": (str, "en", "source language code"),
        "tgt_lang": (str, "de", "target language code"),
        "train_split": (str, "train", ""),
        "dev_split": (str, "val", ""),
        "test_split": (optional(str), None, "evaluated at the end when set"),
        "vocab_size": (int, 8000, "shared source-target BPE vocabulary size"),
        "max_tokens_per_sentence": (int, 256, "training pairs longer than this (in BPE pieces, or than model.max_positions-1) "
                                             "are skipped; dev/test pairs are truncated to it (counts in summary.json)"),
        "max_train_pairs": (optional(int), None, "use only the first N training pairs (smoke tests)"),
        "max_dev_pairs": (optional(int), None, "use only the first N dev pairs"),
        "max_test_pairs": (optional(int), None, "use only the first N test pairs"),
        "tokenizer_min_frequency": (int, 2, "BPE merges need at least this many occurrences"),
        "cache_dir": (optional(str), None, "where prepared corpora (vocabulary + token ids, `ltfm prepare`) are kept; "
                                           "default: data-cache beside run.results_dir"),
    },
    "model": {
        "layers": (int, 6, "N: layers in encoder and in decoder"),
        "d_model": (int, 512, ""),
        "d_ff": (int, 2048, ""),
        "heads": (int, 8, "h"),
        "d_k": (int, 64, ""),
        "d_v": (int, 64, ""),
        "dropout": (float, 0.1, "P_drop"),
        "attention_dropout": (float, 0.0, "dropout on attention weights (not in the paper; fairseq's attention_dropout)"),
        "positional": (choice("sinusoidal", "learned"), "sinusoidal", ""),
        "norm": (choice("post", "pre"), "post", "post: the paper's LayerNorm(x + Sublayer(x)); pre: x + Sublayer(LayerNorm(x))"),
        "max_positions": (int, 1024, "longest sequence (learned positions have one vector each)"),
        "attention_kernel": (choice("auto", "matmul", "sdpa"), "auto",
                             "how Eq. 1 is computed: sdpa (torch's fused kernel), matmul, auto (matmul for short sequences on CPU; model/fast.py)"),
        "fast_dropout": (bool, True, "dropout mask drawn as 16-bit lanes on CPU (speed path, model/fast.py); false: torch's dropout"),
    },
    "train": {
        "label_smoothing": (float, 0.1, "epsilon_ls"),
        "batch_tokens": (int, 4096, "per-device batch: padded source tokens and padded target tokens each at most this"),
        "batch_tokens_total": (optional(int), None, "effective batch in tokens per side; sets accumulation from world size"),
        "accumulate": (int, 1, "gradient accumulation (ignored when batch_tokens_total is set)"),
        "max_steps": (int, 100000, "optimizer steps"),
        "max_time_minutes": (optional(float), None, "stop training after this much wall time"),
        "warmup": (int, 4000, "warmup_steps of the learning-rate schedule"),
        "lr_scale": (float, 1.0, "factor on d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)"),
        "adam_beta1": (float, 0.9, ""),
        "adam_beta2": (float, 0.98, ""),
        "adam_eps": (float, 1e-9, ""),
        "clip_norm": (float, 0.0, "gradient clipping (0: off, as in the paper)"),
        "precision": (choice("auto", "32", "bf16-mixed", "16-mixed", "bf16-true"), "auto",
                      "Lightning precision; auto: bf16-mixed where the GPU/CPU has native bf16, else 32 (precision.py)"),
        "accelerator": (choice("auto", "cpu", "gpu", "cuda", "mps"), "auto", ""),
        "devices": (str, "1", "Lightning devices: a count, 'auto' or a list like '0,1'"),
        "num_nodes": (int, 1, ""),
        "strategy": (choice("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"), "auto", ""),
        "val_every_steps": (int, 1000, "dev loss/perplexity interval"),
        "checkpoint_every_steps": (int, 1000, "checkpoint interval in steps"),
        "checkpoint_every_minutes": (optional(float), None, "checkpoint interval in minutes (instead of steps)"),
        "keep_checkpoints": (int, 5, "step checkpoints kept besides last (for averaging)"),
        "log_every_steps": (int, 50, ""),
        "num_workers": (int, 0, "DataLoader workers"),
        "compile": (bool, False, "torch.compile the model (measured slower on this CPU, see README)"),
        "fused_loss": (bool, True, "pre-softmax projection + smoothed loss computed chunk-wise, gradients eagerly (speed path)"),
        "progress_bar": (bool, True, ""),
        "threads": (optional(int), None, "torch intra-op threads (default: torch's choice)"),
        "record_batches": (bool, False, "write the dataset indices of every training batch, per rank (debugging, tests)"),
    },
    "decode": {
        "beam_size": (int, 4, "1 = greedy"),
        "length_penalty": (float, 0.6, "alpha of the GNMT length penalty ((5+|Y|)/6)^alpha"),
        "max_len_a": (float, 1.0, "maximum output length = a * source length + b"),
        "max_len_b": (int, 50, ""),
        "batch_sentences": (int, 128, "sentences decoded together"),
        "dev_bleu_every_steps": (int, 0, "dev BLEU during training every N steps (0: only at the end)"),
        "dev_bleu_subset": (optional(int), 200, "sentences of the dev set used for BLEU during training (None: all)"),
        "average_last": (int, 0, "at the end, average the last N checkpoints and evaluate that (0: off)"),
        "samples": (int, 8, "sample translations logged at each dev BLEU"),
    },
    "wandb": {
        "mode": (choice("offline", "online", "disabled"), "offline", "WANDB_MODE overrides"),
        "project": (str, "lightning_tfm", "WANDB_PROJECT overrides"),
        "entity": (optional(str), None, "WANDB_ENTITY overrides"),
        "dir": (optional(str), None, "where wandb writes; default the run folder"),
        "tags": (list, [], ""),
    },
    "sweep": {
        "storage": (optional(str), None, "set by ltfm sweep: Optuna storage of the trial"),
        "study": (optional(str), None, "set by ltfm sweep"),
        "trial": (optional(int), None, "set by ltfm sweep: trial number to report to"),
        "metric": (str, "dev_loss", "metric reported to the study at each validation"),
    },
}

# Keys that do not change what is trained: excluded from the run id hash.
# The training budget is not hashed either: re-running with a larger train.max_steps continues the run.
NOT_HASHED = {"run.id", "run.results_dir", "run.variant", "run.family", "run.study", "train.progress_bar",
              "train.max_steps", "train.max_time_minutes", "decode.batch_sentences",
              "train.num_workers", "train.threads", "train.fused_loss", "train.record_batches", "model.attention_kernel",
              "model.fast_dropout", "data.cache_dir", "wandb", "sweep"}


def defaults() -> dict:
    return {sec: {k: copy.deepcopy(spec[1]) for k, spec in keys.items()} for sec, keys in SCHEMA.items()}


def describe(spec) -> str:
    if isinstance(spec, tuple) and spec[0] == "choice":
        return " | ".join(map(str, spec[1:]))
    if isinstance(spec, tuple) and spec[0] == OPT:
        return describe(spec[1]) + " or null"
    return spec.__name__


def coerce(key: str, value: Any, spec) -> Any:
    """Check ``value`` against ``spec``; ints are accepted for floats, numbers for str choices like precision."""
    if isinstance(spec, tuple) and spec[0] == OPT:
        return None if value is None else coerce(key, value, spec[1])
    if isinstance(spec, tuple) and spec[0] == "choice":
        v = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        if v not in spec[1:]:
            raise UserError(f"{key}={value!r} is not one of: {describe(spec)}")
        return v
    if spec is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec is float and isinstance(value, str):
        # PyYAML (YAML 1.1) reads 1e-9 and inf as strings; they are numbers to the user.
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None and not math.isfinite(number):
            raise UserError(f"{key}={value} is not a finite number: give a real value")
        if number is not None:
            return number
    if spec is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if spec is list and isinstance(value, tuple):
        return list(value)
    if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise UserError(f"{key}={value!r} has the wrong type: expected {describe(spec)}")
    return value


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) != 2 or parts[0] not in SCHEMA:
        raise UserError(f"unknown config key {key!r}: keys look like section.name with section one of "
                        f"{', '.join(SCHEMA)}")
    sec, name = parts
    if name not in SCHEMA[sec]:
        raise UserError(f"unknown config key {key!r}: {sec} has {', '.join(SCHEMA[sec])}")
    cfg[sec][name] = coerce(key, value, SCHEMA[sec][name][0])


def parse_override(text: str) -> tuple[str, Any]:
    """``model.heads=4`` -> ("model.heads", 4); values are read as YAML (numbers, booleans, null, lists)."""
    if "=" not in text:
        raise UserError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def merge(cfg: dict, tree: dict, prefix: str = "") -> None:
    for sec, body in tree.items():
        if sec not in SCHEMA:
            raise UserError(f"unknown config section {sec!r}: use one of {', '.join(SCHEMA)}")
        if not isinstance(body, dict):
            raise UserError(f"config section {sec!r} must be a mapping of keys to values")
        for name, value in body.items():
            set_dotted(cfg, f"{sec}.{name}", value)


def read_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(path)!r} not found: give a YAML file such as experiments/multi30k-smoke.yaml")
    try:
        tree = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise UserError(f"config file {str(path)!r} is not valid YAML{where}: fix the syntax") from None
    if not isinstance(tree, dict):
        raise UserError(f"config file {str(path)!r} must hold a mapping of sections (model:, train:, ...)")
    return tree


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None,
                checked: bool = True) -> dict:
    """Defaults <- YAML file <- overrides; validated unless ``checked=False`` (a report reading configs it
    need not run). ``overrides`` is a list of "k=v" or a {dotted: value} dict."""
    cfg = defaults()
    if path is not None:
        tree = read_yaml(path)
        merge(cfg, tree)
        if "run" not in tree or "name" not in (tree.get("run") or {}):
            cfg["run"]["name"] = Path(path).stem
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides or [])
    for key, value in items:
        set_dotted(cfg, key, value)
    resolve_paths(cfg)
    if checked:
        validate(cfg)
    return cfg


def resolve_paths(cfg: dict) -> None:
    """data.path (and data.cache_dir) as absolute paths, before the run id is computed: ``small``,
    ``./small`` and ``/abs/small`` are one run, whatever folder the command runs from."""
    d = cfg["data"]
    if d["path"]:
        d["path"] = str(Path(d["path"]).expanduser().resolve())
    if d["cache_dir"]:
        d["cache_dir"] = str(Path(d["cache_dir"]).expanduser().resolve())


def _check_finite(cfg: dict) -> None:
    """No float key may be inf or nan: ``train.lr_scale=inf`` would train to a NaN loss and call it done."""
    for sec, keys in SCHEMA.items():
        for name, spec in keys.items():
            v = cfg[sec][name]
            if isinstance(v, float) and not math.isfinite(v):
                raise UserError(f"{sec}.{name}={v} is not a finite number: give a real value")


def _check_devices(devices: str) -> None:
    """Lightning's devices syntax: a count (-1 = all), ``auto``, or a list of device indices ``0,1``."""
    text = devices.strip()
    if text == "auto" or re.fullmatch(r"-1|[1-9][0-9]*", text):
        return
    ids = [x.strip() for x in text.strip("[]").split(",") if x.strip()]
    if ids and all(x.isdigit() for x in ids) and len(set(ids)) == len(ids) and ("," in text or text.startswith("[")):
        return
    raise UserError(f"train.devices={devices!r} is not a device count (1, 2, ... or -1 for all), 'auto' or a "
                    "list of device indices like '0,1'")


def check_run_id(rid: str) -> None:
    """A run id names one folder inside run.results_dir: no path separators, no '.' or '..'."""
    if not rid or rid in (".", "..") or any(c in rid for c in "/\\\0") or rid.startswith("~") or rid != rid.strip():
        raise UserError(f"run id {rid!r} must name a folder inside run.results_dir (no '/', '\\', '..' or "
                        "leading '~'): set run.id (or run.name) to a plain name such as base-1")


def validate(cfg: dict) -> None:
    """Cross-key checks: every combination the model cannot build is named here, before any work.

    Every key's range is checked here, not where it is first used: a value that only fails inside
    Lightning, the DataLoader or the decoder after training would cost the whole run (and leave a half
    written run folder)."""
    _check_finite(cfg)
    m, t, d, dec = cfg["model"], cfg["train"], cfg["data"], cfg["decode"]
    check_run_id(run_id(cfg))
    for key in ("layers", "d_model", "d_ff", "heads", "d_k", "d_v", "max_positions"):
        if m[key] < 1:
            raise UserError(f"model.{key}={m[key]} must be a positive integer")
    if m["d_model"] % 2:
        raise UserError(f"model.d_model={m['d_model']} must be even (sinusoids come in sin/cos pairs)")
    for key in ("dropout", "attention_dropout"):
        if not 0.0 <= m[key] < 1.0:
            raise UserError(f"model.{key}={m[key]} must be in [0, 1)")
    if not 0.0 <= t["label_smoothing"] < 1.0:
        raise UserError(f"train.label_smoothing={t['label_smoothing']} must be in [0, 1)")
    for key in ("batch_tokens", "max_steps", "warmup", "accumulate", "val_every_steps", "checkpoint_every_steps"):
        if t[key] < 1:
            raise UserError(f"train.{key}={t[key]} must be a positive integer")
    if t["batch_tokens_total"] is not None and t["batch_tokens_total"] < t["batch_tokens"]:
        raise UserError(f"train.batch_tokens_total={t['batch_tokens_total']} is smaller than "
                        f"train.batch_tokens={t['batch_tokens']}: raise it or lower batch_tokens")
    if t["batch_tokens_total"] is not None and t["accumulate"] != 1:
        raise UserError("train.accumulate and train.batch_tokens_total both set: accumulation is derived from "
                        "batch_tokens_total; drop train.accumulate")
    if d["vocab_size"] < 16:
        raise UserError(f"data.vocab_size={d['vocab_size']} is too small: use at least 16")
    if d["src_lang"] == d["tgt_lang"]:
        raise UserError(f"data.src_lang and data.tgt_lang are both {d['src_lang']!r}: choose two languages")
    if d["source"] == "local" and not d["path"]:
        raise UserError("data.path is not set: pass data.path=FOLDER with {split}.{lang}[.gz] files "
                        "(e.g. data.path=../shared/data/multi30k), or data.source=hub")
    if d["source"] == "hub" and not d["hub_name"]:
        raise UserError("data.hub_name is not set: pass e.g. data.hub_name=wmt14 data.hub_config=de-en")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= t[key] < 1.0:
            raise UserError(f"train.{key}={t[key]} must be in [0, 1) (the paper: 0.9 and 0.98)")
    for key in ("adam_eps", "lr_scale"):
        if t[key] <= 0:
            raise UserError(f"train.{key}={t[key]} must be positive")
    if t["clip_norm"] < 0:
        raise UserError(f"train.clip_norm={t['clip_norm']} must be 0 (off) or positive")
    for key in ("max_time_minutes", "checkpoint_every_minutes"):
        if t[key] is not None and t[key] <= 0:
            raise UserError(f"train.{key}={t[key]} must be positive (or null for no limit)")
    for key in ("num_nodes", "log_every_steps"):
        if t[key] < 1:
            raise UserError(f"train.{key}={t[key]} must be a positive integer")
    for key in ("keep_checkpoints", "num_workers"):
        if t[key] < 0:
            raise UserError(f"train.{key}={t[key]} must be 0 or more")
    if t["threads"] is not None and t["threads"] < 1:
        raise UserError(f"train.threads={t['threads']} must be a positive thread count (or null: torch's choice)")
    _check_devices(t["devices"])
    if d["max_tokens_per_sentence"] < 1:
        raise UserError(f"data.max_tokens_per_sentence={d['max_tokens_per_sentence']} must be a positive integer")
    if d["tokenizer_min_frequency"] < 0:
        raise UserError(f"data.tokenizer_min_frequency={d['tokenizer_min_frequency']} must be 0 or more")
    for key in ("max_train_pairs", "max_dev_pairs", "max_test_pairs"):
        if d[key] is not None and d[key] < 1:
            raise UserError(f"data.{key}={d[key]} must be a positive count (or null for all)")
    if dec["beam_size"] < 1:
        raise UserError(f"decode.beam_size={dec['beam_size']} must be at least 1")
    if dec["batch_sentences"] < 1:
        raise UserError(f"decode.batch_sentences={dec['batch_sentences']} must be at least 1")
    if dec["max_len_a"] < 0 or dec["max_len_b"] < 0 or dec["max_len_a"] == 0 and dec["max_len_b"] == 0:
        raise UserError(f"decode.max_len_a={dec['max_len_a']} and decode.max_len_b={dec['max_len_b']} must be 0 "
                        "or more and allow at least one token (the paper: a=1, b=50)")
    for key in ("dev_bleu_every_steps", "samples"):
        if dec[key] < 0:
            raise UserError(f"decode.{key}={dec[key]} must be 0 (off) or more")
    if dec["average_last"] < 0:
        raise UserError(f"decode.average_last={dec['average_last']} must be 0 (no averaging) or the number of "
                        "last checkpoints to average, e.g. 5")
    if dec["dev_bleu_subset"] is not None and dec["dev_bleu_subset"] < 1:
        raise UserError(f"decode.dev_bleu_subset={dec['dev_bleu_subset']} must be a positive count (or null: all)")
    if not all(isinstance(x, str) for x in cfg["wandb"]["tags"]):
        raise UserError(f"wandb.tags={cfg['wandb']['tags']!r} must be a list of strings")
    if cfg["sweep"]["trial"] is not None and cfg["sweep"]["trial"] < 0:
        raise UserError(f"sweep.trial={cfg['sweep']['trial']} must be 0 or more")


def flatten(cfg: dict) -> dict:
    """{"model": {"heads": 8}} -> {"model.heads": 8}: the paper's knob names as flat keys (W&B columns)."""
    return {f"{sec}.{k}": v for sec, body in cfg.items() for k, v in body.items()}


def config_hash(cfg: dict) -> str:
    flat = {k: v for k, v in flatten(cfg).items() if k not in NOT_HASHED and k.split(".")[0] not in NOT_HASHED}
    return hashlib.sha1(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]


def run_id(cfg: dict) -> str:
    return cfg["run"]["id"] or f"{cfg['run']['name']}-{config_hash(cfg)}"


def dump_yaml(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
