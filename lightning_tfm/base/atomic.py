"""The one way a file of ours is written: whole or not at all, and never a leftover a resume trips on.

Every result (checkpoints, ``summary.json``, ``config.yaml``, hypotheses, reports) goes through
:func:`atomic_path`: the bytes are written to a temporary file in the *same folder* as the target (so the
final rename never crosses filesystems, whatever ``$TMPDIR`` is), flushed and fsynced, renamed over the
target with ``os.replace`` (atomic on POSIX), and the folder is fsynced so the rename itself survives a
power cut. On any error -- a full disk, a read-only folder, an exception in the writer, Ctrl-C -- the
temporary file is removed and the old target (if any) is untouched. A process killed by SIGKILL mid-write
leaves only a ``.<name>.tmp-*`` file, which no reader of ours ever opens. The temporary name holds at most the
first 40 characters of the target's (:func:`temp_name`), so it fits wherever the target's name fits.

Before a command does its work it checks that every file it will write can be written (:func:`check_writable`):
a name the filesystem takes, a folder (or a place to make one) where the file's folder should be, a folder it may
write in, no folder where the file should be. Where a write fails for want of room, the one-line error says how
much is free there (:func:`free_space`).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator

TMP_PREFIX = "."
TMP_MARK = ".tmp-"
#: The longest file name (one path component, in bytes) this code assumes a filesystem takes (POSIX NAME_MAX on
#: Linux's filesystems); :func:`check_writable` asks the filesystem itself where it can.
NAME_MAX = 255
#: The longest path (bytes) the kernel takes (Linux's PATH_MAX)
PATH_MAX = 4096
#: How much of the target's name a temporary name keeps (characters): enough to tell whose it is, short enough to fit
_TMP_KEEP = 40


def temp_name(path: str | os.PathLike) -> Path:
    """A new temporary path beside ``path``: ``.<the first 40 characters of its name>.tmp-<pid>-<random>``. Never
    longer than 40 * 4 + 25 bytes, so it fits in any folder where ``path`` itself fits (a name of 255 bytes too)."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{path.name[:_TMP_KEEP]}{TMP_MARK}{os.getpid()}-{secrets.token_hex(3)}")


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
    tmp = temp_name(path)
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


def _name_max(folder: Path) -> int:
    """The longest file name ``folder``'s filesystem takes (bytes): pathconf's NAME_MAX, at most :data:`NAME_MAX`."""
    try:
        return min(NAME_MAX, os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def _nearest_existing(folder: Path) -> Path:
    while not (folder.exists() or folder.is_symlink()) and folder != folder.parent:
        folder = folder.parent
    return folder


def check_writable(files: Iterable[str | os.PathLike] = (), option: str = "--out",
                   folders: Iterable[str | os.PathLike] = ()) -> None:
    """That every one of ``files`` (and ``folders``, which a command makes or replaces whole) can be written where
    it is asked, before any work: a one-line :class:`~.errors.UserError` naming ``option``, the path and the way out
    otherwise; nothing is left behind. Checked: each name's length (at most the filesystem's NAME_MAX bytes, the
    whole path PATH_MAX), no folder where a file should be (nor a device or other non-file), the nearest existing
    folder above it a folder (not a file, as in ``somefile/x.json``), and that a file can be made there: a
    temporary file (:func:`temp_name`, the name :func:`atomic_path` uses) is created and removed, which catches
    read-only filesystems, folders of another user and ``/proc`` alike."""
    from .errors import UserError

    probed: dict[Path, str | None] = {}
    entries = [(Path(f), False) for f in files] + [(Path(f), True) for f in folders]
    for path, is_folder in entries:
        shown = str(path)
        absolute = Path(os.path.abspath(path))
        if len(os.fsencode(str(absolute))) > PATH_MAX:
            raise UserError(f"{option} {shown[:60]}...: the path is {len(os.fsencode(str(absolute)))} bytes, longer "
                            f"than the {PATH_MAX} a path may have: give a shorter path")
        _check_names(absolute, NAME_MAX, option, shown)  # before any stat: a name too long is an error there
        where = _nearest_existing(absolute.parent)
        _check_names(absolute, _name_max(where if where.is_dir() else where.parent), option, shown)
        there = absolute.exists() or absolute.is_symlink()
        if is_folder and there and not absolute.is_dir():
            raise UserError(f"{option} {shown} is a file: give a folder (a new one, or one this command made)")
        if not is_folder and absolute.is_dir():
            raise UserError(f"{option} {shown} is a folder: give the path of a file")
        if not is_folder and there and not (absolute.is_file() or absolute.is_symlink()):
            raise UserError(f"{option} {shown} is not a regular file (a device, a pipe, a socket): give the path "
                            "of a file")
        if not where.is_dir():
            raise UserError(f"{option} {shown}: {where} is a file, not a folder: give a path in a folder")
        if where not in probed:
            probed[where] = _probe(where)
        if probed[where] is not None:
            raise UserError(f"{option} {shown}: cannot write in {where} ({probed[where]}): give a path in a folder "
                            "you can write")


def _check_names(path: Path, limit: int, option: str, shown: str) -> None:
    from .errors import UserError

    for part in path.parts[1:]:
        if len(os.fsencode(part)) > limit:
            raise UserError(f"{option} {shown[:60]}...: the name {part[:40]}... is {len(os.fsencode(part))} bytes, "
                            f"longer than the {limit} a file name may have here: give a shorter name")


def _probe(folder: Path) -> str | None:
    """None when a file can be made in ``folder`` (one is made and removed), else why not (the system's words)."""
    tmp = temp_name(folder / "probe")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        return e.strerror or e.__class__.__name__
    with contextlib.suppress(OSError):
        tmp.unlink()
    return None
