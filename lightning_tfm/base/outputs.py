"""What a command may write over: never a file it reads, nor a file that belongs to something else (a run's
checkpoints, its config and summary, a report's export), whatever the path's spelling.

:func:`check_outputs` is the one check every command that writes runs on each path it will write, before any work:
each path is resolved (made absolute, ``..`` folded, every link followed: :func:`resolved`) and compared with the
command's inputs, resolved alike, and then asked of ``owners``: functions, each of one layer's knowledge (a run
folder's files: :func:`lightning_tfm.training.runs.run_folder.owned_file`; an export:
:func:`lightning_tfm.report.inputs.export.owned_export`), that say whose a path is, or None. A file to be written is
refused when it is one of the inputs or an owned file; a folder a command replaces whole (a report's) when it is an
input, holds one, or is owned. Each refusal is one :class:`~.errors.UserError` naming the option, the path as
given, what it is and the way out (exit 2, nothing written). The checks of :func:`~.atomic.check_writable` (a name the
filesystem takes, a folder it may write in) follow.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

from .atomic import check_writable
from .errors import UserError

#: Whose a (resolved) path is: a phrase that completes "--out PATH is ..." (``run R's resume point
#: (checkpoints/last.ckpt)``), or None when it is no one's
Owner = Callable[[Path], "str | None"]


def resolved(path: str | os.PathLike) -> Path:
    """``path`` absolute, ``..`` folded and every link followed (the file a write there would change)."""
    return Path(os.path.abspath(path)).resolve()


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(inner: Path, folder: Path) -> bool:
    return inner != folder and folder in inner.parents


def check_outputs(files: Iterable[str | os.PathLike] = (), option: str = "--out", *,
                  folders: Iterable[str | os.PathLike] = (),
                  reads: Iterable[tuple[str, str | os.PathLike]] = (), owners: Iterable[Owner] = (),
                  replaces: Iterable[str | os.PathLike] = ()) -> None:
    """That none of ``files`` (written whole) nor ``folders`` (made or replaced whole) is one of ``reads`` (pairs
    of what an input is, e.g. ``--src``, and its path) or a path an owner of ``owners`` claims, whatever its spelling
    (relative, ``..``, a link; an input not there is left out); then :func:`~.atomic.check_writable`. ``replaces``:
    paths the command itself writes by design (``ltfm average``'s ``checkpoints/average.ckpt``), which an owner's
    claim does not forbid. A one-line UserError naming ``option``, the path as given and the way out otherwise;
    nothing is written."""
    files, folders = [Path(f) for f in files], [Path(f) for f in folders]
    inputs = [(what, Path(p), resolved(p)) for what, p in reads  # an input not there is no one's to lose
              if p is not None and str(p) != "" and os.path.exists(p)]
    owners, allowed = list(owners), {resolved(p) for p in replaces}
    for path, is_folder in [(f, False) for f in files] + [(f, True) for f in folders]:
        shown = str(path)
        if Path(os.path.abspath(path)).name == "":  # "/": no name, no folder to put the work beside
            raise UserError(f"{option} {shown} is the root folder: give a {'folder' if is_folder else 'file'} of "
                            f"its own (e.g. {'reports/build/NAME' if is_folder else 'out/NAME'})")
        target = resolved(path)
        for what, given, source in inputs:
            if _same(target, source):
                raise UserError(f"{option} {shown} is {what} {given}, which this command reads: writing there "
                                "would replace it; give another path")
            if is_folder and _inside(source, target):
                raise UserError(f"{option} {shown} holds {what} {given}, which this command reads, and the folder "
                                "is replaced whole: give another folder")
        if target in allowed:
            continue
        for owner in owners:
            whose = owner(target)
            if whose:
                raise UserError(f"{option} {shown} is {whose}: writing there would replace it; give another path")
    check_writable(files, option, folders)
