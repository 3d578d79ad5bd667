"""Every read of a run for a sweep is at THE SWEEP'S OWN BUDGET (lightning_tfm.sweep.budget), when its run folder holds
more training: a continued sweep (sweeps/table3-cpu-continued.yaml's way) trained rows on in the same folders, or two
sweep files of different budgets share one results folder. ``--status`` (text and JSON), its verdicts, the launcher's
lines, the value the worker tells Optuna and the report read each run at its own sweep's budget, never at the later
one. Run folders are written by the training's own writers (Lightning's CSVLogger, the atomic summary.json) with
dev-PPL curves of known shape; the worker test runs the real CLI, whose trials find their folders completed."""
from __future__ import annotations

import json
import math

import optuna
import pytest
from pytorch_lightning.loggers import CSVLogger

from lightning_tfm import report as rd
from lightning_tfm.base import atomic
from lightning_tfm.report.table3.verdict import predict
from lightning_tfm.sweep import Plan, load_sweep
from lightning_tfm.sweep.launch import _Monitor, progress
from lightning_tfm.sweep.status import format_status, status_rows
from lightning_tfm.sweep.worker import write_trial_config
from lightning_tfm.training.config.run_id import config_hash

from conftest import SMOKE, write_sweep
from test_status_verdicts import CURVES, log_ppl, write_run

LATER = list(range(649, 1800, 50))  # the continued sweep's validations, to 1,800 steps


def continue_run(run_dir, curve: dict[int, float]) -> None:
    """The run trained on to 1,800 steps by another sweep: a second attempt's metrics.csv, and a summary.json at
    1,800 steps keeping the 600-step attempt (as ``ltfm train`` writes them)."""
    logger = CSVLogger(save_dir=str(run_dir), name="logs", version=1)
    for step, ppl in curve.items():
        logger.log_metrics({"dev/loss": math.log(ppl), "dev/ppl": ppl}, step=step)
    logger.save()
    first = json.loads((run_dir / "summary.json").read_text())
    atomic.write_json(run_dir / "summary.json", {
        **first, "steps": 1800, "dev_ppl": curve[1799], "dev_loss": math.log(curve[1799]), "dev_bleu": 30.0,
        "attempts": [{k: v for k, v in first.items() if k != "config"}]})


@pytest.fixture
def continued(tmp_path):
    """The 600-step sweep of test_status_verdicts' curves, its status read, then its base (three seeds) and
    "faster" trained on to 1,800 steps by another sweep, the base's runs much further down (as the paper's base
    keeps learning): (sweep, results, study, the status rows read before the continuation)."""
    import yaml

    sweep_file = tmp_path / "v.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "v", "experiment": str(SMOKE),
                                          "seeds": [1], "variants": {"base": {"seeds": [1, 2, 3]}, "faster": {},
                                                                     "crossing": {}}}))
    sweep, results = load_sweep(sweep_file), tmp_path / "results"
    plan = Plan(sweep, [], data=False)
    entries = {(e.name, e.seed): e for e in sweep.entries()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'v.db'}"
    study = optuna.create_study(storage=storage, study_name="v")
    for (variant, seed) in entries:
        run_dir = results / f"v-{variant}-s{seed}-0000"
        write_run(run_dir, CURVES[variant, seed])
        trial = study.ask()
        for k, v in {**plan.attrs(entries[variant, seed]), "max_steps": 600, "run_dir": str(run_dir),
                     "steps": 600, "dev_ppl": CURVES[variant, seed][599]}.items():
            trial.set_user_attr(k, v)
        study.tell(trial, math.log(CURVES[variant, seed][599]))
    before = status_rows(study, sweep)
    for (variant, seed) in [("base", 1), ("base", 2), ("base", 3), ("faster", 1)]:
        a = 18.0 if variant == "base" else 24.0
        continue_run(results / f"v-{variant}-s{seed}-0000", log_ppl(a, 0.3, LATER, seed))
    return sweep, results, study, storage, before


def _shown(rows):
    return {(r["variant"], r["seed"]): (r["value"], r["steps"], r["verdict"], r["prediction"]) for r in rows}


