"""A prepared corpus's build (:func:`.corpus.prepare`) left nothing behind: the temporary folders of builds that were
killed are removed (:func:`remove_stale_builds`), and SIGTERM or SIGHUP during a build unwinds it, so that its own
is removed too (:func:`stoppable_build`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from pathlib import Path


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


def remove_stale_builds(root: Path, holding: Path | None = None) -> None:
    """Remove the temporary folders of builds that were killed (``.<corpus>.tmp<pid>``, by SIGKILL or a crash
    of the machine), of every corpus in ``root``. Only the holder of a corpus's build lock builds it, so under
    the lock (``holding``: that corpus) every such folder of it is stale; any other is removed only when the
    process that made it is gone and its corpus's lock can be taken at once (no build of it is running)."""
    from filelock import FileLock, Timeout

    for path in root.glob(".*.tmp*"):
        name, _, pid = path.name[1:].rpartition(".tmp")
        if not name or not pid.isdigit() or not path.is_dir():
            continue
        mine = holding is not None and name == holding.name
        if not mine and (int(pid) == os.getpid() or _alive(int(pid))):
            continue
        try:
            with contextlib.nullcontext() if mine else FileLock(str(root / name) + ".lock", timeout=0):
                shutil.rmtree(path, ignore_errors=True)
        except (Timeout, OSError):
            continue
        if not path.exists():
            print(f"ltfm prepare: removed {path.name}, left by a build that was stopped", file=sys.stderr)


class _Stopped(BaseException):
    """SIGTERM or SIGHUP during a build: unwinds it (its temporary folder is removed on the way out)."""


@contextlib.contextmanager
def stoppable_build():
    """SIGTERM and SIGHUP, whose default ends the process at once, unwind the build instead (so its temporary
    folder is removed), and are then sent again to the handler they had: the process ends as it would have,
    without the leftover. SIGINT needs nothing: Ctrl-C already unwinds (KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):  # noqa: ARG001
        raise _Stopped(signum)
    sigs = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, stop) for s in sigs}
    restore = lambda: [signal.signal(s, handler) for s, handler in previous.items()]  # noqa: E731
    try:
        yield
    except _Stopped as e:
        restore()
        print(f"ltfm prepare: stopped by {signal.Signals(e.args[0]).name}: the partial build was removed",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), e.args[0])  # what the signal would have done (the default: end the process)
        raise KeyboardInterrupt from None  # its handler returned: stop all the same
    finally:
        restore()
