"""The Table 2 sweep: rows of different architectures in one sweep (a variant's own ``experiment:``) and the same
training budget for every row in training FLOPs (``budget: {equal: flops}``): the one-line errors, the mixed dry
run (both architectures, their parameter counts and run ids), the equal-FLOPs arithmetic against the
architectures' own ``train_flops_per_token``, and sweeps/table2-cpu.yaml's rows as its comment describes them.
Nothing here trains (sweeps/table2-smoke.yaml is trained by the report's tests)."""
from __future__ import annotations

import json

import pytest
import yaml

from lightning_tfm.base.errors import UserError
from lightning_tfm.bench.speed import DEFAULTS
from lightning_tfm.model.config import ModelConfig
from lightning_tfm.model.rnn import RNN, RNNConfig
from lightning_tfm.model.transformer import Transformer
from lightning_tfm.sweep import Plan, dry_run, load_sweep, trial_config
from lightning_tfm.sweep.schema import describe_keys
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import ROOT, SMOKE

RNN_SMOKE = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"


def given(data_dir, tmp_path, *more: str) -> list[str]:
    """A plan's command-line overrides: the data, and a results folder of the test's own (a dry run names the run
    folder a row would train in, found in the results folder: never the checkout's, where a user's own run of
    the same config would become the row's)."""
    return [f"data.path={data_dir}", f"run.results_dir={tmp_path / 'results'}", *more]


def write(tmp_path, body: dict, name: str = "s.yaml"):
    f = tmp_path / name
    f.write_text(yaml.safe_dump(body, sort_keys=False))
    return f


MIXED = {"name": "mixed", "experiment": str(SMOKE), "budget": {"equal": "flops", "src_len": 12.5, "tgt_len": 14.0},
         "variants": {"tfm": {"family": "transformer"},
                      "rnn": {"family": "rnn", "experiment": str(RNN_SMOKE)},
                      "rnn-wide": {"family": "rnn", "experiment": str(RNN_SMOKE), "rnn.dec_hidden": 256, "budget": 2}}}


# -------------------------------------------------------------------------------------- a variant's experiment
@pytest.mark.parametrize("variant,words", [
    ({"experiment": "nowhere.yaml"}, "variant rnn: experiment 'nowhere.yaml' not found"),
    ({"experiment": 3}, "variant rnn: experiment must be an experiment YAML"),
    ({"experiment": str(RNN_SMOKE), "train.max_steps": 10}, "variant rnn: train.max_steps is set by budget.equal"),
])
def test_a_bad_variant_experiment_is_one_line_naming_the_variant(tmp_path, variant, words):
    f = write(tmp_path, {**MIXED, "variants": {"tfm": {}, "rnn": variant}})
    with pytest.raises(UserError) as e:
        load_sweep(f)
    line = str(e.value)
    assert line.startswith(f"sweep file {str(f)!r}: ") and words in line and "\n" not in line, line


@pytest.mark.parametrize("budget,words", [
    ({"equal": "time"}, "budget.equal must be one of steps, flops"),
    ({"equal": "flops", "src_len": 0}, "budget.src_len must be a number of tokens from 1 to 65536"),
    ({"per": "row"}, "budget: unknown key 'per'"),
])
def test_a_bad_budget_section_is_one_line(tmp_path, budget, words):
    f = write(tmp_path, {**MIXED, "budget": budget})
    with pytest.raises(UserError, match=words):
        load_sweep(f)


def test_a_transformer_knob_on_a_row_of_another_architecture_is_refused_before_any_trial(tmp_path, data_dir):
    f = write(tmp_path, {**MIXED, "variants": {"tfm": {}, "rnn": {"experiment": str(RNN_SMOKE), "model.heads": 2}}})
    with pytest.raises(UserError, match="variant rnn: model.heads does not apply to model.arch=rnn"):
        Plan(load_sweep(f), given(data_dir, tmp_path), data=False)


def test_a_row_on_another_corpus_is_refused(tmp_path, data_dir):
    """Rows of one sweep share the prepared corpus and its BPE vocabulary: a row whose own experiment reads other
    data is a one-line error naming the key, unless the row sets that key itself."""
    other = yaml.safe_load(RNN_SMOKE.read_text())
    other["data"]["vocab_size"] = 2000
    exp = write(tmp_path, other, "rnn-other.yaml")
    f = write(tmp_path, {**MIXED, "variants": {"tfm": {}, "rnn": {"experiment": str(exp)}}})
    with pytest.raises(UserError, match=r"variant rnn: its experiment's data.vocab_size \(2000\) is not the sweep "
                                        r"experiment's \(1000\)"):
        Plan(load_sweep(f), given(data_dir, tmp_path), data=False)
    f = write(tmp_path, {**MIXED, "variants": {"tfm": {}, "rnn": {"experiment": str(exp), "data.vocab_size": 1000}}})
    Plan(load_sweep(f), given(data_dir, tmp_path), data=False)