def test_status_reads_a_continued_sweeps_folders_at_its_own_budget(continued, ltfm_here):
    """After the continued sweep, ``--status`` of the first sweep says what it said before (values, steps,
    verdicts at 3 x 600 steps), in its table and its JSON, and the launcher's lines count the same verdicts."""
    sweep, results, study, storage, before = continued
    after = status_rows(study, sweep)
    assert _shown(after) == _shown(before)
    by = {r["variant"]: r for r in after}
    assert by["faster"]["verdict"].startswith("holds: ") and by["crossing"]["verdict"].startswith("may flip: ")
    assert by["faster"]["prediction"]["at_step"] == 1799  # 3 x 600 updates, not 3 x 1,800
    text, earlier = (format_status(sweep, rows, storage, results).splitlines() for rows in (after, before))
    assert [ln.split("read at step")[0].rstrip() for ln in text] == earlier  # the same table, with a note on the 4 read
    assert sum("read at step 600, its folder trained on (completed at step 1800)" in ln for ln in text) == 4
    p = ltfm_here("sweep", sweep.path, "--status", "--json", "--storage", storage)
    assert p.returncode == 0, p.stderr
    assert _shown(json.loads(p.stdout)) == _shown(before)
    said: list[str] = []
    monitor = _Monitor(sweep, Plan(sweep, [], data=False), cost={}, open_study_fn=lambda: study, started=0.0,
                       workers=1, say=said.append)
    monitor.progress_line(alive=1)
    assert "(1 hold, 1 may flip)" in said[-1], said[-1]


def test_status_reads_a_value_recorded_past_the_budget_at_the_budget(continued, ltfm_here):
    """A trial whose value a re-run recorded from its folder at the later budget (as the worker did before it read
    runs at its budget): --status shows the value at the trial's budget, and says so."""
    sweep, results, study, storage, before = continued
    later = json.loads((results / "v-faster-s1-0000" / "summary.json").read_text())
    moved = optuna.create_study(study_name="v")
    for trial in study.get_trials():
        faster = trial.user_attrs["variant"] == "faster"
        moved.add_trial(optuna.trial.create_trial(
            state=trial.state, value=later["dev_loss"] if faster else trial.value,
            user_attrs={**trial.user_attrs, **({"steps": 1800} if faster else {})}))
    rows = {r["variant"]: r for r in status_rows(moved, sweep)}
    assert rows["faster"]["value"] == pytest.approx(math.log(CURVES["faster", 1][599]))
    assert rows["faster"]["steps"] == 600
    assert rows["faster"]["note"] == "read at step 600, its folder trained on (completed at step 1800)"
    assert rows["base"]["note"] is not None and rows["crossing"]["note"] is None  # crossing: nobody touched it


def test_the_progress_line_reads_a_running_row_up_to_its_budget(continued):
    """A row's folder another sweep trains on past this one's budget: the progress line's step and dev PPL are of
    this sweep's budget, not of the other sweep's training."""
    sweep, results, study, storage, _ = continued
    plan = Plan(sweep, [], data=False)
    moved = optuna.create_study(study_name="v")
    for trial in study.get_trials():
        state = optuna.trial.TrialState.RUNNING if trial.user_attrs["variant"] == "faster" else trial.state
        moved.add_trial(optuna.trial.create_trial(state=state, value=trial.value if state.is_finished() else None,
                                                  user_attrs=trial.user_attrs))
    running = progress(sweep, plan, moved.get_trials(), {})["running"]
    assert [(r["variant"], r["step"]) for r in running] == [("faster", 599)]
    assert running[0]["dev_ppl"] == pytest.approx(CURVES["faster", 1][599])


def _folder(results, name: str, cfg, study: str, steps: int, curve: dict[int, float]):
    """A run folder another sweep ``study`` trained to ``steps`` (its config.yaml, metrics and summary.json)."""
    cfg.run.study, cfg.train.max_steps = study, steps
    run_dir = results / name
    write_trial_config(cfg, run_dir / "config.yaml")
    write_run(run_dir, curve)
    summary = json.loads((run_dir / "summary.json").read_text())
    atomic.write_json(run_dir / "summary.json", {**summary, "steps": steps, "dev_bleu": 9.0,
                                                 "config": {"train": {"warmup": 10}, "run": {"study": study}}})
    return run_dir


