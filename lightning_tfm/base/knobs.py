"""What every config section is made of (fairseq's dataclasses): :class:`Section`, and :func:`knob`, a field with
everything said about it beside it.

A knob is one field: its type, its default and its help, and in its metadata its check (a :class:`Range` for a
number: what config validation refuses, one line naming the key and the range) and, for a knob of the paper's
Table 3, its :class:`Table3` column (its title, its CSV and LaTeX names: the report's configuration table, the
paper's rows in ``resources/paper_table3.csv`` and the sweep dashboard's Optuna params read it). Each section checks
its own values (:meth:`Section.problem`: the fields' checks, then the rules across its keys). Whether a key is part
of the run id's hash is said on it too (``knob(..., hashed=False)``; a whole section: :attr:`Section.HASHED`).

One coercion of a value to its key's type (:func:`coerce`) and one listing of keys (:func:`key_row`, :func:`key_rows`:
``ltfm config --keys`` and ``ltfm sweep --keys``) serve the run config and the sweep file alike.

The model's section (``model/config.py``), the training config's (``training/config/``) and the sweep file's
(``sweep/schema.py``) are declared with these.
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal

from .inputs import shown

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
    text: str = ""  # the allowed values in words where the derived ones say too little (a sweep file's keys)

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
        """The allowed values in words: ``a positive integer, at most 1000``, ``in [0, 1)`` (or :attr:`text`)."""
        if self.text:
            return self.text
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
         factory: Callable[[], Any] | None = None, *, hashed: bool = True, section: tuple | None = None) -> Any:
    """A config field (fairseq style): its default, its one-line meaning (``metadata["help"]``), its own check of a
    value (``metadata["check"]``: a :class:`Range` for a number), for a Table 3 knob its column, whether the run id
    hashes it (``hashed=False``: it changes nothing of what is trained: ``metadata["hashed"]``) and, for a sweep
    file's field holding keys of its own, ``section``: (their class, where they sit: ``heartbeat.``)."""
    meta = {"help": help, **({"check": check} if check else {}), **({"table3": table3} if table3 else {}),
            **({} if hashed else {"hashed": False}), **({"section": section} if section else {})}
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
    if origin is dict:
        return dict
    return hint


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


class Unfit(ValueError):
    """A value that is not of its key's type (:func:`coerce`); ``finite``: a number, but not a finite one."""

    def __init__(self, finite: bool = False):
        super().__init__("not a finite number" if finite else "of another type")
        self.finite = finite


def coerce(value: Any, spec, numbers_as_text: bool = True, finite: bool = False) -> Any:
    """``value`` as a value of type spec ``spec`` (:func:`type_spec`), or :class:`Unfit`: the one coercion of a
    run config's values and a sweep file's. An int is a float too, and so is a number YAML 1.1 reads as text
    (``1e-9``; never an infinite or NaN one). ``numbers_as_text`` (a run config: ``run.name: 2024``, ``precision:
    32``): a number is text for a string or choice key; ``finite``: an infinite float is refused (a sweep file;
    a run config's are refused by its validation, naming the key)."""
    if isinstance(spec, tuple) and spec[0] == OPT:
        return None if value is None else coerce(value, spec[1], numbers_as_text, finite)
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(spec, tuple) and spec[0] == "choice":
        v = str(value) if numbers_as_text and is_number else value
        if v not in spec[1:]:
            raise Unfit()
        return v
    if spec is float and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise Unfit() from None
        if not math.isfinite(value):
            raise Unfit(finite=True)
    if spec is float and is_number:
        if finite and not math.isfinite(value):
            raise Unfit(finite=True)
        return float(value)
    if spec is str and numbers_as_text and is_number:
        return str(value)
    if spec is list and isinstance(value, tuple):
        return list(value)
    if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise Unfit()
    return value


def describe(spec) -> str:
    """A type spec in words, as ``--keys`` and the type errors show it: ``int``, ``post | pre``, ``str or null``,
    ``mapping``."""
    if isinstance(spec, tuple) and spec[0] == "choice":
        return " | ".join(map(str, spec[1:]))
    if isinstance(spec, tuple) and spec[0] == OPT:
        return describe(spec[1]) + " or null"
    if spec is dict or dataclasses.is_dataclass(spec):
        return "mapping"
    return spec.__name__


