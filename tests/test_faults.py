"""Faults a cluster produces every week, run for real: truncated checkpoints, a full or read-only
filesystem (a small tmpfs), two `ltfm train` of one run at once, SIGKILL mid-write, corrupt summaries,
bad config values, secrets in storage URLs. Every case asserts the exit code, a one-line message, no
traceback, and that every earlier result is still there afterwards.

Runs that need a completed training copy the session's smoke run (tests/conftest.py) first: other tests
read the original.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_tfm import cli
from lightning_tfm.training.runs.checkpoints import checkpoint_problem, step_checkpoints

from conftest import SMOKE, ltfm

# A fresh small run (not the smoke fixture): checkpoints every 10 steps, a quick final evaluation.
SMALL = ["train.val_every_steps=10", "train.checkpoint_every_steps=10", "data.max_dev_pairs=20",
         "data.max_test_pairs=20", "data.max_train_pairs=1000"]


def no_traceback(p: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr[-3000:]


def one_line_error(p: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    """The single ``ltfm: error:`` line of a failed command (Lightning's own info lines may precede it)."""
    assert p.returncode == code, (p.returncode, p.stderr[-3000:])
    no_traceback(p)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ltfm: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    for w in words:
        assert w in errors[0], (w, errors[0])
    return errors[0]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def copy_run(smoke_run: Path, results: Path) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    dest = results / smoke_run.name
    shutil.copytree(smoke_run, dest, symlinks=True)
    return dest


def temps(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name and "wandb" not in p.parts]


def du_kb(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) // 1024


# --------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("override, words", [
    ("train.adam_beta2=1.5", ["train.adam_beta2=1.5", "[0, 1)"]),
    ("train.num_nodes=0", ["train.num_nodes=0"]),
    ("train.devices=abc", ["train.devices='abc'", "'0,1'"]),
    ("train.threads=-1", ["train.threads=-1"]),
    ("train.num_workers=-1", ["train.num_workers=-1"]),
    ("decode.batch_sentences=0", ["decode.batch_sentences=0"]),
    ("decode.average_last=-1", ["decode.average_last=-1"]),
    ("train.lr_scale=inf", ["train.lr_scale=inf", "finite"]),
    ("train.lr_scale=.nan", ["train.lr_scale=nan", "finite"]),
    ("run.id=../x", ["'../x'", "inside run.results_dir"]),
    ("run.id=/tmp/elsewhere", ["'/tmp/elsewhere'"]),
])
def test_bad_config_values_stop_before_anything_is_written(override, words, data_dir, tmp_path, capsys):
    results = tmp_path / "results"
    rc = cli.main(["train", str(SMOKE), f"data.path={data_dir}", f"run.results_dir={results}", override])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ltfm: error: "), err
    assert "--last" not in err[0]
    for w in words:
        assert w in err[0], (w, err[0])
    assert not results.exists() and not (tmp_path / "x").exists() and not Path("/tmp/elsewhere").exists()


def test_good_device_specs_still_pass():
    from lightning_tfm.training.config.config import load_config

    for devices in ("1", "2", "-1", "auto", "0,1", "0,"):
        load_config(SMOKE, [f"train.devices={devices}", "data.path=x"])


@pytest.mark.slow
def test_a_diverging_loss_fails_the_run_with_step_and_loss(data_dir, tmp_path):
    results = tmp_path / "results"
    p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", "train.lr_scale=1e30",
             "train.warmup=1", "train.max_steps=20", *SMALL)
    line = one_line_error(p, "training loss became", "at step")
    (run_dir,) = results.iterdir()
    s = summary(run_dir)
    assert s["status"] == "failed" and "training loss became" in s["error"], s
    assert line.split("at step ")[1].split(":")[0].isdigit()


