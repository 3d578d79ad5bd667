"""Run folders named after their row: a sweep trial's run id is ``<sweep>-<variant>-s<seed>-<hash>``, a plain
``ltfm train`` keeps ``<run.name>-<hash>``, and a sweep finds an earlier run of the same config under another name
(the name every trial had before, ``<run.name>-<hash>``; another sweep's row defined the same way) and trains on
there instead of training again. The slow tests run real smoke-scale sweeps (``ltfm sweep``, a few seconds a trial).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import optuna
import pytest

from conftest import SMOKE, ltfm, write_sweep
from lightning_tfm.training import config, run_folder
from lightning_tfm.training.config import load_config
from lightning_tfm.training.run_id import config_hash, run_id
from lightning_tfm.training.run_folder import existing_run_id

NO_WANDB = {"WANDB_MODE": "disabled"}  # the W&B run costs seconds per trial; the names are what is tested here


def trial_cfg(results: Path, **overrides) -> config.Config:
    """A config as a sweep trial of row B1 (seed 3) of sweep ``rows`` has it."""
    return load_config(SMOKE, {"data.path": "/x", "run.results_dir": str(results), "run.study": "rows",
                               "run.variant": "B1", "run.family": "B", "run.seed": 3, **overrides})


def write_run(folder: Path, cfg: config.Config, steps: int | None = 10) -> Path:
    """A run folder as ``ltfm train`` leaves it: its config.yaml and (unless ``steps`` is None) its summary."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config.saved_yaml(cfg))
    if steps is not None:
        (folder / "summary.json").write_text(json.dumps({"run_id": folder.name, "status": "completed",
                                                         "steps": steps}))
    return folder


# ------------------------------------------------------------------------------------------------------------
# The names (no training)
# ------------------------------------------------------------------------------------------------------------
def test_a_trial_is_named_after_its_row_and_seed_and_a_plain_run_keeps_its_id(tmp_path):
    cfg = trial_cfg(tmp_path)
    digest = config_hash(cfg)
    assert run_id(cfg) == f"rows-B1-s3-{digest}"
    # the same config outside a sweep: the same hash (the bookkeeping is not hashed), the plain name
    plain = load_config(SMOKE, {"data.path": "/x", "run.results_dir": str(tmp_path), "run.seed": 3})
    assert run_id(plain) == f"multi30k-smoke-{digest}"
    assert run_id(load_config(SMOKE, ["data.path=/x"])) == "multi30k-smoke-9e45a369"  # pinned by test_config too
    # another config is another folder; run.id, when set, is the folder
    assert run_id(trial_cfg(tmp_path, **{"model.heads": 2})) not in (run_id(cfg), f"rows-B1-s3-{digest}")
    assert run_id(trial_cfg(tmp_path, **{"run.seed": 4})).startswith("rows-B1-s4-")
    assert run_id(trial_cfg(tmp_path, **{"run.id": "mine"})) == "mine"


@pytest.mark.parametrize("study,variant", [("my sweep/../x", "a:b\\c"), ("..", "~v"), ("-s", ".hidden")])
def test_odd_study_and_variant_names_still_make_one_plain_folder_name(tmp_path, study, variant):
    cfg = trial_cfg(tmp_path, **{"run.study": study, "run.variant": variant})  # validated: check_run_id passes
    rid = run_id(cfg)
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*-[A-Za-z0-9_][A-Za-z0-9._-]*-s3-[0-9a-f]{8}", rid), rid
    assert (tmp_path / rid).parent == tmp_path


def test_an_earlier_run_of_the_same_config_under_another_name_is_found(tmp_path):
    cfg = trial_cfg(tmp_path)
    own, digest = run_id(cfg), config_hash(cfg)
    legacy = f"multi30k-smoke-{digest}"
    assert existing_run_id(cfg) == own  # nothing yet: its own name
    write_run(tmp_path / f"impostor-{digest}", trial_cfg(tmp_path, **{"model.heads": 2}), steps=50)
    write_run(tmp_path / legacy, cfg, steps=None)  # a config.yaml alone holds no run
    assert existing_run_id(cfg) == own
    (tmp_path / legacy / "checkpoints").mkdir()
    (tmp_path / legacy / "checkpoints" / "last.ckpt").write_bytes(b"")  # a checkpoint is a run
    assert existing_run_id(cfg) == legacy
    # of several, the one trained furthest: here another sweep's row of the same config (as
    # sweeps/table3-cpu-continued.yaml's rows are sweeps/table3-cpu.yaml's), with its own budget
    protocol = trial_cfg(tmp_path, **{"run.study": "protocol", "train.max_steps": 30})
    write_run(tmp_path / run_id(protocol), protocol, steps=30)
    assert run_id(protocol) == f"protocol-B1-s3-{digest}" and existing_run_id(cfg) == run_id(protocol)
    # its own folder holding a run comes first
    write_run(tmp_path / own, cfg, steps=5)
    assert existing_run_id(cfg) == own
    assert existing_run_id(trial_cfg(tmp_path, **{"run.id": "mine"})) == "mine"


