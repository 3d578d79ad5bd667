"""A trial's process as its worker sees it: the worker stops like Ctrl-C on SIGTERM, and how a trial that ended
badly is told (its log's error line, the signal that killed it). The trial dies with its worker:
:mod:`~lightning_tfm.base.lifeline`."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from pathlib import Path

TERMINATED = threading.Event()


def start(cmd: list[str], env: dict, out) -> subprocess.Popen:
    """Start a trial's process, its output to the open file ``out``: no ``preexec_fn``, so that Python starts it by
    vfork and exec, which run no fork handlers (grpcio's aborted children of a worker on ``grpc://``); the death
    signal is set by the child itself (:func:`~lightning_tfm.base.lifeline.hold_on`)."""
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def _noted(signum, frame):  # noqa: ARG001 - a further stop signal while the worker stops: ignored
    pass


def _on_stop(signum, frame):  # noqa: ARG001
    """Ctrl-C, SIGTERM (``kill``, a batch system's preemption) and SIGUSR1 (SLURM's warning before it, with
    ``--signal=USR1@N``) end a worker: its trial is stopped and put back in the queue as stopped, and the next
    ``ltfm sweep`` resumes it first, from its checkpoint. From the first of them on, every further one is ignored,
    so that none cuts that stop short (not even in the instant before the worker's :func:`shielded` begins)."""
    if signum != signal.SIGINT:
        TERMINATED.set()  # the trial process did not get it: the worker sends it SIGINT
    for sig in _STOPS:
        signal.signal(sig, _noted)
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Let Ctrl-C, SIGTERM and SIGUSR1 end this worker as :func:`_on_stop` says (handlers can only be set in the
    main thread). SIGINT gets that handler too when this process inherited it ignored (a shell script's background
    job, ``cmd &``): a handler does not pass through exec, so the trial starts with the default, which Python makes
    Ctrl-C, and stops when the worker sends it SIGINT (an ignored disposition would pass, leaving it deaf to that)."""
    if threading.current_thread() is threading.main_thread():
        for sig in _STOPS:
            signal.signal(sig, _on_stop)


@contextlib.contextmanager
def shielded():
    """Around a worker's stop (its trial saving a checkpoint, the trial put back in the queue): a second Ctrl-C, or
    the launcher's SIGTERM to a worker still stopping, is noted and ignored instead of cutting the stop short (which
    left the trial running in the study and killed the trial process mid-save). Main thread only; elsewhere as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_process(proc, sig, patience: float) -> None:
    """Stop a trial's process: ``sig`` (SIGINT: it stops at the end of its step and saves its checkpoint; None:
    it got the signal already) and up to ``patience`` seconds for it to end, then SIGKILL."""
    import subprocess

    if sig is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=patience)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


# Lines of a traceback or of the logging module's report of a failed handler that say nothing of why
_NOT_A_REASON = ("Traceback (most recent call last)", "--- Logging error ---", "Call stack:", "Message:", "Arguments:",
                 "During handling of the above exception", "The above exception was the direct cause")


def log_error_line(log: Path) -> str | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("ltfm: error:"):
            return line[len("ltfm: error:"):].strip()
    for line in reversed(lines):
        if line.strip() and not line.startswith((" ", *_NOT_A_REASON)):
            return line.strip()[:300]
    return None


def killed_by(signum: int) -> str:
    """A trial process's end by signal, as its error: SIGKILL is what the kernel's out-of-memory killer and a
    scheduler past its grace period send."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    hint = " (the out-of-memory killer, a scheduler past its grace period, or kill -9)" if signum == 9 else ""
    return f"killed by {name}{hint}"
