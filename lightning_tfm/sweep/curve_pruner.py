"""The pruner of a search sweep (``pruner: {type: curve}`` in a sweep file): the verdict's fit
(:mod:`lightning_tfm.findings.curves`) of a search trial's reports so far, extrapolated to its final step; the trial
is stopped only when even the optimistic end of the bootstrap interval is worse than the best completed trial.
Free of Lightning, because the sweep file's check and the worker build the pruner too
(:func:`lightning_tfm.sweep.spec.build_pruner`)."""
from __future__ import annotations

import math

import numpy as np
import optuna

from ..findings.curves import FAMILIES, FAMILY, fit_curve, interval, points_needed


class CurvePruner(optuna.pruners.BasePruner):
    """Optuna pruner (``pruner: {type: curve}``): stop a search trial only when its learning curve, extrapolated
    to the end of its budget, ends worse than the best completed trial with confidence.

    At each report the trial's values after the warmup are fitted (:func:`fit_curve`, the verdict's fit: a report
    at update ``s`` is Lightning's step ``s - 1`` and is read when ``s > warmup``); with fewer of them than
    :func:`points_needed`, no pruning. The fit predicts the value at the final step with the central ``level``
    interval of ``bootstraps`` residual-bootstrap draws (:meth:`CurveFit.bootstrap`, seeded by ``seed`` and the
    trial number: the same reports, the same call). The trial is pruned when the optimistic end of that interval
    (its low end) is still above the best completed trial's value. The values are fitted as reported: a
    ``dev_loss`` metric is the dev log-PPL the verdict fits (its back-test: the module docstring), ``dev_ppl`` the
    perplexity. ``warmup`` and ``final_step`` default to the trial's ``train.warmup`` and ``train.max_steps``
    (:meth:`for_trial`, which the trial process calls: :mod:`.pruning`); without a budget, the final step is the
    last the best trial reported. A study that maximises (``dev_bleu``) or has several objectives is never pruned:
    the families are falling curves of a loss."""

    def __init__(self, min_points: int = 3, warmup: int | None = None, final_step: int | None = None,
                 level: float = 0.9, bootstraps: int = 200, seed: int = 0, family: str = FAMILY):
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, not {family!r}")
        if not 0 < level < 1 or int(min_points) < 3 or int(bootstraps) < 20:
            raise ValueError("level must be in (0, 1), min_points at least 3 and bootstraps at least 20")
        self.min_points, self.level, self.bootstraps = int(min_points), float(level), int(bootstraps)
        self.warmup, self.final_step, self.seed, self.family = warmup, final_step, int(seed), family

    def for_trial(self, warmup: int | None, max_steps: int | None) -> "CurvePruner":
        """This pruner with the trial's warmup and budget where the sweep file left them unset."""
        return CurvePruner(self.min_points, self.warmup if self.warmup is not None else warmup,
                           self.final_step if self.final_step is not None else max_steps, self.level,
                           self.bootstraps, self.seed, self.family)

    def predict_final(self, values: dict[int, float], final_step: int, number: int = 0
                      ) -> tuple[float, float, float] | None:
        """(predicted value, low, high) at update ``final_step`` from a trial's reports ``{update: value}``, or
        None with too few reports after the warmup."""
        warmup = self.warmup or 0
        pairs = {int(s) - 1: float(v) for s, v in values.items()
                 if int(s) > warmup and v is not None and math.isfinite(v) and v > 0}
        if len(pairs) < points_needed(self.min_points, self.family):
            return None
        fit = fit_curve(list(pairs), list(pairs.values()), warmup=warmup, min_points=self.min_points,
                        family=self.family)
        if fit is None:
            return None
        draws = fit.bootstrap([final_step - 1], self.bootstraps, np.random.default_rng([self.seed, number]))[:, 0]
        low, high = interval(draws, self.level)
        return fit.predict(final_step - 1), low, high

    def prune(self, study, trial) -> bool:
        from optuna.study import StudyDirection
        from optuna.trial import TrialState

        if len(study.directions) != 1 or study.direction != StudyDirection.MINIMIZE or trial.last_step is None:
            return False
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and math.isfinite(t.value)]
        if not done:
            return False
        best = min(done, key=lambda t: t.value)
        final = self.final_step or max(best.intermediate_values, default=None)
        if final is None or trial.last_step >= final:
            return False
        predicted = self.predict_final(trial.intermediate_values, final, trial.number)
        return predicted is not None and predicted[1] > best.value
