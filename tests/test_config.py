"""The typed config: one schema (the dataclasses), run ids pinned across refactors, plain dicts on disk."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from lightning_tfm.base.errors import UserError
from lightning_tfm.model.config import ModelConfig
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import ROOT

SMOKE = ROOT / "experiments" / "multi30k-smoke.yaml"


def test_run_id_is_pinned_across_refactors():
    # Pins run ids across refactors of the config code: computed with the dict-based config (before the
    # typed dataclasses). A change here re-trains every existing run folder instead of resuming it.
    assert run_ids.run_id(config.load_config(SMOKE, ["data.path=/x"])) == "multi30k-smoke-9e45a369"
    assert run_ids.run_id(config.load_config(SMOKE, ["data.path=/x", "model.heads=4", "train.adam_eps=1e-8"])) == \
        "multi30k-smoke-d291b654"


def test_plain_dicts_round_trip_in_section_order():
    cfg = config.load_config(SMOKE, ["data.path=/x", "wandb.tags=[a, b]"])
    tree = cfg.to_dict()
    assert list(tree) == ["run", "data", "model", "train", "decode", "wandb", "sweep"]
    # arch: only when not the default
    assert list(tree["model"]) == [f.name for f in dataclasses.fields(ModelConfig) if f.name != "arch"]
    assert config.Config.from_dict(tree) == cfg
    assert config.Config.from_dict(yaml.safe_load(config.dump_yaml(cfg))) == cfg
    assert config.flatten(cfg)["model.heads"] == cfg.model.heads == tree["model"]["heads"]
    assert config.flatten(cfg) == config.flatten(tree)
    with pytest.raises(UserError, match=r"did you mean model.layers\? model has arch, layers"):
        config.Config.from_dict({"model": {"layer": 2}}, checked=False)


def test_every_field_has_a_meaningful_help_and_schema_is_generated():
    for sec, keys in config.SCHEMA.items():
        section = getattr(config.Config(), sec)
        assert list(keys) == [f.name for f in dataclasses.fields(section)]
        for name, (spec, default, help_) in keys.items():
            assert len(help_.split()) >= 3, f"{sec}.{name} has no meaningful help"
            assert default == getattr(section, name)
    assert config.SCHEMA["train"]["precision"][0] == ("choice", "auto", "32", "bf16-mixed", "16-mixed", "bf16-true")
    assert config.SCHEMA["data"]["path"][0] == ("optional", str)
    assert "CPU" not in config.SCHEMA["train"]["compile"][2]


def test_coercion_and_overrides():
    cfg = config.load_config(None, {"data.path": "/x", "train.adam_eps": "1e-9", "train.precision": 32,
                               "decode.max_len_a": 2})
    assert cfg.train.adam_eps == 1e-9 and cfg.train.precision == "32" and cfg.decode.max_len_a == 2.0
    assert isinstance(cfg.decode.max_len_a, float)
    with pytest.raises(UserError, match="not a finite number"):
        config.load_config(None, {"data.path": "/x", "train.lr_scale": "inf"})
    with pytest.raises(UserError, match="wrong type"):
        config.load_config(None, ["data.path=/x", "model.heads=four"])
    with pytest.raises(UserError, match="not one of: post | pre"):
        config.load_config(None, ["data.path=/x", "model.norm=mid"])


def test_table3_knobs_are_the_fields_with_a_table3_column_and_feed_the_report_and_the_dashboard():
    """A knob is one field: its Table 3 column (title, CSV and LaTeX names) is in its metadata, and every list of
    knobs is derived from the fields: the report's CSV, configuration and LaTeX columns, the paper's parsed rows,
    the dashboard's Optuna params."""
    from lightning_tfm.report.table3 import columns
    from lightning_tfm.report.table3.paper import load_paper
    from lightning_tfm.sweep.queue import DASHBOARD_CHOICES, DASHBOARD_KNOBS

    knobs = config.TABLE3_KNOBS
    marked = {f"{sec}.{f.name}" for sec in config.SCHEMA for f in dataclasses.fields(getattr(config.Config(), sec))
              if "table3" in f.metadata}
    assert [k.key for k in knobs if k.key in marked] == [k.key for k in knobs] and len(knobs) == len(marked)
    # the paper's own columns first, in its order (table3.csv's columns as the committed reports have them), the
    # training budget last
    assert [k.title for k in knobs[:8]] == ["N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls"]
    assert knobs[-1].key == "train.max_steps" and [k.key for k in knobs[8:10]] == ["model.positional", "model.norm"]
    csv_columns = [c.key for c in columns.columns(columns.CSV)]
    assert csv_columns[3:3 + len(knobs)] == [k.csv for k in knobs]
    assert [c.shown[columns.CONFIG].title for c in columns.columns(columns.CONFIG)][1:1 + len(knobs)] == \
        [k.title for k in knobs]
    tex = [k.tex for k in knobs if k.tex]
    assert [c.latex.title for c in columns.columns(columns.LATEX)][1:1 + len(tex)] == tex
    assert "$h$" in [k.tex for k in knobs] and not any(k.tex for k in knobs if k.key == "model.norm")
    assert DASHBOARD_KNOBS == tuple(k.key for k in knobs if k.key != "train.max_steps")
    assert DASHBOARD_CHOICES == {k: config.choices(k) for k in DASHBOARD_KNOBS if config.choices(k)}
    assert DASHBOARD_CHOICES["model.norm"] == ("post", "pre")
    a1 = load_paper()["A1"]  # the paper's knob columns read as their keys' types
    assert (a1["heads"], a1["d_k"], a1["dropout"], a1["train_steps"], a1["positional"]) == (1, 512, 0.1, 100000,
                                                                                             "sinusoidal")
    for k in knobs:
        config.get_dotted(config.Config(), k.key)  # every knob is a config key


