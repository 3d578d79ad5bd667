"""A reference run across sessions (reports/reference/carry.sh: ``make reference-carry``, and ``make reference``
restoring): a stopped sweep packed without checkpoints, unpacked into an empty results folder on another
machine, goes on without training a completed trial again, and reads back as the same report; a pack while a
trial trains, and an unpack over a study, are refused in one line (exit 2) with nothing written."""
from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import tarfile

import pytest

from conftest import ROOT, ltfm

CARRY = ROOT / "reports" / "reference" / "carry.sh"


def carry(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CARRY), *map(str, args)], capture_output=True, text=True, timeout=300)


def summaries(results) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in results.glob("rep-*/summary.json")}


@pytest.mark.slow  # trains a row
def test_a_carried_sweep_goes_on_elsewhere_without_training_a_completed_trial_again(swept, data_dir, tmp_path):
    here = tmp_path / "here"
    shutil.copytree(swept["results"], here)
    pack = tmp_path / "rep-carry.tar.gz"
    p = carry("save", pack, here, "rep")
    assert p.returncode == 0 and "3 completed runs" in p.stdout, p.stdout + p.stderr
    with tarfile.open(pack) as tar:
        names = tar.getnames()
    assert "rep.db" in names and not any("checkpoints" in n or n.endswith("tokenizer.json") for n in names), names
    assert pack.stat().st_size < 2_000_000  # committable: no checkpoints

    there = tmp_path / "there"  # another machine: an empty results folder
    p = carry("restore", pack, there, "rep")
    assert p.returncode == 0 and "3 completed runs" in p.stdout, p.stdout + p.stderr
    done = summaries(there)
    assert done == {k: v for k, v in summaries(here).items() if json.loads(v).get("status") == "completed"}
    status = ltfm("sweep", swept["sweep"], "--status", "--json", f"run.results_dir={there}")
    rows = {(r["variant"], r["state"]) for r in json.loads(status.stdout)}
    assert {("base", "complete"), ("A1", "complete"), ("prenorm", "complete")} <= rows, rows

    a = ltfm("report", swept["sweep"], "--results", here, "--out", tmp_path / "a")
    b = ltfm("report", swept["sweep"], "--results", there, "--out", tmp_path / "b")
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    assert (tmp_path / "a" / "table3.csv").read_text() == (tmp_path / "b" / "table3.csv").read_text()

    p = ltfm("sweep", swept["sweep"], f"data.path={data_dir}", f"run.results_dir={there}")  # goes on: D1 is new
    assert p.returncode in (0, 1), p.stdout[-3000:] + p.stderr[-3000:]  # 1: the crashing row fails again
    assert "D1 seed 1: completed" in p.stdout and "worker done: 1 completed" in p.stdout, p.stdout  # D1 alone
    after = summaries(there)
    assert all(after[k] == v for k, v in done.items()), "a completed trial was trained again"
    assert not any((there / k / "checkpoints").exists() for k in done)


def test_carry_refuses_a_training_sweep_and_an_unpack_over_a_study(swept, tmp_path):
    here = tmp_path / "here"
    shutil.copytree(swept["results"], here)
    pack = tmp_path / "c.tar.gz"

    p = carry("save", pack, tmp_path / "nothing", "rep")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "nothing to carry" in p.stderr, p.stderr
    run = next(here.glob("rep-base-*"))
    with open(run / "train.lock", "a") as held:  # a trial training now
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        p = carry("save", pack, here, "rep")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "stop the sweep first" in p.stderr, p.stderr
    assert not pack.exists() and not pack.with_name(pack.name + ".partial").exists()

    assert carry("save", pack, here, "rep").returncode == 0
    before = (here / "rep.db").read_bytes()
    p = carry("restore", pack, here, "rep")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "already holds the study rep" in p.stderr, p.stderr
    assert (here / "rep.db").read_bytes() == before


def test_the_segments_wall_times_sum_across_sessions(tmp_path):
    assert carry("segment", tmp_path, "s", 100, 400, "abc").returncode == 0
    assert carry("segment", tmp_path, "s", 1000, 1060, "def+").returncode == 0
    assert carry("wall", tmp_path, "s").stdout.split() == ["360"]
    assert (tmp_path / "s.segments").read_text().splitlines() == ["100 400 abc", "1000 1060 def+"]


def test_a_stopped_trial_claimed_again_says_the_step_its_run_folder_resumes_from(tmp_path):
    """A trial stopped at step 1062 and carried without its checkpoints starts again from step 0 elsewhere: its note
    (``--status``, the report's trial table) says so, not "resumed from step 1062"; with its checkpoints there it
    resumes where it stopped."""
    from lightning_tfm.sweep.held import resume_note
    from lightning_tfm.training.runs.resume import newest_step

    carried = tmp_path / "rep-big-s1-751f8056"
    (carried / "checkpoints").mkdir(parents=True)
    assert resume_note(1062, newest_step(carried), carried) == \
        f"resumed from step 0 after a stop at step 1062: {carried} has no checkpoint past step 0"
    (carried / "checkpoints" / "step=001000.ckpt").write_bytes(b"")  # named by its step: what a resume reads first
    note = resume_note(1062, newest_step(carried), carried)
    assert note.startswith("resumed from step 1000 after a stop at step 1062"), note
    assert resume_note(1062, 1062, carried) == "resumed from step 1062 after a stop"
    assert resume_note(None, 0, carried) == "resumed from step 0 after a stop"  # stopped before its first checkpoint
