"""The run config's sections besides the model's, each a typed dataclass (fairseq style) that checks its own values.

:class:`RunConfig`, :class:`DataConfig`, :class:`TrainConfig`, :class:`DecodeConfig`, :class:`WandbConfig` and
:class:`SweepConfig` are, with the model's :class:`~lightning_tfm.model.config.ModelConfig`, the sections of
:class:`.config.Config`. A key is one field (:func:`~lightning_tfm.base.knobs.knob`): its type, default and help,
and its own check beside it (a :class:`~lightning_tfm.base.knobs.Range` for every number: the highest far above
any real run, below what allocates a table too large to build, overflows an int64 inside torch or runs for ever; a
path, a name or a label for text a file name or a report shows). A section's :meth:`problem` runs them, then its rules
across its keys (``train.batch_tokens_total`` against ``train.batch_tokens``); :func:`.config.validate` adds the
few checks across sections.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from ...base.inputs import shown
from ...base.knobs import UNIT, Range, Section, Table3, default_of, knob, path_check
from ...model.config import MAX_POSITIONS

STEPS = 10 ** 9  # an interval or a count of optimizer steps: far beyond any run (the paper's big: 300k)
#: The most characters of a row's label (run.variant, run.family): one line that the report's table, its export
#: (report/inputs/export.py) and W&B show; also of a corpus's split and language names.
LABEL_CHARS = 100
PLATEAU_KEYS = ("lr_schedule", "lr", "lr_decay_factor", "lr_patience", "lr_min")  # train.*: the plateau schedule's


def steps(lo: int = 1) -> Range:
    return Range(lo, STEPS)


def positive(hi: float) -> Range:
    """More than 0, at most ``hi``: a rate, or a time limit (0 would stop at once)."""
    return Range(0, hi, lo_open=True)


# ----------------------------------------------------------------------------- the text keys' checks
def label_check(key: str, v: Any) -> str | None:
    """run.variant and run.family: one line of at most :data:`LABEL_CHARS`."""
    if v is not None and (len(v) > LABEL_CHARS or not v.isprintable() or not v.strip()):
        return (f"{key}={shown(v)} must be one line of 1 to {LABEL_CHARS} printable characters, not blank (it has "
                f"{len(v)}): a row's name, as the report shows it")
    return None


def name_check(key: str, v: Any) -> str | None:
    """A part of the corpus's file names ({split}.{lang}[.gz]) and of the Hub's split and column names."""
    if v is not None and (not v or len(v) > LABEL_CHARS or not v.isprintable() or any(c in v for c in "/\\")):
        return (f"{key}={shown(v)} must be a plain name of at most {LABEL_CHARS} characters, no '/', '\\' or control "
                "characters (it names the corpus's files, {split}.{lang})")
    return None


def project_check(key: str, v: Any) -> str | None:
    """A W&B project name as W&B takes it (else a run stopped at its W&B init)."""
    if not v or len(v) > 128 or not v.isprintable() or any(c in v for c in "/\\#?%:"):
        return f"{key}={shown(v)} must be at most 128 characters, none of / \\ # ? % : (W&B's rule)"
    return None


def devices_check(key: str, v: Any) -> str | None:
    """Lightning's devices syntax: a count (-1 = all), ``auto``, or a list of device indices ``0,1``."""
    text = v.strip()
    if text == "auto" or re.fullmatch(r"-1|[1-9][0-9]*", text):
        return None
    ids = [x.strip() for x in text.strip("[]").split(",") if x.strip()]
    if ids and all(x.isdigit() for x in ids) and len(set(ids)) == len(ids) and ("," in text or text.startswith("[")):
        return None
    return (f"{key}={shown(v)} is not a device count (1, 2, ... or -1 for all), 'auto' or a list of device indices "
            "like '0,1'")


def strings_check(key: str, v: Any) -> str | None:
    return None if all(isinstance(x, str) for x in v) else f"{key}={shown(v)} must be a list of strings"


