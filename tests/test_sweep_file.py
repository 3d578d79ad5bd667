"""The sweep file typed like the config: a dataclass per section with help beside each field, one validation
(a one-line error naming the file and the key), ``ltfm sweep --keys``; every trial's config derived from the
experiment YAML read once per sweep and validated once; the committed sweeps' run ids unchanged."""
from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from lightning_tfm.base.errors import UserError
from lightning_tfm.sweep import Plan, dry_run, load_sweep, schema, trial_config
from lightning_tfm.sweep.schema import describe_keys
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import ROOT, SMOKE

SECTIONS = {"": schema.SweepFile, "sampler.": schema.SamplerSpec, "pruner.": schema.PrunerSpec,
            "heartbeat.": schema.HeartbeatSpec, "report.": schema.ReportSpec,
            "variants.<name>.": schema.VariantSpec, "space.<section.key>.": schema.DistributionSpec}


def test_every_key_of_every_section_is_listed_with_its_help():
    rows = {key: (kind, default, help_) for key, kind, default, help_ in describe_keys()}
    for head, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            kind, default, help_ = rows[head + f.name]
            assert kind and default and len(help_.split()) >= 3, (head + f.name, rows[head + f.name])
    # the schema is the loader's: defaults, and the keys a section passes on
    assert rows["heartbeat.interval"][1] == "30" and rows["metric"][0] == "dev_loss | dev_ppl | dev_bleu"
    assert rows["name"][1] == "(required)" and rows["seeds"][1] == "[1]"
    for extra in ("sampler.<argument>", "pruner.<argument>", "variants.<name>.<section.key>",
                  "overrides.<section.key>"):
        assert extra in rows
    assert [k for k, *_ in describe_keys("report.")] == ["report.k", "report.min_points", "report.level",
                                                     "report.bootstraps", "report.seed", "report.family"]
    assert schema.REPORT_DEFAULTS == dataclasses.asdict(schema.ReportSpec())
    with pytest.raises(UserError, match="no sweep-file key starts with 'nope'"):
        describe_keys("nope")


def test_sweep_keys_on_the_command_line(ltfm_here):
    p = ltfm_here("sweep", "--keys", "heartbeat.")
    assert p.returncode == 0, p.stderr
    assert [line.split()[0] for line in p.stdout.splitlines()] == ["heartbeat.interval", "heartbeat.grace",
                                                                    "heartbeat.max_retry"]


GOOD = {"name": "s", "experiment": str(SMOKE), "variants": {"base": {}}}
SPACE = {"name": "s", "experiment": str(SMOKE), "space": {"model.dropout": {"type": "float", "low": 0, "high": 0.3}}}


@pytest.mark.parametrize("body,words", [
    ({**GOOD, "heartbeats": {}}, "unknown key 'heartbeats': a sweep file has name"),
    ({**GOOD, "name": 3}, "name must be set to at most 100 letters"),
    ({**GOOD, "metric": "bleu"}, "metric must be one of dev_loss"),
    ({**GOOD, "n_trials": "many"}, "n_trials must be a positive integer"),
    ({**GOOD, "sampler": {"type": "grid"}}, "sampler type must be one of tpe"),
    ({**GOOD, "sampler": {"type": "tpe", "seed": "one"}}, "sampler seed must be an integer from 0"),
    ({**GOOD, "sampler": {"type": "tpe", "n_startup": 3}}, "sampler tpe:"),
    ({**GOOD, "pruner": {"type": "median", "n_warmup": 3}}, "pruner median:"),
    ({**GOOD, "heartbeat": {"intervall": 5}}, "heartbeat: unknown key 'intervall': heartbeat takes interval"),
    ({**GOOD, "heartbeat": {"interval": "5s"}}, "heartbeat.interval must be a positive integer"),
    ({**GOOD, "heartbeat": [5]}, "heartbeat must be a mapping with interval, grace, max_retry"),
    ({**GOOD, "report": {"k": "2x"}}, "report.k must be a number >= 1"),
    ({**GOOD, "report": {"window": 3}}, "report: unknown key 'window'"),
    ({**GOOD, "overrides": {"model.headz": 2}}, "overrides: unknown config key 'model.headz'"),
    ({**GOOD, "variants": {"A1": {"model.headz": 2}}}, "variant A1: unknown config key 'model.headz'"),
    ({**GOOD, "variants": {"A1": {"budget": "big"}}}, "variant A1: budget must be a positive factor"),
    ({**GOOD, "variants": {"A1": {"seeds": 1}}}, "variant A1: seeds must be a non-empty list"),
    ({**SPACE, "space": {"model.dropout": {"type": "float", "low": 0, "high": 0.3, "lowest": 0}}},
     "space model.dropout: unknown field 'lowest'"),
    ({**SPACE, "space": {"model.dropout": {"type": "gaussian"}}}, "space model.dropout must be a mapping with type"),
])
def test_an_unknown_or_mistyped_key_in_each_section_is_one_line(tmp_path, body, words):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(body))
    with pytest.raises(UserError) as e:
        load_sweep(f)
    line = str(e.value)
    assert line.startswith(f"sweep file {str(f)!r}: ") and words in line and "\n" not in line, line


