"""Ctrl-C of ``ltfm sweep FILE --workers 2`` (``make ablation``), end to end (issue #64 item 4): a real launcher in
its own process group, SIGINT to the group as a terminal sends it. Its trials are stopped (not failed, not left
running): every run folder keeps a summary, ``--status`` and the progress line say *stopped*, the command exits 130
(``make ablation``'s recipe says the sweep was stopped), and the next run claims the stopped trials first and resumes
each one's run from its step, one COMPLETE trial per row.

No step races a clock: each trial process is held (SIGSTOP) once it has saved its first step checkpoint and said its
first validation's progress line, so both rows are training when the signal comes however slow the machine, and
the signal is pending in each trial when it is let go (SIGCONT). A trial is held only where it holds no write lock
of the sweep's SQLite file (a trial stopped inside its write would lock the test out). The second Ctrl-C comes once
the launcher says it is stopping, while the workers still wait for their held trials."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from lightning_tfm.sweep.storage import RESUME_STEP
from lightning_tfm.training.runs.resume import newest_step

from conftest import ROOT, default_signals, ltfm
from test_sweep import TINY, _alive, _versions, trials_of, wait_for_line, write_sweep

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROWS = {"base": {}, "C1": {"family": "ff", "model.d_ff": 32}}
BUDGET = 30  # steps: a row is held at its first validation (step 10), stopped at 11, resumed to its end


def _hold_after_first_validation(results: Path, proc: subprocess.Popen, out: Path) -> dict[Path, int]:
    """Each row's run folder -> its trial process's pid, each process stopped (SIGSTOP) as soon as its log has the
    progress line of its first validation (step 10, after the step checkpoint saved at 10); returns once every
    row's trial is held."""
    held: dict[Path, int] = {}
    while len(held) < len(ROWS):
        assert proc.poll() is None, out.read_text()[-3000:]
        for log in (results / "sweep-logs" / "ctrlc").glob("trial-*.log"):
            text = log.read_text(errors="replace")
            run = re.search(r"ltfm: training (\S+) from step", text)
            if run and (results / run.group(1)) not in held and re.search(r"ltfm: step \d+/", text):
                run_dir = results / run.group(1)
                assert list(run_dir.glob("checkpoints/step=*.ckpt")), text
                held[run_dir] = json.loads((run_dir / "summary.json").read_text())["pid"]
                os.kill(held[run_dir], signal.SIGSTOP)
                for _ in range(200):  # held inside a write of the study: let it finish that write, then hold again
                    if _takes_a_write_lock(results / "ctrlc.db"):
                        break
                    os.kill(held[run_dir], signal.SIGCONT)
                    time.sleep(0.02)
                    os.kill(held[run_dir], signal.SIGSTOP)
                else:
                    raise AssertionError("the sweep's database stayed locked while a trial was held")
        time.sleep(0.2)
    return held