# ----------------------------------------------------------------------------------------- the sections
@dataclass
class RunConfig(Section):
    SECTION: ClassVar[str] = "run"

    name: str = knob("run", "experiment name; part of the run id")
    id: str | None = knob(None, "run folder; default <name>-<config hash> (a sweep trial's: "
                                "<study>-<variant>-s<seed>-<hash>)", hashed=False)
    results_dir: str = knob("results", "where run folders are written", path_check, hashed=False)
    seed: int = knob(1, "random seed of initialisation, dropout and batch order",
                     Range(0, 2 ** 32 - 1))  # what Lightning's seeding takes
    variant: str | None = knob(None, "Table 3 row or sweep variant this run belongs to", label_check,
                               hashed=False)
    family: str | None = knob(None, "row family: base, A, B, C, D, E, big, norm, search", label_check,
                              hashed=False)
    study: str | None = knob(None, "sweep/study name this run belongs to (its W&B group)", hashed=False)


PAIRS = Range(1, 10 ** 12)


@dataclass
class DataConfig(Section):
    SECTION: ClassVar[str] = "data"

    source: Literal["local", "hub"] = knob("local", "local folder of {split}.{lang}[.gz] files, or the Hugging Face "
                                                    "Hub")
    path: str | None = knob(None, "local folder of the corpus files (data.source=local)", path_check)
    hub_name: str | None = knob(None, "Hub dataset id, e.g. wmt14 or bentrevett/multi30k")
    hub_config: str | None = knob(None, "Hub dataset configuration, e.g. de-en")
    src_lang: str = knob("en", "language code of the source side, e.g. en (file suffix / Hub column)", name_check)
    tgt_lang: str = knob("de", "language code of the target side, e.g. de (file suffix / Hub column)", name_check)
    train_split: str = knob("train", "name of the split the model and the BPE vocabulary are trained on", name_check)
    dev_split: str = knob("val", "name of the split for dev loss/perplexity and dev BLEU (the paper: newstest2013)",
                          name_check)
    test_split: str | None = knob(None, "evaluated at the end when set", name_check)
    vocab_size: int = knob(8000, "shared source-target BPE vocabulary size", Range(16, 2 ** 20))
    max_tokens_per_sentence: int = knob(256, "training pairs longer than this (in BPE pieces, or than "
                                             "model.max_positions-1) are skipped; dev/test pairs are truncated to it "
                                             "(counts in summary.json)", Range(1, MAX_POSITIONS))
    max_train_pairs: int | None = knob(None, "use only the first N training pairs (smoke tests)", PAIRS)
    max_dev_pairs: int | None = knob(None, "use only the first N dev pairs", PAIRS)
    max_test_pairs: int | None = knob(None, "use only the first N test pairs", PAIRS)
    tokenizer_min_frequency: int = knob(2, "BPE merges need at least this many occurrences", Range(0, 10 ** 9))
    cache_dir: str | None = knob(None, "where prepared corpora (vocabulary + token ids, `ltfm prepare`) are kept; "
                                       "default: data-cache beside run.results_dir", path_check,
                                 hashed=False)

    def problem(self) -> str | None:
        if self.src_lang == self.tgt_lang:
            return f"data.src_lang and data.tgt_lang are both {shown(self.src_lang)}: choose two languages"
        return super().problem()


