"""``ltfm sweep --workers``: K workers of one study started here and one readable progress line (rows
done/running/left, each running row's step and dev PPL, the time left); a row's own seeds."""
from __future__ import annotations

import datetime as dt
import re

import optuna
import pytest
import yaml

from lightning_tfm.base.errors import UserError

from conftest import ROOT, ltfm

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _metrics(run_dir, rows):
    folder = run_dir / "logs" / "version_0"
    folder.mkdir(parents=True)
    lines = ["step,train/loss,dev/ppl,dev/loss"] + [f"{s},{loss},{ppl if ppl else ''},{''}" for s, loss, ppl in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_progress_counts_rows_reads_running_rows_and_estimates_the_time_left(tmp_path, data_dir):
    from lightning_tfm.sweep import Plan, claim_waiting, enqueue_missing, load_sweep
    from lightning_tfm.sweep.launch import format_progress, progress

    sweep = load_sweep(ROOT / "sweeps/table3-cpu.yaml")
    plan = Plan(sweep, ["train.max_steps=100", f"data.path={data_dir}"])
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name=sweep.name)
    storage = study._storage
    enqueue_missing(study, plan)
    sid = storage.get_study_id_from_name(sweep.name)
    total = len(sweep.entries())
    assert total == 23  # 21 rows, the base at 3 seeds
    cost = {plan.grid_key(e): 100.0 for e in sweep.entries()}  # every row the same work: the ETA is checkable
    cost[plan.grid_key(next(e for e in sweep.entries() if e.name == "big"))] = 300.0

    p = progress(sweep, plan, study.get_trials(deepcopy=False), cost, workers=2)
    assert (p["done"], p["running"], p["left"], p["eta_s"]) == (0, [], total, None)  # nothing measured yet
    assert "rows 0/23 done, 0 running, 23 left" in format_progress(sweep.name, p, 0) and "ETA estimating" in \
        format_progress(sweep.name, p, 0)

    # big (queued first) finishes; base seed 1 is half-way, dev PPL read from its metrics.csv
    big, _ = claim_waiting(study, storage, sid)
    assert big.user_attrs["variant"] == "big"
    study.tell(big.number, 3.0)
    base, _ = claim_waiting(study, storage, sid)
    run_dir = tmp_path / "base-run"
    _metrics(run_dir, [(10, 5.0, None), (20, 4.0, 61.5), (50, 3.5, None)])
    storage.set_trial_user_attr(base._trial_id, "run_dir", str(run_dir))
    trials = study.get_trials(deepcopy=False)
    t_big = next(t for t in trials if t.number == big.number)
    t_base = next(t for t in trials if t.number == base.number)
    # Time the work: big took 600 s for its 300 units (0.5 a second); base has run 100 s, spent partly starting
    # up (50 units done): only finished rows set the rate, so a slow start never reads as slow work.
    start = t_base.datetime_start
    t_big.datetime_start, t_big.datetime_complete = start - dt.timedelta(seconds=600), start
    now = start + dt.timedelta(seconds=100)
    p = progress(sweep, plan, trials, cost, now=now, workers=2)
    assert (p["done"], len(p["running"]), p["left"]) == (1, 1, total - 2)
    assert p["running"][0] == {"variant": "base", "seed": 1, "step": 50, "max_steps": 100, "dev_ppl": 61.5,
                               "for_s": 100.0, "gpu": None}
    left = 50 + 100 * (total - 2)  # half of base s1, then 21 rows of 100
    assert p["eta_s"] == pytest.approx(left / (300 / 600) / 2)
    line = format_progress(sweep.name, p, 400)
    assert re.search(r"rows 1/23 done, 1 running, 21 left \| base s1 step 50/100 dev ppl 61\.5 \| ETA \d+:\d\d", line)

    # a row whose trial crashed (not re-queued) counts as failed, not as left
    c1 = None
    while (claimed := claim_waiting(study, storage, sid)) is not None:
        trial, _ = claimed
        if trial.user_attrs["variant"] == "C1":
            c1 = trial
            storage.set_trial_user_attr(trial._trial_id, "exit_code", 1)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial.number, 3.0)
    assert c1 is not None
    study.tell(base.number, 3.0)
    p = progress(sweep, plan, study.get_trials(deepcopy=False), cost, workers=2)
    assert (p["done"], p["failed"], p["running"], p["left"]) == (total - 1, 1, [], 0)
    assert "1 failed" in format_progress(sweep.name, p, 10)


