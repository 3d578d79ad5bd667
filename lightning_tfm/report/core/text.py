"""Cells of the report: how a number, a knob, a markdown cell, a string from a sweep or an export, or an error
line is written; and the environment and lock helpers the report's writers share."""
from __future__ import annotations

import contextlib
import html
import os
import re
from pathlib import Path
from typing import Any


def fmt(x: Any, digits: int, sign: bool = False) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return str(x)


def fmt_knob(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def md_cell(text: str) -> str:
    """A table cell: its pipes escaped, on one line; a "<" that could open a tag or an autolink as an entity (the
    strings from a sweep or an export are :func:`md_text` already: this is the net below them)."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", str(text)).replace("|", "\\|").replace("\n", " ")


def md_text(value: Any) -> str:
    """A string from a sweep, a run or an export (a row's name, a status, a note, a machine, a source) as
    markdown that renders as the string itself, never as markup: HTML's special characters as entities
    (``html.escape``: no tag, no event handler), markdown's link and image brackets, code ticks and backslashes
    escaped (no ``javascript:`` link), on one line. Our own markdown around it stays markdown."""
    text = html.escape(str(value), quote=False)
    return re.sub(r"([\\`\[\]])", r"\\\1", " ".join(text.splitlines()))


def md_code(value: Any) -> str:
    """``value`` as a markdown code span (shown as it is, markup included), whatever backticks it holds: the
    fence is one tick longer than its longest run of ticks (CommonMark)."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html_text(value: Any) -> str:
    """A string shown by a renderer that reads HTML (plotly's titles, legends and hover text): as entities."""
    return html.escape(str(value), quote=False)


def first_line(text: Any, limit: int = 300) -> str:
    """The first line of an error message (ANSI colours removed, at most ``limit`` characters): a report
    names a problem in one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text or "")).strip()
    return text.splitlines()[0][:limit] if text else ""


@contextlib.contextmanager
def environment(name: str, value: str):
    """``os.environ[name] = value`` while the block runs, then as it was (unset if it was unset)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def waiting_lock(path: Path, what: str):
    """Hold the file lock ``path``; when another process holds it, one line says whose turn this is waiting for."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another `ltfm report` to finish with {what} (lock {path})", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