def test_a_folder_being_trained_now_is_a_run(tmp_path):
    cfg = trial_cfg(tmp_path)
    legacy = write_run(tmp_path / f"multi30k-smoke-{config_hash(cfg)}", cfg, steps=None)
    assert existing_run_id(cfg) == run_id(cfg)
    with run_folder.RunLock(legacy, legacy.name):  # its first attempt has not written its summary yet
        assert existing_run_id(cfg) == legacy.name
    assert existing_run_id(cfg) == run_id(cfg)


# ------------------------------------------------------------------------------------------------------------
# Real sweeps
# ------------------------------------------------------------------------------------------------------------
def sweep(tmp_path: Path, name: str, variants: dict, results: Path, data_dir: Path, *args, storage: str | None = None):
    path = write_sweep(tmp_path / f"{name}.yaml", name, variants)
    p = ltfm("sweep", path, f"data.path={data_dir}", f"run.results_dir={results}", *args,
             *(["--storage", storage] if storage else []), env=NO_WANDB)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    db = storage or f"sqlite:///{results / f'{name}.db'}"
    return p, {(t.user_attrs["variant"], t.user_attrs["seed"]): t
               for t in optuna.load_study(study_name=name, storage=db).get_trials()}


def runs_in(results: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "summary.json").read_text()) for d in results.iterdir()
            if (d / "summary.json").is_file()}


def versions(run_dir: Path) -> int:
    return len(list(run_dir.glob("logs/version_*")))


def run_folders(results: Path) -> set[str]:
    return {d.name for d in results.iterdir() if (d / "config.yaml").is_file()}


@pytest.mark.slow
def test_sweep_folders_are_named_by_row_and_seed_and_runs_under_their_old_names_are_taken_over(tmp_path, data_dir):
    """A sweep names its folders by row and seed; renamed as the version that named every trial
    ``<run.name>-<hash>`` left them, they are taken over by a re-run of the sweep (on a fresh study: the old one
    would not queue its finished rows at all), the finished one as done, the unfinished one resumed. (Another
    sweep's row of the same config, as sweeps/table3-cpu-continued.yaml's, is found the same way:
    test_an_earlier_run_of_the_same_config_under_another_name_is_found.)"""
    results = tmp_path / "results"
    rows = {"base": {}, "D1": {"model.dropout": 0.0, "seeds": [2]}}
    _, trials = sweep(tmp_path, "rows", rows, results, data_dir, "train.max_steps=10")
    runs = runs_in(results)
    assert sorted(re.sub(r"-[0-9a-f]{8}$", "", n) for n in runs) == ["rows-D1-s2", "rows-base-s1"]
    for name, summary in runs.items():
        assert name.endswith(f"-{config_hash(load_config(results / name / 'config.yaml'))}")
        assert summary["run_id"] == name and summary["status"] == "completed"
        a = trials[(summary["config"]["run"]["variant"], summary["config"]["run"]["seed"])].user_attrs
        assert a["run_id"] == name and Path(a["run_dir"]).name == name
    listed = ltfm("runs", results)
    assert listed.returncode == 0 and all(name in listed.stdout for name in runs), listed.stdout
    by_row = {re.sub(r"-[0-9a-f]{8}$", "", n): results / n for n in runs}

    # both folders as the earlier version named them
    legacy = {}
    for row in ("rows-base-s1", "rows-D1-s2"):
        new = by_row[row]
        old = results / f"multi30k-smoke-{config_hash(load_config(new / 'config.yaml'))}"
        shutil.move(new, old)
        summary = json.loads((old / "summary.json").read_text())
        (old / "summary.json").write_text(json.dumps({**summary, "run_id": old.name, "run_dir": str(old)}))
        legacy[row] = old
    finished_at = json.loads((legacy["rows-base-s1"] / "summary.json").read_text())["finished_at"]
    before = run_folders(results)

    rows["D1"]["budget"] = 2  # D1 unfinished at the new budget (20 steps); base finished (10)
    p, again = sweep(tmp_path, "rows", rows, results, data_dir, "train.max_steps=10",
                     storage=f"sqlite:///{tmp_path / 'fresh.db'}")
    assert run_folders(results) == before  # no folder of its own for a row that has one under the old name
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in again.values()), p.stdout
    base, d1 = again[("base", 1)], again[("D1", 2)]
    assert Path(base.user_attrs["run_dir"]) == legacy["rows-base-s1"] and Path(d1.user_attrs["run_dir"]) == legacy["rows-D1-s2"]
    # base: done, not trained again
    summary = json.loads((legacy["rows-base-s1"] / "summary.json").read_text())
    assert summary["finished_at"] == finished_at and versions(legacy["rows-base-s1"]) == 1
    assert "already completed" in Path(base.user_attrs["log"]).read_text()
    assert base.value == pytest.approx(summary["dev_loss"])
    # D1: resumed from its step-10 checkpoint in its folder, to 20 steps; its trial process trained there
    summary = json.loads((legacy["rows-D1-s2"] / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["status"] == "completed" and versions(legacy["rows-D1-s2"]) == 2
    assert sorted(d1.intermediate_values) == [10, 20]
    assert load_config(legacy["rows-D1-s2"] / "config.yaml").run.id == legacy["rows-D1-s2"].name