@dataclass
class TrainConfig(Section):
    SECTION: ClassVar[str] = "train"

    label_smoothing: float = knob(0.1, "epsilon_ls: label smoothing of the cross-entropy targets (Sec. 5.4)", UNIT,
                                  Table3("ε_ls", 8, tex=r"$\epsilon_{\mathrm{ls}}$"))
    batch_tokens: int = knob(4096, "per-device batch: padded source tokens and padded target tokens each at most this",
                             Range(1, 2 ** 24))
    batch_tokens_total: int | None = knob(None, "effective batch in tokens per side; sets accumulation from world size",
                                          Range(1, 2 ** 30))
    accumulate: int = knob(1, "gradient accumulation (ignored when batch_tokens_total is set)", Range(1, 10 ** 5))
    max_steps: int = knob(100000, "optimizer steps to train for (the paper: 100k for base, Sec. 5.2)", steps(),
                          Table3("train steps", 100, csv="train_steps", tex="train steps", label="{} steps"),
                          hashed=False)
    max_time_minutes: float | None = knob(None, "stop training after this much wall time", positive(10 ** 7),
                                          hashed=False)
    warmup: int = knob(4000, "warmup_steps of the learning-rate schedule (Sec. 5.3, Eq. 3)", steps())
    # no tight upper bound: a scale too large costs nothing but a diverging loss, which stops the run at once
    # naming its step and loss (training/train.py's non-finite-loss check)
    lr_scale: float = knob(1.0, "factor on d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)", positive(1e30))
    lr_schedule: Literal["noam", "plateau"] = knob("noam", "noam: Eq. 3 (warmup, lr_scale); plateau: the recurrent "
                                                   "recipes' constant train.lr, decayed when the dev loss stalls")
    lr: float = knob(2e-4, "plateau: the learning rate until the first decay (joeynmt's IWSLT14 RNN: 2e-4)",
                     positive(10))
    lr_decay_factor: float = knob(0.7, "plateau: factor on the learning rate at each decay (joeynmt: 0.7)",
                                  Range(0, 1, lo_open=True, hi_open=True))
    lr_patience: int = knob(8, "plateau: stalled validations (no lower dev loss) let pass; the next decays the rate "
                               "(joeynmt: 8)", steps(0))
    lr_min: float = knob(0.0, "plateau: the learning rate never decays below this", Range(0, 10))
    adam_beta1: float = knob(0.9, "Adam's beta_1, decay of the gradient mean (Sec. 5.3: 0.9)", UNIT)
    adam_beta2: float = knob(0.98, "Adam's beta_2, decay of the squared-gradient mean (Sec. 5.3: 0.98)", UNIT)
    adam_eps: float = knob(1e-9, "Adam's epsilon added to the update's denominator (Sec. 5.3: 1e-9)", positive(1))
    clip_norm: float = knob(0.0, "gradient clipping (0: off, as in the paper)", Range(0, 10 ** 6))
    precision: Literal["auto", "32", "bf16-mixed", "16-mixed", "bf16-true"] = knob(
        "auto", "Lightning precision; auto: bf16-mixed where the GPU/CPU has native bf16, else 32 (precision.py)")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = knob(
        "auto", "Lightning accelerator the run trains on; auto: a GPU when there is one, else the CPU")
    devices: str = knob("1", "Lightning devices: a count, 'auto' or a list like '0,1'", devices_check)
    num_nodes: int = knob(1, "machines taking part in a multi-node run (Lightning num_nodes)", Range(1, 10 ** 5))
    strategy: Literal["auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"] = knob(
        "auto", "Lightning strategy spreading training over several devices (auto: ddp when there are several)")
    val_every_steps: int = knob(1000, "interval in optimizer steps of the dev loss/perplexity", steps())
    checkpoint_every_steps: int = knob(1000, "checkpoint interval in optimizer steps", steps())
    checkpoint_every_minutes: float | None = knob(None, "checkpoint interval in minutes (instead of steps)",
                                                  positive(10 ** 7))
    checkpoint_every_seconds: float | None = knob(600.0, "also rewrite checkpoints/last.ckpt (what a killed run "
                                                         "resumes from) once this many seconds passed since the last "
                                                         "checkpoint, whichever comes first with the step interval; "
                                                         "0: after every step; null: the step interval alone",
                                                  Range(0, 10 ** 9), hashed=False)
    keep_checkpoints: int = knob(5, "step checkpoints kept besides last (for averaging)", Range(0, 10 ** 6))
    log_every_steps: int = knob(50, "interval in optimizer steps of the training loss/learning-rate log lines",
                                steps())
    num_workers: int = knob(0, "DataLoader worker processes (0: load batches in the training process)",
                            Range(0, 1024), hashed=False)
    compile: bool = knob(False, "torch.compile the model (whether it pays off depends on the machine: time it)")
    fused_loss: bool = knob(True, "pre-softmax projection + smoothed loss computed chunk-wise, gradients eagerly "
                                  "(speed path)", hashed=False)
    progress_bar: bool = knob(True, "show Lightning's progress bar on the terminal (off for logs and sweep workers)",
                              hashed=False)
    threads: int | None = knob(None, "torch intra-op threads (default: torch's choice)", Range(1, 4096),
                               hashed=False)
    record_batches: bool = knob(False, "write the dataset indices of every training batch, per rank (debugging, "
                                       "tests)", hashed=False)

    def problem(self) -> str | None:
        if self.batch_tokens_total is not None and self.batch_tokens_total < self.batch_tokens:
            return (f"train.batch_tokens_total={self.batch_tokens_total} is smaller than "
                    f"train.batch_tokens={self.batch_tokens}: raise it or lower batch_tokens")
        if self.batch_tokens_total is not None and self.accumulate != 1:
            return ("train.accumulate and train.batch_tokens_total both set: accumulation is derived from "
                    "batch_tokens_total; drop train.accumulate")
        defaults = {f.name: default_of(f) for f in fields(self)}
        stray = [f"train.{k}" for k in PLATEAU_KEYS[1:] if getattr(self, k) != defaults[k]]
        if stray and self.lr_schedule == "noam":
            return (f"{', '.join(stray)}: only for train.lr_schedule=plateau (the default is noam, Eq. 3): set it, or "
                    f"drop {'it' if len(stray) == 1 else 'them'}")
        return super().problem()


