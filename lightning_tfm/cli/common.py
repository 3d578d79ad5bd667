"""What several commands share: data.path's default for an experiment that names no data (:func:`default_data`,
:func:`with_default_data`), and the check of every path a command writes (:func:`check_outputs`)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..training.config.config import Config

#: Multi30k beside the checkout, from the folder a command runs in (the checkout's root): data.path's default for a
#: local experiment that names no data (:func:`default_data`). The Makefile's DATA default is read from this line.
DEFAULT_DATA = "../shared/data/multi30k"


def default_data(cfg: Config) -> list[str]:
    """``["data.path=DEFAULT_DATA"]`` when ``cfg`` (read without it) reads a local corpus but names no data.path (an
    explicit ``data.path=null`` names one: none) and DEFAULT_DATA holds files, with a note on stderr; else ``[]``.
    Put before the command line's overrides."""
    if cfg.data.source != "local" or cfg.data.path or "path" in cfg.data.given() or \
            not any(Path(DEFAULT_DATA).glob(f"{cfg.data.train_split}.*")):
        return []
    print(f"ltfm: data.path={DEFAULT_DATA} (no data.path given; that folder exists)", file=sys.stderr, flush=True)
    return [f"data.path={Path(DEFAULT_DATA).resolve()}"]


def with_default_data(sweep, overrides: list[str]) -> list[str]:
    """The command line's overrides, after data.path's default when the sweep's experiment names no data
    (:func:`default_data`): every trial reads what its base does."""
    from ..sweep.plan import parse_cli_overrides, trial_config

    return default_data(trial_config(sweep, cli_overrides=parse_cli_overrides(overrides), checked=False,
                                     data=False)) + list(overrides or [])


def check_outputs(files=(), option: str = "--out", *, folders=(), reads=(), replaces=()) -> None:
    """:func:`lightning_tfm.base.outputs.check_outputs` with every owner (a run's files, exports:
    :func:`lightning_tfm.report.inputs.export.owners`): what each command that writes calls before its work."""
    from ..base.outputs import check_outputs as check
    from ..report.inputs.export import owners

    check(files, option, folders=folders, reads=reads, owners=owners(), replaces=replaces)
