"""The study's queue of rows: the (variant, seed) rows a variants sweep enqueues as WAITING trials (with the
row's Table 3 knobs as params, for optuna-dashboard), the atomic claim of one, and the duplicate check.

- :func:`enqueue_missing` adds the rows missing from the study, under the study's queue lock
  (:func:`~.storage.queue_lock`: two workers starting at once queue each row once);
- :func:`claim_waiting` takes one with the storage's atomic WAITING -> RUNNING transition: a trial stopped by
  Ctrl-C first (:data:`STOPPED`, it resumes its run), then the study's retries, then the rows in queue order;
- :func:`ask_new` starts a new search point (what ``study.ask`` does, with the trial's first heartbeat at once);
  both sample through :func:`open_trial`, whose sampler failure names its trial (:class:`SamplerFailed`);
- :func:`duplicate_of` finds a lower-numbered live trial of a row enqueued twice.
"""
from __future__ import annotations

import contextlib
from typing import Any

from ..training.config import config
from .budget import PAST_BUDGET
from .plan import Plan
from .spec import Entry
from .storage import queue_lock, retry

#: The ``status`` user attribute of a trial put back in the queue by Ctrl-C (or SIGTERM) of its worker: WAITING in
#: the study, shown as *stopped* by ``--status`` and the progress line, and claimed first by the next worker
STOPPED = "stopped"


def enqueue_missing(study, plan: Plan) -> int:
    """Enqueue every (variant, seed) row that has no live trial yet, under the study's queue lock; returns how
    many were added."""
    with queue_lock(study._storage, plan.sweep.name):
        return _enqueue_missing(study, plan)


def _enqueue_missing(study, plan: Plan) -> int:
    from optuna.trial import TrialState

    by_key: dict[str, list] = {}
    for t in retry(study.get_trials, deepcopy=False):
        by_key.setdefault(t.user_attrs.get("grid_key"), []).append(t)
    added = 0
    space = dashboard_space(plan)
    # Longest rows first (stable, so the paper's order holds within a budget): with several workers a
    # row trained for 3x the steps overlaps the short ones instead of running alone at the end.
    for entry in sorted(plan.sweep.entries(), key=lambda e: -e.budget):
        trials = by_key.get(plan.grid_key(entry), [])
        if any(t.state != TrialState.FAIL for t in trials):
            continue  # waiting, running, complete or pruned somewhere
        if any(t.user_attrs.get("skip") in NOT_AGAIN for t in trials):
            continue  # will not build now either; a run folder trained past the budget stays so
        add_waiting(study, plan, entry, space)
        added += 1
    return added


#: The ``skip`` of a closed trial whose row is never queued again: it will not build now either; a run folder trained
#: past the budget stays so
NOT_AGAIN = ("unbuildable", PAST_BUDGET)


def add_waiting(study, plan: Plan, entry: Entry, space: dict, **attrs) -> None:
    """Add ``entry`` to the study as a WAITING trial (the caller holds the queue lock and has checked that its
    row has no live trial), with the row's knobs as its params (``space``: :func:`dashboard_space`), the plan's
    attributes of it and ``attrs``. This is ``study.enqueue_trial`` with the knobs as the trial's params
    (enqueue_trial's own params are only applied by suggest_* calls, which these trials never make)."""
    from optuna.trial import TrialState, create_trial

    params, dists = dashboard_params(plan, entry, space)
    retry(study.add_trial, create_trial(state=TrialState.WAITING, params=params, distributions=dists,
                                         user_attrs={**plan.attrs(entry), **attrs}))


# The Table 3 knobs each variant trial carries as its Optuna params (flat config keys, as in W&B), so that
# optuna-dashboard's trials table, parallel coordinates and Hyperparameter Importance show them. Nothing
# samples them: they describe the row.
# The training budget (train.max_steps) is the trial's budget, not a knob of the row: left out.
DASHBOARD_KNOBS = tuple(k.key for k in config.TABLE3_KNOBS if k.key != "train.max_steps")
# Categorical knobs get every allowed value as choices (the config field's Literal), the same in every study:
# Optuna refuses a parameter whose categorical choices differ between the trials of one study.
DASHBOARD_CHOICES = {key: config.choices(key) for key in DASHBOARD_KNOBS if config.choices(key)}


def _knob_value(plan: Plan, entry: Entry, key: str) -> Any:
    return plan.trial_overrides(entry).get(key, config.get_dotted(plan.base_cfg, key))


