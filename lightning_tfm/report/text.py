"""Cells of the report: how a number, a knob, a markdown cell or an error line is written."""
from __future__ import annotations

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
    return str(text).replace("|", "\\|").replace("\n", " ")


def first_line(text: Any, limit: int = 300) -> str:
    """The first line of an error message (ANSI colours removed, at most ``limit`` characters): a report
    names a problem in one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text or "")).strip()
    return text.splitlines()[0][:limit] if text else ""