def test_each_section_checks_its_own_values():
    """Every number key has its range beside it (a Range in its field's metadata), and its section's problem()
    names it: validate is each section's problem(), then the checks across sections."""
    from lightning_tfm.base.knobs import Range

    for sec, keys in config.SCHEMA.items():  # the registered architectures' sections too (rnn)
        section = getattr(config.Config(), sec)
        assert type(section).SECTION == sec and section.problem() is None
        for f in dataclasses.fields(section):
            spec = keys[f.name][0]
            if (spec[1] if isinstance(spec, tuple) and spec[0] == "optional" else spec) in (int, float):
                assert isinstance(f.metadata.get("check"), Range), f"{sec}.{f.name} has no range"
    cfg = config.Config()
    cfg.train.adam_beta2 = 1.0
    assert cfg.train.problem() == "train.adam_beta2=1.0 must be in [0, 1)" and cfg.model.problem() is None
    cfg.model.heads = 0
    assert cfg.model.problem() == "model.heads=0 must be a positive integer, at most 1024"
    cfg.train.lr = 0.0
    with pytest.raises(UserError, match=r"^train.lr=0.0 must be positive, at most 10$"):
        config.check_value("train.lr", 0.0)  # a sweep file's value, on its own
    cfg = config.load_config(SMOKE, ["data.path=/x"], checked=False)
    cfg.decode.max_len_a, cfg.decode.max_len_b = 0.0, 0
    with pytest.raises(UserError, match="decode.max_len_a=0 and decode.max_len_b=0 allow no token"):
        config.validate(cfg)  # a rule across the section's keys


def test_a_sections_state_is_no_key():
    """What a config holds besides its keys (the keys given since a section was made, an architecture's own
    sections, the validation's mark) is declared state, no dataclass field: not in the schema, ``ltfm config
    --keys``, the saved config, the flat keys or the run id's hash."""
    from lightning_tfm.model import registry

    cfg = config.load_config(ROOT / "experiments" / "multi30k-rnn-smoke.yaml", ["data.path=/d"])
    assert cfg._validated is not None and cfg.model.given() == {"arch"} and "rnn" in registry.made_sections(cfg.model)
    names = {"_given", "_sections", "_validated"}
    for sec in config.SCHEMA:
        section = getattr(cfg, sec)
        assert not names & {f.name for f in dataclasses.fields(section)} and not names & set(config.SCHEMA[sec])
    keys = set(config.flatten(cfg)) | set(run_ids.hashed(cfg, corpus="x"))
    assert not any(k.split(".")[-1] in names for k in keys) and not any(n in config.dump_yaml(cfg) for n in names)
    assert config.Config.from_dict(cfg.to_dict()) == cfg  # the state is not compared either
