"""``ltfm runs``: the results folder as a table, and one run's W&B run read from its offline files.

summary.json files are written by hand here: what is under test is reading and showing them, not training.
The W&B run is a real offline one, written through the project's tracking (no mocking of wandb): a training
and its resumption, with metrics and a samples table, as training logs them."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_tfm.base.errors import UserError
from lightning_tfm.training.runs.runs import format_table, list_runs


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


def table_rows(text: str) -> dict[str, list[str]]:
    lines = text.strip().splitlines()
    return {line.split()[0]: line.split() for line in lines[2:]}


def test_runs_shows_completed_failed_and_running(results, ltfm_here):
    proc = ltfm_here("runs", str(results))
    assert proc.returncode == 0, proc.stderr
    header, rule = proc.stdout.splitlines()[:2]
    assert header.split() == ["id", "variant", "arch", "precision", "status", "params", "dev_ppl", "dev_bleu",
                              "test_bleu", "wall", "time"]
    assert set(rule) == {"-", " "}
    rows = table_rows(proc.stdout)
    assert set(rows) == {"cpu-base-1a2b", "cpu-A1-3c4d", "cpu-A2-5e6f", "cpu-A3-7a8b", "cpu-A4-9c0d",
                         "no-summary-yet"}
    assert rows["cpu-base-1a2b"] == ["cpu-base-1a2b", "base", "-", "-", "completed", "9.4M", "8.12", "35.3", "34.9",
                                     "20m34s"]
    assert rows["cpu-A1-3c4d"] == ["cpu-A1-3c4d", "A1", "-", "-", "failed", "9.4M", "-", "-", "-", "1m01s"]
    assert rows["cpu-A2-5e6f"][:7] == ["cpu-A2-5e6f", "A2", "-", "-", "running", "9.3M", "30.50"]
    # running on this machine, but its process is gone: stale; on another machine we cannot tell
    assert rows["cpu-A3-7a8b"][4] == "stale" and rows["cpu-A4-9c0d"][4] == "running"
    assert rows["no-summary-yet"][4:6] == ["no", "summary"]


def test_runs_shows_each_runs_architecture_and_precision(tmp_path, ltfm_here):
    """model.arch and the precision the run resolved, by Lightning's full name: an older summary's "32" reads as
    32-true; a summary from before model.arch existed built the transformer."""
    r = tmp_path / "results"
    write_summary(r, "rnn-1", variant="rnn", status="completed", precision="bf16-mixed", steps=20)
    write_summary(r, "old-2", variant="base", status="completed", precision="32", steps=20)
    write_summary(r, "gpu-3", variant="base", status="failed", precision="16-mixed")
    for run, model in (("rnn-1", {"arch": "rnn", "layers": 1}), ("old-2", {"layers": 6}),
                       ("gpu-3", {"arch": "transformer"})):
        summary = json.loads((r / run / "summary.json").read_text())
        summary["config"]["model"] = model
        (r / run / "summary.json").write_text(json.dumps(summary))
    proc = ltfm_here("runs", str(r))
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert {run: row[2:4] for run, row in rows.items()} == {"rnn-1": ["rnn", "bf16-mixed"],
                                                           "old-2": ["transformer", "32-true"],
                                                           "gpu-3": ["transformer", "16-mixed"]}
    by_id = {row["id"]: row for row in json.loads(ltfm_here("runs", str(r), "--json").stdout)}
    assert (by_id["old-2"]["arch"], by_id["old-2"]["precision"]) == ("transformer", "32-true")
    assert [row.split()[0] for row in format_table(list_runs(r), sort="arch").splitlines()[2:]][0] == "rnn-1"


def test_runs_json_and_sort(results, ltfm_here):
    proc = ltfm_here("runs", str(results), "--json", "--sort=-dev_ppl")  # argparse needs = before "-"
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


def test_runs_bad_input_is_one_line_exit_2(results, tmp_path, ltfm_here):
    proc = ltfm_here("runs", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "nowhere" in proc.stderr and "Traceback" not in proc.stderr
    proc = ltfm_here("runs", str(results), "--sort", "bleuu")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "bleuu" in proc.stderr and "dev_bleu" in proc.stderr
    with pytest.raises(UserError, match="unknown sort column"):
        format_table(list_runs(results), sort="path")


def test_unreadable_summary_and_empty_folder(tmp_path, ltfm_here):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = ltfm_here("runs", str(empty))
    assert proc.returncode == 0 and proc.stdout == "" and "no runs" in proc.stderr
    (tmp_path / "empty" / "half").mkdir()
    (tmp_path / "empty" / "half" / "summary.json").write_text('{"run_id": "half", "sta')
    assert [(r["id"], r["status"]) for r in list_runs(empty)] == [("half", "unreadable")]


# ------------------------------------------------------------------------------------------ choosing columns
def one_line_error(code: int, captured) -> str:
    """The stderr of a refused command: exit 2, nothing on stdout, one line, no traceback."""
    assert code == 2 and captured.out == "", captured
    err = captured.err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def test_an_unknown_sort_column_is_refused_before_the_folder_is_read(tmp_path, monkeypatch, capsys):
    from lightning_tfm import cli

    monkeypatch.chdir(tmp_path)  # no results/ here: the column is checked first
    err = one_line_error(cli.main(["runs", "--sort=NOT_A_COLUMN"]), capsys.readouterr())
    assert "unknown sort column 'NOT_A_COLUMN'" in err and "did you mean" not in err
    assert "sortable columns are id, variant" in err and "dev_bleu" in err and "wall_time_s" in err
    assert "path" not in err.split("are ", 1)[1].split(" (")[0].split(", ")
    err = one_line_error(cli.main(["runs", "--json", "--sort=-dev_bleuu"]), capsys.readouterr())
    assert "did you mean dev_bleu?" in err


# ------------------------------------------------------------------------------------ the folder beside results/
def test_without_results_the_folder_that_holds_runs_is_named(tmp_path, ltfm_here):
    """`ltfm runs` where `make ablation QUICK=1` wrote results-quick/ and no results/ exists."""
    for i in range(3):
        write_summary(tmp_path / "results-quick", f"quick-A{i}-s1-0a0b", variant=f"A{i}", status="completed")
    write_summary(tmp_path / "archive", "old-base-s1-1c1d", variant="base", status="completed")
    (tmp_path / "docs" / "notes").mkdir(parents=True)  # a folder of folders that are no runs: not named

    def runs(*args):
        return ltfm_here("runs", *args, cwd=tmp_path)
    proc = runs()
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("ltfm: error: no results/ here; results-quick/ holds 3 runs: ltfm runs "
                                   "results-quick (also archive/: 1)")
    (tmp_path / "results").mkdir()  # there, but empty: the same pointer beside "no runs"
    proc = runs()
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.strip() == ("no runs in results; results-quick/ holds 3 runs: ltfm runs results-quick "
                                   "(also archive/: 1)")
    proc = runs("results-quick")
    assert proc.returncode == 0 and len(table_rows(proc.stdout)) == 3


# ------------------------------------------------------------------------------------------- ltfm runs --wandb
WANDB_ENV = ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_NAME",
             "WANDB_RUN_GROUP", "WANDB_JOB_TYPE", "WANDB_TAGS", "WANDB_DISABLED", "WANDB_BASE_URL")


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """``<root>/results/toy-0001``: a training that failed after 4 steps and its resumption to step 8, each
    logging through the project's W&B logger what training logs (train loss every step, dev perplexity and a
    samples table at the end), ended by ``tracking.finish``; and its summary.json. Offline wandb, every file of
    it inside the folder. Returns (run folder, finish()'s answers)."""
    from lightning_tfm.training.config.config import load_config
    from lightning_tfm.training.runs import results
    from lightning_tfm.training.tracking import tracking

    root = tmp_path_factory.mktemp("wandb-runs")
    with pytest.MonkeyPatch.context() as mp:
        for var in WANDB_ENV:
            mp.delenv(var, raising=False)
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_CONSOLE", "off")
        mp.setenv("NETRC", str(root / "no-netrc"))
        for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            (root / var.lower()).mkdir()
            mp.setenv(var, str(root / var.lower()))
        cfg = load_config(None, {"data.path": "/unused", "run.name": "toy", "run.variant": "A2", "run.family": "A",
                                 "run.study": "t3", "model.heads": 4})
        run_dir = root / "results" / "toy-0001"
        infos = []
        for attempt, status in enumerate(("failed", "completed")):
            logger = tracking.make_wandb_logger(cfg, run_dir.name, run_dir)
            for step in range(4 * attempt, 4 * attempt + 4):
                logger.log_metrics({results.TRAIN_LOSS: 3.0 - step}, step=step)
            logger.log_metrics({results.DEV_PPL: 20.0 - step}, step=step)
            tracking.log_samples(logger, step, [("a source", "a reference", f"hypothesis {attempt}")])
            infos.append(tracking.finish(logger, {"status": status, "dev_ppl": 9.5 - attempt, "params": 1234}))
    (run_dir / "summary.json").write_text(json.dumps({"run_id": run_dir.name, "status": "completed",
                                                      "config": cfg.to_dict(), **infos[-1]}))
    return run_dir, infos


def sections(text: str) -> dict[str, list[str]]:
    """``ltfm runs RUN --wandb``'s output: {section title's first word: its lines}; "" for the head."""
    out = {}
    for block in text.strip().split("\n\n"):
        first, *rest = block.splitlines()
        title = "" if first.startswith("W&B run") else first.split()[0]
        out[title] = [first, *rest] if title == "" else rest
    return out


def test_runs_wandb_shows_the_config_summary_and_history_of_a_resumed_run(wandb_run, capsys, monkeypatch):
    from lightning_tfm import cli

    run_dir, infos = wandb_run
    run_id = infos[0]["wandb_run_id"]
    assert infos[1]["wandb_run_id"] == run_id
    assert cli.main(["runs", str(run_dir), "--wandb"]) == 0
    out = capsys.readouterr().out
    head, config, summary, history = (sections(out)[k] for k in ("", "config", "summary", "history"))
    assert head[0] == (f"W&B run {run_id} (offline): project lightning_tfm, group t3, job type A, name A2-s1; "
                       "tags A2, A; exit 0")  # the resumption's exit, not the failed attempt's
    assert "(2 segments: a resumed training)" in head[1]
    folders = [Path(info["wandb_dir"]).name for info in infos]
    assert head[2].split() == ["upload:", "wandb", "sync", *[str(run_dir / "wandb" / f) for f in folders]]
    config = dict(line.split(None, 1) for line in config)
    assert config["model.heads"] == "4" and config["run.id"] == "toy-0001" and config["run.variant"] == "A2"
    summary = dict(line.split(None, 1) for line in summary)
    assert summary["dev_ppl"] == "8.5" and summary["params"] == "1234" and summary["status"] == "completed"
    assert not [k for k in summary if k.startswith("_")]
    assert history[0].split() == ["key", "steps", "last", "step", "last", "value"]
    rows = {r.split()[0]: r.split() for r in history[1:]}
    assert rows["train/loss"][:4] == ["train/loss", "8", "7", "-4"]  # 4 steps an attempt, the last at step 7
    assert rows["dev/ppl"][:4] == ["dev/ppl", "2", "7", "13"]
    assert rows["dev/samples"][:4] == ["dev/samples", "2", "7", "table"] and rows["dev/samples"][4] == "1x3"

    # by run id from where results/ is, as JSON
    monkeypatch.chdir(run_dir.parent.parent)
    assert cli.main(["runs", "toy-0001", "--wandb", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["run_id"] == run_id and data["mode"] == "offline" and data["exit_code"] == 0
    assert [Path(f).parent.name for f in data["files"]] == folders
    assert data["history"]["train/loss"] == {"steps": 8, "last_step": 7, "last": -4.0}
    assert data["history"]["dev/ppl"] == {"steps": 2, "last_step": 7, "last": 13.0}
    assert data["summary"]["dev_ppl"] == 8.5 and data["config"]["model.heads"] == 4


def test_the_segments_of_a_resumed_run_are_read_as_one(wandb_run):
    from lightning_tfm.training.runs import results
    from lightning_tfm.training.tracking import wandb_files

    run_dir, infos = wandb_run
    segments = wandb_files.read_runs(run_dir)
    assert [s.exit_code for s in segments] == [1, 0] and [s.summary["dev_ppl"] for s in segments] == [9.5, 8.5]
    run = wandb_files.read_run_folder(run_dir)
    assert run.paths == wandb_files.run_files(run_dir) == [s.path for s in segments]
    assert run.history == segments[0].history + segments[1].history
    assert [s for s, _ in run.metric(results.TRAIN_LOSS)] == list(range(8))
    assert [t["data"][0][2] for t in run.tables[results.DEV_SAMPLES]] == ["hypothesis 0", "hypothesis 1"]
    assert run.exit_code == 0 and run.summary["dev_ppl"] == 8.5 and run.resumed


def test_a_run_whose_wandb_dir_is_shared_reads_its_own_segments(wandb_run, tmp_path):
    """``wandb.dir=SHARED``: the run folder has no ``wandb/``; its segments are found by its id in the folder its
    summary names, beside another run's."""
    import shutil

    from lightning_tfm.training.tracking import wandb_files

    run_dir, infos = wandb_run
    run_id = infos[0]["wandb_run_id"]
    shared = tmp_path / "shared" / "wandb"
    shutil.copytree(run_dir / "wandb", shared, symlinks=True)
    other = shared / Path(infos[0]["wandb_dir"]).name.replace(run_id, "zzother1")
    (shared / Path(infos[0]["wandb_dir"]).name).rename(other)
    (other / f"run-{run_id}.wandb").rename(other / "run-zzother1.wandb")
    moved = tmp_path / "results" / run_dir.name
    shutil.copytree(run_dir, moved, ignore=shutil.ignore_patterns("wandb"))
    summary = json.loads((moved / "summary.json").read_text())
    summary["wandb_dir"] = str(shared / Path(infos[1]["wandb_dir"]).name)
    # the first segment now belongs to another run: only the second is this run's
    assert [str(p) for p in wandb_files.run_files(moved, summary)] == [f"{summary['wandb_dir']}/run-{run_id}.wandb"]
    (moved / wandb_files.ID_FILE).unlink()  # no id recorded: nothing is guessed from a shared folder
    assert wandb_files.run_files(moved, {k: v for k, v in summary.items() if k != "wandb_run_id"}) == []


def test_runs_wandb_mistakes_are_one_line(wandb_run, tmp_path, monkeypatch, capsys):
    import shutil

    from lightning_tfm import cli
    from lightning_tfm.training.tracking import wandb_files

    run_dir, _ = wandb_run
    monkeypatch.chdir(tmp_path)
    err = one_line_error(cli.main(["runs", "nowhere", "--wandb"]), capsys.readouterr())
    assert "no run 'nowhere'" in err and "ltfm runs results" in err
    err = one_line_error(cli.main(["runs", str(run_dir.parent), "--wandb"]), capsys.readouterr())
    assert "is a results folder, not a run" in err
    err = one_line_error(cli.main(["runs", "--wandb"]), capsys.readouterr())
    assert "--wandb shows one run" in err
    err = one_line_error(cli.main(["runs", str(run_dir), "--wandb", "--sort=dev_ppl"]), capsys.readouterr())
    assert "give one or the other" in err

    # a run trained with W&B disabled, found by its id in the folder beside the missing results/
    write_summary(tmp_path / "results-quick", "quiet-1a2b", status="completed", wandb_mode="disabled")
    err = one_line_error(cli.main(["runs", "quiet-1a2b", "--wandb"]), capsys.readouterr())
    assert err.startswith("ltfm: error: results-quick/quiet-1a2b has no W&B run files") and "disabled" in err

    # a damaged .wandb file: which run, and why
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    first = wandb_files.run_files(broken)[0]
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # in the last record (the exit record)
    first.write_bytes(bytes(data))
    err = one_line_error(cli.main(["runs", str(broken), "--wandb"]), capsys.readouterr())
    assert f"cannot read the W&B run of {broken}" in err and "checksum mismatch" in err