def test_a_running_rows_step_comes_from_its_trials_log_before_its_metrics_are_written(tmp_path, data_dir):
    """(#64 item 18) A row's trial writes its run's metrics.csv rarely; its log gets the run's progress lines (the
    callback a trial runs, :class:`~lightning_tfm.training.tracking.progress.ProgressLines`, writing to the log as
    a trial's stderr): the progress line shows the step of the log's last one, "starting" only before the first."""
    from types import SimpleNamespace

    from lightning_tfm.sweep import Plan, claim_waiting, enqueue_missing, load_sweep
    from lightning_tfm.sweep.launch import format_progress, progress
    from lightning_tfm.training.tracking.progress import ProgressLines

    sweep = load_sweep(ROOT / "sweeps/smoke.yaml")
    plan = Plan(sweep, ["train.max_steps=100", f"data.path={data_dir}"])
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name=sweep.name)
    enqueue_missing(study, plan)
    trial, _ = claim_waiting(study, study._storage, study._storage.get_study_id_from_name(sweep.name))
    log, run_dir = tmp_path / "trial.log", tmp_path / "run"  # the run folder has no metrics.csv yet
    study._storage.set_trial_user_attr(trial._trial_id, "log", str(log))
    study._storage.set_trial_user_attr(trial._trial_id, "run_dir", str(run_dir))
    name = trial.user_attrs["variant"]

    def row() -> str:
        line = format_progress(sweep.name, progress(sweep, plan, study.get_trials(deepcopy=False), {}), 10)
        return next(part for part in line.split(" | ") if part.startswith(f"{name} s1 "))

    log.write_text("Using bfloat16 Automatic Mixed Precision (AMP)\n")  # what a trial says before it trains
    assert row() == f"{name} s1 starting"
    trainer = SimpleNamespace(is_global_zero=True, sanity_checking=False, global_step=40, max_steps=100,
                              callback_metrics={})
    with log.open("a") as out:
        lines = ProgressLines("run", out=out)
        lines.on_train_start(trainer, None)  # a resumed run: "training run from step 40 to 100"
        out.flush()
        assert row() == f"{name} s1 step 40/100"
        trainer.global_step = 50
        lines.on_validation_end(trainer, None)
        out.write("a warning\n" * 300)  # whatever else the run logs after it
    assert row() == f"{name} s1 step 50/100"
    _metrics(run_dir, [(60, 3.5, 40.0)])  # the run's metrics.csv, later than the log's last line: the newer
    assert row() == f"{name} s1 step 60/100 dev ppl 40.0"


def test_workers_share_the_cores_on_a_cpu():
    from lightning_tfm.sweep.launch import worker_overrides, worker_plan

    assert [(s.gpu, s.threads, s.loader_workers) for s in worker_plan("auto", [], 2)] == [(None, 1, 0)] * 2
    assert [s.threads for s in worker_plan(2, [], 8)] == [4, 4]
    assert worker_overrides(["a.b=1"], worker_plan(2, [], 2)[0]) == ["a.b=1", "train.threads=1"]
    # the command line wins
    assert worker_overrides(["train.threads=3"], worker_plan(2, [], 8)[1]) == ["train.threads=3"]


