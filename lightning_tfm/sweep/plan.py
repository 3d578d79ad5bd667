"""Trial configurations: what each row of a sweep trains, in one path.

A trial's config is the experiment (the sweep's, or the variant's own: a row of another architecture) < the sweep
file's ``overrides`` < the command line's ``dotted.key=value`` < the variant's (or sampled) values < its budget
(the variant's ``budget`` factor on train.max_steps; with the file's ``budget: {equal: flops}``, the sweep
experiment's steps x its training FLOPs per step over the row's, :func:`step_flops`) < the run.* bookkeeping
(seed, variant, family, study). :func:`trial_overrides` says it as overrides and
:func:`trial_config` as the typed :class:`~lightning_tfm.training.config.config.Config`. Overrides stay plain
``{"dotted.key": value}`` dicts (they are what Optuna's user attributes and the sweep file hold); the worker
(:class:`Plan`), the dry run and the reports (:mod:`lightning_tfm.report.inputs.records`) all go through them.
Every config is built from an experiment YAML the sweep read once (:meth:`~.spec.Sweep.experiment_tree`), and a
trial's config is validated once, when built.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..base.errors import UserError
from ..base.inputs import shown
from ..training.config import config
from .spec import RESERVED, Entry, Sweep

#: What a worker adds under the command line (a sweep file may set it otherwise): a trial's output goes to
#: its log file, where a progress bar is noise.
WORKER_DEFAULTS = {"train.progress_bar": False}


def parse_cli_overrides(overrides: list[str] | None) -> dict:
    out = {}
    for text in overrides or []:
        key, value = config.parse_override(text)
        if key in RESERVED or key.startswith("sweep."):
            raise UserError(f"{key} is set by ltfm sweep for each trial: leave it out (seeds come from the sweep file)")
        config.set_dotted(config.Config(), key, value)  # unknown key / wrong type: one line, exit 2
        out[key] = value
    return out


def trial_overrides(sweep: Sweep, entry: Entry, base: dict, base_steps: int | float,
                    results_dir: Path | None = None, flops: tuple[float, float] | None = None) -> dict:
    """A trial's overrides of its experiment: ``base`` (the sweep file's, then the command line's), the
    entry's, its budget as a factor on train.max_steps (``base_steps`` = its experiment's with ``base``; equal
    FLOPs: the sweep experiment's, times ``flops`` = (its FLOPs per step, the row's), :func:`step_flops` when not
    given), the run.* bookkeeping (seed, variant, family, study), and last the worker's absolute ``results_dir``."""
    ov = {**base, **entry.overrides}
    if entry.max_steps is not None:
        ov["train.max_steps"] = entry.max_steps
    elif sweep.budget.get("equal") == "flops":
        base_fps, row_fps = flops or step_flops(sweep, entry, base)
        ov["train.max_steps"] = max(1, int(round(base_steps * entry.budget * base_fps / row_fps)))
    elif entry.budget != 1.0:
        ov["train.max_steps"] = max(1, int(round(ov.get("train.max_steps", base_steps) * entry.budget)))
    ov.update({"run.seed": entry.seed, "run.variant": entry.name, "run.family": entry.family,
               "run.study": sweep.name})
    if results_dir is not None:
        ov["run.results_dir"] = str(results_dir)
    return ov


def experiment_config(sweep: Sweep, overrides: dict, checked: bool = True, data: bool = True,
                      experiment: Path | None = None) -> config.Config:
    """The sweep's experiment (or a row's own, ``experiment``) with ``overrides`` (``config.load_config`` on the
    YAML the sweep read once)."""
    path = experiment or sweep.experiment
    return config.load_config(path, overrides, checked=checked, data=data, tree=sweep.experiment_tree(path))


def sentence_lengths(sweep: Sweep) -> tuple[float, float]:
    """(source, target) mean sentence length in tokens that training FLOPs are counted at: the sweep file's
    ``budget.src_len`` and ``budget.tgt_len`` (a prepared corpus's means), else ``ltfm bench``'s, the report's
    default too (one home: bench/speed.py)."""
    from ..bench.speed import DEFAULTS

    return (sweep.budget.get("src_len") or float(DEFAULTS["src_len"]),
            sweep.budget.get("tgt_len") or float(DEFAULTS["tgt_len"]))


