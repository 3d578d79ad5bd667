"""The docstrings and comments of lightning_tfm/ name what exists: every dotted name ``lightning_tfm.<module>...``
they write out (``:mod:`lightning_tfm.report.calibration```, ``:func:`~lightning_tfm.findings.verdict.sign```) is a
module or an attribute of one (a dataclass field counts) today, not a module that moved or was renamed."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

from conftest import ROOT

NAME = re.compile(r"(?<![\w.])lightning_tfm((?:\.\w+)+)")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a chain of attributes (or a dataclass's field) of the longest module
    prefix of it that imports."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if attr in getattr(obj, "__dataclass_fields__", {}):
                return True
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def missing_names(files: list[Path], root: Path) -> list[str]:
    """``file: name`` (the file's path under ``root``) for each dotted lightning_tfm name written in ``files`` that
    does not resolve."""
    out = []
    for f in files:
        for m in NAME.finditer(f.read_text(encoding="utf-8")):
            if not resolves("lightning_tfm" + m.group(1)):
                out.append(f"{f.relative_to(root).as_posix()}: lightning_tfm{m.group(1)}")
    return sorted(set(out))


def test_every_dotted_name_in_the_package_resolves():
    files = sorted((ROOT / "lightning_tfm").rglob("*.py"))
    assert len(files) > 50
    assert missing_names(files, ROOT) == []


def test_a_stale_name_is_found(tmp_path):
    f = tmp_path / "a" / "b" / "mod.py"
    f.parent.mkdir(parents=True)
    f.write_text('"""Reads :mod:`lightning_tfm.report.table3.calibration` (moved), :func:`lightning_tfm.findings.\n'
                 'verdict.sign` (wrapped: the module resolves), :func:`~lightning_tfm.findings.verdict.sign`, the\n'
                 'field ``lightning_tfm.model.ModelConfig.d_k`` and '
                 'lightning_tfm.model.registry.no_such_function."""\n',
                 encoding="utf-8")
    assert missing_names([f], tmp_path) == ["a/b/mod.py: lightning_tfm.model.registry.no_such_function",
                                  "a/b/mod.py: lightning_tfm.report.table3.calibration"]
