"""Cells of the report: how a number, a knob, a markdown cell or an error line is written; and the
environment helper the report's writers share."""
from __future__ import annotations

import contextlib
import os
import re
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
    return str(text).replace("|", "\\|").replace("\n", " ")


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
