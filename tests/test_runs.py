"""``ltfm runs``: the results folder as a table. summary.json files are written by hand here: what is
under test is reading and showing them, not training."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_tfm.training.errors import UserError
from lightning_tfm.training.runs import format_table, list_runs

LTFM = [sys.executable, "-m", "lightning_tfm"]


def write_summary(results: Path, run_id: str, **fields) -> None:
    d = results / run_id
    d.mkdir(parents=True)
    summary = {"run_id": run_id, "config": {"run": {"variant": fields.pop("variant", None), "family": "A"}}, **fields}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.yaml").write_text("run: {}\n")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def results(tmp_path) -> Path:
    r = tmp_path / "results"
    write_summary(r, "cpu-base-1a2b", variant="base", status="completed", params=9_437_184, dev_loss=2.1,
                  dev_ppl=8.1234, dev_bleu=35.27, test_bleu=34.9, wall_time_s=1234.4, steps=3000)
    write_summary(r, "cpu-A1-3c4d", variant="A1", status="failed", params=9_400_000, wall_time_s=61.0,
                  error="CUDA out of memory")
    write_summary(r, "cpu-A2-5e6f", variant="A2", status="running", params=9_300_000, dev_ppl=30.5,
                  pid=os.getpid(), host=socket.gethostname())
    write_summary(r, "cpu-A3-7a8b", variant="A3", status="running", pid=dead_pid(), host=socket.gethostname())
    write_summary(r, "cpu-A4-9c0d", variant="A4", status="running", pid=dead_pid(), host="another-machine")
    (r / "no-summary-yet").mkdir()
    (r / "no-summary-yet" / "config.yaml").write_text("run: {}\n")
    (r / "not-a-run").mkdir()  # e.g. a shared wandb dir: ignored
    (r / "study.db").write_text("")
    return r


def run_ltfm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LTFM, *args], capture_output=True, text=True, timeout=120)


def table_rows(text: str) -> dict[str, list[str]]:
    lines = text.strip().splitlines()
    return {line.split()[0]: line.split() for line in lines[2:]}


def test_runs_shows_completed_failed_and_running(results):
    proc = run_ltfm("runs", str(results))
    assert proc.returncode == 0, proc.stderr
    header, rule = proc.stdout.splitlines()[:2]
    assert header.split() == ["id", "variant", "status", "params", "dev_ppl", "dev_bleu", "test_bleu", "wall", "time"]
    assert set(rule) == {"-", " "}
    rows = table_rows(proc.stdout)
    assert set(rows) == {"cpu-base-1a2b", "cpu-A1-3c4d", "cpu-A2-5e6f", "cpu-A3-7a8b", "cpu-A4-9c0d",
                         "no-summary-yet"}
    assert rows["cpu-base-1a2b"] == ["cpu-base-1a2b", "base", "completed", "9.4M", "8.12", "35.3", "34.9", "20m34s"]
    assert rows["cpu-A1-3c4d"] == ["cpu-A1-3c4d", "A1", "failed", "9.4M", "-", "-", "-", "1m01s"]
    assert rows["cpu-A2-5e6f"][:5] == ["cpu-A2-5e6f", "A2", "running", "9.3M", "30.50"]
    # running on this machine, but its process is gone: stale; on another machine we cannot tell
    assert rows["cpu-A3-7a8b"][2] == "stale" and rows["cpu-A4-9c0d"][2] == "running"
    assert rows["no-summary-yet"][2:4] == ["no", "summary"]


def test_runs_json_and_sort(results):
    proc = run_ltfm("runs", str(results), "--json", "--sort=-dev_ppl")  # argparse needs = before "-"
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [r["id"] for r in data][:2] == ["cpu-A2-5e6f", "cpu-base-1a2b"]  # descending, missing last
    by_id = {r["id"]: r for r in data}
    assert by_id["cpu-base-1a2b"]["dev_bleu"] == 35.27 and by_id["cpu-base-1a2b"]["family"] == "A"
    assert by_id["cpu-A1-3c4d"]["status"] == "failed" and by_id["cpu-A3-7a8b"]["status"] == "stale"
    assert Path(by_id["cpu-A1-3c4d"]["path"]) == results / "cpu-A1-3c4d"

    rows = list_runs(results)
    ordered = [line.split()[0] for line in format_table(rows, sort="params").splitlines()[2:]]
    assert ordered[:3] == ["cpu-A2-5e6f", "cpu-A1-3c4d", "cpu-base-1a2b"]
    ordered = [line.split()[0] for line in format_table(rows, sort="wall time").splitlines()[2:]]
    assert ordered[:2] == ["cpu-A1-3c4d", "cpu-base-1a2b"]


def test_runs_bad_input_is_one_line_exit_2(results, tmp_path):
    proc = run_ltfm("runs", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "nowhere" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_ltfm("runs", str(results), "--sort", "bleuu")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "bleuu" in proc.stderr and "dev_bleu" in proc.stderr
    with pytest.raises(UserError, match="unknown sort key"):
        format_table(list_runs(results), sort="path")


def test_unreadable_summary_and_empty_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_ltfm("runs", str(empty))
    assert proc.returncode == 0 and proc.stdout == "" and "no runs" in proc.stderr
    (tmp_path / "empty" / "half").mkdir()
    (tmp_path / "empty" / "half" / "summary.json").write_text('{"run_id": "half", "sta')
    assert [(r["id"], r["status"]) for r in list_runs(empty)] == [("half", "unreadable")]
