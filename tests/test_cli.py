"""The command line explains itself: help on every option, `ltfm config` for the resolved config and the keys."""
from __future__ import annotations

import argparse

import pytest

from conftest import ROOT, ltfm
from lightning_tfm.cli import build_parser
from lightning_tfm.training import config


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_and_argument_has_help():
    missing = [f"{p.prog} {a.dest}" for p in _parsers(build_parser()) for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
               and a.help != argparse.SUPPRESS and not (a.help or "").strip()]
    assert not missing, missing


def test_top_level_help_is_written_for_users():
    p = ltfm("--help")
    assert p.returncode == 0
    assert "start with:" in p.stdout and "ltfm config --keys" in p.stdout
    assert "library functions" not in p.stdout  # words for the project's developers stay in the code
    assert "ltfm config --keys" in ltfm("train", "--help").stdout


def test_config_prints_what_the_run_saves_and_loads_back_with_its_run_id(tmp_path):
    args = ["experiments/multi30k-smoke.yaml", "data.path=/data/m30k", "model.heads=2", "train.lr_scale=0.5"]
    p = ltfm("config", *args)
    assert p.returncode == 0, p.stderr
    first, body = p.stdout.split("\n", 1)
    cfg = config.load_config(ROOT / args[0], args[1:])
    assert first.startswith(f"# run id: {config.run_id(cfg)} ")
    saved = tmp_path / "resolved.yaml"
    saved.write_text(p.stdout)
    again = config.load_config(saved)
    assert config.run_id(again) == config.run_id(cfg) and config.flatten(again) == config.flatten(cfg)
    assert body == config.dump_yaml(cfg)  # the exact config.yaml the run writes (no secret in it to mask)


def test_config_keys_lists_every_schema_key_with_its_meaning():
    p = ltfm("config", "--keys")
    assert p.returncode == 0, p.stderr
    lines = {line.split()[0]: line for line in p.stdout.splitlines()}
    for sec, keys in config.SCHEMA.items():
        for name, (spec, default, help_text) in keys.items():
            line = lines[f"{sec}.{name}"]
            assert help_text.strip() and line.rstrip().endswith(help_text.strip()), f"{sec}.{name} has no meaning"
            assert config.describe(spec) in line
    assert "sinusoidal | learned" in lines["model.positional"]
    only = ltfm("config", "--keys", "model.d_")
    assert {line.split()[0] for line in only.stdout.splitlines()} == {"model.d_model", "model.d_ff", "model.d_k",
                                                                     "model.d_v"}


@pytest.mark.parametrize("args, msg", [(["config", "--keys", "nope"], "no config key starts with 'nope'"),
                                       (["config"], "give an experiment file"),
                                       (["config", "--keys", "model", "experiments/multi30k-smoke.yaml"],
                                        "--keys lists the schema")])
def test_config_mistakes_are_one_line(args, msg):
    p = ltfm(*args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0


def test_the_status_hint_after_failed_trials_finds_the_same_study():
    """The ``--status`` command a sweep prints when trials failed keeps the results folder and storage it was
    given (the default storage lives in that folder), with the password masked."""
    import argparse

    from lightning_tfm.sweep.cli import status_command

    args = argparse.Namespace(sweep_file="sweeps/table3-cpu.yaml", storage="postgresql://u:s3cret@db/x",
                              overrides=["data.path=/d", "run.results_dir=/r q", "train.max_steps=20"])
    hint = status_command(args)
    assert hint == "ltfm sweep sweeps/table3-cpu.yaml --status 'run.results_dir=/r q' --storage 'postgresql://u:***@db/x'"
    assert "s3cret" not in hint
