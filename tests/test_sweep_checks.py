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

from conftest import SMOKE
from lightning_tfm.sweep import Plan, load_sweep
from lightning_tfm.training import atomic


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
