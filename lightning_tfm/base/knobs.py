"""What every config section is made of (fairseq's dataclasses): :class:`Section`, and :func:`knob`, a field with
everything said about it beside it.

A knob is one field: its type, its default and its help, and in its metadata its check (a :class:`Range` for a
number: what config validation refuses, one line naming the key and the range) and, for a knob of the paper's
Table 3, its :class:`Table3` column (its title, its CSV and LaTeX names: the report's configuration table, the
paper's rows in ``resources/paper_table3.csv`` and the sweep dashboard's Optuna params read it). Each section checks
its own values (:meth:`Section.problem`: the fields' checks, then the rules across its keys).

The model's section (``model/config.py``), the training config's (``training/config/``) and the sweep file's
(``sweep/schema.py``) are declared with these.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal

# A type spec (generated from a field's annotation): int, float, str, bool, list, ("choice", a, b, ...)
# or ("optional", spec).
OPT = "optional"

#: A field's own check (metadata "check"): (dotted key, value) -> what is wrong, in one line, or None.
Check = Callable[[str, Any], "str | None"]


@dataclass(frozen=True)
class Range:
    """The values a number key takes: ``lo`` to ``hi``, an open end excluding its bound (``model.dropout``: [0, 1);
    ``train.lr``: positive). A null (an optional key unset) passes. Called as a field's check."""
    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __call__(self, key: str, v: Any) -> str | None:
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if (self.lo < v or v == self.lo and not self.lo_open) and (v < self.hi or v == self.hi and not self.hi_open):
            return None
        return f"{key}={v} must be {self.words(v)}"

    @property
    def bounds(self) -> tuple[float, float]:
        return self.lo, self.hi

    def words(self, v: Any = 0.0) -> str:
        """The allowed values in words: ``a positive integer, at most 1000``, ``in [0, 1)``."""
        if self.hi_open:
            return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi})"
        low = ("positive" if self.lo == 0 else f"more than {self.lo}") if self.lo_open else \
            "a positive integer" if self.lo == 1 and isinstance(v, int) else "0 or more" if self.lo == 0 else \
            f"{self.lo} or more"
        return f"{low}, at most {self.hi}"


UNIT = Range(0, 1, hi_open=True)  # a probability or a decay rate: dropout, label smoothing, Adam's betas


@dataclass(frozen=True)
class Table3:
    """A knob's column among the Table 3 knobs (metadata "table3"): the report's configuration table and CSV, the
    paper's rows (``resources/paper_table3.csv``), table3.tex and the sweep dashboard's Optuna params."""
    title: str           # the column's title: the paper's symbol (N, h, P_drop) or a word
    place: int           # its column among the knobs, ascending (the training budget last)
    csv: str = ""        # its column of table3.csv and of the paper's CSV (default: the field's name)
    tex: str = ""        # its header in table3.tex, for a column of the paper's own Table 3 ("": none)
    label: str = ""      # how a row's name in the lead figure shows a value ("{} positions"; default "title value")


def knob(default: Any, help: str, check: Check | None = None, table3: Table3 | None = None,
         factory: Callable[[], Any] | None = None) -> Any:
    """A config field (fairseq style): its default, its one-line meaning (``metadata["help"]``), its own check of a
    value (``metadata["check"]``: a :class:`Range` for a number) and, for a Table 3 knob, its column."""
    meta = {"help": help, **({"check": check} if check else {}), **({"table3": table3} if table3 else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def check_of(kind: type | Section, name: str) -> Check | None:
    """The check of field ``name`` of a section dataclass (or of a section): its :class:`Range` for a number."""
    return next((f.metadata.get("check") for f in dataclasses.fields(kind) if f.name == name), None)


def type_spec(hint) -> Any:
    """A field annotation as a type spec."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return ("choice",) + typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return (OPT, type_spec(inner))
    if origin is list:
        return list
    return hint


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def section_schema(kind: type) -> dict[str, tuple]:
    """{key: (type spec, default, help)} of a section dataclass: what validation, overrides and
    ``ltfm config --keys`` read."""
    hints = typing.get_type_hints(kind)
    return {f.name: (type_spec(hints[f.name]), default_of(f), f.metadata["help"]) for f in dataclasses.fields(kind)}


class Section:
    """Base of a config section dataclass. It checks its own values (:meth:`problem`) and remembers which keys were
    set after it was made (:meth:`given`), so that a knob given for an architecture that does not have it is an
    error (model/registry.py), while the defaults it carries are not. ``SECTION`` is its name in the config, the
    head of its keys (``model``; an architecture's: the name it is registered under)."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self):
        object.__setattr__(self, "_given", set())

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if "_given" in self.__dict__:
            self._given.add(name)

    def given(self) -> set[str]:
        """The keys set since the section was made (by the YAML, an override, a sweep variant)."""
        return set(self.__dict__.get("_given", ()))

    def problem(self) -> str | None:
        """What is wrong with the values, in one line naming the key and the way out (None: nothing): each field's
        own check (its metadata's, as a :class:`Range`), in field order. A section with rules across its keys adds
        them (overriding this, calling it); config validation stops on it before any work."""
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None and (why := check(f"{self.SECTION}.{f.name}", getattr(self, f.name))) is not None:
                return why
        return None
