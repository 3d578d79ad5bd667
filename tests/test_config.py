"""The typed config: one schema (the dataclasses), run ids pinned across refactors, plain dicts on disk."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from conftest import ROOT
from lightning_tfm.model.config import ModelConfig
from lightning_tfm.training import config
from lightning_tfm.training.errors import UserError

SMOKE = ROOT / "experiments" / "multi30k-smoke.yaml"


def test_run_id_is_pinned_across_refactors():
    # Pins run ids across refactors of the config code: computed with the dict-based config (before the
    # typed dataclasses). A change here re-trains every existing run folder instead of resuming it.
    assert config.run_id(config.load_config(SMOKE, ["data.path=/x"])) == "multi30k-smoke-9e45a369"
    assert config.run_id(config.load_config(SMOKE, ["data.path=/x", "model.heads=4", "train.adam_eps=1e-8"])) == \
        "multi30k-smoke-d291b654"


def test_plain_dicts_round_trip_in_section_order():
    cfg = config.load_config(SMOKE, ["data.path=/x", "wandb.tags=[a, b]"])
    tree = cfg.to_dict()
    assert list(tree) == ["run", "data", "model", "train", "decode", "wandb", "sweep"]
    assert list(tree["model"]) == [f.name for f in dataclasses.fields(ModelConfig) if f.name != "arch"]  # arch: only when not the default
    assert config.Config.from_dict(tree) == cfg and config.Config.from_dict(yaml.safe_load(config.dump_yaml(cfg))) == cfg
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


def test_table3_knobs_feed_the_report_and_the_dashboard():
    from lightning_tfm.report.table import CSV_KNOBS, KNOBS
    from lightning_tfm.sweep.queue import DASHBOARD_CHOICES, DASHBOARD_KNOBS

    assert [k for _, k in KNOBS] == [k for _, k, _ in config.TABLE3_KNOBS] == list(CSV_KNOBS)
    assert DASHBOARD_KNOBS == tuple(k for _, k, _ in config.TABLE3_KNOBS)[:-1]
    assert DASHBOARD_CHOICES == {"model.positional": ("sinusoidal", "learned"), "model.norm": ("post", "pre")}
    for _, key, _ in config.TABLE3_KNOBS:
        config.get_dotted(config.Config(), key)  # every knob is a config key
