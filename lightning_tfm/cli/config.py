"""``ltfm config``: an experiment's resolved config, or every config key (``--keys``)."""
from __future__ import annotations

import argparse

from ..base.command import OVERRIDES, Command, print_keys
from ..base.errors import UserError
from ..base.knobs import key_row
from .common import default_data


def _config_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("config", nargs="?", help="experiment YAML (not with --keys)")
    c.add_argument("--keys", nargs="?", const="", metavar="PREFIX", help="list every key (or those starting "
                   "with PREFIX, e.g. train or model.d_)")
    c.add_argument("overrides", nargs="*", help=OVERRIDES)


def config_cli(args) -> int:
    """``ltfm config CONFIG.yaml [k=v ...]``: the resolved config as the run saves it (``config.yaml``), under a
    comment with its run id; ``ltfm config --keys [PREFIX]``: every key of the schema with its type, default,
    allowed values and meaning (the schema validation uses, so nothing here can fall out of date)."""
    from ..training.config import config
    from ..training.runs.run_folder import existing_run_id

    if args.keys is not None:
        if args.config or args.overrides:
            raise UserError("--keys lists the schema: give no config file or overrides with it")
        rows = [key_row(f"{sec}.{name}", *entry) for sec, keys in config.SCHEMA.items()
                for name, entry in keys.items() if f"{sec}.{name}".startswith(args.keys)]
        if not rows:
            raise UserError(f"no config key starts with {args.keys!r}: sections are {', '.join(config.SCHEMA)}")
        print_keys(rows)
        return 0
    if not args.config:
        raise UserError("give an experiment file (ltfm config experiments/multi30k-smoke.yaml [k=v ...]) or --keys")
    overrides = default_data(config.load_config(args.config, args.overrides, checked=False)) + args.overrides
    cfg = config.load_config(args.config, overrides)
    config.check_data_folder(cfg)
    rid = existing_run_id(cfg, others=False)
    print(f"# run id: {rid} (its folder: {cfg.run.results_dir}/{rid})")
    print(config.saved_yaml(cfg), end="")
    return 0


CONFIG = Command("config", "the resolved config of an experiment, or every config key", _config_arguments,
                 config_cli, "Print the config a run would save (YAML, with its run id), or with --keys every key "
                 "with its type, default, allowed values and meaning.")
