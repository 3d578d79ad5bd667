"""No module of the package uses another's private names (issue #45): a name that starts with one underscore is
its module's own business. A helper another module needs is public (or moves to where it belongs). Checked on the
source, by an AST walk over lightning_tfm/**/*.py: ``from <a module of lightning_tfm> import _name`` (relative or
absolute, over several lines too) and ``module._name`` where ``module`` is a module of lightning_tfm imported as a
module (``from ..training import tracking``, ``import lightning_tfm.report.inputs.records as records``), inside
functions too. A public name imported under a private alias (``import decode_dtype as _dtype``) is fine."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "lightning_tfm"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_file(module: str) -> Path | None:
    """The file of a module of the package (a package's ``__init__.py``), None for anything else."""
    parts = module.split(".")
    if parts[0] != PACKAGE.name:
        return None
    path = PACKAGE.parent.joinpath(*parts)
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def private_uses(path: Path, source: str | None = None) -> list[str]:
    """``file:line: what`` for every private name of another module of the package that ``path`` (its text:
    ``source``, default the file's) imports or reads as a module's attribute."""
    rel = path.relative_to(ROOT)
    module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text() if source is None else source)
    bound: dict[str, str] = {}   # a name of this file -> the module of the package it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".")
                base = ".".join(up[:len(up) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if _module_file(base) is None:
                continue  # not the package's: another library's private names are its own business
            for a in node.names:
                if _private(a.name):
                    found.append(f"{rel}:{node.lineno}: from {base} import {a.name}")
                if _module_file(f"{base}.{a.name}") is not None:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _module_file(a.name) is not None:  # ``import a.b as m``: m is a.b; ``import a.b``: a is a
                    top = a.name.split(".")[0]
                    bound[a.asname or top] = a.name if a.asname else top

    def resolve(expr) -> str | None:
        """The module of the package an expression names: a bound name, or a submodule as its attribute."""
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            outer = resolve(expr.value)
            if outer is not None and _module_file(f"{outer}.{expr.attr}") is not None:
                return f"{outer}.{expr.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target = resolve(node.value)
            if target is not None and target != module:
                found.append(f"{rel}:{node.lineno}: {target}.{node.attr}")
    return sorted(dict.fromkeys(found), key=lambda hit: int(hit.split(":")[1]))


def test_no_module_uses_another_modules_private_names():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in private_uses(path)]
    assert not found, "private names of another module (make the helper public or move it):\n" + "\n".join(found)


def test_the_check_finds_each_form_and_allows_a_private_alias_of_a_public_name():
    """The walk itself, on a module of report/table3/ written here (it names report/'s modules only: other
    layers' modules move): each form it must catch, with its line."""
    source = '''
from ..inputs.records import (
    RunRecord,
    _flatten,
)
from lightning_tfm.report.table3.table import _status
from .stats import finite as _finite
from ..views import figures
from ... import report as rp
import lightning_tfm.report.inputs.records
import lightning_tfm.report.views.render as rr
from optuna_dashboard._note import get_note_from_system_attrs


def f(study):
    from ..views.render import _duration
    study._storage, _finite(1), figures.metric_series, figures.__name__, rp.table3.table.row_status
    return figures._series, rp.table3.stats._sign, lightning_tfm.report.inputs.records._num, rr._private, _duration
'''
    found = private_uses(PACKAGE / "report" / "table3" / "probe.py", source)
    assert [hit.split(": ", 1)[1] for hit in found] == [
        "from lightning_tfm.report.inputs.records import _flatten",
        "from lightning_tfm.report.table3.table import _status",
        "from lightning_tfm.report.views.render import _duration", "lightning_tfm.report.views.figures._series",
        "lightning_tfm.report.table3.stats._sign", "lightning_tfm.report.inputs.records._num",
        "lightning_tfm.report.views.render._private"]
    assert [int(hit.split(":")[1]) for hit in found] == [2, 6, 16, 18, 18, 18, 18]
    assert all(hit.startswith("lightning_tfm/report/table3/probe.py:") for hit in found)
