"""A trial a worker holds (claimed: RUNNING in the study, its heartbeat beating): every write the worker makes for
it goes through :func:`write`, which turns a trial found finished by another worker into :class:`TakenOver`.

Any of those writes can find the trial finished: the study fails a trial as stale when its heartbeat lapses (the
storage unreachable for longer than the grace, the worker stopped by SIGSTOP, a clock jump) and queues its retry,
which owns the row from then on. The worker then stops working on the trial (its process ended if one runs, nothing
of it recorded as its own), says one line and goes on to the next trial (:class:`~.worker.Worker`). A trial's end
(:func:`close`) and a stopped trial's return to the queue (:func:`put_back`) change its state under the study's
queue lock (:func:`~.storage.queue_lock`), so no worker sees its row without a live trial in between.
"""
from __future__ import annotations

from .queue import STOPPED
from .storage import queue_lock, retry


class TakenOver(Exception):
    """A write for a trial this worker holds found it finished by another worker: the study failed it as stale
    (its heartbeat lapsed while the storage could not be reached, or while this worker was stopped) and queued its
    retry, which owns the row now."""

    def __init__(self, number: int):
        super().__init__(f"trial {number} was taken over by another worker (its heartbeat lapsed while the storage "
                         "was unreachable or this worker was stopped); going on")
        self.number = number


def write(number: int, fn, *args, **kw):
    """Every write a worker makes for the trial ``number`` it holds: ``fn(*args, **kw)`` with the storage's
    :func:`~.storage.retry`; the trial found finished by another worker raises :class:`TakenOver`."""
    import optuna

    try:
        return retry(fn, *args, **kw)
    except optuna.exceptions.UpdateFinishedTrialError:
        raise TakenOver(number) from None


def set_attrs(trial, attrs: dict) -> None:
    """The trial's user attributes ``attrs``, a write each (None values left out)."""
    for k, v in attrs.items():
        if v is not None:
            write(trial.number, trial.set_user_attr, k, v)


def check(storage, trial) -> None:
    """Raise :class:`TakenOver` unless ``trial`` is still RUNNING in the study."""
    from optuna.trial import TrialState

    if retry(storage.get_trial, trial._trial_id).state != TrialState.RUNNING:
        raise TakenOver(trial.number)


def close(study, storage, name: str, trial, state, values, attrs: dict) -> None:
    """Record the trial's end: its attributes, then its state (``study.tell``) under the study ``name``'s queue
    lock."""
    set_attrs(trial, attrs)
    with queue_lock(storage, name):
        check(storage, trial)
        write(trial.number, study.tell, trial.number, values, state=state, skip_if_finished=True)


def put_back(storage, name: str, trial, step: int | None) -> None:
    """A trial stopped by Ctrl-C (or SIGTERM): WAITING again with ``status`` :data:`~.queue.STOPPED` and the step
    its run stopped at, claimed first by the next worker (:func:`~.queue.claim_waiting`), which resumes its run."""
    from optuna.trial import TrialState

    set_attrs(trial, {"status": STOPPED, "stopped_at": step, "reason": stop_note(step)})
    with queue_lock(storage, name):
        check(storage, trial)
        write(trial.number, storage.set_trial_state_values, trial._trial_id, state=TrialState.WAITING)


def stop_note(step: int | None) -> str:
    """What a stopped trial's next run does: resume at its newest checkpoint's step, or start again without one."""
    if not step:
        return "stopped before its first checkpoint: the same command starts it again first"
    return f"stopped at step {step}: the same command resumes it first"


def resume_note(stopped_at: int | None, step: int, run_dir) -> str:
    """What a stopped trial claimed again says of its run: where it resumes, which is its run folder's newest
    checkpoint (``step``), not the step it stopped at, when the folder lacks the checkpoints it had (a study carried
    to another machine without them, ``make reference-carry``; checkpoints deleted)."""
    if not stopped_at or step >= stopped_at:
        return f"resumed from step {step} after a stop"
    return (f"resumed from step {step} after a stop at step {stopped_at}: {run_dir} has no checkpoint past step "
            f"{step}")