def tokens_per_step(batch_tokens: int, devices: str | int = "1", accumulate: int = 1,
                    batch_tokens_total: int | None = None) -> float:
    """Target tokens per side of one optimizer step, the one count (a sweep's plan, the report's equal compute, a
    run's own record): ``train.batch_tokens_total`` when set (the accumulation is derived from it), else
    ``train.batch_tokens`` x the processes ``devices`` names (a count, or a list's length; 'auto' and -1: 1, no
    machine asked) x ``train.accumulate``."""
    if batch_tokens_total:
        return float(batch_tokens_total)
    d = str(devices).strip()
    n = int(d) if d.isdigit() else len(d.split(",")) if "," in d else 1
    return float(batch_tokens * max(n, 1) * accumulate)


@dataclass
class DecodeConfig(Section):
    SECTION: ClassVar[str] = "decode"

    beam_size: int = knob(4, "beam width of the search (Sec. 6.1: 4); 1 = greedy", Range(1, 1024))
    length_penalty: float = knob(0.6, "alpha of the GNMT length penalty ((5+|Y|)/6)^alpha", Range(-10, 10))
    max_len_a: float = knob(1.0, "maximum output length = a * source length + b", Range(0, 1000))
    max_len_b: int = knob(50, "b of the maximum output length a * source length + b (Sec. 6.1: input length + 50)",
                          Range(0, MAX_POSITIONS))
    batch_sentences: int = knob(128, "sentences decoded together in one batch", Range(1, 10 ** 6),
                                hashed=False)
    dev_bleu_every_steps: int = knob(0, "dev BLEU during training every N steps (0: only at the end)", steps(0))
    dev_bleu_subset: int | None = knob(200, "sentences of the dev set used for BLEU during training (None: all)",
                                       steps())
    average_last: int = knob(0, "at the end, average the last N checkpoints and evaluate that (0: off)",
                             Range(0, 10 ** 5))
    samples: int = knob(8, "sample translations logged at each dev BLEU", Range(0, 10 ** 4))

    def problem(self) -> str | None:
        if self.max_len_a == 0 and self.max_len_b == 0:
            return ("decode.max_len_a=0 and decode.max_len_b=0 allow no token: raise either (the paper: a=1, b=50)")
        return super().problem()


@dataclass
class WandbConfig(Section):
    SECTION: ClassVar[str] = "wandb"
    HASHED: ClassVar[bool] = False  # where a run logs changes nothing of what it trains

    mode: Literal["offline", "online", "disabled"] = knob("offline", "W&B logging mode; the WANDB_MODE environment "
                                                                     "variable overrides it")
    project: str = knob("lightning_tfm", "W&B project; the WANDB_PROJECT environment variable overrides it",
                        project_check)
    entity: str | None = knob(None, "W&B entity (user or team); WANDB_ENTITY overrides it")
    dir: str | None = knob(None, "where wandb writes; default the run folder", path_check)
    tags: list[str] = knob(None, "extra W&B tags of the run (the variant and family are added)", strings_check,
                           factory=list)


@dataclass
class SweepConfig(Section):
    SECTION: ClassVar[str] = "sweep"
    HASHED: ClassVar[bool] = False  # the study a trial reports to: a trial trains what its other keys say

    storage: str | None = knob(None, "Optuna storage of the trial, for a trial run by hand (ltfm sweep passes it in "
                                     "the environment, never in the config)")
    study: str | None = knob(None, "set by ltfm sweep: Optuna study the trial belongs to")
    trial: int | None = knob(None, "set by ltfm sweep: trial number to report to", Range(0, 2 ** 31 - 1))
    metric: str = knob("dev_loss", "metric reported to the study at each validation")