def test_several_workers_share_each_gpu_and_the_gpus_fill_evenly():
    from lightning_tfm.sweep.launch import worker_overrides, worker_plan

    one = worker_plan("auto", ["0"], 16, per_gpu=4)  # one H100-class GPU, 16 cores: 4 rows at once
    assert [s.gpu for s in one] == ["0"] * 4
    assert [(s.threads, s.loader_workers) for s in one] == [(2, 2)] * 4  # 4 cores each: the loop and the loader
    two = worker_plan("auto", ["0", "1"], 16, per_gpu=3)
    assert [s.gpu for s in two] == ["0", "1", "0", "1", "0", "1"]
    assert all(s.threads >= 1 for s in two) and sum(s.threads + s.loader_workers for s in two) <= 16
    five = worker_plan(5, ["0", "1"], 4)  # an explicit count: round-robin, never a GPU with two more than another
    assert [s.gpu for s in five] == ["0", "1", "0", "1", "0"] and all(s.loader_workers == 0 for s in five)
    assert worker_overrides([], one[0]) == ["train.threads=2", "train.accelerator=gpu", "train.devices=1",
                                            "train.num_workers=2"]
    assert worker_overrides(["train.num_workers=0", "train.threads=1"], one[0]) == \
        ["train.num_workers=0", "train.threads=1", "train.accelerator=gpu", "train.devices=1"]
    with pytest.raises(UserError, match="--workers-per-gpu 0 must be at least 1"):
        worker_plan("auto", ["0"], 16, per_gpu=0)


def test_each_gpu_worker_sees_its_own_device_and_the_storage_url_stays_off_the_command_line():
    from lightning_tfm.sweep import STORAGE_ENV
    from lightning_tfm.sweep.launch import worker_env, worker_plan
    from lightning_tfm.sweep.worker import GPU_ENV

    url = "postgresql://u:secret@db/x"
    slots = worker_plan("auto", ["4", "6"], 8, per_gpu=2)  # a job already limited to GPUs 4 and 6
    envs = [worker_env({}, s, url) for s in slots]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4", "6", "4", "6"]
    assert [e[GPU_ENV] for e in envs] == ["4", "6", "4", "6"] and all(e[STORAGE_ENV] == url for e in envs)
    cpu = worker_env({"PATH": "/bin"}, worker_plan(2, [], 2)[1], url)
    assert "CUDA_VISIBLE_DEVICES" not in cpu and GPU_ENV not in cpu and cpu[STORAGE_ENV] == url
    assert cpu["PATH"] == "/bin"


def test_the_progress_line_shows_each_gpus_rows_and_utilisation():
    from lightning_tfm.sweep.launch import format_gpus, gpu_usage

    usage = gpu_usage("0, 87, 21811\n1, 12, 3072\nbad line\n")
    assert usage == {"0": (87, 21811), "1": (12, 3072)}
    running = [{"gpu": "0"}, {"gpu": "0"}, {"gpu": "0"}, {"gpu": "1"}]
    assert format_gpus(running, ["0", "1"], usage) == "GPU 0: 3 rows 87% 21.3 GiB, GPU 1: 1 row 12% 3.0 GiB"
    assert format_gpus([], ["0"], {}) == "GPU 0: 0 rows"


def test_a_rows_own_seeds_and_bad_ones(tmp_path):
    from lightning_tfm.sweep import load_sweep

    body = {"name": "s", "experiment": str(ROOT / "experiments/multi30k-smoke.yaml"), "seeds": [7],
            "variants": {"base": {"seeds": [1, 2, 3]}, "C1": {"model.layers": 1}}}
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(body, sort_keys=False))
    assert [(e.name, e.seed) for e in load_sweep(f).entries()] == [("base", 1), ("base", 2), ("base", 3), ("C1", 7)]
    for bad in ([], [1, 1], "1", [1.5]):
        body["variants"]["base"]["seeds"] = bad
        f.write_text(yaml.safe_dump(body, sort_keys=False))
        with pytest.raises(UserError,
                           match="variant base: seeds must be a non-empty list of at most 100 distinct integers"):
            load_sweep(f)


def test_bad_workers_argument_stops_with_one_line(tmp_path, data_dir, ltfm_here):
    for args, msg in ((["--workers", "0"], "--workers '0' must be a count of at least 1 or 'auto'"),
                      (["--workers", "many"], "--workers 'many' must be a count"),
                      (["--workers", "auto", "--workers-per-gpu", "0"], "--workers-per-gpu 0 must be at least 1"),
                      (["--workers-per-gpu", "2"], "--workers-per-gpu goes with --workers auto")):
        p = ltfm_here("sweep", "sweeps/smoke.yaml", *args, f"data.path={data_dir}", f"run.results_dir={tmp_path}")
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
    assert not list(tmp_path.iterdir())  # nothing written


