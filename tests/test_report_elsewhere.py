"""``ltfm report SWEEP`` with no completed run of the sweep in the results folder it reads, while a folder beside
it has some (``make ablation QUICK=1`` writes results-quick/; #52 item 20): the one-line error names that folder,
how many completed runs it holds and the command that reads it (``--results results-quick``); exit 2, nothing
written. No training: the runs are summary.json files as a run writes them."""
from __future__ import annotations

import json
import shlex

import pytest

from conftest import ROOT, plant_decoy

SWEEP = ROOT / "sweeps" / "table3-cpu.yaml"


def completed(folder, name, study="table3-cpu", status="completed"):
    run = folder / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"run_id": name, "status": status, "config": {
        "run": {"study": study, "variant": "base", "seed": 1}}, "dev_ppl": 50.0}))


@pytest.mark.parametrize("results", ["missing", "decoy", "given"])
def test_no_completed_run_here_names_the_folder_that_has_them(ltfm_here, tmp_path, results):
    for i in range(3):
        completed(tmp_path / "results-quick", f"quick-{i}")
    completed(tmp_path / "results-quick", "failed", status="failed")
    completed(tmp_path / "other", "x", study="another-sweep")  # runs of another sweep: not named
    args = []
    if results == "decoy":
        plant_decoy(tmp_path / "results")  # the README's first `ltfm train`: not a run of the sweep
    elif results == "given":
        (tmp_path / "mine").mkdir()
        args = ["--results", "mine"]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    p = ltfm_here("report", SWEEP, *args, "--out", tmp_path / "out", cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    line = p.stderr.strip()
    assert line.startswith("ltfm: error: no ") and "sweep" in line and "table3-cpu" in line, line
    assert line.endswith(f"results-quick/ has 3 completed run(s) of it: ltfm report {shlex.quote(str(SWEEP))} "
                         "--results results-quick"), line
    assert "other" not in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_without_runs_elsewhere_the_way_out_is_to_run_the_sweep(ltfm_here, tmp_path):
    p = ltfm_here("report", SWEEP, "--out", tmp_path / "out", cwd=tmp_path)
    assert p.returncode == 2 and "results-quick" not in p.stderr and "run `ltfm sweep" in p.stderr, p.stderr
