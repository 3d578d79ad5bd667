"""A table's typed row and its columns, declared once: the mechanism both tables' declarations use
(:mod:`.table3.columns`, Table 3's; :mod:`.table2.columns`, Table 2's).

A table is a row dataclass (:class:`Fields`: also read as a mapping by its field names, as the views and the
notebooks read it) and one list of :class:`Column`: what each column means, its value (a field of the row by
default), the views it is in (:data:`CSV`, the one view every table has, or a table's own), the markdown tables it
is :class:`Shown` in, with its header and how its cell prints; :func:`in_view` reads a view's columns off the list.
:class:`Kind` is a report's table as W&B and optuna-dashboard take it (:data:`.publish.kinds.KINDS`).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

CSV = "csv"   # a table's CSV (header = the column's key)
Cell = Callable[[Any, dict], str]   # (row, table) -> the markdown cell


class Fields:
    """A row dataclass also read as a mapping by its field names (``row["dev_ppl"]``), as the views and the
    notebooks read it; :meth:`_other` answers other keys (none: KeyError)."""

    def __getitem__(self, key: str) -> Any:
        if key in field_names(type(self)):
            return getattr(self, key)
        return self._other(key)

    def _other(self, key: str) -> Any:
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in field_names(type(self)):
            raise KeyError(f"{key!r} is no field of a table row")
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


@functools.cache
def field_names(cls) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class Shown:
    """A column in one table: its header (``{side}``: A or B in a comparison), how its cell prints, whether it is
    left-aligned; in table3.tex, the header of its group (over it and its neighbours of the same group)."""
    title: str
    cell: Cell
    left: bool = False
    group: str = ""


@dataclass(frozen=True)
class Column:
    key: str                                   # the CSV's and the W&B tables' header
    help: str                                  # what it means
    views: frozenset = frozenset({CSV})
    shown: Mapping[str, Shown] = field(default_factory=dict)
    value: Callable[[Fields], Any] | None = None  # default: the row's field ``key``
    compare_at: int | None = None              # its place among a comparison side's columns; None: not there
    latex: Shown | None = None                 # its column of table3.tex (LATEX); None: not there

    def of(self, row: Fields) -> Any:
        return self.value(row) if self.value is not None else getattr(row, self.key)

    def csv_text(self, row: Fields, digits: int | None = 6) -> Any:
        """Its cell of the CSV: empty for None, a float to ``digits`` significant digits (None: as Python prints
        it, :attr:`Kind.digits`)."""
        v = self.of(row)
        return "" if v is None else f"{v:.{digits}g}" if isinstance(v, float) and digits else v

    def data(self, row: Fields, digits: int | None = 6) -> Any:
        """Its value in a W&B table: the CSV's (a float to ``digits`` significant digits)."""
        v = self.of(row)
        return float(f"{v:.{digits}g}") if isinstance(v, float) and digits else v


def in_view(cols, view: str) -> list[Column]:
    """The columns of ``cols`` in ``view`` (one of their ``views``, or a markdown table they are ``shown`` in), in
    their order."""
    return [c for c in cols if view in c.views or view in c.shown]


@dataclass(frozen=True)
class Kind:
    """A report's table as W&B and optuna-dashboard take it (:mod:`.publish.kinds`): its name (``table3``,
    ``table2``: its files' stem, the W&B run's and artifact's suffix, the study note's block), ``columns(view)``:
    the columns of a view, read from its one column list, and for each place what of it goes there: the artifact's
    ``files``; the W&B tables (``wandb``: name -> the
    columns' view) over the rows of ``rows(table)`` with ``digits`` significant digits (None: as the CSV prints
    them); the W&B summary (``summary(table)``); the study note (``note(table)``: its markdown parts); whether
    the study gets custom plots; how :func:`.publish.published.publish` gets the table (``build(data, sweep, out)``).
    What ``ltfm report`` does with it: ``exported``, whether the notebook writes the sweep's export and builds its
    table from it (``--from-export`` rebuilds such a report; ``build(None, sweep, out)`` rebuilds its table from the
    report folder), ``headline(table)``, the text it prints first, and ``claims(markdown)``, the lines it prints of
    the written markdown; ``what``, the report in a few words for a message."""
    name: str
    columns: Callable[[str], list[Column]]
    files: tuple[str, ...]
    wandb: Mapping[str, str]
    summary: Callable[[dict], dict]
    note: Callable[[dict], list[str]]
    build: Callable[[Any, Any, Any], dict]
    rows: Callable[[Any], list] = lambda table: table.rows
    digits: int | None = 6
    plots: bool = False
    exported: bool = False
    headline: Callable[[dict], str] | None = None
    claims: Callable[[Any], list[str]] | None = None
    what: str = ""   # the report in a few words, as a message names it ("a Table 2 report (...)")

    def wandb_tables(self, table: dict) -> dict[str, tuple[list[str], list[list]]]:
        """Each W&B table as (its columns' keys, a list of cells per row)."""
        out = {}
        for name, view in self.wandb.items():
            cols = self.columns(view)
            out[name] = ([c.key for c in cols], [[c.data(r, self.digits) for c in cols] for r in self.rows(table)])
        return out
