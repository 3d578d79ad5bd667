"""``ltfm runs RUN --wandb`` reads a run's W&B files back only when they are what they claim (issue #52, item 14): a
regular ``run-<id>.wandb`` file holding run ``<id>``, its tables regular files in its ``files/``. A copied run folder
whose segment is a folder or a symbolic link (looping, or to another folder's file) showed the run of the folder it
was copied from (found through its summary's ``wandb_dir``); now each is one line naming the file and what it is."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from test_runs import wandb_run  # noqa: F401  (a fixture: a real offline W&B run, resumed once)


@pytest.fixture
def copy(wandb_run, tmp_path):  # noqa: F811
    """A copy of the run folder (its summary still names the original's W&B folder), and its segments' files."""
    from lightning_tfm.training.tracking import wandb_files

    run_dir, _ = wandb_run
    dest = tmp_path / "results" / run_dir.name
    shutil.copytree(run_dir, dest, symlinks=True)
    return dest, wandb_files.run_files(dest, json.loads((dest / "summary.json").read_text()))


def error(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: ") and "Traceback" not in p.stderr, p.stderr
    assert not p.stdout.strip(), p.stdout  # no run shown
    return lines[0]


def test_the_copy_reads_its_own_files(copy, ltfm_here):
    dest, files = copy
    assert all(str(f).startswith(str(dest)) for f in files) and len(files) == 2
    p = ltfm_here("runs", dest, "--wandb")
    assert p.returncode == 0 and str(dest / "wandb") in p.stdout, p.stderr


@pytest.mark.parametrize("kind", ["folder", "loop", "link-to-the-original", "link-to-nothing"])
def test_a_segment_that_is_not_a_file_of_this_run_is_one_line(kind, copy, wandb_run, ltfm_here):  # noqa: F811
    dest, files = copy
    original = wandb_run[0] / files[0].relative_to(dest)
    target = files[0]
    target.unlink()
    if kind == "folder":
        target.mkdir()
    elif kind == "loop":
        os.symlink(target.name, target)
    elif kind == "link-to-the-original":
        os.symlink(original, target)
    else:
        os.symlink(target.parent / "gone.wandb", target)
    line = error(ltfm_here("runs", dest, "--wandb"))
    what = {"folder": "is a folder", "loop": "is a symbolic link that loops",
            "link-to-the-original": f"is a symbolic link to {original}",
            "link-to-nothing": "is a symbolic link to nothing"}[kind]
    assert f"{target} {what}, not a W&B file of this run" in line, line


def test_a_file_holding_another_run_is_one_line(copy, ltfm_here, tmp_path):
    dest, files = copy
    other = files[0].parent.with_name(files[0].parent.name.rsplit("-", 1)[0] + "-zzother1")
    # a folder named for another run id, beside, holding this run's file: in the folder's own wandb/, no id file
    (dest / "wandb_id.txt").unlink()
    summary = json.loads((dest / "summary.json").read_text())
    for key in ("wandb_run_id", "wandb_dir"):
        summary.pop(key, None)
    (dest / "summary.json").write_text(json.dumps(summary))
    shutil.rmtree(files[1].parent)
    files[0].parent.rename(other)
    (other / files[0].name).rename(other / "run-zzother1.wandb")
    line = error(ltfm_here("runs", dest, "--wandb"))
    assert f"{other / 'run-zzother1.wandb'} holds W&B run" in line and "not zzother1" in line, line


def test_a_table_file_that_is_a_link_elsewhere_is_one_line(copy, ltfm_here, tmp_path):
    dest, files = copy
    tables = [p for p in (files[0].parent / "files").rglob("*.json") if "table" in str(p)]
    assert tables, sorted(map(str, (files[0].parent / "files").rglob("*")))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"columns": ["a"], "data": [["not this run's"]]}))
    tables[0].unlink()
    os.symlink(elsewhere, tables[0])
    line = error(ltfm_here("runs", dest, "--wandb"))
    assert "is not a file in" in line and "not this run's" not in line, line
