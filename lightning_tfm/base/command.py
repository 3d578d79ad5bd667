"""What a command of ``ltfm`` is (:class:`Command`, declared once beside its handler in ``lightning_tfm/cli/``) and
what every command prints the same way: the closing lines of a command that makes something (:func:`say_done`) and
``--keys`` (:func:`print_keys`). Standard library only: ``ltfm --help`` never imports torch."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

#: The help of the ``dotted.key=value`` arguments of the commands that read an experiment file.
#: The exit code of a command stopped by Ctrl-C (or SIGTERM, SIGUSR1: a worker's stop), as a shell reports SIGINT:
#: a sweep's stopped trials went back to the queue, and the same command resumes them.
STOPPED_RC = 130

OVERRIDES = "dotted.key=value settings on top of the file (ltfm config --keys lists every key)"

@dataclass(frozen=True)
class Command:
    """One ``ltfm`` subcommand, declared once: its name, the one line of ``ltfm --help`` (``help``), the
    paragraph of ``ltfm NAME --help`` (``description``), the function that adds its arguments to its parser,
    and the handler, called with the parsed arguments, that returns the exit code."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]
    description: str | None = None


def say_done(output: str, then: str | None = None) -> None:
    """The closing lines of a command that makes something, on stderr after its own output: where what it made is,
    and the command to run next."""
    print(f"ltfm: output: {output}", file=sys.stderr, flush=True)
    if then:
        print(f"ltfm: next: {then}", file=sys.stderr, flush=True)


def print_keys(rows: list[tuple[str, str, str, str]]) -> None:
    """``--keys``: one line a key (key, type, default, meaning: :func:`~.knobs.key_row`'s, for a run config's keys
    and a sweep file's alike), in aligned columns."""
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for key, kind, default, help in rows:
        print(f"{key:<{w[0]}}  {kind:<{w[1]}}  default {default:<{w[2]}}  {help}")
