"""The package's layers: imports point one way, no module imports itself round a cycle, a model is built in
the model layer only, and the command line stays light."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "lightning_tfm"
# One package a layer, as the README's diagram: base <- model <- training <- bench <- findings <- sweep <- report <-
# cli.
LAYERS = {"base": 0, "model": 1, "training": 2, "bench": 3, "findings": 4, "sweep": 5, "report": 6, "cli": 7,
          "__main__": 7}


def _layer(module: str) -> int:
    """The layer of a dotted module name (``pkg.training.config.config``): its package's top-level package's; a
    sub-package belongs to the layer it sits in. The package itself is the command line's."""
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else LAYERS["cli"]


def _module(path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _import_nodes(path, root: Path = ROOT):
    """(node, the absolute module it imports from) of every import statement in the file, inside functions too."""
    module = _module(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            yield node, ".".join(base + ([node.module] if node.module else []))
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name


def _imports(path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, inside functions too."""
    out = []
    for node, target in _import_nodes(path, root):
        if isinstance(node, ast.ImportFrom):
            names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            out += [(node.lineno, n) for n in names]
        else:
            out.append((node.lineno, target))
    return out


def _upward(package: Path) -> list[str]:
    """Every import of a module from a layer above its own (inside functions too), as ``path:line imports X``."""
    root, upward = package.parent, []
    for path in sorted(package.rglob("*.py")):
        module = _module(path, root)
        for line, target in _imports(path, root):
            if target.startswith(package.name + ".") and _layer(target) > _layer(module):
                upward.append(f"{path.relative_to(root)}:{line} imports {target}")
    return upward


def test_imports_point_one_way():
    """A module never imports from a layer above it (not even inside a function): the paper's model knows
    nothing of training, training nothing of the benchmarks, the benchmarks nothing of findings, findings
    nothing of sweeps, sweeps nothing of reports. A module of a sub-package (``training/config/``) is of its
    layer (``training``)."""
    upward = _upward(PACKAGE)
    assert not upward, upward


def test_every_module_belongs_to_a_layer_and_none_is_over_500_lines():
    """No module sits outside the layers (the package root holds only ``__main__``), and none grows
    past 500 lines."""
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    assert not loose, f"modules at the package root, outside every layer: {loose}"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == \
        {k for k in LAYERS if k != "__main__"}
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


# The report's rooms, bottom to top (report/__init__.py's map): a room imports only from the rooms below it; views and
# table2 share a rank (neither imports the other); report/'s own modules (commands, backtest) and its __init__ stand
# above every room.
REPORT_ROOMS = {"core": 0, "inputs": 1, "table3": 2, "views": 3, "table2": 3, "publish": 4}
REPORT_TOP = len(REPORT_ROOMS)


def _report_room(module: str) -> tuple[str, int]:
    """(room, rank) of a dotted module of the report (``pkg.report.table3.table``: ``table3``); a module at
    report/'s top, or the package itself, is of the top."""
    parts = module.split(".")
    if len(parts) > 2 and parts[2] in REPORT_ROOMS:
        return parts[2], REPORT_ROOMS[parts[2]]
    return "", REPORT_TOP


def _across_rooms(package: Path) -> list[str]:
    """Every import of one report room's module from another room not below it (inside functions too), as
    ``path:line imports X``."""
    root, found = package.parent, []
    prefix = f"{package.name}.report"
    for path in sorted((package / "report").rglob("*.py")):
        room, rank = _report_room(_module(path, root))
        for line, target in _imports(path, root):
            if target == prefix or target.startswith(prefix + "."):
                other, other_rank = _report_room(target)
                if other != room and other_rank >= rank:
                    found.append(f"{path.relative_to(root)}:{line} imports {target}")
    return found


def test_the_reports_rooms_import_one_way():
    """Inside the report layer, a room imports only from the rooms below it (core <- inputs <- table3 <- views,
    table2 <- publish <- commands), not even inside a function: what reads a sweep's runs knows nothing of the
    tables, Table 3 nothing of how it is shown or published, Table 2 and the views nothing of each other."""
    assert set(REPORT_ROOMS) == {p.parent.name for p in (PACKAGE / "report").glob("*/__init__.py")}
    across = _across_rooms(PACKAGE)
    assert not across, across


def _rooms(package: Path) -> list[str]:
    """What is wrong with the package's folders: a folder of modules that is no package (no ``__init__.py``: a
    namespace package, which the layer checks would still walk but which says nothing of what it holds), a package
    whose ``__init__`` has no docstring saying what lives there, a sub-package of a layer with fewer than three
    modules (a concern gets its own folder at three)."""
    root, found = package.parent, []
    for folder in sorted({p.parent for p in package.rglob("*.py")}):
        init, where = folder / "__init__.py", folder.relative_to(root)
        if not init.exists():
            found.append(f"{where}/: modules but no __init__.py")
        elif not ast.get_docstring(ast.parse(init.read_text())):
            found.append(f"{where}/__init__.py: no docstring saying what lives there")
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"] + \
            [d for d in folder.iterdir() if (d / "__init__.py").exists()]
        if len(where.parts) > 2 and len(modules) < 3:
            found.append(f"{where}/: {len(modules)} module(s); a sub-package holds three or more")
    return found


def test_every_package_says_what_lives_in_it():
    """Every package and sub-package has an ``__init__.py`` whose docstring says what lives there (the code map
    of the folder), and a layer's sub-package gathers a concern of three or more modules."""
    problems = _rooms(PACKAGE)
    assert not problems, problems


def _graph(package: Path) -> dict[str, dict[str, str]]:
    """{module: {module it imports: where (path:line)}} over the package's modules, imports inside functions
    too. A name imported from a package is an import of its ``__init__``; ``from . import x`` of the submodule
    ``x``. A package's ``__init__`` importing its own submodules is no cycle: Python imports a package before its
    submodules anyway, so that implicit step is not an edge; a submodule importing from its own package's
    ``__init__`` (which imports it) is one."""
    root = package.parent
    paths = {_module(p, root): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {m: {} for m in paths}
    for module, path in paths.items():
        for node, target in _import_nodes(path, root):
            names = [f"{target}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for name in [n for n in names if n in paths] or [target]:
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].setdefault(name, f"{path.relative_to(root)}:{node.lineno}")
    return graph


def _cycles(package: Path) -> list[str]:
    """Import cycles among the package's modules (a depth-first search; one cycle per edge that closes one),
    each as its modules in order, with the line of each import."""
    graph, state, stack, found = _graph(package), {}, [], []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target, where in graph[module].items():
            if state.get(target) == "open":
                ring = stack[stack.index(target):] + [target]
                found.append(" -> ".join(ring) + f" ({', '.join(graph[a][b] for a, b in zip(ring, ring[1:]))})")
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module)
    return found


def test_no_import_cycle_between_modules():
    """No module imports another that imports it back, directly or round a longer ring, not even inside a
    function: a cycle inside a layer makes two modules one (neither can change or be read alone) and
    works only while the function-level import stays where it is."""
    cycles = _cycles(PACKAGE)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _constructor_calls(package: Path, classes: set[str]) -> list[str]:
    """Every call ``C(...)`` or ``C.from_config(...)`` of a class in ``classes`` (also through a module,
    ``transformer.C(...)``, or an alias, ``import C as D``) in the package's modules outside ``model/``."""
    root, found = package.parent, []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(package / "model"):
            continue
        tree = ast.parse(path.read_text())
        names = set(classes) | {a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                                for a in node.names if a.name in classes and a.asname}

        def named(expr) -> bool:
            return (isinstance(expr, ast.Name) and expr.id in names) or (isinstance(expr, ast.Attribute)
                                                                          and expr.attr in names)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (named(node.func) or isinstance(node.func, ast.Attribute)
                                               and node.func.attr == "from_config" and named(node.func.value)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_models_are_built_in_the_model_layer_only():
    """An architecture's constructor is called in ``model/`` only (``build_model`` of the registry): every other
    caller builds through the registry, so that an architecture is added in one place."""
    import lightning_tfm.model  # noqa: F401  (registers the package's architectures)
    from lightning_tfm.model.registry import ARCHITECTURES

    classes = {a.cls.__name__ for a in ARCHITECTURES.values()}
    assert "Transformer" in classes
    calls = _constructor_calls(PACKAGE, classes)
    assert not calls, f"architectures built outside lightning_tfm/model/ (use build_model): {calls}"


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    return tmp_path / "pkg"


def test_the_checks_see_planted_violations(tmp_path):
    """The two checks above find what they are for: a cycle closed by an import inside a function, and a
    constructor called outside the model layer (by name, through its module, and as ``from_config``)."""
    package = _plant(tmp_path, {
        "__init__.py": "from .sub import a\n",  # a package importing its own submodule: no cycle
        "sub/__init__.py": "",
        "sub/a.py": "from . import b\n",
        "sub/b.py": "def f():\n    from .c import g\n",
        "sub/c.py": "from ..sub.a import x\n",
        "model/m.py": "class Net: ...\nnet = Net()\n",
        "training/t.py": "from ..model import m\nfrom ..model.m import Net as N\n"
                         "def f(cfg):\n    return m.Net(), N.from_config(cfg), N.count(cfg)\n"})
    (cycle,) = _cycles(package)
    assert cycle == "pkg.sub.a -> pkg.sub.b -> pkg.sub.c -> pkg.sub.a (pkg/sub/a.py:1, pkg/sub/b.py:2, pkg/sub/c.py:1)"
    calls = _constructor_calls(package, {"Net"})
    assert [c.split(": ")[1] for c in calls] == ["m.Net(...)", "N.from_config(...)"]
    (package / "sub" / "b.py").write_text("def f():\n    pass\n")
    assert not _cycles(package)


def test_the_layer_and_room_checks_see_planted_violations(tmp_path):
    """An upward import from inside a sub-package is found (the sub-package is of its layer) while a downward one
    into a sub-package is not; a folder of modules without ``__init__.py``, an ``__init__`` without a docstring
    and a sub-package of two modules are found."""
    package = _plant(tmp_path, {
        "__init__.py": '"""The package."""\n',
        "training/__init__.py": '"""One run."""\n',
        "training/config/__init__.py": "",
        "training/config/a.py": "def f():\n    from ...sweep import s\n",
        "training/config/b.py": "",
        "sweep/__init__.py": '"""Sweeps."""\n',
        "sweep/s.py": "from ..training.config.a import f\nfrom ..training.config import b\n",
        "sweep/loose/x.py": ""})
    assert _layer("pkg.training.config.a") == LAYERS["training"]
    assert _upward(package) == ["pkg/training/config/a.py:2 imports pkg.sweep"]
    assert _rooms(package) == ["pkg/sweep/loose/: modules but no __init__.py",
                               "pkg/sweep/loose/: 1 module(s); a sub-package holds three or more",
                               "pkg/training/config/__init__.py: no docstring saying what lives there",
                               "pkg/training/config/: 2 module(s); a sub-package holds three or more"]


def test_help_and_argument_errors_import_neither_torch_nor_optuna():
    """``ltfm --help`` (and every argument error) stays fast: the commands' declarations import only the
    standard library; a handler imports its modules when it runs."""
    code = ("import sys; from lightning_tfm.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert main(['sweep', '--n-trials', 'x']) == 2 and main(['train']) == 2 and main(['nope']) == 2\n"
            "heavy = sorted(m for m in ('torch', 'optuna', 'pytorch_lightning', 'numpy') if m in sys.modules)\n"
            "print('heavy', heavy, file=sys.stderr)\nassert not heavy, heavy")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage: ltfm" in p.stdout
    assert "ltfm: error: argument --n-trials: invalid int value: 'x' (see ltfm sweep --help)" in p.stderr


def test_the_room_order_check_sees_planted_violations(tmp_path):
    """An import up the report's rooms (inside a function too) and one between the two rooms of the same rank are
    found; an import down the rooms, within a room and from report/'s top are not."""
    package = _plant(tmp_path, {
        "report/__init__.py": "", "report/commands.py": "from .publish import p\n",
        "report/core/a.py": "def f():\n    from ..inputs import b\n",
        "report/inputs/b.py": "from ..core import a\nfrom . import c\n", "report/inputs/c.py": "",
        "report/views/v.py": "from ..table2.t import x\nfrom ..table3 import y\n",
        "report/table2/t.py": "def g():\n    from ..views import v\n",
        "report/publish/p.py": "from ..core import a\nfrom .. import commands\n"})
    assert _across_rooms(package) == ["pkg/report/core/a.py:2 imports pkg.report.inputs",
                                      "pkg/report/publish/p.py:2 imports pkg.report.commands",
                                      "pkg/report/table2/t.py:2 imports pkg.report.views",
                                      "pkg/report/views/v.py:1 imports pkg.report.table2.t"]


def _notebook_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from lightning_tfm... import name`` in a notebook's code cells."""
    import json

    found = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lightning_tfm":
                found += [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "lightning_tfm"]
    return found


def test_the_report_notebooks_import_what_the_package_has():
    """Every name a packaged report notebook imports from the package exists there (a module moved or renamed
    leaves no notebook behind: the notebooks are not Python files, and an import that fails shows only when a
    report runs)."""
    import importlib

    notebooks = sorted((PACKAGE / "resources" / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 4
    missing = []
    for path in notebooks:
        imports = _notebook_imports(path)
        assert imports, f"{path.name} imports nothing of the package"
        for module, name in imports:
            try:
                found = importlib.import_module(module)
            except ImportError as e:
                missing.append(f"{path.name}: {module} ({e})")
                continue
            if name and not hasattr(found, name) and importlib.util.find_spec(f"{module}.{name}") is None:
                missing.append(f"{path.name}: {module}.{name}")
    assert not missing, missing


def test_the_notebook_import_check_sees_a_moved_module(tmp_path):
    """The check above reads a notebook's imports, a name inside a function's cell too."""
    nb = tmp_path / "n.ipynb"
    nb.write_text('{"cells": [{"cell_type": "code", "source": ["%matplotlib inline\\n", "def f():\\n", '
                  '"    from lightning_tfm.training.redact import reveal\\n"]}, {"cell_type": "markdown", "source": '
                  '["from lightning_tfm.x import y"]}]}')
    assert _notebook_imports(nb) == [("lightning_tfm.training.redact", "reveal")]


def test_the_readmes_drawing_is_the_layers_and_its_map_names_every_package():
    """The README's drawing of the imports lists the layers in the order the checks above enforce, and its code map
    names every package and sub-package (a package added or moved shows there)."""
    readme = (ROOT / "README.md").read_text()
    (drawing,) = [line for line in readme.splitlines() if line.startswith("base/ <-")]
    assert [part.strip().rstrip("/") for part in drawing.split("<-")] == \
        [k for k, _ in sorted(LAYERS.items(), key=lambda kv: kv[1]) if k != "__main__"]
    code_map = readme[readme.index("lightning_tfm/\n"):]
    code_map = code_map[:code_map.index("```")]
    named = {line.split()[0].rstrip("/") for line in code_map.splitlines()[1:] if line[2:3].strip() and line.strip()}
    named |= {line.split()[0].rstrip("/") for line in code_map.splitlines() if line.startswith("    ") and
              line[4:5].strip()}
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert packages <= named, f"packages the README's code map leaves out: {sorted(packages - named)}"
