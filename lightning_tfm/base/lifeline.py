"""A process that dies with the one that started it (Linux ``PR_SET_PDEATHSIG``): a sweep's trial dies with its
worker, so that a killed worker leaves no orphan training that would race the retried trial.

The starter names itself in the child's environment (:func:`tie`); the child, first thing
(:func:`hold_on`, at the start of ``ltfm``), asks the kernel for SIGKILL when its parent dies, then checks its
parent is still that process (it may have died in between). The child does this itself, after exec: a
``preexec_fn`` would make Python fork the starter whole, and a worker on ``grpc://`` (Optuna's storage proxy)
forks grpcio's threads with it; its children aborted there (``epoll_wait error: Bad file descriptor``), 7 in 100
starts in a test beside busy gRPC calls. Without it Python starts the child by vfork and exec, which run no fork
handlers.
"""
from __future__ import annotations

import os
import signal
import sys

PARENT_ENV = "LTFM_DIES_WITH_PID"
"""The pid of the process this one dies with (set by :func:`tie`, read and removed by :func:`hold_on`)."""

_PR_SET_PDEATHSIG = 1


def tie(env: dict) -> dict:
    """``env`` for a child that dies with this process (on Linux; elsewhere unchanged)."""
    return {**env, PARENT_ENV: str(os.getpid())} if sys.platform.startswith("linux") else env


def hold_on() -> None:
    """In a child started with :func:`tie`'s environment: SIGKILL when the parent dies, and at once if it already
    has. The variable is removed, so that this process's own children (Lightning's ranks) are not tied to it."""
    pid = os.environ.pop(PARENT_ENV, None)
    if pid is None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if str(os.getppid()) != pid:  # the parent died before the kernel was asked
        os.kill(os.getpid(), signal.SIGKILL)
