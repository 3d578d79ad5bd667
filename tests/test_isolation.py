"""No test reads or writes the checkout's own output folders (``results/``, ``results-quick/``, ``data-cache/``,
``reports/build/``, ``wandb/``, ...: conftest's ``OUTPUTS``). The session runs in a stand-in of the checkout
(conftest's ``stand_in``) whose ``results/`` holds a decoy: the run the README's first ``ltfm train`` leaves in a
new user's checkout (issue #44: a Table 2 dry run took it for its Transformer row). A test that reads the default
results folder meets the decoy; one that writes there writes into the stand-in; and the session fails if the
checkout's own folders changed (conftest's ``checkout_untouched``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids
from lightning_tfm.training.runs.run_folder import existing_run_id

import conftest
from conftest import DATA, OUTPUTS, ROOT, SMOKE, changes, plant_decoy, snapshot


def test_the_session_runs_in_a_stand_in_of_the_checkout_not_in_it():
    work = conftest.WORK
    assert Path.cwd() == work != ROOT and not work.is_relative_to(ROOT)
    for name in ("experiments", "sweeps", "lightning_tfm", "Makefile", "reports/reference"):  # read as the checkout's
        assert (work / name).is_symlink() and (work / name).resolve() == (ROOT / name).resolve(), name
    for out in OUTPUTS:  # written as its own
        assert not (work / out).is_symlink() and not (work / out).resolve().is_relative_to(ROOT), out


def test_the_default_results_folder_holds_the_readme_smoke_run_as_a_decoy():
    """What would have caught issue #44: a sweep row of the smoke experiment's config, with the default results
    folder, is taken for the decoy (a sweep trains on in a folder of the same config under another name)."""
    row = config.load_config(SMOKE, {"data.path": str(DATA), "run.study": "mixed", "run.variant": "tfm"})
    decoy = existing_run_id(row)
    assert decoy != run_ids.run_id(row) and decoy.startswith("multi30k-smoke-")
    assert (Path(row.run.results_dir).absolute() / decoy).parent == conftest.WORK / "results"


def test_commands_run_in_the_stand_in(ltfm_here):
    p = ltfm_here("runs", "--json")  # the default results folder: the stand-in's, with the decoy alone
    assert p.returncode == 0, p.stderr
    assert [r["id"] for r in json.loads(p.stdout)] == [d.name for d in (conftest.WORK / "results").iterdir()]


def test_a_change_to_an_output_folder_is_named(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "kept").write_text("x")
    before = snapshot(tmp_path)
    assert changes(before, snapshot(tmp_path)) == []
    run = plant_decoy(tmp_path / "results")
    (tmp_path / "reports" / "build").mkdir(parents=True)
    os.utime(tmp_path / "results" / "kept", ns=(0, 0))
    found = changes(before, snapshot(tmp_path))
    assert f"new: results/{run.name}/summary.json" in found and "new: reports/build" in found
    assert "modified: results/kept" in found
    assert not any("reports/reference" in c for c in found)