def test_each_experiment_is_read_once_per_sweep(monkeypatch, tmp_path, data_dir):
    reads = []
    read_yaml = config.read_yaml
    monkeypatch.setattr(config, "read_yaml", lambda path: reads.append(path) or read_yaml(path))
    sweep = load_sweep(write(tmp_path, MIXED))
    plan = Plan(sweep, given(data_dir, tmp_path), data=False)
    for e in sweep.entries():
        plan.config(e)
        trial_config(sweep, e, checked=False)
    assert sorted(map(str, reads)) == sorted([str(SMOKE), str(RNN_SMOKE)])


def test_the_keys_are_listed(ltfm_here):
    rows = {key: (kind, default) for key, kind, default, _ in describe_keys()}
    assert rows["variants.<name>.experiment"] == ("str or null", "null")
    assert rows["budget.equal"] == ("steps | flops", "steps")
    assert [k for k, *_ in describe_keys("budget.")] == ["budget.equal", "budget.src_len", "budget.tgt_len"]
    p = ltfm_here("sweep", "--keys", "budget.")
    assert p.returncode == 0 and p.stdout.split()[0] == "budget.equal", p.stderr


# ------------------------------------------------------------------------------------------ the mixed dry run
def test_mixed_dry_run_lists_both_architectures_with_params_steps_flops_and_run_ids(tmp_path, data_dir, ltfm_here):
    sweep = load_sweep(write(tmp_path, MIXED))
    plan = Plan(sweep, given(data_dir, tmp_path), data=False)
    rows = {r["name"]: r for r in dry_run(sweep, plan, None)}
    assert {n: r["arch"] for n, r in rows.items()} == {"tfm": "transformer", "rnn": "rnn", "rnn-wide": "rnn"}
    for name, r in rows.items():
        assert not r["skipped"] and isinstance(r["params"], int) and r["params"] > 0, r
        # the run id, computed here without the plan's code: the row's own experiment with the trial's overrides
        exp = ROOT / "experiments" / ("multi30k-smoke.yaml" if name == "tfm" else "multi30k-rnn-smoke.yaml")
        assert r["experiment"] == str(exp)
        ov = {"data.path": str(data_dir), **r["overrides"], "run.seed": r["seed"], "run.study": "mixed",
              "run.variant": name}
        assert r["run_id"] == run_ids.run_id(config.load_config(exp, ov)), r
        assert r["run_id"].startswith(f"mixed-{name}-s1-")
        assert r["train_flops"] == pytest.approx(r["max_steps"] * r["flops_per_step"])
    # equal FLOPs: every row of budget 1 spends the base's (up to the rounding of its steps)
    base = rows["tfm"]["train_flops"]
    assert rows["rnn"]["train_flops"] == pytest.approx(base, rel=0.5 / rows["rnn"]["max_steps"])
    assert rows["rnn-wide"]["train_flops"] == pytest.approx(2 * base, rel=0.5 / rows["rnn-wide"]["max_steps"])
    p = ltfm_here("sweep", write(tmp_path, MIXED), "--dry-run", "--json", *given(data_dir, tmp_path))
    assert p.returncode == 0, p.stderr
    assert {r["name"]: r["max_steps"] for r in json.loads(p.stdout)} == {n: r["max_steps"] for n, r in rows.items()}


def test_equal_flops_steps_are_the_architectures_own_count(tmp_path, data_dir):
    """train.max_steps = round(base steps x base FLOPs per step / row FLOPs per step), FLOPs per step =
    train_flops_per_token at the file's lengths x target tokens per step: checked against the models' classes."""
    sweep = load_sweep(write(tmp_path, MIXED))
    plan = Plan(sweep, given(data_dir, tmp_path, "train.max_steps=40"), data=False)
    tfm = ModelConfig(layers=2, d_model=64, d_ff=128, heads=4, d_k=16, d_v=16)  # experiments/multi30k-smoke.yaml
    rnn = RNNConfig(emb_size=64, enc_hidden=64, dec_hidden=128, attention_size=64, dropout=0.1)  # its RNN's
    S, T, V = 12.5, 14.0, 1000
    f_tfm = Transformer.train_flops_per_token(tfm, V, S, T) * 2048     # 2,048 target tokens a step, both
    f_rnn = RNN.train_flops_per_token(rnn, V, S, T) * 2048
    wide = RNNConfig(emb_size=64, enc_hidden=64, dec_hidden=256, attention_size=64, dropout=0.1)
    f_wide = RNN.train_flops_per_token(wide, V, S, T) * 2048
    steps = {e.name: plan.max_steps(e) for e in sweep.entries()}
    assert steps == {"tfm": 40, "rnn": round(40 * f_tfm / f_rnn), "rnn-wide": round(2 * 40 * f_tfm / f_wide)}
    assert steps["rnn"] != 40 and steps["rnn-wide"] != steps["rnn"]  # the arithmetic is not the identity here
    rnn_row = next(e for e in sweep.entries() if e.name == "rnn")
    assert plan.config(rnn_row).train.max_steps == steps["rnn"]  # what the trial trains
    # the default lengths are ltfm bench's, the report's default too
    sweep = load_sweep(write(tmp_path, {**MIXED, "budget": {"equal": "flops"}}, "d.yaml"))
    plan = Plan(sweep, given(data_dir, tmp_path, "train.max_steps=40"), data=False)
    S, T = DEFAULTS["src_len"], DEFAULTS["tgt_len"]
    ratio = Transformer.train_flops_per_token(tfm, V, S, T) / RNN.train_flops_per_token(rnn, V, S, T)
    assert plan.max_steps(next(e for e in sweep.entries() if e.name == "rnn")) == round(40 * ratio)


