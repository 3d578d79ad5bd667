"""The command line explains itself: help on every option, `ltfm config` for the resolved config and the keys."""
from __future__ import annotations

import argparse
import signal

import pytest

from lightning_tfm import cli
from lightning_tfm.cli import build_parser
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import ROOT, SMOKE


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


def test_top_level_help_is_written_for_users(ltfm_here):
    p = ltfm_here("--help")
    assert p.returncode == 0
    assert "start with:" in p.stdout and "ltfm config --keys" in p.stdout
    assert "library functions" not in p.stdout  # words for the project's developers stay in the code
    assert "ltfm config --keys" in ltfm_here("train", "--help").stdout


def test_config_prints_what_the_run_saves_and_loads_back_with_its_run_id(tmp_path, ltfm_here):
    args = ["experiments/multi30k-smoke.yaml", f"data.path={tmp_path}", "model.heads=2", "train.lr_scale=0.5"]
    p = ltfm_here("config", *args)
    assert p.returncode == 0, p.stderr
    first, body = p.stdout.split("\n", 1)
    cfg = config.load_config(ROOT / args[0], args[1:])
    assert first.startswith(f"# run id: {run_ids.run_id(cfg)} ")
    saved = tmp_path / "resolved.yaml"
    saved.write_text(p.stdout)
    again = config.load_config(saved)
    assert run_ids.run_id(again) == run_ids.run_id(cfg) and config.flatten(again) == config.flatten(cfg)
    assert body == config.dump_yaml(cfg)  # the exact config.yaml the run writes (no secret in it to mask)


def test_config_keys_lists_every_schema_key_with_its_meaning(ltfm_here):
    p = ltfm_here("config", "--keys")
    assert p.returncode == 0, p.stderr
    lines = {line.split()[0]: line for line in p.stdout.splitlines()}
    for sec, keys in config.SCHEMA.items():
        for name, (spec, default, help_text) in keys.items():
            line = lines[f"{sec}.{name}"]
            assert help_text.strip() and line.rstrip().endswith(help_text.strip()), f"{sec}.{name} has no meaning"
            assert config.describe(spec) in line
    assert "sinusoidal | learned" in lines["model.positional"]
    only = ltfm_here("config", "--keys", "model.d_")
    assert {line.split()[0] for line in only.stdout.splitlines()} == {"model.d_model", "model.d_ff", "model.d_k",
                                                                     "model.d_v"}


@pytest.mark.parametrize("args, msg", [(["config", "--keys", "nope"], "no config key starts with 'nope'"),
                                       (["config"], "give an experiment file"),
                                       (["config", "--keys", "model", "experiments/multi30k-smoke.yaml"],
                                        "--keys lists the schema")])
