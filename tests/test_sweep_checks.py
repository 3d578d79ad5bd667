"""A sweep read at its own budget and a sweep file checked at load (issue #52, items 5, 8 and 16): ``--status`` of a
5-step sweep sharing its results folder with a 10-step one reads each run at exactly 5 updates, or says there is
no value there; every sampler's and pruner's arguments are checked when the file is loaded (a bad one is one line,
exit 2, before any trial); a FLOPs budget's sentence lengths are range-checked."""
from __future__ import annotations

import json
import math

import optuna
import pytest
import yaml
from pytorch_lightning.loggers import CSVLogger

from lightning_tfm.base import atomic
from lightning_tfm.sweep import Plan, load_sweep

from conftest import SMOKE


def _run(run_dir, vals: dict[int, float], steps: int, attempts: list | None = None, version: int = 0) -> None:
    """A run folder as training leaves it: Lightning's metrics.csv (a validation after u updates at step u - 1; the
    one that ends a training off the validation interval at its last step) and summary.json."""
    logger = CSVLogger(save_dir=str(run_dir), name="logs", version=version)
    for step, ppl in vals.items():
        logger.log_metrics({"dev/loss": math.log(ppl), "dev/ppl": ppl}, step=step)
    logger.save()
    last = vals[max(vals)]
    atomic.write_json(run_dir / "summary.json", {"status": "completed", "steps": steps, "dev_ppl": last,
                                                 "dev_loss": math.log(last), "attempts": attempts or [],
                                                 "config": {"train": {"warmup": 1}}})


def test_status_of_the_shorter_of_two_sweeps_reads_each_run_at_exactly_its_budget(tmp_path, ltfm_here):
    """Item 5: the 10-step sweep trained "a" (validations every 2 updates: steps 1, 3, 5, 7, 9), "b" was trained
    to 5 steps first (its end validation at step 5) then on to 10 (the validation after 6 updates also at step 5).
    The 5-step sweep's --status: "a" has no validation after 5 updates (none, said so), "b" the 5-step one."""
    results = tmp_path / "results"
    sweep_file = tmp_path / "short.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "short", "experiment": str(SMOKE), "seeds": [1],
                                          "overrides": {"train.max_steps": 5}, "variants": {"a": {}, "b": {}}}))
    sweep = load_sweep(sweep_file)
    plan = Plan(sweep, [], data=False)
    ppl = {u: 100.0 / u for u in range(1, 11)}  # the dev PPL after u updates
    a = results / "long-a"
    _run(a, {u - 1: ppl[u] for u in (2, 4, 6, 8, 10)}, 10)
    b = results / "long-b"
    _run(b, {1: ppl[2], 3: ppl[4], 5: ppl[5]}, 5)  # the 5-step training
    five = json.loads((b / "summary.json").read_text())
    _run(b, {5: ppl[6], 7: ppl[8], 9: ppl[10]}, 10, attempts=[five], version=1)  # then on to 10
    study = optuna.create_study(storage=f"sqlite:///{results / 'short.db'}", study_name="short")
    for entry, folder in zip(sweep.entries(), (a, b)):
        trial = study.ask()
        for k, v in {**plan.attrs(entry), "run_dir": str(folder), "steps": 5}.items():
            trial.set_user_attr(k, v)
        study.tell(trial, 0.0)
    p = ltfm_here("sweep", sweep_file, "--status", "--json", f"run.results_dir={results}")
    assert p.returncode == 0, p.stderr
    rows = {r["variant"]: r for r in json.loads(p.stdout)}
    assert rows["a"]["value"] is None and rows["a"]["steps"] == 5, rows["a"]
    assert "holds no validation at step 5" in rows["a"]["note"], rows["a"]
    assert rows["b"]["value"] == pytest.approx(math.log(ppl[5])) and rows["b"]["steps"] == 5, rows["b"]
    from lightning_tfm.sweep.status import run_curve
    assert run_curve(b, 5)[0] == {1: pytest.approx(ppl[2]), 3: pytest.approx(ppl[4]), 5: pytest.approx(ppl[5])}
    assert run_curve(a, 5)[0] == {}