def flops_per_step(cfg: config.Config, lengths: tuple[float, float]) -> float:
    """Training FLOPs of one optimizer step of a config: :func:`lightning_tfm.model.registry.train_flops_per_step`
    at its model section, its data.vocab_size, ``lengths`` and its target tokens a step
    (:func:`lightning_tfm.training.config.sections.tokens_per_step`)."""
    from ..model import registry
    from ..training.config.sections import tokens_per_step

    t = cfg.train
    tokens = tokens_per_step(t.batch_tokens, t.devices, t.accumulate, t.batch_tokens_total)
    return registry.train_flops_per_step(cfg.model, cfg.data.vocab_size, lengths, tokens)


def step_flops(sweep: Sweep, entry: Entry, base: dict) -> tuple[float, float]:
    """(the sweep experiment's training FLOPs per step, the row's), both with ``base`` (the sweep file's and the
    command line's overrides), at :func:`sentence_lengths`. A row whose architecture cannot be told is one line."""
    from ..model import registry

    lengths = sentence_lengths(sweep)
    row = experiment_config(sweep, {**base, **entry.overrides}, checked=False, data=False,
                            experiment=sweep.experiment_of(entry.name))
    out = []
    for who, cfg in (("the sweep's experiment", experiment_config(sweep, base, checked=False, data=False)),
                     (f"variant {entry.name}", row)):
        why = registry.check(cfg.model)
        if why is not None:
            raise UserError(f"{sweep.path}: {who}: {why}")
        out.append(flops_per_step(cfg, lengths))
    return out[0], out[1]


def row_base_steps(sweep: Sweep, entry: Entry, base: dict, base_cfg: config.Config) -> int:
    """The train.max_steps a row's budget applies to: the sweep experiment's with ``base`` (``base_cfg``'s), but
    for a row of its own experiment without equal FLOPs, that experiment's with ``base``."""
    own = sweep.experiment_of(entry.name)
    if own == sweep.experiment or sweep.budget.get("equal") == "flops":
        return base_cfg.train.max_steps
    return experiment_config(sweep, base, checked=False, data=False, experiment=own).train.max_steps


def trial_config(sweep: Sweep, entry: Entry | None = None, cli_overrides: dict | None = None,
                 checked: bool = True, results_dir: Path | None = None, data: bool = True) -> config.Config:
    """The config of one trial (without ``entry``: the sweep's base): the experiment with
    :func:`trial_overrides`. ``cli_overrides`` come after the sweep file's; ``results_dir`` is the worker's.
    ``checked=False`` (not validated) is for the reports: they show rows that cannot be built and need no data.path;
    ``data=False`` validates all but the data source (the dry run and the status table read no data). Only the
    config returned is validated (with ``entry``, the base gives its train.max_steps alone)."""
    base = {**sweep.overrides, **(cli_overrides or {})}
    cfg = experiment_config(sweep, base, checked=checked and entry is None, data=data)
    if entry is None:
        return cfg
    ov = trial_overrides(sweep, entry, base, row_base_steps(sweep, entry, base, cfg), results_dir)
    return experiment_config(sweep, ov, checked=checked, data=data, experiment=sweep.experiment_of(entry.name))