def test_config_mistakes_are_one_line(args, msg, ltfm_here):
    p = ltfm_here(*args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0


def test_the_status_hint_after_failed_trials_finds_the_same_study():
    """The ``--status`` command a sweep prints when trials failed keeps the results folder and storage it was
    given (the default storage lives in that folder), with the password masked."""
    import argparse

    from lightning_tfm.cli.sweep import status_command

    args = argparse.Namespace(sweep_file="sweeps/table3-cpu.yaml", storage="postgresql://u:s3cret@db/x",
                              overrides=["data.path=/d", "run.results_dir=/r q", "train.max_steps=20"])
    hint = status_command(args)
    assert hint == "ltfm sweep sweeps/table3-cpu.yaml --status 'run.results_dir=/r q' --storage 'postgresql://u:***@db/x'"
    assert "s3cret" not in hint


def test_every_declared_command_is_on_the_command_line():
    """A command is declared once, in a module of ``lightning_tfm/cli/``, and nowhere else in the package (no
    ``Command(...)`` outside it); the command line lists every one declared there (a declared command left out of
    ``ltfm`` would be dead code), each name once. The modules are found on disk, so that a new one is checked too."""
    import ast
    import importlib
    import pkgutil

    from lightning_tfm.base.command import Command

    outside = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in (ROOT / "lightning_tfm").rglob("*.py")
               if "cli" not in path.relative_to(ROOT / "lightning_tfm").parts[:1]
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Command"]
    assert not outside, f"commands declared outside lightning_tfm/cli/: {outside}"
    modules = [importlib.import_module(f"lightning_tfm.cli.{m.name}") for m in pkgutil.iter_modules(cli.__path__)]
    declared = [v for m in modules for v in vars(m).values() if isinstance(v, Command)]
    names = {m.__name__.rsplit(".", 1)[1] for m in modules}
    assert len(modules) >= 7 and {"train", "sweep", "report", "bench"} <= names
    assert sorted(c.name for c in cli.COMMANDS) == sorted(c.name for c in declared)
    assert set(cli.COMMANDS) == set(declared) and len(set(c.name for c in cli.COMMANDS)) == len(cli.COMMANDS)


def test_sweep_keys_lists_every_sweep_file_key_with_its_meaning(capsys):
    """``ltfm sweep --keys [PREFIX]`` prints the sweep file's schema as ``ltfm config --keys`` prints the
    config's: a line a key with its type, default and meaning."""
    from lightning_tfm.sweep.schema import describe_keys

    assert cli.main(["sweep", "--keys"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    rows = describe_keys("")
    assert set(lines) == {key for key, *_ in rows}
    for key, kind, default, help_text in rows:
        assert help_text.strip() and lines[key].rstrip().endswith(help_text.strip()), f"{key} has no meaning"
        assert f" {kind} " in lines[key] and f"default {default}" in lines[key]
    for key in ("name", "experiment", "metric", "sampler.type", "pruner.type", "heartbeat.interval",
                "report.k", "seeds", "n_trials"):
        assert key in lines, key
    assert cli.main(["sweep", "--keys", "heartbeat."]) == 0
    assert {line.split()[0] for line in capsys.readouterr().out.splitlines()} == {
        "heartbeat.interval", "heartbeat.grace", "heartbeat.max_retry"}


@pytest.mark.parametrize("args, msg", [(["sweep", "--keys", "nope"], "no sweep-file key starts with 'nope'"),
                                       (["sweep"], "give a sweep file"),
                                       (["sweep", "--keys", "sampler", "sweeps/table3-cpu.yaml"],
                                        "--keys lists the sweep file's keys")])
def test_sweep_keys_mistakes_are_one_line(args, msg, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and err.strip().count("\n") == 0


def test_train_reads_and_validates_its_config_once(monkeypatch, tmp_path, data_dir):
    """``ltfm train`` reads the experiment file once and validates the config once (training validates what
    it is given; the command does not check it a second time). The run stops right after validation."""
    from lightning_tfm.base.errors import UserError
    from lightning_tfm.training.runs import run_folder

    calls = {"read_yaml": 0, "validate": 0}

    def counted(name):
        real = getattr(config, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(config, name, call)
    counted("read_yaml")
    counted("validate")

    def stop_here(results_dir):
        raise UserError("stopped by the test after validation")
    monkeypatch.setattr(run_folder, "check_writable", stop_here)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        assert cli.main(["train", str(SMOKE), f"data.path={data_dir}", f"run.results_dir={tmp_path}"]) == 2
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert calls == {"read_yaml": 1, "validate": 1}


def test_every_command_help_has_a_description_line(ltfm_here):
    """``ltfm NAME --help`` says what the command does under its usage line: the command's description, else its
    line of ``ltfm --help`` as a sentence."""
    subs = {p.prog.split()[-1]: p for p in list(_parsers(build_parser()))[1:]}
    assert set(subs) == {c.name for c in cli.COMMANDS}
    for command in cli.COMMANDS:
        text = subs[command.name].description
        assert text and text[0].isupper() and text.endswith("."), command.name
        assert text == (command.description or command.help[0].upper() + command.help[1:] + "."), command.name
    assert subs["average"].description == "Average the last N checkpoints of a run into one file."
    p = ltfm_here("sweep", "--help")
    assert p.returncode == 0
    usage, description = p.stdout.split("\n\n")[:2]
    assert usage.startswith("usage: ltfm sweep") and " ".join(description.split()).startswith(
        "Run (or join) the Optuna study of a sweep file")


@pytest.mark.parametrize("where, key, guess", [("override", "model.head", "model.heads"),
                                               ("override", "modle.heads", "model.heads"),
                                               ("override", "train.warmupp", "train.warmup"),
                                               ("yaml", "model.head", "model.heads"),
                                               ("override", "model.foo", None),   # nothing close
                                               ("override", "model.d", None)])    # d_k, d_v, d_ff: as close
def test_an_unknown_config_key_gets_a_did_you_mean(where, key, guess, tmp_path, capsys):
    """``ltfm train exp.yaml model.head=4`` (or ``head: 4`` in the file): the one-line error names the closest
    key of the schema, when one is closest."""
    args = [str(SMOKE), f"{key}=4"]
    if where == "yaml":
        sec, name = key.split(".")
        exp = tmp_path / "exp.yaml"
        exp.write_text(f"{sec}:\n  {name}: 4\n")
        args = [str(exp)]
    assert cli.main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith(f"ltfm: error: unknown config key '{key}': ")
    if guess:
        assert f": did you mean {guess}? " in err
    else:
        assert "did you mean" not in err


def test_an_unknown_section_in_a_file_gets_a_did_you_mean(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text("modle:\n  heads: 4\n")
    assert cli.main(["config", str(exp)]) == 2
    assert capsys.readouterr().err.strip() == ("ltfm: error: unknown config section 'modle': did you mean model? use "
                                              f"one of {', '.join(config.SCHEMA)}")