def _space_sweep(path, **top) -> object:
    path.write_text(yaml.safe_dump({"name": "s", "experiment": str(SMOKE), "n_trials": 2,
                                    "space": {"model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}, **top}))
    return path


# Each sampler and pruner type the schema allows, with an argument Optuna takes at build time and refuses only when
# it samples or prunes (or at build time: then it was caught before too); "none" and "curve" have their own checks.
BAD_PLUGINS = [
    ("sampler", {"type": "tpe", "gamma": "x"}, "gamma='x'"),
    ("sampler", {"type": "tpe", "n_ei_candidates": 0}, "n_ei_candidates=0"),
    ("sampler", {"type": "tpe", "seed": 3, "weights": 3}, "weights=3"),
    ("sampler", {"type": "random", "seed": 1, "bogus": 1}, "bogus=1"),
    ("sampler", {"type": "qmc", "qmc_type": "x"}, "qmc_type='x'"),
    ("sampler", {"type": "gp", "n_startup_trials": "x"}, "n_startup_trials='x'"),
    ("sampler", {"type": "cmaes", "sigma0": -1.0}, "cmaes"),
    ("pruner", {"type": "hyperband", "min_resource": "x"}, "min_resource='x'"),
    ("pruner", {"type": "hyperband", "max_resource": 0}, "max_resource=0"),
    ("pruner", {"type": "successive_halving", "reduction_factor": "x"}, "reduction_factor='x'"),
    ("pruner", {"type": "median", "interval_steps": 0}, "interval_steps=0"),
    ("pruner", {"type": "percentile", "percentile": 50, "n_min_trials": "x"}, "n_min_trials='x'"),
    ("pruner", {"type": "threshold", "upper": 1.0, "n_warmup_steps": "x"}, "n_warmup_steps='x'"),
]


@pytest.mark.parametrize("what,spec,named", BAD_PLUGINS, ids=lambda x: x if isinstance(x, str) else x["type"])
def test_a_bad_sampler_or_pruner_argument_is_one_line_at_load(tmp_path, ltfm_here, what, spec, named):
    """Item 8: the file check (``--dry-run``) and ``ltfm sweep`` refuse it in one line naming the argument, before
    any trial: no storage is written."""
    sweep_file = _space_sweep(tmp_path / "s.yaml", **{what: spec})
    results = tmp_path / "results"
    for args in (["--dry-run"], []):
        p = ltfm_here("sweep", sweep_file, *args, f"run.results_dir={results}", f"data.path={tmp_path}")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert p.stderr.startswith(f"ltfm: error: sweep file {str(sweep_file)!r}: {what} {spec['type']}")
        assert named in p.stderr, p.stderr
    assert not results.exists()


@pytest.mark.parametrize("what,spec", [("sampler", {"type": "tpe", "n_startup_trials": 50, "seed": 2,
                                                    "multivariate": True}),
                                       ("sampler", {"type": "gp", "seed": 1}), ("sampler", "qmc"),
                                       ("pruner", {"type": "hyperband", "min_resource": 2}),
                                       ("pruner", {"type": "percentile", "percentile": 25.0}), ("pruner", "curve")])
def test_good_sampler_and_pruner_arguments_pass(tmp_path, ltfm_here, what, spec):
    p = ltfm_here("sweep", _space_sweep(tmp_path / "s.yaml", **{what: spec}), "--dry-run")
    assert p.returncode == 0 and "search-0001" in p.stdout, p.stderr[-2000:]


@pytest.mark.parametrize("key", ["src_len", "tgt_len"])
@pytest.mark.parametrize("value", [1.0e-300, 0.5, 1.0e6, -1.0])
def test_a_flops_budgets_sentence_length_is_range_checked(tmp_path, ltfm_here, key, value):
    """Item 16: ``budget: {equal: flops, src_len: 1.0e-300}`` trained a row of "inf FLOPs, 1 step"."""
    def sweep_file(length):
        path = tmp_path / "v.yaml"
        path.write_text(yaml.safe_dump({"name": "v", "experiment": str(SMOKE), "budget": {"equal": "flops",
                                                                                         key: length},
                                        "variants": {"base": {}, "wide": {"model.d_ff": 64}}}))
        return path

    p = ltfm_here("sweep", sweep_file(value), "--dry-run")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert f"budget.{key} must be a number of tokens from 1 to 65536, not {value}" in p.stderr, p.stderr
    ok = ltfm_here("sweep", sweep_file(1.0), "--dry-run", "--json")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert all(math.isfinite(r["train_flops"]) and r["max_steps"] >= 1 for r in json.loads(ok.stdout))


@pytest.mark.parametrize("step", [2.2250738585e-313, 1e-12])
def test_a_space_step_too_fine_for_a_grid_is_one_line(tmp_path, ltfm_here, step):
    """Found by tests/test_properties.py: a float range's step of 1e-313 ended in decimal's DivisionImpossible
    traceback; a grid of more than 10**9 values is refused in one line."""
    sweep_file = _space_sweep(tmp_path / "s.yaml")
    tree = yaml.safe_load(sweep_file.read_text())
    tree["space"]["model.dropout"]["step"] = step
    sweep_file.write_text(yaml.safe_dump(tree))
    p = ltfm_here("sweep", sweep_file, "--dry-run")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"space model.dropout: step {step} makes more than 1e+09 values from 0.0 to 0.3" in p.stderr, p.stderr


@pytest.mark.parametrize("where", ["sweep", "row"])
@pytest.mark.parametrize("name", ["a" * 300, "a\0b", "b/" * 3000])
def test_an_experiment_that_is_no_path_is_one_line(tmp_path, ltfm_here, where, name):
    """Found by tests/test_properties.py: ``experiment: aaa...`` (300 characters) ended in OSError's "File name too
    long" traceback; the sweep's experiment and a row's own are checked as paths."""
    tree = {"name": "e", "experiment": str(SMOKE), "variants": {"base": {}}}
    if where == "sweep":
        tree["experiment"] = name
    else:
        tree["variants"]["base"]["experiment"] = name
    sweep_file = tmp_path / "e.yaml"
    sweep_file.write_text(yaml.safe_dump(tree))
    p = ltfm_here("sweep", sweep_file, "--dry-run")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "is not a path the file system takes" in p.stderr, p.stderr


@pytest.mark.parametrize("command", [["config"], ["train"], ["prepare"], ["sweep", "--dry-run"], ["sweep", "--status"]])
def test_a_file_argument_that_is_no_path_is_one_line(ltfm_here, command):
    """The sibling on the command line: an experiment or sweep file named by 300 characters is not found, in one
    line (not OSError's traceback)."""
    p = ltfm_here(command[0], "a" * 300, *command[1:])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not found" in p.stderr, p.stderr[-2000:]