class Plan:
    """A worker's resolved sweep: the base overrides (the sweep file's, then the command line's) and, per row,
    the overrides its ``ltfm train`` gets and the config they give (:func:`trial_config`'s, built once from the
    experiment the sweep read once, and validated once). ``data=False``: a plan
    that trains nothing (the dry run, the status table) needs no data source; without one (:attr:`has_data`),
    its run ids are not those of the trained rows (data.path is part of them)."""

    def __init__(self, sweep: Sweep, cli_overrides: list[str] | None, data: bool = True):
        self.sweep = sweep
        self.cli = {**{k: v for k, v in WORKER_DEFAULTS.items() if k not in sweep.overrides},
                    **parse_cli_overrides(cli_overrides)}
        self.base = {**sweep.overrides, **self.cli}
        self.data = data
        self.base_cfg = trial_config(sweep, cli_overrides=self.cli, data=data)  # the user's base must be valid: exit 2
        self.has_data = config.has_data(self.base_cfg)
        self.results_dir = Path(self.base_cfg.run.results_dir).absolute()
        self._rows: dict[tuple[str, str], tuple[int, tuple[float, float] | None]] = {}
        if sweep.mode == "variants":
            self._check_architectures()

    def _check_architectures(self) -> None:
        """A variant giving a knob its architecture does not have (``model.heads`` on ``model.arch: rnn``) is a
        mistake in the sweep file, not a combination that cannot be built: one line, exit 2, before any trial.
        So is a row of its own experiment reading other data than the sweep's (a data.* key it does not set
        itself): the rows of a sweep train on one prepared corpus and BPE vocabulary."""
        from ..model import registry

        base_data = {k: v for k, v in config.flatten(self.base_cfg).items() if k.startswith("data.")}
        for entry in {e.name: e for e in self.sweep.entries()}.values():
            own = self.sweep.experiment_of(entry.name)
            cfg = experiment_config(self.sweep, self.trial_overrides(entry), checked=False, data=False, experiment=own)
            why = registry.check(cfg.model)
            if why is not None:
                raise UserError(f"{self.sweep.path}: variant {entry.name}: {why}")
            if own == self.sweep.experiment:
                continue
            for k, v in config.flatten(cfg).items():
                if k.startswith("data.") and k not in entry.overrides and v != base_data.get(k):
                    raise UserError(f"{self.sweep.path}: variant {entry.name}: its experiment's {k} ({shown(v)}) is "
                                    f"not the sweep experiment's ({shown(base_data.get(k))}): the rows of a sweep "
                                    f"train on one corpus and BPE vocabulary; set it alike in {own.name} (or in the "
                                    "variant)")

    def _row(self, entry: Entry) -> tuple[int, tuple[float, float] | None]:
        """(the steps the row's budget applies to, its equal-FLOPs pair or None), computed once per row."""
        key = (entry.name, json.dumps(entry.overrides, sort_keys=True, default=str))
        if key not in self._rows:
            flops = step_flops(self.sweep, entry, self.base) if self.sweep.budget.get("equal") == "flops" else None
            self._rows[key] = (row_base_steps(self.sweep, entry, self.base, self.base_cfg), flops)
        return self._rows[key]

    def trial_overrides(self, entry: Entry) -> dict:
        steps, flops = self._row(entry)
        return trial_overrides(self.sweep, entry, self.base, steps, self.results_dir, flops)

    def config(self, entry: Entry) -> config.Config:
        return experiment_config(self.sweep, self.trial_overrides(entry), data=self.data,
                                 experiment=self.sweep.experiment_of(entry.name))

    def max_steps(self, entry: Entry) -> int:
        ov = self.trial_overrides(entry)
        return int(ov.get("train.max_steps", self._row(entry)[0]))

    def grid_key(self, entry: Entry) -> str:
        return f"{entry.name}/seed{entry.seed}/steps{self.max_steps(entry)}/{entry.definition_hash()}"

    def attrs(self, entry: Entry) -> dict:
        return {"grid_key": self.grid_key(entry), "variant": entry.name, "family": entry.family,
                "seed": entry.seed, "max_steps": self.max_steps(entry), "overrides": entry.overrides,
                "budget": entry.budget}


def build_model_params(cfg: config.Config) -> int:
    """Build the trial's model (on the meta device: no memory, no time; the constructor's own checks) and count
    its parameters (the architecture's own count, model/registry.py).

    The vocabulary is ``data.vocab_size``; a trained BPE vocabulary may come out slightly smaller.
    """
    import torch  # here, not at the top: `ltfm sweep --status` and the reports never build a model

    from ..model import registry
    with torch.device("meta"):
        registry.build_model(cfg.model, cfg.data.vocab_size)
    return registry.count_parameters(cfg.model, cfg.data.vocab_size)


def check_buildable(plan: Plan, entry: Entry) -> tuple[dict | None, int | None, str | None]:
    """(config, params, None) or (None, None, reason) for a combination that cannot be built."""
    try:
        cfg = plan.config(entry)
        return cfg, build_model_params(cfg), None
    except UserError as e:
        return None, None, str(e)
    except Exception as e:  # the model constructor refused it
        return None, None, f"model cannot be built: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def yaml_value(v: Any) -> str:
    """A value as ``ltfm``'s ``key=value`` parser (YAML) reads it back exactly: 1e-9 -> 1.0e-09, '1' -> "'1'"."""
    text = yaml.safe_dump(v, default_flow_style=True, width=1 << 30)
    return text[:-len("\n...\n")] if text.endswith("\n...\n") else text.rstrip("\n")


def format_overrides(ov: dict) -> str:
    return " ".join(f"{k}={yaml_value(v)}" for k, v in ov.items()) or "(base)"
