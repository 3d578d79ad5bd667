"""The docstrings and comments of lightning_tfm/ name what exists: every dotted name ``lightning_tfm.<module>...``
they write out (``:mod:`lightning_tfm.report.calibration```, ``:func:`~lightning_tfm.findings.verdict.sign```) is a
module or an attribute of one (a dataclass field counts) today, not a module that moved or was renamed."""
from __future__ import annotations

import functools
import importlib
import math
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


# ------------------------------------------------------------------------------------- defaults a docstring quotes
# A default quoted as ``name`` V in a paragraph that speaks of defaults: "(:data:`.settings.REPORT_DEFAULTS`: ``k`` 3,
# ``level`` 0.8, ``family`` power)", "``train.max_steps`` (default 100000)", "``SETTLE_MOST`` 10". V is a number,
# True, False or None, or (for a text key) one of the values its field allows.
QUOTED = re.compile(r"``([A-Za-z_][\w.]*)``(?: \(default |: | = |=| )(-?\d[\d_]*(?:\.\d+)?(?:e-?\d+)?|[A-Za-z][\w-]*)")
PARAGRAPH = re.compile(r"\n\s*(?:#\s*)?\n")


def _literal(text: str):
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    try:
        return float(text.replace("_", ""))
    except ValueError:
        return text


def _fields(section) -> dict[str, tuple]:
    """{field: (default, the values a text field allows, or None)} of a knob section (a dataclass)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(section)
    out = {}
    for f in dataclasses.fields(section):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        choices = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal else None
        out[f.name] = (default, choices)
    return out


@functools.cache
def known_defaults() -> tuple[dict[str, tuple], dict[str, dict[str, tuple]]]:
    """({config key "section.key": (default, choices)}, {name a paragraph may give a section by: its fields}): the
    run config's sections, the sweep file's and the findings' settings, each knob section by its class name and by
    the ``*_DEFAULTS`` dict of it."""
    import dataclasses

    from lightning_tfm.base.knobs import Section
    from lightning_tfm.findings import settings
    from lightning_tfm.sweep import schema
    from lightning_tfm.training.config import config

    keys = {f"{sec}.{k}": value for sec in config.SCHEMA
            for k, value in _fields(type(getattr(config.Config(), sec))).items()}
    sections: dict[str, dict[str, tuple]] = {}
    modules = [settings, schema, config] + [importlib.import_module(f"lightning_tfm.{m}") for m in
                                            ("training.config.sections", "model.config", "model.rnn")]
    for module in modules:
        for name, obj in vars(module).items():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and (issubclass(obj, Section) or
                                                                            name.endswith("Spec")):
                sections[name] = _fields(obj)
        for name, obj in vars(module).items():
            if name.endswith("_DEFAULTS") and isinstance(obj, dict):
                sections.update({name: f for f in sections.values() if {k: d for k, (d, _) in f.items()} == obj})
    for sec, spec in [(s, sections.get(f"{s.title()}Spec")) for s in ("report", "budget", "heartbeat")]:
        keys.update({f"{sec}.{k}": value for k, value in (spec or {}).items()})
    return keys, sections


def stale_defaults(text: str, module: str) -> list[str]:
    """``name (V quoted, D in the code)`` for each default ``text`` (the source of ``module``) quotes that is not the
    code's: a config or sweep-file key, a field of a knob section the paragraph names (its class or ``*_DEFAULTS``),
    a constant of the module itself."""
    keys, sections = known_defaults()
    out = []
    for para in PARAGRAPH.split(text):
        if "default" not in para.lower():
            continue
        named = [fields for name, fields in sections.items() if re.search(rf"\b{name}\b", para)]
        for m in QUOTED.finditer(para):
            name, quoted = m.group(1), _literal(m.group(2))
            found = keys.get(name) or next((f[name] for f in named if name in f), None)
            if found is None and name.isupper() and hasattr(mod := importlib.import_module(module), name):
                found = (getattr(mod, name), None)
            if found is None:
                continue
            default, choices = found
            if isinstance(quoted, str) and not (choices and quoted in choices) and quoted not in ("True", "None"):
                continue  # a word that is no value of the key ("``k`` x the budget")
            same = (default == quoted) if not isinstance(quoted, float) or isinstance(default, bool) else \
                isinstance(default, (int, float)) and math.isclose(default, quoted)
            if not same:
                out.append(f"{name} ({m.group(2)} quoted, {default!r} in the code)")
    return out


def test_every_default_a_docstring_quotes_is_the_codes():
    """The run config's, the sweep file's and the findings' keys, and a module's constants, as the package's
    docstrings and comments quote their defaults: the values the code has (a default changed in the code and left in
    a docstring fails here)."""
    checked, stale = 0, []
    for f in sorted((ROOT / "lightning_tfm").rglob("*.py")):
        if f.name == "__main__.py":
            continue
        module = ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        text = f.read_text(encoding="utf-8")
        checked += sum(1 for para in PARAGRAPH.split(text) if "default" in para.lower() for _ in QUOTED.finditer(para))
        stale += [f"{f.relative_to(ROOT).as_posix()}: {s}" for s in stale_defaults(text, module)]
    assert checked > 5
    assert stale == []


def test_a_stale_quoted_default_is_found():
    """A planted docstring quoting the report's level as 0.9 (it is 0.8), train.max_steps's default as 5 and a
    constant of its module wrongly is caught; the right values and a word that is no value are not."""
    text = ('"""The settings (:data:`.settings.REPORT_DEFAULTS`: ``k`` 3, ``level`` 0.9, ``family`` power, ``k`` x\n'
            'the budget); ``train.max_steps`` (default 5), ``train.warmup`` (default 4000), ``SETTLE_MOST`` 12, by\n'
            'default."""\n')
    assert stale_defaults(text, "lightning_tfm.findings.curves") == [
        "level (0.9 quoted, 0.8 in the code)", "train.max_steps (5 quoted, 100000 in the code)",
        "SETTLE_MOST (12 quoted, 10.0 in the code)"]