def _takes_a_write_lock(db: Path) -> bool:
    """Whether a write transaction of the SQLite file ``db`` begins now (none held by a stopped process)."""
    con = sqlite3.connect(db, timeout=1.0, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def _let_go(held: dict[Path, int], launcher: subprocess.Popen) -> None:
    """Wake each held trial (SIGCONT): it finds its stop signal pending and stops at the end of its step; then
    wait for the launcher to end."""
    for pid in held.values():
        os.kill(pid, signal.SIGCONT)
    launcher.wait(timeout=600)


def _reap(launcher: subprocess.Popen) -> None:
    """A launcher still running when its test ends (an assertion failed): its whole group killed."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


@pytest.mark.slow
@pytest.mark.parametrize("started_by", ["ltfm", pytest.param("make", marks=pytest.mark.long)])
def test_ctrl_c_of_a_sweep_stops_its_trials_and_the_next_run_resumes_them(started_by, tmp_path, data_dir, ltfm_here):
    """Ctrl-C twice of ``ltfm sweep FILE --workers 2`` while both rows train; then one worker resumes a stopped
    trial. ``make`` (make test-long: two process starts more): the sweep started by ``make ablation`` (its setup
    taken as done: this interpreter's environment), whose recipe says the sweep was stopped, not that trials failed;
    after the one worker, the same ``ltfm sweep`` command finishes the table."""
    from lightning_tfm.sweep import Plan, load_sweep
    from lightning_tfm.sweep.launch import _log_step, format_progress, progress, row_costs

    results = tmp_path / "results"
    sweep_file = write_sweep(tmp_path, "ctrlc", ROWS)
    overrides = [f"data.path={data_dir}", f"run.results_dir={results}", *TINY, f"train.max_steps={BUDGET}"]
    args = ["sweep", str(sweep_file), "--workers", "2", *overrides]
    url = f"sqlite:///{results / 'ctrlc.db'}"
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-m", "lightning_tfm", *args]
    if started_by == "make":
        venv = Path(sys.executable).parent.parent
        if not (venv / "bin" / "ltfm").is_file():
            pytest.skip(f"make ablation runs $(VENV)/bin/ltfm: none beside {sys.executable}")
        cmd = ["make", "-o", "setup", "ablation", f"VENV={venv}", f"SWEEP={sweep_file}", "WORKERS=2",
               f"DATA={data_dir}", f"ARGS={' '.join(overrides)}"]
    out = tmp_path / "first.out"
    with out.open("w") as fh:  # its own group: the terminal's Ctrl-C reaches the launcher, its workers and trials
        launcher = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True, preexec_fn=default_signals)
    try:
        held = _hold_after_first_validation(results, launcher, out)

        # While the rows train (#64 item 18): the progress line reads each running row's step from its trial's log
        # (its "ltfm: step N/M" lines), not "starting".
        sweep = load_sweep(sweep_file)
        plan = Plan(sweep, overrides)
        trials = trials_of(url, "ctrlc")
        assert sorted(t.state.name for t in trials) == ["RUNNING", "RUNNING"]
        p = progress(sweep, plan, trials, row_costs(plan), workers=2)
        line = format_progress(sweep.name, p, 60)
        assert "0/2 done, 2 running, 0 left" in line and "starting" not in line, line
        for t in trials:  # a trial's log has them (its first validation, at step 10, has come)
            logged = _log_step(t.user_attrs["log"])
            assert logged is not None and logged >= 10, Path(t.user_attrs["log"]).read_text()[-2000:]
            (row,) = [r for r in p["running"] if r["variant"] == t.user_attrs["variant"]]
            assert row["step"] >= logged and f"{row['variant']} s1 step {row['step']}/{BUDGET}" in line, line

        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C
        wait_for_line(out, "interrupted: stopping the workers", launcher)
        os.killpg(launcher.pid, signal.SIGINT)  # and again, while the workers stop (their trials are still held)
        _let_go(held, launcher)
    finally:
        _reap(launcher)
    said = out.read_text()
    lines = said.splitlines()
    assert "Traceback" not in said and not [ln for ln in lines if ln.startswith("ltfm: some trials failed")], said
    if started_by == "ltfm":
        assert launcher.returncode == 130, said[-3000:]
    else:  # the recipe saw the sweep's 130 and said so; make stops there (its --status, runs and report never run)
        assert "ltfm: the sweep was stopped; make ablation again resumes it" in lines, said[-3000:]
        assert launcher.returncode == -signal.SIGINT, said[-3000:]  # make ends by the signal it got, as make does
        assert not [ln for ln in lines if ln.startswith(f"{venv}/bin/ltfm sweep {sweep_file} --status")], said
    assert not [pid for pid in held.values() if _alive(pid)]
    left = subprocess.run(["pgrep", "-f", str(results)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes still running: {left}"

    # Each trial is back in the queue as stopped, at its run's newest checkpoint (never failed, never running).
    trials = trials_of(url, "ctrlc")
    assert len(trials) == 2
    at = {}
    for t in trials:
        assert t.state == optuna.trial.TrialState.WAITING and t.user_attrs["status"] == "stopped", t
        run_dir = Path(t.user_attrs["run_dir"])
        at[t.user_attrs["variant"]] = t.user_attrs["stopped_at"]
        assert t.user_attrs["stopped_at"] == newest_step(run_dir) >= 10
        summary = json.loads((run_dir / "summary.json").read_text())  # the trial stopped as Ctrl-C stops a run
        assert summary["status"] == "stopped" and summary["steps"] == t.user_attrs["stopped_at"], summary
    stopped = re.search(r"\[ctrlc\] stopped: (.*); the same command resumes them first", said)
    assert stopped, said[-3000:]
    assert sorted(stopped.group(1).split(", ")) == sorted(f"{v} seed 1 at step {s}" for v, s in at.items())

    status = ltfm_here(*args[:2], *overrides, "--status")
    assert status.returncode == 0, status.stderr
    states = [ln.split()[3] for ln in status.stdout.splitlines() if re.match(r"\d+ ", ln)]
    assert states == ["stopped", "stopped"], status.stdout
    assert status.stdout.splitlines()[-1].endswith(": 2 stopped"), status.stdout
    runs = ltfm_here("runs", results)
    assert runs.returncode == 0 and "no summary" not in runs.stdout, runs.stdout + runs.stderr
    p = progress(sweep, plan, trials_of(url, "ctrlc"), row_costs(plan), workers=2)
    assert "rows 0/2 done, 0 running, 2 left (2 stopped, resumed first)" in format_progress(sweep.name, p, 60)

    # One worker (`ltfm sweep FILE --n-trials 1`): it claims a stopped trial (the first of them) and resumes its run
    # from the step it stopped at, to the budget; the other row stays stopped.
    one = ltfm(*args[:2], *overrides, "--n-trials", "1", env={"WANDB_MODE": "disabled"})
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    trials = sorted(trials_of(url, "ctrlc"), key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE", "WAITING"] and trials[1].user_attrs["status"] == "stopped"
    _resumed(trials[0], at[trials[0].user_attrs["variant"]])
    if started_by == "ltfm":
        return
    # The same command again finishes the table: the other stopped trial resumed, one COMPLETE trial per row.
    again = ltfm(*args, env={"WANDB_MODE": "disabled"})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = trials_of(url, "ctrlc")
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "COMPLETE"]  # the same two trials, nothing new
    assert sorted(t.user_attrs["variant"] for t in trials) == sorted(ROWS)
    for t in trials:
        _resumed(t, at[t.user_attrs["variant"]])


def _resumed(trial, step: int) -> None:
    """``trial`` completed by resuming its run from ``step``: its second attempt starts there, its log says so,
    the run ends at the budget."""
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.user_attrs["status"] == "completed" and trial.user_attrs[RESUME_STEP] == step
    assert trial.user_attrs["reason"] == f"resumed from step {step} after a stop"
    log = Path(trial.user_attrs["log"]).read_text()
    assert re.search(rf"ltfm: training \S+ from step {step} to {BUDGET}", log), log[-3000:]
    run_dir = Path(trial.user_attrs["run_dir"])
    versions = _versions(run_dir)  # two attempts of one run: the second starts where the first stopped
    assert len(versions) == 2
    with (versions[1] / "metrics.csv").open() as f:
        assert min(int(float(r["step"])) for r in csv.DictReader(f)) >= step - 1
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == BUDGET


def test_a_stopped_trial_is_claimed_before_any_other_and_shown_stopped(data_dir):
    """The queue's order after a Ctrl-C: the stopped trial first, though a row queued before it waits and a stale
    trial's retry too; ``--status`` calls it stopped (with no duration: it runs no more) until it is claimed."""
    from lightning_tfm.sweep import Plan, claim_waiting, enqueue_missing, held, load_sweep
    from lightning_tfm.sweep.status import trial_rows
    from lightning_tfm.sweep.storage import RetryWhileProgressing

    sweep = load_sweep(ROOT / "sweeps/smoke.yaml")
    plan = Plan(sweep, [f"data.path={data_dir}"])
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name=sweep.name)
    storage, sid = study._storage, study._storage.get_study_id_from_name(sweep.name)
    enqueue_missing(study, plan)
    first, second, third = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)[:3]

    def claim(t=None):
        keys = {t.user_attrs["grid_key"]} if t is not None else None
        return claim_waiting(study, storage, sid, keys)[0]

    stopped, stale = claim(third), claim(second)  # two workers' rows; the first row is still waiting
    held.put_back(storage, sweep.name, stopped, 7)  # Ctrl-C of its worker
    storage.set_trial_state_values(stale._trial_id, state=optuna.trial.TrialState.FAIL)  # a dead worker's row
    RetryWhileProgressing(3)(study, storage.get_trial(stale._trial_id))

    rows = {r["number"]: r for r in trial_rows(study.get_trials(deepcopy=False))}
    assert (rows[third.number]["state"], rows[third.number]["duration_s"]) == ("stopped", None)
    assert rows[third.number]["note"].startswith("stopped at step 7"), rows[third.number]
    again = claim()
    assert again.number == third.number and again.user_attrs["stopped_at"] == 7
    retry = claim()  # then the retry
    assert storage.get_trial(retry._trial_id).system_attrs.get("failed_trial") == second.number
    assert claim().number == first.number  # then the rows in queue order
    assert trial_rows([storage.get_trial(again._trial_id)])[0]["state"] == "running"


