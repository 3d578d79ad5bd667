"""The curve pruner (``pruner: {type: curve}``, lightning_tfm.sweep.curve_pruner.CurvePruner) in a real in-memory Optuna
study on synthetic learning curves of known shape: a clearly worse curve is stopped, a slow starter whose curve
crosses the best is kept (where the median pruner stops it), and too few reports after the warmup never prune."""
from __future__ import annotations

import dataclasses

import numpy as np
import optuna
import pytest
import yaml

from lightning_tfm.base.errors import UserError
from lightning_tfm.sweep import load_sweep, schema
from lightning_tfm.sweep.curve_pruner import CurvePruner

from conftest import SMOKE

STEPS = list(range(100, 1001, 100))   # updates at which a trial reports its dev loss; its budget is 1,000
WARMUP = 100


def curve(a: float, alpha: float, seed: int, noise: float = 0.005) -> dict[int, float]:
    """A dev loss ``a * t^-alpha`` (t: updates) at every report, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    return {s: a * s ** -alpha * float(np.exp(rng.normal(0.0, noise))) for s in STEPS}


# Three finished trials near dev loss 2.0 at the budget; a clearly worse one (3.9 at the budget); a slow starter:
# worse than every finished trial at its first reports, better than all of them (1.8) at the budget.
FINISHED = [curve(8.0, 0.2, 1), curve(8.3, 0.2, 2), curve(8.6, 0.2, 3)]
WORSE = curve(9.0, 0.12, 4)
SLOW_STARTER = curve(20.0, 0.35, 5)


def study_with(pruner) -> optuna.Study:
    """An in-memory study holding the finished trials, each told its value at the budget."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    for values in FINISHED:
        trial = study.ask()
        for step, v in values.items():
            trial.report(v, step)
        study.tell(trial, values[STEPS[-1]])
    return study


def run(study: optuna.Study, values: dict[int, float]) -> int | None:
    """Report ``values`` as a trial would, asking the study's pruner after each report (never at the budget,
    as the trial process never asks there); returns the step it was pruned at, or None."""
    trial = study.ask()
    for step, v in values.items():
        trial.report(v, step)
        if step < STEPS[-1] and trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return step
    study.tell(trial, values[STEPS[-1]])
    return None


def test_the_synthetic_curves_are_what_the_tests_say():
    best = min(v[1000] for v in FINISHED)
    assert WORSE[1000] > 1.8 * best and SLOW_STARTER[1000] < 0.95 * best
    assert all(SLOW_STARTER[s] > max(v[s] for v in FINISHED) for s in STEPS[:2])  # behind every one to step 200
    assert all(SLOW_STARTER[s] > sorted(v[s] for v in FINISHED)[1] for s in STEPS[:3])  # the median to 300


def test_a_clearly_worse_curve_is_pruned_as_soon_as_the_fit_has_its_points():
    """Reports after the warmup (100): 200, 300, 400 make the 3 points a power law needs; pruned at 400."""
    assert run(study_with(CurvePruner(warmup=WARMUP)), WORSE) == 400


def test_a_slow_starter_whose_curve_crosses_the_best_is_not_pruned():
    pruner = CurvePruner(warmup=WARMUP)
    study = study_with(pruner)
    assert run(study, SLOW_STARTER) is None
    assert study.best_value == pytest.approx(SLOW_STARTER[1000])
    # what it saw at its first chance: a predicted end near the truth (1.78), below the best finished trial (2.0)
    point, low, high = pruner.predict_final({s: SLOW_STARTER[s] for s in STEPS[:4]}, 1000)
    assert low < point < high and abs(point - SLOW_STARTER[1000]) < 0.1 and point < min(v[1000] for v in FINISHED)


