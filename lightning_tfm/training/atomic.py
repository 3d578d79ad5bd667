"""The one way a file of ours is written: whole or not at all, and never a leftover a resume trips on.

Every result (checkpoints, ``summary.json``, ``config.yaml``, hypotheses, reports) goes through
:func:`atomic_path`: the bytes are written to a temporary file in the *same folder* as the target (so the
final rename never crosses filesystems, whatever ``$TMPDIR`` is), flushed and fsynced, renamed over the
target with ``os.replace`` (atomic on POSIX), and the folder is fsynced so the rename itself survives a
power cut. On any error -- a full disk, a read-only folder, an exception in the writer, Ctrl-C -- the
temporary file is removed and the old target (if any) is untouched. A process killed by SIGKILL mid-write
leaves only a ``.<name>.tmp-*`` file, which no reader of ours ever opens.

Where a write fails for want of room, the one-line error says how much is free there (:func:`free_space`).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterator

TMP_PREFIX = "."
TMP_MARK = ".tmp-"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported on this platform/filesystem: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that wants a path (``torch.save``,
    ``tokenizer.save``); when the block ends without error the file is fsynced and renamed to ``path``.
    On error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    # Not tempfile.mkstemp: its 0600 mode would make every result private; 0666 & umask as open() does.
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(3)}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def is_temp(path: str | os.PathLike) -> bool:
    """True for a temporary file of :func:`atomic_path` (left only by a process killed mid-write)."""
    name = Path(path).name
    return name.startswith(TMP_PREFIX) and TMP_MARK in name


def remove_stale_temps(folder: str | os.PathLike) -> None:
    """Delete temporary files left in ``folder`` by a killed writer (call only while holding the run lock)."""
    folder = Path(folder)
    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_file() and is_temp(p):
                with contextlib.suppress(OSError):
                    p.unlink()


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
