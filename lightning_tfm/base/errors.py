"""The one exception type that means "the user's input is wrong": the CLI prints it on one line, exit 2; and the
hint such a line gives for a mistyped name (:func:`closest`)."""
from __future__ import annotations

import difflib


class UserError(Exception):
    """Bad config, data, CLI argument, storage URL or checkpoint. The message names the problem and the fix.

    ``hint``: the program's own words that end the line, such as the form ``dotted.key=value`` a text should have
    had: the CLI masks secrets in the message (base/redact.py: it may quote what the user typed) and shows the hint
    as written, so it must hold nothing the user gave."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message + hint)
        self.message, self.hint = message, hint


def closest(word: str, choices) -> str:
    """The one of ``choices`` closest to ``word`` (difflib, a ratio of at least 0.75; none when two are as close:
    ``model.d``), else the one ``word`` begins, else "": what a mistyped key, flag or command was meant to be."""
    choices = list(choices)
    ranked = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in choices), reverse=True)
    (r1, best), (r2, _) = (ranked + [(0.0, "")] * 2)[:2]
    longer = [c for c in choices if c.startswith(word)]
    return best if r1 >= 0.75 and r1 > r2 else longer[0] if len(longer) == 1 else ""