# ---------------------------------------------------------------------------------------- checkpoints
@pytest.mark.slow
def test_truncated_last_checkpoint_is_set_aside_and_the_run_resumes(smoke_run, data_dir, tmp_path, ltfm_here):
    results = tmp_path / "results"
    run_dir = copy_run(smoke_run, results)
    before = summary(run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    with open(last, "r+b") as f:  # what a full disk or a kill during the copy from $TMPDIR used to leave
        f.truncate(last.stat().st_size // 2)

    # averaging works from the intact step checkpoints, saying it skipped last.ckpt
    p = ltfm_here("average", run_dir, "--last", "2")
    assert p.returncode == 0, p.stderr
    no_traceback(p)
    assert "skipping unreadable" in p.stderr and "last.ckpt" in p.stderr
    assert "step=000150.ckpt, step=000200.ckpt" in p.stdout

    p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", "train.max_steps=210")
    assert p.returncode == 0, p.stderr[-3000:]
    no_traceback(p)
    warnings = [ln for ln in p.stderr.splitlines() if ln.startswith("ltfm: warning:")]
    assert len(warnings) == 1 and "last.ckpt is unreadable" in warnings[0], p.stderr[-3000:]
    assert "ltfm: resuming from step=000200.ckpt (step 200) instead" in p.stderr
    assert len(list((run_dir / "checkpoints").glob("last.ckpt.corrupt-*"))) == 1
    after = summary(run_dir)
    assert after["status"] == "completed" and after["steps"] == 210
    # the earlier completed attempt is kept whole
    (earlier,) = after["attempts"]
    assert earlier["status"] == "completed" and earlier["steps"] == 200
    assert earlier["dev_bleu"] == before["dev_bleu"] and earlier["test_bleu"] == before["test_bleu"]
    assert checkpoint_problem(run_dir / "checkpoints" / "last.ckpt") is None


def test_no_readable_checkpoint_means_starting_over_and_saying_so(tmp_path, capsys):
    from lightning_tfm.training.runs.resume import pick, set_aside_unreadable

    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    for name in ("last.ckpt", "step=000010.ckpt"):
        (ckpt / name).write_bytes(b"PK\x03\x04 not really a checkpoint")
    assert set_aside_unreadable(pick(ckpt)) is None
    err = capsys.readouterr().err
    assert "starts over from step 0" in err and err.count("is unreadable") == 2
    assert sorted(p.name.split(".corrupt-")[0] for p in ckpt.iterdir()) == ["last.ckpt", "step=000010.ckpt"]
    assert step_checkpoints(tmp_path / "run") == []  # set aside: never read again, never averaged


def test_a_run_killed_before_writing_last_ckpt_resumes_from_its_newest_step_checkpoint(smoke_run, tmp_path, capsys):
    """Killed between writing step=N.ckpt and last.ckpt: the newest step checkpoint is the run's state. Starting
    over instead would train the steps again and write step=N-v1.ckpt beside the old file."""
    from lightning_tfm.training.runs.resume import pick, set_aside_unreadable

    run_dir = copy_run(smoke_run, tmp_path / "results")
    ckpt = run_dir / "checkpoints"
    (ckpt / "last.ckpt").unlink()
    newest_step, newest = step_checkpoints(run_dir)[-1]
    assert set_aside_unreadable(pick(ckpt)) == newest
    assert f"resuming from {newest.name} (step {newest_step}) (no last.ckpt" in capsys.readouterr().err
    assert not list(ckpt.glob("*.corrupt-*"))  # nothing set aside


def test_a_last_ckpt_older_than_the_newest_step_checkpoint_is_not_resumed_from(smoke_run, tmp_path, capsys):
    """Killed after writing step=N.ckpt but before last.ckpt was updated: last.ckpt holds an earlier step, and the
    run resumes from step=N.ckpt (the chaos soak found step=N-v1.ckpt written by a resume from last.ckpt)."""
    from lightning_tfm.training.runs.resume import pick, set_aside_unreadable

    run_dir = copy_run(smoke_run, tmp_path / "results")
    ckpt = run_dir / "checkpoints"
    (older_step, older), (newest_step, newest) = step_checkpoints(run_dir)[-2:]
    shutil.copy2(older, ckpt / "last.ckpt")  # last.ckpt one checkpoint behind
    assert set_aside_unreadable(pick(ckpt)) == newest
    assert f"(newer than last.ckpt, step {older_step}" in capsys.readouterr().err
    shutil.copy2(newest, ckpt / "last.ckpt")  # up to date: last.ckpt, as always
    assert set_aside_unreadable(pick(ckpt)) == ckpt / "last.ckpt"


# ---------------------------------------------------------------------------------- atomic writes
KILLED_WRITER = """
import os, signal, sys
from lightning_tfm.base.atomic import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    with open(tmp, "wb") as f:
        f.write(b"half a new checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_mid_write_leaves_the_old_file_and_a_temp_that_is_cleaned(tmp_path):
    from lightning_tfm.base.atomic import is_temp, remove_stale_temps, write_text

    target = tmp_path / "summary.json"
    write_text(target, '{"status": "completed"}\n')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], env=env, capture_output=True)
    assert p.returncode == -signal.SIGKILL
    assert target.read_text() == '{"status": "completed"}\n'
    left = [q for q in tmp_path.iterdir() if q != target]
    assert len(left) == 1 and is_temp(left[0]) and left[0].name.startswith(".summary.json.tmp-")
    remove_stale_temps(tmp_path)
    assert list(tmp_path.iterdir()) == [target]


def test_a_failed_writer_leaves_nothing(tmp_path):
    from lightning_tfm.base.atomic import atomic_path, write_json

    target = tmp_path / "x.ckpt"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("writer died")
    assert json.loads(target.read_text()) == {"v": 1} and list(tmp_path.iterdir()) == [target]


# ----------------------------------------------------------------------------- full / read-only disk
@pytest.mark.slow
@pytest.mark.long  # make test keeps test_a_prepared_corpus_on_a_full_disk_is_one_line
def test_full_disk_one_line_failed_summary_history_kept_then_resume(smoke_run, data_dir, tmp_path, tmpfs, ltfm_here):
    size = du_kb(smoke_run) + 1200  # room for the small files, not for one more checkpoint
    results = tmpfs(size)
    run_dir = copy_run(smoke_run, results)
    before = summary(run_dir)
    args = ["train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", "train.max_steps=250"]
    p = ltfm(*args)
    line = one_line_error(p, f"cannot write in {run_dir}", "No space left on device", "free there")
    assert "kB free" in line or "bytes free" in line or "MB free" in line
    failed = summary(run_dir)
    assert failed["status"] == "failed" and "No space left on device" in failed["error"]
    assert failed["attempts"][-1]["status"] == "completed"
    assert failed["attempts"][-1]["dev_bleu"] == before["dev_bleu"]
    assert temps(run_dir) == []  # nothing half-written for a resume to trip on
    for ck in (run_dir / "checkpoints").glob("*.ckpt"):
        assert checkpoint_problem(ck) is None, ck
    rows = {r["id"]: r for r in json.loads(ltfm_here("runs", results, "--json").stdout)}
    row = rows[run_dir.name]
    assert row["status"] == "failed (completed before)" and row["dev_bleu"] == before["dev_bleu"]
    assert "failed (completed before)" in ltfm_here("runs", results).stdout

    # the user frees space; the same command resumes and finishes, the history has all three attempts
    subprocess.run(["mount", "-o", f"remount,size={size + 40000}k", str(results)], check=True)
    p = ltfm(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    no_traceback(p)
    done = summary(run_dir)
    assert done["status"] == "completed" and done["steps"] == 250
    assert [a["status"] for a in done["attempts"]] == ["completed", "failed"]


def test_read_only_results_folder_is_one_line(smoke_run, data_dir, tmp_path, tmpfs, ltfm_here):
    results = tmpfs(du_kb(smoke_run) + 2000)
    run_dir = copy_run(smoke_run, results)
    subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True)
    p = ltfm_here("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", "train.max_steps=250")
    one_line_error(p, "not writable", "Read-only file system", "free")
    assert summary(run_dir)["status"] == "completed"


# --------------------------------------------------------------------------- one training per folder
@pytest.mark.slow
def test_second_train_of_a_run_exits_2_naming_the_holder_and_sigkill_releases_it(data_dir, tmp_path):
    results = tmp_path / "results"
    # The first training's budget is never reached (it is killed): it holds its lock however long the second
    # process takes to start, on a machine of any speed. The third, the same run, ends 10 steps past the last
    # checkpoint (train.max_steps is not part of the run id).
    args = [sys.executable, "-m", "lightning_tfm", "train", str(SMOKE), f"data.path={data_dir}",
            f"run.results_dir={results}", *SMALL]
    audit = tmp_path / "locks.jsonl"  # every acquisition and release, as the chaos soak checks them
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "LTFM_LOCK_LOG": str(audit)}
    first = subprocess.Popen([*args, "train.max_steps=100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env)
    try:
        while not any(p.stat().st_size for p in results.glob("*/train.lock")):
            assert first.poll() is None, "first training never took its lock"
            time.sleep(0.2)
        second = ltfm(*args[3:], "train.max_steps=100000", env={"LTFM_LOCK_LOG": str(audit)})
        one_line_error(second, "is already being trained by", f"pid {first.pid} on host")
        (run_dir,) = results.iterdir()
        # any step checkpoint: the newest replaces the one before it (train.keep_checkpoints), so a poll may never
        # see step 10 on a fast machine
        while not list((run_dir / "checkpoints").glob("step=*.ckpt")):
            assert first.poll() is None
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the kernel released the lock with the process: the same command resumes, in the same files
    last = max(int(p.stem.split("=")[1]) for p in (run_dir / "checkpoints").glob("step=*.ckpt"))
    third = ltfm(*args[3:], f"train.max_steps={last + 10}", env={"LTFM_LOCK_LOG": str(audit)})
    assert third.returncode == 0, third.stderr[-3000:]
    no_traceback(third)
    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["steps"] == last + 10
    # the audit: the first holder's acquisition (never released: killed), no entry of the refused second
    # process, then the third's acquisition naming the dead first holder, and its release
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["event"], e["run"]) for e in events] == [("acquire", run_dir.name), ("acquire", run_dir.name),
                                                          ("release", run_dir.name)], events
    assert events[0]["pid"] == first.pid and events[1]["pid"] == events[2]["pid"] != first.pid
    assert events[1]["prev_pid"] == first.pid and events[1]["prev_alive"] is False
    assert events[0]["t"] < events[1]["t"] <= events[2]["t"]
    names = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert not [n for n in names if "-v" in n], names  # no last-v1.ckpt / step=*-v1.ckpt from a second writer


# ------------------------------------------------------------------------------------ odd summaries
ODD_SUMMARIES = {"truncated": '{"run_id": "x", "status": "compl', "list": "[]", "steps-text": '{"steps": "20"}',
                 "config-text": '{"config": "oops"}'}


def test_runs_shows_odd_summaries_as_unreadable(tmp_path, ltfm_here):
    for name, text in ODD_SUMMARIES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(text)
    p = ltfm_here("runs", tmp_path)
    assert p.returncode == 0, p.stderr
    no_traceback(p)
    rows = {r["id"]: r for r in json.loads(ltfm_here("runs", tmp_path, "--json").stdout)}
    assert {k: r["status"] for k, r in rows.items()} == {k: "unreadable" for k in ODD_SUMMARIES}
    assert "steps" in rows["steps-text"]["error"] and "config" in rows["config-text"]["error"]
    assert p.stdout.count("unreadable") == len(ODD_SUMMARIES)


@pytest.mark.slow
def test_train_warns_about_an_odd_summary_and_writes_a_fresh_one(smoke_run, data_dir, tmp_path):
    results = tmp_path / "results"
    run_dir = copy_run(smoke_run, results)
    (run_dir / "summary.json").write_text(ODD_SUMMARIES["steps-text"])
    (run_dir / ".summary.json.tmp-999-abcdef").write_text("left by a killed writer")
    p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}")
    assert p.returncode == 0, p.stderr[-3000:]
    no_traceback(p)
    warnings = [ln for ln in p.stderr.splitlines() if ln.startswith("ltfm: warning:")]
    assert len(warnings) == 1 and "steps is '20'" in warnings[0] and "checkpoints are kept" in warnings[0]
    s = summary(run_dir)
    assert s["status"] == "completed" and s["steps"] == 200  # resumed from last.ckpt: nothing retrained
    assert (next(run_dir.glob("summary.json.unreadable-*"))).read_text() == ODD_SUMMARIES["steps-text"]
    assert not (run_dir / ".summary.json.tmp-999-abcdef").exists()


# ------------------------------------------------------------------------------------ secrets, paths
def test_storage_url_password_is_masked_whole():
    from lightning_tfm.base.redact import mask_url, scrub, scrub_text

    url = "postgresql://alice:s3cr@tPW@host/db"
    assert mask_url(url) == "postgresql://alice:***@host/db"
    assert mask_url("mysql+pymysql://u:a/b:c@d@h:3306/db") == "mysql+pymysql://u:***@h:3306/db"
    assert mask_url("sqlite:////tmp/a@b.db") == "sqlite:////tmp/a@b.db"
    driver = 'could not translate host name "tPW@host" to address'  # what psycopg says about this URL
    for text in (scrub_text(driver, url), scrub({"storage": url})["storage"], scrub_text(f"open {url} failed")):
        assert "s3cr" not in text and "tPW" not in text, text


def test_sweep_status_never_shows_any_part_of_the_password(data_dir, ltfm_here):
    p = ltfm_here("sweep", "sweeps/smoke.yaml", "--status", "--storage", "postgresql://alice:s3cr@tPW@host/db",
                  f"data.path={data_dir}")
    one_line_error(p, "postgresql://alice:***@host/db")
    assert "s3cr" not in p.stderr + p.stdout and "tPW" not in p.stderr + p.stdout


def test_report_out_replaces_only_a_folder_it_made(tmp_path):
    from lightning_tfm.base.errors import UserError
    from lightning_tfm.report.publish.notebooks import MARKER, _replace_dir, check_out

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("my notes")
    (mine / "numbers.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="not a report folder"):
        check_out(mine)
    staging = tmp_path / ".staging"
    staging.mkdir()
    (staging / "table3.md").write_text("report")
    with pytest.raises(UserError):
        _replace_dir(staging, mine)
    assert (mine / "notes.md").read_text() == "my notes" and not staging.exists()
    out = tmp_path / "report"
    check_out(out)
    staging.mkdir()
    (staging / "table3.md").write_text("report")
    _replace_dir(staging, out)  # new folder: made, and marked
    assert (out / MARKER).is_file()
    staging.mkdir()
    (staging / "table3.md").write_text("report 2")
    check_out(out)
    _replace_dir(staging, out)  # our own folder: replaced
    assert (out / "table3.md").read_text() == "report 2"


@pytest.mark.slow
@pytest.mark.long  # make test-long; make test keeps SIGTERM's line, exit 143 and failed summary
# (test_a_sigterm_after_fit_is_recorded_and_exits_143_like_one_during_fit), a SIGTERM-stopped run resumed on its batches
# (test_stop_resume.py, SIGTERM-mid-epoch) and a worker's trial stopped by SIGTERM (test_sweep.py)
def test_a_run_stopped_by_a_schedulers_signal_says_so_and_exits_non_zero(tmp_path, data_dir):
    """SIGTERM (preemption, `kill`) and SIGUSR1 (SLURM's requeue warning, outside SLURM) stop `ltfm train` with
    one line and exit 143, never 0: `&&` chains and schedulers read 0 as done. The summary says why, and the
    same command resumes."""
    cmd = [sys.executable, "-m", "lightning_tfm", "train", str(SMOKE), f"data.path={data_dir}",
           f"run.results_dir={tmp_path}", "train.max_steps=100000", "train.checkpoint_every_steps=10",
           "wandb.mode=disabled", "train.threads=1", "decode.beam_size=1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    steps = []
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        seen = {p.name for p in tmp_path.glob("*/checkpoints/step=*.ckpt")}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        while not ({p.name for p in tmp_path.glob("*/checkpoints/step=*.ckpt")} - seen):  # however long it takes
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 143, err[-2000:]
        assert err.strip().splitlines()[-1] == ("ltfm: stopped by SIGTERM (preempted or killed): run the same "
                                                "command to resume from the last checkpoint")
        assert "Traceback" not in err
        (summary_path,) = tmp_path.glob("*/summary.json")
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "stopped" and "stopped by SIGTERM" in summary["error"]
        steps.append(summary["steps"])
    assert 0 < steps[0] < steps[1] < 100000  # the second attempt resumed the first
    assert [a["status"] for a in summary["attempts"]] == ["stopped"]


SIGTERM_IN_FINAL_EVALUATION = """
import os, signal, sys
from lightning_tfm.training import evaluate
from lightning_tfm.cli import main

def final_evaluation(*args, **kw):  # fit is over (Lightning's SIGTERM handling with it): the scheduler's signal
    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("the signal did not stop the run")
evaluate.final_evaluation = final_evaluation
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_sigterm_after_fit_is_recorded_and_exits_143_like_one_during_fit(tmp_path, data_dir):
    """Outside ``Trainer.fit`` (the final evaluation here) SIGTERM used to end `ltfm train` at once: exit -15, no
    line, summary.json left "running". It stops the run as during fit: one line, exit 143, a failed summary."""
    p = subprocess.run([sys.executable, "-c", SIGTERM_IN_FINAL_EVALUATION, "train", str(SMOKE),
                        f"data.path={data_dir}", f"run.results_dir={tmp_path}", "train.max_steps=10", *SMALL,
                        "wandb.mode=disabled"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 143, (p.returncode, p.stderr[-2000:])
    assert p.stderr.strip().splitlines()[-1].startswith("ltfm: stopped by SIGTERM")
    no_traceback(p)
    (run_dir,) = tmp_path.iterdir()
    assert summary(run_dir)["status"] == "stopped" and "stopped by SIGTERM" in summary(run_dir)["error"]
    assert not temps(run_dir)


def test_a_prepared_corpus_on_a_full_disk_is_one_line(tmpfs, data_dir, ltfm_here):
    cache = tmpfs(64, "cache")  # far too small for the vocabulary and the ids
    p = ltfm_here("prepare", SMOKE, f"data.path={data_dir}", f"data.cache_dir={cache}", "data.vocab_size=200")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ltfm: error: cannot write the prepared corpus in ") and "data.cache_dir" in last
    assert [q.name for q in cache.iterdir() if not q.name.endswith(".lock")] == []  # no half-built folder