@pytest.mark.slow  # three `ltfm train` processes (each finds its run completed and returns)
def test_two_sweep_files_sharing_a_results_folder_each_record_their_own_budget(tmp_path, data_dir, ltfm_here):
    """A 30-step sweep ("long") trained rows whose configs a 20-step sweep ("short") has too, in one results folder:
    the short sweep's trials find those folders completed (``ltfm train`` returns at once) and record the value at
    20 steps (the curve's validation there), never the 30-step one; a folder with no validation at 20 steps leaves
    its trial skipped with the reason. ``--status --json``, its verdicts and the report read them at 20 steps."""
    results = tmp_path / "results"
    sweep_file = write_sweep(tmp_path / "short.yaml", "short", {"base": {}, "fast": {"model.dropout": 0.0},
                                                                 "gap": {"model.dropout": 0.2},
                                                                 "halted": {"model.dropout": 0.3}})
    args = (f"data.path={data_dir}", f"run.results_dir={results}")
    sweep = load_sweep(sweep_file)
    plan = Plan(sweep, list(args))
    cfgs = {e.name: plan.config(e) for e in sweep.entries()}
    every2 = list(range(11, 30, 2))                                   # validations at steps 11, 13, ..., 29
    base = {s: math.exp(6.0 * (s + 1) ** -0.3) for s in every2 if s < 20}
    fast = {s: math.exp(5.9 * (s + 1) ** -0.3) for s in every2}      # its folder trained to 30 steps by "long"
    gap = {s: p for s, p in fast.items() if s != 19}                  # no validation at the budget
    _folder(results, f"short-base-s1-{config_hash(cfgs['base'])}", cfgs["base"], "short", 20, base)
    _folder(results, f"long-fast-s1-{config_hash(cfgs['fast'])}", cfgs["fast"], "long", 30, fast)
    _folder(results, f"long-gap-s1-{config_hash(cfgs['gap'])}", cfgs["gap"], "long", 30, gap)
    # a run of the long sweep stopped (Ctrl-C) at step 30 of its budget: never resumed with this smaller one
    halted = _folder(results, f"long-halted-s1-{config_hash(cfgs['halted'])}", cfgs["halted"], "long", 30, fast)
    atomic.write_json(halted / "summary.json", {**json.loads((halted / "summary.json").read_text()),
                                                "status": "stopped"})
    (halted / "checkpoints").mkdir(exist_ok=True)
    (halted / "checkpoints" / "step=000030.ckpt").write_bytes(b"")  # what it could resume from
    kept = {f: (halted / f).read_bytes() for f in ("summary.json", "config.yaml")}

    p = ltfm_here("sweep", sweep_file, *args)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    trials = {t.user_attrs["variant"]: t for t in
              optuna.load_study(study_name="short", storage=f"sqlite:///{results / 'short.db'}").get_trials()}
    t = trials["fast"]
    assert t.user_attrs["run_dir"].startswith(str(results / "long-fast-s1-"))   # trained on in the long sweep's folder
    assert t.value == pytest.approx(math.log(fast[19]))                          # at 20 steps, not at 30
    assert (t.user_attrs["steps"], t.user_attrs["trained_past"]) == (20, "completed at step 30")
    assert t.user_attrs["dev_ppl"] == pytest.approx(fast[19]) and "dev_bleu" not in t.user_attrs  # no BLEU at 20
    h = trials["halted"]  # read at 20 steps from its curve, untouched: no `ltfm train` refused or resumed it
    assert h.state == optuna.trial.TrialState.COMPLETE and h.value == pytest.approx(math.log(fast[19]))
    assert h.user_attrs["trained_past"] == "stopped at step 30"
    assert {f: (halted / f).read_bytes() for f in kept} == kept
    g = trials["gap"]
    assert g.state == optuna.trial.TrialState.FAIL and g.user_attrs["skip"] == "past_budget"
    assert g.user_attrs["reason"] == ("its run folder was trained on (completed at step 30) and holds no validation "
                                      "at step 20, this sweep's budget")

    s = ltfm_here("sweep", sweep_file, "--status", "--json", *args)
    assert s.returncode == 0, s.stderr
    rows = {r["variant"]: r for r in json.loads(s.stdout)}
    assert (rows["fast"]["value"], rows["fast"]["steps"]) == (pytest.approx(math.log(fast[19])), 20)
    assert rows["gap"]["state"] == "past budget" and rows["gap"]["value"] is None
    report = predict([{k: v for k, v in fast.items() if k < 20}], [base], sweep.report, warmup=10, base_warmup=10)
    assert rows["fast"]["prediction"]["at_step"] == 59 == report.at_step     # 3 x 20 steps, either side
    assert rows["fast"]["prediction"]["point"] == report.point

    data = rd.load_report_data(sweep_file, results_dir=results)
    by = {r.variant: r for r in data.records}
    assert (by["fast"].steps, by["fast"].dev_ppl, by["fast"].dev_bleu) == (20, pytest.approx(fast[19]), None)
    assert by["gap"].status == "continued" and by["gap"].dev_ppl is None
