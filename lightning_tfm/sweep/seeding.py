"""A seeded sampler that many workers share: the sweep file's sampler, its random state drawn anew for every
trial from the file's seed and the trial's number.

Every worker of a sweep is its own process that builds the sweep file's sampler with the file's ``seed``: left
as it is, each would replay one random sequence, and workers that start together propose the same points
(the same startup trials, the same candidates), closed as duplicates. Seeding by trial number keeps one
worker's search reproducible (the same file and storage give the same points in the same order) while every
trial, whichever worker asks for it, gets its own draw. QMC is left as it is: its points come from one
scrambled sequence indexed by the study, which a per-trial seed would break.
"""
from __future__ import annotations

from typing import Any

import optuna


class PerTrialSeed(optuna.samplers.BaseSampler):
    """``cls(seed=f(seed, trial number), **kwargs)``, built before each trial; every call goes to it."""

    def __init__(self, cls: type, kwargs: dict, seed: int):
        self._cls, self._kwargs, self._seed = cls, dict(kwargs), int(seed)
        self._inner = cls(seed=self._seed, **self._kwargs)

    def seed_for(self, number: int) -> int:
        return (self._seed * 1_000_003 + number) % (2 ** 32)

    def before_trial(self, study, trial) -> None:
        self._inner = self._cls(seed=self.seed_for(trial.number), **self._kwargs)
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial) -> dict[str, Any]:
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()
