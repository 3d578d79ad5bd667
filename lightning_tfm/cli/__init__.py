"""``ltfm``: the command line. Every command is declared in this package, once, beside its handler (a
:class:`~lightning_tfm.base.command.Command`: its name, its help, the function that adds its arguments, the handler),
one module per command or close family (fairseq's ``fairseq_cli/``); :data:`COMMANDS` lists them, in the order of
``ltfm --help``. Adding a command: its module here, and its line in :data:`COMMANDS`.

A command module imports only the standard library and :mod:`lightning_tfm.base` at the top: ``ltfm --help`` and
every argument error build the whole parser, and must not import torch, Lightning or Optuna. A handler imports what
it needs when it runs.

Every user error (config, data, arguments, storage, checkpoint) ends as one line on stderr and exit code 2, with no
traceback.
"""
from __future__ import annotations

import argparse
import errno
import os
import re
import sys

from ..base.command import STOPPED_RC, Command
from ..base.errors import UserError, closest
from ..base.lifeline import hold_on
from . import bench, config, evaluate, report, runs, sweep, train


def suggestion(word: str, choices: list[str]) -> str:
    """``"; did you mean --from-export?"``: the one of ``choices`` closest to ``word``
    (:func:`~lightning_tfm.base.errors.closest`, as a config key's hint), else ""."""
    best = closest(word, choices)
    return f"; did you mean {best}?" if best else ""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + message otherwise)
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        hint = suggestion(choice.group(1), re.findall(r"'([^']*)'", choice.group(2))) if choice else ""
        raise UserError(f"{message}{hint} (see {self.prog} --help)")

    def flags(self) -> list[str]:
        """Every option string of this parser (``--from-export``, ``-h``), for a mistyped one's suggestion."""
        return [s for action in self._actions for s in action.option_strings]

    def unrecognized(self, unknown: list[str]) -> None:
        """Refuse ``unknown`` arguments: one line naming them, the closest flag of this command for each mistyped
        one (``--from-exprt``: did you mean --from-export?), exit 2."""
        hints = [suggestion(a.split("=", 1)[0], self.flags()) for a in unknown if a.startswith("-")]
        hint = next((h for h in hints if h), "")
        raise UserError(f"unrecognized arguments: {' '.join(unknown)}{hint} (see {self.prog} --help)")


USAGE = """Train the Transformer of "Attention Is All You Need", run the paper's Table 3 as an Optuna sweep,
and regenerate the table beside the paper's.

start with:
  ltfm train experiments/multi30k-smoke.yaml data.path=../shared/data/multi30k   one model, a few minutes
  ltfm sweep sweeps/table3-cpu.yaml data.path=../shared/data/multi30k --workers auto
                                                                                 the Table 3 sweep
  ltfm report sweeps/table3-cpu.yaml                                             its report: md, csv, html

every config key, its type, default and meaning: ltfm config --keys [PREFIX]"""

#: The subcommands, in the order of ``ltfm --help``.
COMMANDS: tuple[Command, ...] = (train.TRAIN, config.CONFIG, train.PREPARE, sweep.SWEEP, report.REPORT, runs.RUNS,
                                 evaluate.EVALUATE, evaluate.TRANSLATE, evaluate.AVERAGE, bench.BENCH)


def description(command: Command) -> str:
    """The paragraph under ``ltfm NAME --help``'s usage: the command's ``description``, else its one line of
    ``ltfm --help`` as a sentence."""
    if command.description:
        return command.description
    text = command.help.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ltfm", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    p.commands = {}
    for command in COMMANDS:
        p.commands[command.name] = sub.add_parser(command.name, help=command.help, description=description(command))
        command.arguments(p.commands[command.name])
    return p


def main(argv: list[str] | None = None) -> int:
    hold_on()  # a sweep's trial: dies with its worker
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        # dotted.key=value overrides may come after options too (`ltfm evaluate RUN --src a --ref b
        # decode.beam_size=1`): argparse stops collecting positionals at the first option.
        unknown = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
        if unknown:
            parser.commands[args.command].unrecognized(unknown)
        if extra:
            args.overrides = list(args.overrides or []) + extra
        return next(c for c in COMMANDS if c.name == args.command).handler(args)
    except UserError as e:  # its text masked (base/redact.py): argparse quotes a mistyped --storage URL whole;
        # not its hint, the program's own words (dotted.key=value would read as a secret key's value)
        from ..base.redact import scrub_text
        print(f"ltfm: error: {scrub_text(e.message, args=sys.argv[1:] if argv is None else argv)}{e.hint}",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ltfm runs | head`: the reader went away; not an error of ours (an OSError too:
        # before the handler of OSError, which re-raises what it does not know)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a path the file system cannot take, wherever a command meets it first: one line
        if e.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
            raise
        from ..base.redact import scrub_text
        name = str(e.filename or "")
        shown_name = name if len(name) <= 80 else f"{name[:60]}...({len(os.fsencode(name))} bytes)"
        why = "a name in it is too long" if e.errno == errno.ENAMETOOLONG else "its links loop"
        print(f"ltfm: error: {scrub_text(shown_name)!r}: the file system cannot take this path ({why}): give "
              "another (names of at most 255 bytes)", file=sys.stderr)
        return 2
    except ValueError as e:  # a NUL in a path (os.stat's "embedded null byte"): one line
        if "embedded null" not in str(e):
            raise
        print("ltfm: error: a path given holds a NUL character: give it without one", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ltfm: interrupted", file=sys.stderr)
        return STOPPED_RC


if __name__ == "__main__":
    sys.exit(main())