# (#64 item 14) options that would do nothing together: the options given, and what the one line must name
NOTHING_TOGETHER = [
    (["--json"], ("--json", "--status", "--dry-run")),
    (["--status", "--dry-run"], ("--status", "--dry-run")),
    (["--status", "--workers", "2"], ("--status", "--workers")),
    (["--status", "--n-trials", "2"], ("--status", "--n-trials")),
    (["--status", "--every", "5"], ("--status", "--every")),
    (["--dry-run", "--workers", "2"], ("--dry-run", "--workers")),
    (["--dry-run", "--every", "5", "--workers", "2"], ("--dry-run", "--every", "--workers")),
    (["--every", "5"], ("--every", "--workers")),
]


@pytest.mark.parametrize("given, named", NOTHING_TOGETHER, ids=[" ".join(g) for g, _ in NOTHING_TOGETHER])
def test_sweep_options_that_do_nothing_together_are_refused_with_one_line(given, named, tmp_path, data_dir,
                                                                          ltfm_here):
    """Refused before anything is opened or run (no study, no results folder), never ignored."""
    results = tmp_path / "results"
    p = ltfm_here("sweep", "sweeps/smoke.yaml", *given, f"data.path={data_dir}", f"run.results_dir={results}")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("ltfm: error: "), (p.returncode, p.stderr)
    assert all(option in lines[0] for option in named), lines[0]
    assert p.stdout == "" and not results.exists()


def test_the_sweep_options_that_go_together_are_taken(tmp_path, data_dir, ltfm_here):
    """The control: --json with --dry-run (or --status), a search's dry run with --n-trials."""
    args = [f"data.path={data_dir}", f"run.results_dir={tmp_path / 'results'}"]
    assert ltfm_here("sweep", "sweeps/smoke.yaml", "--dry-run", "--json", *args).returncode == 0
    assert ltfm_here("sweep", "sweeps/search.yaml", "--dry-run", "--n-trials", "2", *args).returncode == 0
    status = ltfm_here("sweep", "sweeps/smoke.yaml", "--status", "--json", *args)  # no study yet: its own error
    assert status.returncode == 2 and "no sweep database" in status.stderr, status.stderr