def key_row(key: str, spec, default: Any, help: str) -> tuple[str, str, str, str]:
    """One line of ``--keys`` (``ltfm config --keys``, ``ltfm sweep --keys``: :func:`~.command.print_keys`): the
    key, its type (:func:`describe`), its default (``null``; ``-``: a section of keys of its own) and its help."""
    shown_default = "null" if default is None else "-" if dataclasses.is_dataclass(default) else str(default)
    return key, describe(spec), shown_default, help


def key_rows(kind: type, head: str = "") -> list[tuple[str, str, str, str]]:
    """The :func:`key_row` of every field of a section dataclass, keys after ``head``, in field order; a field
    holding keys of its own (``metadata["section"]``) is followed by theirs, and a class with ``EXTRA`` (the
    placeholder, type and meaning of the other keys it passes on) ends with that."""
    hints = typing.get_type_hints(kind)
    rows = []
    for f in dataclasses.fields(kind):
        rows.append(key_row(head + f.name, type_spec(hints[f.name]), default_of(f), f.metadata["help"]))
        if f.metadata.get("section"):
            rows += key_rows(*f.metadata["section"])
    if hasattr(kind, "EXTRA"):
        placeholder, words, help = kind.EXTRA
        rows.append((head + placeholder, words, "-", help))
    return rows


def unhashed(head: str, kind: type) -> set[str]:
    """The keys of section ``kind`` (its keys after ``head.``) the run id does not hash: the section's name for a
    section hashed not at all (:attr:`Section.HASHED`), else its fields marked ``knob(..., hashed=False)``."""
    if not getattr(kind, "HASHED", True):
        return {head}
    return {f"{head}.{f.name}" for f in dataclasses.fields(kind) if not f.metadata.get("hashed", True)}


def section_schema(kind: type) -> dict[str, tuple]:
    """{key: (type spec, default, help)} of a section dataclass: what validation, overrides and
    ``ltfm config --keys`` read."""
    hints = typing.get_type_hints(kind)
    return {f.name: (type_spec(hints[f.name]), default_of(f), f.metadata["help"]) for f in dataclasses.fields(kind)}


class Section:
    """Base of a config section dataclass. It checks its own values (:meth:`problem`) and remembers which keys were
    set after it was made (:meth:`given`), so that a knob given for an architecture that does not have it is an
    error (model/registry.py), while the defaults it carries are not. ``SECTION`` is its name in the config, the
    head of its keys (``model``; an architecture's: the name it is registered under); ``HASHED``: False for a
    section the run id hashes none of (``wandb``), the keys of the others say it each (:func:`knob`).

    A section's state besides its keys is declared here, on a class that is no dataclass, so that it is no field:
    not a key, not in ``dataclasses.fields``/``asdict``, the schema, the saved config or the run id's hash."""

    SECTION: ClassVar[str] = ""
    HASHED: ClassVar[bool] = True
    #: State, no key: the keys set since the section was made (None while it is being made: its defaults).
    _given: set[str] | None = None

    def __post_init__(self):
        self._given = set()

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if self._given is not None and name in self.__dataclass_fields__:
            self._given.add(name)

    def given(self) -> set[str]:
        """The keys set since the section was made (by the YAML, an override, a sweep variant)."""
        return set(self._given or ())

    def problem(self) -> str | None:
        """What is wrong with the values, in one line naming the key and the way out (None: nothing): each field's
        own check (its metadata's, as a :class:`Range`), in field order. A section with rules across its keys adds
        them (overriding this, calling it); config validation stops on it before any work."""
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None and (why := check(f"{self.SECTION}.{f.name}", getattr(self, f.name))) is not None:
                return why
        return None


def path_check(key: str, v: Any) -> str | None:
    """A path the file system takes: no NUL, at most 255 bytes a name, 4096 in all (else a traceback)."""
    raw = os.fsencode(v) if isinstance(v, str) else b""
    if b"\0" in raw or len(raw) > 4096 or any(len(p) > 255 for p in raw.split(b"/")):
        return (f"{key}={shown(v)} is not a path the file system takes: no NUL character, at most 255 bytes a folder "
                "or file name, 4096 in all")
    return None
