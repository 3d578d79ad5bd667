"""A local corpus's files and what identifies it: its content, not its folder.

A local corpus (``data.source=local``) is a folder of line-aligned files ``{split}.{lang}`` or
``{split}.{lang}.gz`` (:func:`split_file`). :func:`fingerprint` is the identity of the files a config reads (the
train, dev and, when set, test split of both languages): a hash of each file's text (a ``.gz`` file's as
decompressed), so that the same corpus copied to another folder, or compressed, is the same corpus, and one line
changed is another. The run id hashes it in place of ``data.path`` (:mod:`.config.run_id`).

This module imports nothing of the config (the run id, which :func:`.config.config.validate` checks, uses it) nor torch.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from ...base.errors import UserError, closest

PREFIX = "sha256:"  # how a fingerprint starts: what it is a hash of is said by its name


def folder_problem(folder: str | Path) -> str | None:
    """Why ``folder`` (data.path) is no corpus folder, in one line naming it, the closest existing folder (a typo's
    fix) and the way out; None when it is a folder."""
    folder = Path(folder)
    try:
        if folder.is_dir():
            return None
        what = "is a file, not a folder" if folder.exists() else "does not exist"
    except (OSError, ValueError):
        what = "cannot be read"
    near = _nearest(folder)
    hint = f"did you mean {str(near)!r}? " if near is not None else ""
    return (f"data folder {str(folder)!r} {what}: {hint}set data.path=FOLDER (make: DATA=FOLDER), a folder of "
            "{split}.{lang}[.gz] files")


def _nearest(folder: Path) -> Path | None:
    """The existing folder ``folder`` was likely meant to be: below its nearest existing parent, the closest name
    to the first missing one, with the rest of the path when that exists (``multi30kk`` -> ``multi30k``)."""
    parts = folder.parts
    for i in range(len(parts) - 1, 0, -1):
        parent = Path(*parts[:i])
        try:
            if not parent.is_dir():
                continue
            names = [p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return None
        best = closest(parts[i], names)
        if not best:
            return None
        whole = parent.joinpath(best, *parts[i + 1:])
        return whole if whole.is_dir() else parent / best
    return None


def split_file(folder: str | Path, split: str, lang: str) -> Path:
    """The file of one side of one split: ``{split}.{lang}``, else ``{split}.{lang}.gz``; one line when neither is."""
    folder = Path(folder)
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (folder / name).is_file():
            return folder / name
    if (why := folder_problem(folder)) is not None:
        raise UserError(why)
    raise UserError(f"missing data file {folder / f'{split}.{lang}'}[.gz]: check data.path, the split names "
                    f"(data.train_split/dev_split/test_split) and the languages (data.src_lang/tgt_lang)")


# (path, device, inode, size, mtime and ctime in ns) -> the SHA-256 of the file's text: a file is read once per
# process while it is unchanged (a sweep's dry run names every row, each of the same corpus). The ctime is there
# because an edit that keeps the size and restores the mtime (``cp -p``, ``rsync -t``, ``tar x``) still sets it.
_SEEN: dict[tuple, str] = {}


def text_digest(path: Path) -> str:
    """SHA-256 of a file's text: its bytes, a ``.gz`` file's decompressed (read in 1 MiB blocks)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _SEEN:
        h = hashlib.sha256()
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _SEEN[key] = h.hexdigest()
    return _SEEN[key]


def fingerprint(data) -> str | None:
    """The content identity of the local corpus a data section (``cfg.data``) reads: ``sha256:<hex>`` over each
    used file's name (``train.en``, ``.gz`` left out) and text; None for the Hub, for a config without
    ``data.path``, and when a file is missing or unreadable (then nothing can tell its content: its folder
    stands for it, as before)."""
    if data.source != "local" or not data.path:
        return None
    splits = [data.train_split, data.dev_split, *([data.test_split] if data.test_split else [])]  # corpus.splits_of
    try:
        files = {f"{s}.{lang}": text_digest(split_file(Path(data.path).expanduser(), s, lang))
                 for s in splits for lang in (data.src_lang, data.tgt_lang)}
    except (UserError, OSError, EOFError, gzip.BadGzipFile, ValueError):
        return None
    return PREFIX + hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()

