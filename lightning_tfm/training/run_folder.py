"""A run folder's life: the lock that lets one process train it, its earlier summary and attempts,
whether it is already done, and the one-line errors of a results folder that cannot be written.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from . import results
from .errors import UserError
from .config import Config


def rank_zero() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0 and \
        int(os.environ.get("NODE_RANK", "0")) == 0


def free_space(path: Path) -> str:
    """Free space on the filesystem of ``path`` (or of its nearest existing ancestor), e.g. ``12.0 MB``."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return "unknown"
    for div, unit in ((2 ** 30, "GB"), (2 ** 20, "MB"), (2 ** 10, "kB")):
        if free >= div:
            return f"{free / div:.1f} {unit}"
    return f"{free} bytes"


def check_writable(results_dir: Path) -> None:
    """Try to create (and remove) a folder in the nearest existing ancestor: os.access says yes to root."""
    import tempfile

    p = results_dir.absolute()
    while not p.exists():
        p = p.parent
    try:
        if not p.is_dir():
            raise NotADirectoryError(p)
        tempfile.TemporaryDirectory(dir=p).cleanup()
    except OSError as e:
        raise UserError(f"results folder {str(results_dir)!r} is not writable ({e.strerror or e.__class__.__name__}; "
                        f"{free_space(p)} free): set run.results_dir to a folder you can write") from None


# Errors that mean "the results folder cannot take this write": the user's to fix (exit 2), not a crash.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


# ... as some libraries (tokenizers, torch's C++ writer) report them: as text, not an OSError
_STORAGE_TEXTS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "file write failed")


def storage_error(exc: BaseException, run_dir: Path) -> UserError | None:
    """A one-line UserError naming the folder and its free space when ``exc`` (or its cause) is a failed
    write into the results folder (disk full, quota, read-only, permission), else None."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            what = e.strerror or os.strerror(e.errno)
            break
        if any(t in str(e) for t in _STORAGE_TEXTS):
            what = next(t for t in _STORAGE_TEXTS if t in str(e))
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    return UserError(f"cannot write in {run_dir} ({what}; {free_space(run_dir)} free there): free space, or set "
                     f"run.results_dir to a writable folder, then run the same command again to resume")


LOCK_FILE = "train.lock"


class RunLock:
    """One training per run folder: an exclusive ``flock`` on ``<run>/train.lock``, held while the
    process trains. The kernel releases it when the process ends in any way (exit, crash, SIGKILL), so
    there is no stale lock to clean up. The file records the holder's host and pid for the message
    the second process prints. (flock works across NFS clients on Linux >= 2.6.12, as POSIX locks.)"""

    def __init__(self, run_dir: Path, rid: str):
        self.path, self.rid, self.fd = run_dir / LOCK_FILE, rid, None

    def __enter__(self) -> "RunLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            finally:
                os.close(fd)
            who = (f"pid {holder.get('pid')} on host {holder.get('host')}" if isinstance(holder, dict) and
                   holder.get("pid") else "another process")
            raise UserError(f"run {self.rid} {results.RUN_LOCKED} {who} (lock {self.path}): wait for it to finish or stop "
                            f"it; running the same command afterwards resumes the run") from None
        self.fd = fd
        with contextlib.suppress(OSError):  # a full disk must not stop the holder itself
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode() + b"\n", 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None


def previous_summary(summary_path: Path) -> dict | None:
    """The run's earlier summary, or None. An unusable one (truncated, hand-edited) is set aside with a
    warning; a fresh summary is written and the checkpoints are kept."""
    prev, problem = results.load_summary(summary_path.parent)
    if problem is not None:
        dest = summary_path.with_name(f"summary.json.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(summary_path, dest)
            kept = f"moved to {dest.name}"
        except OSError:
            kept = "left as it is"
        print(f"ltfm: warning: {summary_path} {problem}; {kept}; writing a fresh summary (checkpoints are kept)",
              file=sys.stderr)
    return prev


def attempts(prev: dict | None) -> list[dict]:
    """Every earlier attempt of the run, newest last: a continuation that fails never erases results."""
    if not prev:
        return []
    earlier = [a for a in prev.get("attempts") or [] if isinstance(a, dict)]
    return earlier + [{k: v for k, v in prev.items() if k not in ("attempts", "config")}]


def already_done(prev: dict | None, cfg: Config) -> bool:
    return bool(prev) and prev.get("status") == "completed" and (prev.get("steps") or 0) >= cfg.train.max_steps