def test_without_a_budget_section_rows_train_their_steps_as_before(tmp_path, data_dir):
    body = {**MIXED}
    del body["budget"]
    sweep = load_sweep(write(tmp_path, body))
    assert sweep.budget["equal"] == "steps"
    plan = Plan(sweep, given(data_dir, tmp_path), data=False)
    # a row of its own experiment trains that experiment's steps, its budget factor on them
    assert {e.name: plan.max_steps(e) for e in sweep.entries()} == {"tfm": 200, "rnn": 200, "rnn-wide": 400}
    table3 = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    plan = Plan(table3, given(data_dir, tmp_path), data=False)
    assert {e.name: plan.max_steps(e) for e in table3.entries() if e.name in ("base", "big")} == \
        {"base": 600, "big": 1800}
    assert plan.grid_key(table3.entries()[0]).startswith("base/seed1/steps600/")


# ------------------------------------------------------------------------------------ the committed Table 2 files
def test_table2_cpu_rows(data_dir, tmp_path):
    sweep = load_sweep(ROOT / "sweeps" / "table2-cpu.yaml")
    assert sweep.budget["equal"] == "flops"
    plan = Plan(sweep, given(data_dir, tmp_path), data=False)
    rows = dry_run(sweep, plan, None)
    assert [(r["name"], r["seed"]) for r in rows] == [(n, s) for n in ("transformer", "rnn", "rnn-params")
                                                      for s in (1, 2, 3)]
    by = {r["name"]: r for r in rows}
    assert by["transformer"]["arch"] == "transformer" and by["rnn"]["arch"] == by["rnn-params"]["arch"] == "rnn"
    assert by["transformer"]["max_steps"] == 600
    # one RNN at the Transformer's parameter count (within 5%)
    assert abs(by["rnn-params"]["params"] / by["transformer"]["params"] - 1) < 0.05, by
    for name in ("rnn", "rnn-params"):
        assert by[name]["train_flops"] == pytest.approx(by["transformer"]["train_flops"], rel=0.01)
        cfg = plan.config(next(e for e in sweep.entries() if e.name == name))
        assert cfg.train.lr_schedule == "plateau"
    for e in sweep.entries():
        cfg = plan.config(e)
        assert cfg.decode.beam_size == 4 and cfg.data.test_split == "test_2016_flickr"
    assert {name: bleu_points(plan.config(next(e for e in sweep.entries() if e.name == name)))
            for name in by} == {"transformer": [100, 200, 300, 400, 500, 600], "rnn": [50, 100, 150, 200],
                                "rnn-params": [100, 200, 300, 400, 500, 600]}
    # the rnn row validates twice as often, its plateau patience so that the rate decays after the same stalled
    # steps as its experiment's ((patience + 1) x validation interval: the (patience + 1)-th stalled one decays)
    rnn = plan.config(next(e for e in sweep.entries() if e.name == "rnn"))
    own = config.load_config(ROOT / "experiments" / "table2-cpu-rnn.yaml", {"data.path": str(data_dir)})
    assert (rnn.train.lr_patience + 1) * rnn.train.val_every_steps == \
        (own.train.lr_patience + 1) * own.train.val_every_steps == 200
    assert {plan.config(e).decode.dev_bleu_subset for e in sweep.entries()} == {200}


def bleu_points(cfg) -> list[int]:
    """The steps at which a run of ``cfg`` logs dev BLEU (training/lit.py's DevBleu: a validation step that is a
    multiple of decode.dev_bleu_every_steps; the closing validation at max_steps too when it is one)."""
    every, val = cfg.decode.dev_bleu_every_steps, cfg.train.val_every_steps
    return [s for s in range(val, cfg.train.max_steps + 1, val) if every and s % every == 0]


def test_table2_smoke_is_a_mixed_sweep_of_a_handful_of_steps(data_dir, tmp_path):
    sweep = load_sweep(ROOT / "sweeps" / "table2-smoke.yaml")
    plan = Plan(sweep, given(data_dir, tmp_path), data=False)
    rows = dry_run(sweep, plan, None)
    assert {r["arch"] for r in rows} == {"transformer", "rnn"} and len(rows) == 2
    assert all(not r["skipped"] and r["max_steps"] <= 60 for r in rows), rows
    # every row logs a dev-BLEU curve (two validations or more): the report's claim (b) reads it
    for e in sweep.entries():
        assert len(bleu_points(plan.config(e))) >= 2, e.name