def test_every_default_a_commands_help_quotes_is_its_arguments():
    """``ltfm COMMAND --help``: an option whose help says "(default V)" or "default V" and whose argparse default is
    set has that default (``ltfm average --last``: 5; ``--checkpoint``: last)."""
    from lightning_tfm.cli import build_parser

    parser, checked, stale = build_parser(), 0, []
    for name, sub in parser.commands.items():
        for action in sub._actions:
            m = re.search(r"\(?default:? ([^\s,;:)]+)", action.help or "")
            if m is None or action.default in (None, False) or not action.option_strings:
                continue
            checked += 1
            if str(action.default) != m.group(1):
                stale.append(f"ltfm {name} {action.option_strings[-1]}: help {m.group(0)!r}, "
                             f"default {action.default!r}")
    assert checked >= 3
    assert stale == []


# ------------------------------------------------------------------------------ relative references, as Sphinx reads
ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc):`~?(\.+[\w.]+)`")


@functools.cache
def package_names() -> frozenset[str]:
    """Every dotted name of the package: its modules, their attributes, a class's attributes and dataclass fields."""
    out = set()
    for f in sorted((ROOT / "lightning_tfm").rglob("*.py")):
        if f.name == "__main__.py":
            continue
        module = ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out.add(module)
        for name, obj in vars(importlib.import_module(module)).items():
            out.add(f"{module}.{name}")
            if isinstance(obj, type):
                out |= {f"{module}.{name}.{a}" for a in [*dir(obj), *getattr(obj, "__dataclass_fields__", {})]}
    return frozenset(out)


def unresolved_references(text: str) -> list[str]:
    """The relative references (``:func:`~.checkpoints.load_checkpoint```) of ``text`` that name nothing of the
    package: Sphinx resolves ``.a.b`` to a name ending in ``.a.b``, searched from the module outwards; none ends so
    when the name moved or was renamed."""
    names = package_names()
    return sorted({m.group(1) for m in ROLE.finditer(text)
                   if not any(n.endswith("." + m.group(1).lstrip(".")) for n in names)})


def test_every_relative_reference_in_the_package_names_something():
    files = sorted((ROOT / "lightning_tfm").rglob("*.py"))
    found = {f.relative_to(ROOT).as_posix(): refs for f in files
             if (refs := unresolved_references(f.read_text(encoding="utf-8")))}
    assert found == {}


def test_a_moved_relative_reference_is_found():
    text = ('"""Reads :data:`~.checkpoints.RNG` (moved to checkpoint_io), :data:`~.checkpoint_io.RNG`, '
            ':func:`.resume.pick` and :mod:`..runs.no_such_module`."""')
    assert unresolved_references(text) == ["..runs.no_such_module", ".checkpoints.RNG"]
