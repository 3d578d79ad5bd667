"""A package's names imported on first use (PEP 562): the one loader of :mod:`lightning_tfm.report` and
:mod:`lightning_tfm.sweep`, so that importing the package imports none of its modules (nor torch, nor Optuna) until a
name that needs them is asked for."""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping


def lazy_names(package: str, namespace: dict,
               homes: Mapping[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], object], Callable[[], list]]:
    """(``__all__``, ``__getattr__``, ``__dir__``) of the package named ``package`` (its ``__name__``; ``namespace``:
    its ``globals()``) whose names live in the modules of ``homes`` ({module, relative to the package: its names}):
    a name is imported from its module on first use, a submodule not imported yet by its name (``sweep.plan``), and
    each is kept in the package's namespace; any other name is an AttributeError."""
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str):
        if name in home:
            value = getattr(importlib.import_module(f".{home[name]}", package), name)
        elif importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f".{name}", package)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home})

    return sorted(home), __getattr__, __dir__