@pytest.mark.slow
@pytest.mark.long
def test_sigterm_to_the_launcher_stops_its_workers_and_the_same_command_finishes_the_table(tmp_path, data_dir):
    """`kill` of the one process a user started: no worker or trial is left running, nothing finished is lost,
    and the same command again completes the rows."""
    import os
    import signal
    import subprocess
    import sys

    results = tmp_path / "results"
    args = [sys.executable, "-m", "lightning_tfm", "sweep", "sweeps/smoke.yaml", "--workers", "2", "--every", "2",
            f"data.path={data_dir}", f"run.results_dir={results}", "train.max_steps=400", "train.val_every_steps=20",
            "data.max_train_pairs=300", "decode.max_len_b=10"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: the signal reaches the launcher alone
    lines = []
    # until a trial is training, however long that takes; or the launcher's output ends
    while not re.search(r"step [1-9]\d*/400", line := proc.stdout.readline()):
        lines.append(line)
        if not line:  # its output ended: the launcher exited before any trial trained
            proc.wait()
            pytest.fail(f"no trial started training (exit {proc.returncode}): " + "".join(lines)[-2000:])
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted: stopping the workers" in out
    left = subprocess.run(["pgrep", "-f", str(results)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes still running: {left}"
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{results / 'smoke.db'}")
    assert not [t for t in study.get_trials() if t.state.name == "RUNNING"]
    # the same command, with a budget that ends soon: every row completes, the interrupted ones from a checkpoint;
    # what `make ablation` shows: progress lines, one line per finished row with its dev PPL, a log per worker
    p = ltfm(*args[3:-4], "train.max_steps=40", "train.val_every_steps=20", "data.max_train_pairs=300",
             "decode.max_len_b=10", env={"WANDB_DIR": str(tmp_path)}, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:]
    out = p.stdout
    assert "2 worker(s) on 2 CPU core(s), 1 thread(s) each" in out
    lines = [ln for ln in out.splitlines() if re.match(r"\[smoke [\d:]+\] rows \d/4 done", ln)]
    assert lines and "rows 4/4 done, 0 running, 0 left" in lines[-1]
    assert any(re.search(r"\| (base|A1|C1|prenorm) s1 (starting|step \d+/40)", ln) for ln in lines), lines
    for row in ("base", "A1", "C1", "prenorm"):
        assert re.search(rf"finished: {row} seed 1: dev ppl \d+\.\d\d (\(.*\) )?\(\d+:\d\d\)$", out, re.M), out
    logs = results / "sweep-logs" / "smoke"
    assert (logs / "worker-0.log").is_file() and (logs / "worker-1.log").is_file()
    # the launcher queued the rows once, before the workers started: no duplicate trials
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{results / 'smoke.db'}")
    assert not [t for t in study.get_trials() if t.user_attrs.get("skip") == "duplicate"]
    assert {t.user_attrs["variant"] for t in study.get_trials() if t.state.name == "COMPLETE"} == \
        {"base", "A1", "C1", "prenorm"}

def test_a_search_sweeps_progress_line_counts_its_trials():
    from lightning_tfm.sweep import load_sweep
    from lightning_tfm.sweep.launch import format_search_progress

    sweep = load_sweep(ROOT / "sweeps/search.yaml")
    study = optuna.create_study()
    for value in (1.0, 2.0):
        study.tell(study.ask(), value)
    study.tell(study.ask(), state=optuna.trial.TrialState.PRUNED)
    study.ask()  # running
    dup = study.ask()
    study._storage.set_trial_user_attr(dup._trial_id, "skip", "duplicate")
    study.tell(dup, state=optuna.trial.TrialState.FAIL)
    line = format_search_progress(sweep, study.get_trials(deepcopy=False), 75)
    assert line == (f"[{sweep.name} 1:15] trials 3/{sweep.n_trials} finished (2 completed, 1 pruned, 0 failed), "
                    "1 running")


def test_written_status_names_run_folders_within_the_results_folder(tmp_path):
    from lightning_tfm.sweep import load_sweep
    from lightning_tfm.sweep.status import format_status
    from lightning_tfm.training.runs.results import in_results, storage_in_results

    results = tmp_path / "results"
    assert in_results(str(results / "table3-cpu-base-1234"), results) == "table3-cpu-base-1234"
    assert in_results("/elsewhere/run", results) == "/elsewhere/run" and in_results(None, results) is None
    assert storage_in_results(f"sqlite:///{results}/t.db", results) == "t.db (SQLite, in the results folder)"
    assert storage_in_results("postgresql://u:pw@h/db", results) == "postgresql://u:***@h/db"
    rows = [{"number": 0, "variant": "base", "seed": 1, "state": "complete", "value": 3.5, "steps": 600,
             "duration_s": 401, "run_dir": str(results / "table3-cpu-base-1234"), "note": None}]
    text = format_status(load_sweep(ROOT / "sweeps/table3-cpu.yaml"), rows, f"sqlite:///{results}/t.db", results)
    assert str(tmp_path) not in text and "table3-cpu-base-1234" in text
    assert "t.db (SQLite, in the results folder)" in text.splitlines()[-1]


def test_status_names_each_kind_of_skipped_trial():
    from lightning_tfm.sweep.status import status_rows

    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="s")
    for skip in ("unbuildable", "duplicate", "running", None):
        t = study.ask()
        t.set_user_attr("variant", f"row-{skip}")
        if skip:
            t.set_user_attr("skip", skip)
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, 1.0)
    assert [r["state"] for r in status_rows(study)] == ["skipped", "duplicate", "running elsewhere", "complete"]