def dashboard_space(plan: Plan) -> dict:
    """One distribution per knob spanning the values of the plan's rows: identical for every trial the plan
    enqueues (Optuna's importance evaluators need one search space)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    for key in DASHBOARD_KNOBS:
        if key in DASHBOARD_CHOICES:
            space[key] = CategoricalDistribution(DASHBOARD_CHOICES[key])
            continue
        values = [_knob_value(plan, e, key) for e in plan.sweep.entries()]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            continue
        if all(isinstance(v, int) for v in values):
            space[key] = IntDistribution(min(values), max(values))
        else:
            space[key] = FloatDistribution(float(min(values)), float(max(values)))
    return space


def dashboard_params(plan: Plan, entry: Entry, space: dict) -> tuple[dict, dict]:
    params, dists = {}, {}
    for key, dist in space.items():
        value = _knob_value(plan, entry, key)
        if value is None or (key in DASHBOARD_CHOICES and value not in DASHBOARD_CHOICES[key]):
            continue
        params[key] = float(value) if dist.__class__.__name__ == "FloatDistribution" else value
        dists[key] = dist
    return params, dists


def claim_waiting(study, storage, study_id: int, keys: set[str] | None = None):
    """Atomically move one WAITING trial to RUNNING (as ``study.ask`` does), or None if none is left.

    With ``keys``, only trials of those grid keys: a worker runs its own plan's rows (its budget, its variant
    definitions), and leaves rows enqueued by workers with another plan to them."""
    import optuna
    from optuna.trial import TrialState

    waiting = retry(study.get_trials, deepcopy=False, states=(TrialState.WAITING,))
    first = sorted(waiting, key=lambda t: (t.user_attrs.get("status") != STOPPED, "failed_trial" not in t.system_attrs,
                                           t.number))
    for t in first:
        if keys is not None and t.user_attrs.get("grid_key") not in keys:
            continue
        trial_id = retry(storage.get_trial_id_from_study_id_trial_number, study_id, t.number)
        try:
            if retry(storage.set_trial_state_values, trial_id, state=TrialState.RUNNING):
                _first_heartbeat(storage, trial_id)
                return open_trial(study, trial_id), trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def ask_new(study, storage, study_id: int):
    """A new trial of a search, ``(trial, trial_id)``: ``study.ask`` split so that the trial is known before its
    sampler runs, and beats at once (a worker killed or a sampler failing while it samples leaves no trial running
    forever)."""
    # through the study's own storage, as study.ask does: Optuna's cache of it must know the trial, or the first
    # suggest_* of a sampler that reads no trials (random) fails with a KeyError of the trial id (Optuna 5)
    trial_id = retry(study._storage.create_new_trial, study_id)
    _first_heartbeat(storage, trial_id)
    return open_trial(study, trial_id), trial_id


def _first_heartbeat(storage, trial_id: int) -> None:
    """A claimed trial's first heartbeat, at once: Optuna never judges a RUNNING trial without one stale, so a
    worker killed before its :class:`~.storage.Heartbeat` starts would leave the trial running forever (and every
    other worker waiting on it)."""
    with contextlib.suppress(Exception):
        storage.record_heartbeat(trial_id)


class SamplerFailed(Exception):
    """The sweep's sampler raised (not the storage) while sampling the trial of ``trial_id``: the worker closes
    that trial as failed with this error instead of leaving it running."""

    def __init__(self, trial_id: int, error: BaseException):
        why = str(error).splitlines()[0] if str(error) else ""
        super().__init__(f"{error.__class__.__name__}: {why}" if why else error.__class__.__name__)
        self.trial_id = trial_id


@contextlib.contextmanager
def sampling(trial_id: int):
    """Around a sampler's work on the trial of ``trial_id``: what the sampler raises becomes :class:`SamplerFailed`
    naming the trial; a storage error (after :func:`~.storage.retry`'s patience) stays what it is."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except (optuna.exceptions.StorageInternalError, SQLAlchemyError, optuna.exceptions.UpdateFinishedTrialError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever the sampler raises is the sampler's
        raise SamplerFailed(trial_id, e) from e


def open_trial(study, trial_id: int):
    """The trial of ``trial_id``; building it runs the sampler's relative sampling (``optuna.trial.Trial``)."""
    import optuna

    # As Study.ask does before each trial: samplers read the study's trials through this per-thread cache, which
    # only ask clears; kept, the sampler would not see the trials finished since it was filled
    study._thread_local.cached_all_trials = None
    with sampling(trial_id):
        return retry(optuna.trial.Trial, study, trial_id)


def duplicate_of(study, number: int, key: str):
    """The lower-numbered live (waiting/running/complete/pruned) trial holding ``key``, if any."""
    from optuna.trial import TrialState

    for t in retry(study.get_trials, deepcopy=False):
        if t.number < number and t.user_attrs.get("grid_key") == key and t.state != TrialState.FAIL:
            return t
    return None
