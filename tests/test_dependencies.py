"""Every package the code and the tests import is declared in pyproject.toml: the top-level names of the imports of
lightning_tfm/ and tests/ (an AST walk, relative imports, the standard library and our own modules left out), each
matched to its distribution through importlib.metadata, against the dependencies and the optional extras."""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

#: import name -> distribution, for the names that differ and that importlib.metadata cannot tell where the
#: distribution is not installed (an extra's: psycopg2, transformers)
DISTRIBUTION = {"yaml": "PyYAML", "PIL": "pillow", "bs4": "beautifulsoup4", "sklearn": "scikit-learn",
                "psycopg2": "psycopg2-binary", "optuna_dashboard": "optuna-dashboard", "IPython": "ipython",
                "google": "protobuf", "pytorch_lightning": "pytorch-lightning",
                "lightning_fabric": "pytorch-lightning"}  # pytorch-lightning ships lightning_fabric inside it
SOURCES = ("lightning_tfm", "tests")


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares it (``PyYAML`` = ``pyyaml``, ``psycopg2_binary`` =
    ``psycopg2-binary``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: Path) -> set[str]:
    """The distributions pyproject.toml declares: the dependencies and every optional extra (normalized)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return {normalized(re.match(r"[A-Za-z0-9._-]+", s).group()) for s in specs}


def imported(path: Path) -> set[str]:
    """The top-level names a Python file imports, relative imports left out."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def local_modules(root: Path) -> set[str]:
    """The names our own files answer to: the package, and each module or package a folder of the sources holds
    (the tests' conftest, wandb_offline, pg; the soak's check, scale)."""
    names = {"lightning_tfm"}
    for src in SOURCES:
        for p in (root / src).rglob("*"):
            if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()):
                names.add(p.stem if p.suffix == ".py" else p.name)
    return names


@functools.lru_cache(maxsize=None)
def installed() -> dict[str, list[str]]:
    """{import name: the installed distributions providing it} (importlib.metadata's, read once)."""
    return importlib.metadata.packages_distributions()


def distributions_of(name: str) -> set[str]:
    """The distributions that may provide import name ``name`` (normalized)."""
    found = set(installed().get(name, []))
    return {normalized(d) for d in found | {DISTRIBUTION.get(name, name)}}


def undeclared(files: list[Path], pyproject: Path, local: set[str]) -> dict[str, list[str]]:
    """{import name: the files importing it} for each third-party import no declared distribution provides."""
    have = declared(pyproject)
    out: dict[str, list[str]] = {}
    for f in files:
        for name in imported(f):
            if name in sys.stdlib_module_names or name in local:
                continue
            if not distributions_of(name) & have:
                out.setdefault(name, []).append(str(f))
    return out


def test_every_import_of_the_package_and_the_tests_is_declared():
    files = [p for src in SOURCES for p in sorted((ROOT / src).rglob("*.py"))]
    assert len(files) > 100
    assert undeclared(files, ROOT / "pyproject.toml", local_modules(ROOT)) == {}


def test_an_undeclared_import_is_found(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["PyYAML>=6", "numpy"]\n'
                         '[project.optional-dependencies]\ndev = ["beautifulsoup4"]\n', encoding="utf-8")
    code = tmp_path / "mod.py"
    code.write_text("import os\nimport numpy as np\nimport yaml\nfrom bs4 import BeautifulSoup\nfrom . import sibling\n"
                    "import mine\nfrom PIL import Image\nimport scipy.stats\n"
                    "def f():\n    from zz_not_a_declared_package.sub import g\n", encoding="utf-8")
    # the standard library, a relative import, a local module and the declared ones (through the extra too, and
    # under another import name) pass; pillow, scipy and an import inside a function are reported
    assert undeclared([code], pyproject, {"mine"}) == {"PIL": [str(code)], "scipy": [str(code)],
                                                       "zz_not_a_declared_package": [str(code)]}
    assert imported(code) >= {"os", "numpy", "yaml", "bs4", "mine", "PIL", "scipy", "zz_not_a_declared_package"}
    assert normalized("PyYAML") == normalized("pyyaml") and normalized("psycopg2_binary") == "psycopg2-binary"


def private_imports(files: list[Path], local: set[str]) -> list[str]:
    """``file:line: module`` for every import of another package's private module or name (``from optuna_dashboard._note
    import x``, ``import a._b``, ``from a import _c``): its maintainers may change or remove it in any release. Our own
    modules' private names are tests/test_private_names.py's business."""
    out = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
            if isinstance(node, ast.Import):
                mods = [(a.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [(node.module, f"{node.module}.{a.name}") for a in node.names]
            else:
                continue
            for module, full in mods:
                top = module.split(".")[0]
                if top in local or top in sys.stdlib_module_names:
                    continue
                if any(part.startswith("_") and not part.startswith("__") for part in full.split(".")):
                    out.append(f"{f}:{node.lineno}: {full}")
    return out


def test_no_private_name_of_another_package_is_imported():
    files = [p for src in SOURCES for p in sorted((ROOT / src).rglob("*.py"))]
    assert private_imports(files, local_modules(ROOT)) == []


def test_a_private_import_is_found(tmp_path):
    code = tmp_path / "mod.py"
    code.write_text("import os._x\nfrom optuna_dashboard import get_note\nfrom mine import _own\n"
                    "def f():\n    from optuna_dashboard._note import get_note_from_system_attrs\n"
                    "    import lightning_fabric.utilities._private\n    from numpy import _core\n", encoding="utf-8")
    assert private_imports([code], {"mine"}) == [
        f"{code}:5: optuna_dashboard._note.get_note_from_system_attrs",
        f"{code}:6: lightning_fabric.utilities._private", f"{code}:7: numpy._core"]
