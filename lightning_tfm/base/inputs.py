"""What a user hands the program as YAML, read whole and bounded: config and sweep files, and the values of
``dotted.key=value`` overrides.

Every YAML text a user gives goes through :func:`load_yaml`: PyYAML's safe loader, with a bound on the file's
size, on its nesting and on the values its aliases expand to (a "billion laughs" file of a few hundred bytes
would otherwise hand a list of 10^9 strings to the first code that walks it, and an error message that
formats it), and with each key written once in its mapping (PyYAML keeps the last of two silently: a second
``model:`` would replace the first section whole). An override's value (:func:`override_value`) is the text
after ``=`` as typed: YAML reads its numbers, booleans, null and lists, but never drops part of it as a comment.
Error messages show a user's value through :func:`shown`, which is bounded whatever the value.
"""
from __future__ import annotations

import os
import reprlib
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

MAX_BYTES = 1 << 20    # a config or sweep file is a few KB
MAX_DEPTH = 32         # nesting of mappings and lists (a sweep file uses 5)
MAX_VALUES = 100_000   # values (nodes) once every alias is expanded (a sweep file holds hundreds)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 80, 80, 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, cut to a line whatever the value's size or depth."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing nesting deeper than :data:`MAX_DEPTH` while it composes (a deeply nested
    text would otherwise end in a RecursionError), and a key written twice in one mapping, at any depth (PyYAML
    keeps the last silently: a second ``model:`` section would replace the first whole)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooLarge(f"nests deeper than {MAX_DEPTH} levels: a config needs a few")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _TooLarge(Exception):
    pass


class _Repeated(Exception):
    pass


def _check_repeats(loader: yaml.SafeLoader, root: yaml.Node) -> None:
    """Each key written once in its mapping, in every mapping of ``root`` (checked as composed, before a ``<<:
    *merge`` brings keys that the mapping's own may override); keys compared by their value, as the dict YAML
    builds does (``1`` and ``0x1`` are one key)."""
    done: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in done or isinstance(node, yaml.ScalarNode):
            continue
        done.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo += node.value
            continue
        seen: dict = {}
        for key_node, value_node in node.value:
            todo += [key_node, value_node]
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a key that is a list or mapping: the constructor refuses it itself
            key, line = loader.construct_object(key_node), key_node.start_mark.line + 1
            if key in seen:
                where = f"line {line}" if seen[key] == line else f"lines {seen[key]} and {line}"
                raise _Repeated(f"repeats the key {shown(key)} ({where}): YAML would keep only the last; keep one")
            seen[key] = line


def _check_expansion(root: yaml.Node) -> None:
    """The values ``root`` holds once its aliases are expanded, counted without expanding them (an aliased
    node is counted once per use, from a memo): at most :data:`MAX_VALUES`, no deeper than :data:`MAX_DEPTH`,
    and no node inside itself (``&a [*a]``)."""
    memo: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def walk(node, level: int) -> tuple[int, int]:  # (values, depth)
        key = id(node)
        if key in open_:
            raise _TooLarge("holds an alias of a node inside itself (&a [*a]): write its values out")
        if key not in memo:
            if isinstance(node, yaml.ScalarNode):
                children = []
            elif isinstance(node, yaml.SequenceNode):
                children = node.value
            else:
                children = [x for pair in node.value for x in pair]
            open_.add(key)
            parts = [walk(c, level + 1) for c in children]
            open_.discard(key)
            memo[key] = (1 + sum(n for n, _ in parts), 1 + max((d for _, d in parts), default=0))
        values, depth = memo[key]
        if values > MAX_VALUES:
            raise _TooLarge(f"expands to more than {MAX_VALUES:,} values through its aliases (*name): write its values "
                            "out")
        if level + depth > MAX_DEPTH:
            raise _TooLarge(f"nests deeper than {MAX_DEPTH} levels through its aliases (*name): a config needs a few")
        return values, depth

    walk(root, 0)


def load_yaml(text: str, what: str) -> Any:
    """``yaml.safe_load(text)`` within the bounds above. ``what`` names the text in the one-line error
    (``config file 'x.yaml'``); a syntax error is raised as :class:`yaml.YAMLError`, for the caller to place."""
    if len(text) > MAX_BYTES:
        raise UserError(f"{what} is larger than {MAX_BYTES >> 20} MiB: a config is a few KB; give the right file")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        _check_repeats(loader, node)
        return loader.construct_document(node)
    except (_TooLarge, _Repeated) as e:
        raise UserError(f"{what} {e}") from None
    except ValueError as e:  # Python refuses integers of thousands of digits (int_max_str_digits)
        raise UserError(f"{what} holds a value that cannot be read ({str(e).split(':')[0]}): give a real "
                        "value") from None
    finally:
        loader.dispose()


def read_yaml_text(path: str | os.PathLike, what: str) -> str:
    """A user's YAML file as text: at most :data:`MAX_BYTES`, UTF-8, readable; one-line errors otherwise."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise UserError(f"{what} cannot be read ({e.strerror or e.__class__.__name__}): give a readable "
                        "YAML file") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{what} is larger than {MAX_BYTES >> 20} MiB: a config is a few KB; give the right file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None


_IGNORED = (yaml.StreamStartToken, yaml.StreamEndToken)


def override_value(key: str, raw: str, text: bool = False) -> Any:
    """The value of the override ``key=raw``, as typed.

    YAML reads it (``4`` is a number, ``[a, b]`` a list, ``null`` nothing, ``'1'`` the string 1), with two
    exceptions that keep the text whole: a plain (unquoted) value is its text when YAML would drop part of it
    as a comment (``/data/lf #2``) or, for a key of type str (``text``), when YAML would read it as something
    else (``007``, ``yes``, ``1.10``); any other value with a comment is refused. Text that is not YAML at
    all (``*name``, an unclosed quote) is the text itself."""
    if raw == "":
        return ""
    try:
        tokens = [t for t in yaml.scan(raw, Loader=_Loader) if not isinstance(t, _IGNORED)]
    except yaml.YAMLError:
        return raw
    covered = [False] * len(raw)
    for t in tokens:
        covered[t.start_mark.index:t.end_mark.index] = [True] * (t.end_mark.index - t.start_mark.index)
    comment = any(not c.isspace() and not seen for c, seen in zip(raw, covered))
    plain = not tokens or (len(tokens) == 1 and isinstance(tokens[0], yaml.ScalarToken) and tokens[0].plain)
    try:
        value = load_yaml(raw, f"override {key}")
    except yaml.YAMLError:
        return raw
    if plain and (text and (comment or value is not None) or comment and (value is None or isinstance(value, str))):
        return raw.strip()
    if comment:
        raise UserError(f"override {key}={shown(raw)}: YAML would drop the text from ' #' on as a comment: "
                        f"quote the value ({key}='...') or leave the comment out")
    return value