def test_a_worse_prediction_prunes_only_with_confidence():
    """One curve 11% above the best at the budget, measured with 0.2% noise and with 3%: the quiet one is pruned at
    the first chance; the noisy one's predicted end is worse than the best from step 500 on, but its interval holds
    the best until step 700."""
    best = min(v[1000] for v in FINISHED)
    quiet, noisy = curve(8.9, 0.2, 6, 0.002), curve(8.9, 0.2, 6, 0.03)
    assert run(study_with(CurvePruner(warmup=WARMUP)), quiet) == 400
    pruner = CurvePruner(warmup=WARMUP)
    for last in (500, 600):  # number 3: the trial's in run(), after the three finished ones
        point, low, high = pruner.predict_final({s: v for s, v in noisy.items() if s <= last}, 1000, number=3)
        assert low < best < point < high
    assert run(study_with(pruner), noisy) == 700


def test_too_few_points_after_the_warmup_never_prune():
    """The worse curve cut where the fit lacks points: no pruning, however bad the values; a larger min_points
    waits longer."""
    assert run(study_with(CurvePruner(warmup=WARMUP)), {s: WORSE[s] for s in STEPS[:3]} | {1000: WORSE[1000]}) is None
    assert run(study_with(CurvePruner(warmup=300)), WORSE) == 600          # 400, 500, 600 after the warmup
    assert run(study_with(CurvePruner(warmup=WARMUP, min_points=5)), WORSE) == 600
    assert CurvePruner(warmup=WARMUP).predict_final({s: 99.0 for s in (100, 200, 300)}, 1000) is None


def test_no_finished_trial_or_a_maximised_metric_never_prune():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    assert run(optuna.create_study(pruner=CurvePruner(warmup=WARMUP)), WORSE) is None   # nothing to compare with
    study = optuna.create_study(direction="maximize", pruner=CurvePruner(warmup=WARMUP))  # dev_bleu: no loss curve
    for values in FINISHED:
        trial = study.ask()
        for step, v in values.items():
            trial.report(v, step)
        study.tell(trial, values[1000])
    assert run(study, {s: 0.1 * v for s, v in WORSE.items()}) is None


def test_beside_the_median_pruner_on_the_same_trials():
    """Both stop the clearly worse curve; the median pruner also stops the slow starter at its first report (it is
    behind every finished trial there), which would have been the best trial of the study."""
    median = study_with(optuna.pruners.MedianPruner(n_startup_trials=len(FINISHED), n_warmup_steps=WARMUP))
    curve_ = study_with(CurvePruner(warmup=WARMUP))
    assert run(median, WORSE) is not None and run(curve_, WORSE) is not None
    assert run(median, SLOW_STARTER) == 100
    assert run(curve_, SLOW_STARTER) is None
    assert curve_.best_value < median.best_value


def test_the_same_reports_give_the_same_call_and_the_trial_fills_the_unset_settings():
    a, b = CurvePruner(warmup=WARMUP, seed=3), CurvePruner(warmup=WARMUP, seed=3)
    part = {s: WORSE[s] for s in STEPS[:5]}
    assert a.predict_final(part, 1000, number=7) == b.predict_final(part, 1000, number=7)
    trial = CurvePruner(min_points=4).for_trial(warmup=200, max_steps=600)
    assert (trial.warmup, trial.final_step, trial.min_points) == (200, 600, 4)
    kept = CurvePruner(warmup=50, final_step=900).for_trial(warmup=200, max_steps=600)
    assert (kept.warmup, kept.final_step) == (50, 900)


def test_its_settings_are_the_sweep_files_typed_keys(tmp_path):
    """The pruner: section's curve keys are the class's arguments with the same defaults; a bad value is one line
    naming the key."""
    import inspect

    fields = {f.name: f.default for f in dataclasses.fields(schema.PrunerSpec) if f.name != "type"}
    params = {k: p.default for k, p in inspect.signature(CurvePruner).parameters.items()}
    assert fields == params
    assert "curve" in schema.PRUNERS
    for bad, words in (({"level": 1.5}, "pruner level must be a number in (0, 1)"),
                       ({"min_points": 2}, "pruner min_points must be an integer >= 3"),
                       ({"family": "cubic"}, "pruner family must be")):
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_sweep(_sweep_file(tmp_path, {"type": "curve", **bad}))


def _sweep_file(folder, pruner: dict):
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "experiment": str(SMOKE), "pruner": pruner,
                                    "space": {"model.dropout": {"type": "float", "low": 0, "high": 0.3}}}))
    return path
