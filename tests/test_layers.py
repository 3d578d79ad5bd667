"""The package's layers: imports point one way, and the command line stays light."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "lightning_tfm"
# model <- training (everything else at the top level) <- sweep <- report <- the command line
LAYERS = {"model": 0, "sweep": 2, "report": 3, "cli": 4, "__main__": 4}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], 1) if len(parts) > 1 else 4


def _module(path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, inside functions too."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def test_imports_point_one_way():
    """A module never imports from a layer above it (not even inside a function): the paper's model knows
    nothing of training, training nothing of sweeps, sweeps nothing of reports."""
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        for line, target in _imports(path):
            if target.startswith("lightning_tfm.") and _layer(target) > _layer(module):
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, upward


def test_help_imports_neither_torch_nor_optuna():
    """``ltfm --help`` (and every argument error) stays fast: subcommands import their modules when they run."""
    code = ("import sys; from lightning_tfm.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'optuna', 'pytorch_lightning', 'lightning_tfm.sweep')"
            " if m in sys.modules)\nprint('heavy', heavy, file=sys.stderr)\nassert not heavy, heavy")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage: ltfm" in p.stdout
