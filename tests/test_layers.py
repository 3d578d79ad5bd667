"""The package's layers: imports point one way, and the command line stays light."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "lightning_tfm"
# One package a layer, as the README's diagram: model <- training <- sweep <- report <- the command line.
LAYERS = {"model": 0, "training": 1, "sweep": 2, "report": 3, "cli": 4, "__main__": 4}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else 4


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


def test_every_module_belongs_to_a_layer_and_none_is_over_500_lines():
    """No module sits outside the layers (the package root holds only the command line), and none grows
    past 500 lines."""
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "cli")]
    assert not loose, f"modules at the package root, outside every layer: {loose}"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == \
        {k for k in LAYERS if k not in ("cli", "__main__")}
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_help_imports_neither_torch_nor_optuna():
    """``ltfm --help`` (and every argument error) stays fast: subcommands import their modules when they run."""
    code = ("import sys; from lightning_tfm.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'optuna', 'pytorch_lightning', 'lightning_tfm.sweep')"
            " if m in sys.modules)\nprint('heavy', heavy, file=sys.stderr)\nassert not heavy, heavy")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage: ltfm" in p.stdout