def test_a_bad_sweep_file_stops_the_command_with_exit_2(tmp_path, ltfm_here):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({**GOOD, "heartbeat": {"interval": 5, "grace": 60, "retries": 2}}))
    p = ltfm_here("sweep", f, "--dry-run")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "unknown key 'retries'" in p.stderr


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml")))
def test_dry_run_ids_of_the_committed_sweeps_are_those_of_ltfm_config(name, data_dir):
    """Each row's run id (what resumes its run folder) is `ltfm config` on the base experiment with the sweep's
    overrides, the row's, its seed and its name in the study (``<sweep>-<row>-s<seed>-<hash>``): computed here
    without the plan's code."""
    sweep = load_sweep(ROOT / "sweeps" / f"{name}.yaml")
    plan = Plan(sweep, [f"data.path={data_dir}"], data=False)
    rows = dry_run(sweep, plan, 4)
    assert rows
    for row in rows:
        if row["skipped"]:
            continue
        ov = {**sweep.overrides, "data.path": str(data_dir), **row["overrides"], "run.seed": row["seed"],
              "run.study": sweep.name, "run.variant": row["name"]}
        assert row["run_id"] == run_ids.run_id(config.load_config(row["experiment"], ov)), row
        assert row["run_id"].startswith(f"{sweep.name}-{row['name']}-s{row['seed']}-"), row


def test_smoke_sweep_dry_run_id_on_the_command_line(data_dir, ltfm_here):
    p = ltfm_here("sweep", "sweeps/smoke.yaml", "--dry-run", "--json", f"data.path={data_dir}")
    base = next(r for r in json.loads(p.stdout) if r["name"] == "base")
    overrides = [f"{k}={'null' if v is None else v}"
                 for k, v in load_sweep(ROOT / "sweeps/smoke.yaml").overrides.items()]
    c = ltfm_here("config", SMOKE, *overrides, f"data.path={data_dir}", "run.study=smoke", "run.variant=base",
             f"run.seed={base['seed']}")
    assert c.stdout.startswith(f"# run id: {base['run_id']} "), (c.stdout[:200], base)


def test_the_experiment_is_read_once_per_sweep_and_each_config_validated_once(monkeypatch, data_dir):
    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    reads, checks = [], []
    read_yaml, check_finite = config.read_yaml, config._check_finite
    monkeypatch.setattr(config, "read_yaml", lambda path: reads.append(path) or read_yaml(path))
    monkeypatch.setattr(config, "_check_finite", lambda cfg: checks.append(cfg) or check_finite(cfg))
    plan = Plan(sweep, [f"data.path={data_dir}"])
    entries = sweep.entries()
    configs = [plan.config(e) for e in entries]          # the worker's, the dry run's
    for e in entries:
        trial_config(sweep, e, checked=False)            # the reports'
    assert reads == [sweep.experiment]
    assert len(checks) == 1 + len(entries)                # the base, then each trial once
    # the trial process: `ltfm train` loads its config, then train() checks what it is given: no second check
    checks.clear()
    cfg = config.load_config(SMOKE, [f"data.path={data_dir}"])
    config.validate(cfg)
    assert len(checks) == 1
    # a config changed after it passed is checked again
    cfg.model.d_model = 33
    with pytest.raises(UserError, match="d_model=33 must be even"):
        config.validate(cfg)
    assert configs[0].run.variant == entries[0].name