def _ignore_sigint() -> None:  # a shell script's background job (`make ablation &`): SIGINT ignored, SIGTERM not
    default_signals()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.long  # make test-long: a sweep of two rows more
def test_a_settling_sweep_whose_workers_were_stopped_behind_its_back_exits_as_stopped(tmp_path, data_dir):
    """``ltfm sweep FILE --workers 2 --settle`` started as a script's background job (SIGINT ignored, which it keeps),
    SIGINT to its group: the workers stop (they take SIGINT whatever they inherit) and their trials go back to the
    queue; the launcher says the workers were stopped, which trials, and exits 130, as after its own Ctrl-C, never
    printing the settle loop's closing lines as if the rows were done (``make ablation``'s recipe then stops, where
    it went on to the report of a third of the table)."""
    results = tmp_path / "results"
    sweep_file = write_sweep(tmp_path, "ctrlc", ROWS)
    overrides = [f"data.path={data_dir}", f"run.results_dir={results}", *TINY, f"train.max_steps={BUDGET}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out = tmp_path / "first.out"
    with out.open("w") as fh:
        launcher = subprocess.Popen([sys.executable, "-m", "lightning_tfm", "sweep", str(sweep_file), "--workers", "2",
                                     "--settle", *overrides], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True, preexec_fn=_ignore_sigint)
    try:
        held = _hold_after_first_validation(results, launcher, out)
        os.killpg(launcher.pid, signal.SIGINT)
        _let_go(held, launcher)
    finally:
        _reap(launcher)
    said = out.read_text()
    assert launcher.returncode == 130, said[-3000:]
    assert "2 of 2 worker(s) were stopped" in said and re.search(r"\[ctrlc\] stopped: .*at step", said), said[-3000:]
    assert "Traceback" not in said and "settled" not in said and "not answered" not in said, said[-3000:]
    trials = trials_of(f"sqlite:///{results / 'ctrlc.db'}", "ctrlc")
    assert sorted((t.state.name, t.user_attrs["status"]) for t in trials) == [("WAITING", "stopped")] * 2
