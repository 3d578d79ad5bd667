"""Verdicts where a sweep is watched: ``ltfm sweep --status`` and the launcher's line for a finished row say whether
each row's change against the base holds at k x the budget (lightning_tfm.sweep.status.row_verdicts), from run
folders written by the training's own writers (Lightning's CSVLogger, the atomic summary.json) with dev-PPL curves
of known shape, and trials that name them as the worker's do."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import optuna
import pytest
import yaml
from pytorch_lightning.loggers import CSVLogger

from lightning_tfm import report as rd
from lightning_tfm.base import atomic
from lightning_tfm.report.table3.verdict import pct, predict
from lightning_tfm.sweep import Plan, load_sweep
from lightning_tfm.sweep.launch import _Monitor
from lightning_tfm.sweep.status import format_status, row_verdicts, status_rows

from conftest import SMOKE

WARMUP = 200
EVERY_50 = list(range(49, 600, 50))   # Lightning's steps of a validation every 50 updates, to a 600-step budget


def log_ppl(a: float, alpha: float, steps, seed: int) -> dict[int, float]:
    """Dev PPL whose log is ``a * t^-alpha`` (t: updates), with 0.3% noise on the log."""
    rng = np.random.default_rng(seed)
    return {s: math.exp(a * (s + 1) ** -alpha * (1 + rng.normal(0, 0.003))) for s in steps}


# The base at three seeds (dev PPL ~39 at 600 updates); "faster": a parallel curve 20% lower in log PPL (-41% PPL),
# so still lower at 3x by more than the extrapolation's error; "crossing": better at 600 updates (-17%) but nearly
# flat, above the base by 1,800 (+92%);
# "sparse": two validations, too few after the warmup for a fit; "running": not finished.
CURVES = {
    ("base", 1): log_ppl(24.8, 0.3, EVERY_50, 1), ("base", 2): log_ppl(25.0, 0.3, EVERY_50, 2),
    ("base", 3): log_ppl(25.2, 0.3, EVERY_50, 3),
    ("faster", 1): log_ppl(20.0, 0.3, EVERY_50, 4),
    ("crossing", 1): log_ppl(4.78, 0.05, EVERY_50, 5),
    ("sparse", 1): log_ppl(20.0, 0.3, [299, 599], 6),
    ("running", 1): log_ppl(20.0, 0.3, EVERY_50[:6], 7),
}


def write_run(run_dir, curve: dict[int, float]) -> None:
    """A finished run's folder as training leaves it: logs/version_0/metrics.csv and summary.json."""
    logger = CSVLogger(save_dir=str(run_dir), name="logs", version=0)
    for step, ppl in curve.items():
        logger.log_metrics({"dev/loss": math.log(ppl), "dev/ppl": ppl}, step=step)
    logger.save()
    atomic.write_json(run_dir / "summary.json", {"status": "completed", "steps": max(curve) + 1,
                                                 "dev_ppl": curve[max(curve)], "dev_loss": math.log(curve[max(curve)]),
                                                 "config": {"train": {"warmup": WARMUP}}})


def sweep_with_runs(tmp, name: str, variants: dict, curves: dict, storage=None):
    """The sweep file ``name`` of ``variants``, its plan, its results folder and a study (in ``storage``, else in
    memory) whose trials carry the worker's attributes (the plan's, the run folder) for each (variant, seed) of
    ``curves``, its run folder written: finished, unless the variant is "running"."""
    sweep_file = tmp / f"{name}.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": name, "experiment": str(SMOKE), "seeds": [1],
                                          "variants": variants}))
    sweep, results = load_sweep(sweep_file), tmp / "results"
    plan = Plan(sweep, [], data=False)
    entries = {(e.name, e.seed): e for e in sweep.entries()}
    results.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage or optuna.storages.InMemoryStorage(), study_name=name)
    for (variant, seed), curve in curves.items():
        run_dir = results / f"{name}-{variant}-s{seed}-0000"
        write_run(run_dir, curve)
        trial = study.ask()
        # the curves' budget, 600 steps, as the trial's (the smoke experiment's own is smaller)
        for k, v in {**plan.attrs(entries[variant, seed]), "max_steps": 600, "run_dir": str(run_dir)}.items():
            trial.set_user_attr(k, v)
        if variant != "running":
            trial.set_user_attr("dev_ppl", curve[max(curve)])
            study.tell(trial, math.log(curve[max(curve)]))
    return sweep, results, study, plan


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The sweep of :data:`CURVES` (the base at three seeds, the other rows at one)."""
    return sweep_with_runs(tmp_path_factory.mktemp("verdicts"), "v", {
        "base": {"seeds": [1, 2, 3]}, "faster": {}, "crossing": {}, "sparse": {}, "running": {}}, CURVES)


def test_each_finished_row_gets_the_verdict_of_its_predicted_gap(swept):
    sweep, _, study, _ = swept
    verdicts = row_verdicts(sweep, status_rows(study))
    assert set(verdicts) == {"faster", "crossing", "sparse"}  # running: not finished; base: none
    faster, crossing, sparse = verdicts["faster"], verdicts["crossing"], verdicts["sparse"]
    assert faster.verdict.verdict == "holds" and faster.verdict.gap.high < 0
    assert faster.verdict.gap.at_step == faster.verdict.gap.base_step == 1799       # k 3 x 600 updates
    assert faster.verdict.gap.low < -0.528 < faster.verdict.gap.high                 # the truth at 1,800: -20% of 2.64
    assert crossing.verdict.verdict == "may flip" and crossing.verdict.gap.low > 0   # today -18%, above at 3x
    # the predicted gap at 3x, the one-sided bound the call rests on, then the size's 80% interval
    assert re.fullmatch(r"holds: -\d+% at 3x, bound -\d+% \(80% \[-\d+, -\d+\]\)", faster.text), faster.text
    assert re.fullmatch(r"may flip: \+\d+% at 3x, bound [+-]\d+% \(80% \[\+\d+, \+\d+\]\)", crossing.text), \
        crossing.text
    assert (sparse.verdict.verdict, sparse.verdict.gap) == ("too few points", None)
    assert sparse.text == "too few points: the row: 2 validation(s) after the warmup (step 200), the fit needs 3"


def test_the_status_verdict_is_the_reports_prediction(swept):
    """The same fit, draws and interval as the report's verdict (lightning_tfm.report.table3.verdict.predict) on the
    same curves: a status line never contradicts the report's prediction."""
    sweep, _, study, _ = swept
    status = row_verdicts(sweep, status_rows(study))
    base = [CURVES["base", s] for s in (1, 2, 3)]
    for variant in ("faster", "crossing"):
        report = predict([CURVES[variant, 1]], base, sweep.report, warmup=WARMUP, base_warmup=WARMUP)
        assert (report.point, report.low, report.high, report.at_step) == \
            (lambda g: (g.point, g.low, g.high, g.at_step))(status[variant].verdict.gap)


def test_status_shows_a_verdict_column_for_finished_rows_only(swept):
    sweep, results, study, _ = swept
    rows = status_rows(study, sweep)
    by = {r["variant"]: r for r in rows}
    assert by["faster"]["verdict"].startswith("holds: ") and by["crossing"]["verdict"].startswith("may flip: ")
    assert by["base"]["verdict"] is None and by["running"]["verdict"] is None
    assert by["sparse"]["verdict"].startswith("too few points: ")
    text = format_status(sweep, rows, f"sqlite:///{results}/v.db", results)
    head, *lines = text.splitlines()
    assert "verdict at 3x" in head
    line = {ln.split()[1]: ln for ln in lines[:-1]}
    assert by["faster"]["verdict"] in line["faster"] and "may flip" in line["crossing"]
    assert "holds" not in line["sparse"] and "may flip" not in line["base"]


def test_no_verdict_column_without_a_finished_base(swept, tmp_path):
    sweep, results, study, _ = swept
    rows = [r for r in status_rows(study) if r["variant"] != "base"]
    assert row_verdicts(sweep, rows) == {}
    assert "verdict" not in format_status(sweep, rows, f"sqlite:///{results}/v.db", results).splitlines()[0]


def test_the_launchers_lines_carry_the_verdicts(swept):
    """The line for a finished row ends with its verdict; the progress line counts the finished rows' verdicts."""
    sweep, _, study, plan = swept
    said: list[str] = []
    monitor = _Monitor(sweep, plan, cost={}, open_study_fn=lambda: study, started=0.0, workers=1, say=said.append)
    monitor.finished_rows()
    by_name = {v: x.text for v, x in row_verdicts(sweep, status_rows(study)).items()}
    line = {ln.split(": ")[1]: ln for ln in said}
    assert set(line) == {"base seed 1", "base seed 2", "base seed 3", "faster seed 1", "crossing seed 1",
                         "sparse seed 1"}
    assert f"dev ppl {CURVES['faster', 1][599]:.2f} ({by_name['faster']}) (" in line["faster seed 1"]
    assert f"({by_name['crossing']})" in line["crossing seed 1"]
    assert not any(w in line[n] for w in ("holds", "may flip") for n in ("sparse seed 1", "base seed 1"))
    monitor.progress_line(alive=1)
    assert said[-1].startswith("[v ") and "] rows 6/7 done (1 hold, 1 may flip), 1 running, 0 left" in said[-1]


def test_status_json_gives_each_finished_rows_verdict_as_numbers(swept, tmp_path, ltfm_here):
    """``ltfm sweep FILE --status --json``: the verdict's text and its numbers (label, predicted gap and interval,
    the step they are at) on each finished row, None on the others; the same as the table's."""
    sweep, results, study, _ = swept
    storage = f"sqlite:///{tmp_path / 'v.db'}"
    optuna.copy_study(from_study_name="v", from_storage=study._storage, to_storage=storage)
    p = ltfm_here("sweep", sweep.path, "--status", "--json", "--storage", storage)
    assert p.returncode == 0, p.stderr
    by = {r["variant"]: r for r in json.loads(p.stdout)}
    verdicts = row_verdicts(sweep, status_rows(study))
    for variant in ("faster", "crossing"):
        gap = verdicts[variant].verdict.gap
        assert by[variant]["verdict"] == verdicts[variant].text
        assert by[variant]["prediction"] == {"verdict": verdicts[variant].verdict.verdict, "point": gap.point,
                                             "low": gap.low, "high": gap.high,
                                             "bound": gap.point - np.sign(gap.now) * gap.sign_margin,
                                             "at_step": 1799}
    assert by["faster"]["prediction"]["verdict"] == "holds" and by["crossing"]["prediction"]["verdict"] == "may flip"
    assert all(by[v]["verdict"] is None and by[v]["prediction"] is None for v in ("base", "running"))
    assert by["sparse"]["verdict"].startswith("too few points: ") and by["sparse"]["prediction"] is None


# A row worse than the base by ~13% at 600 updates whose curve falls a little slower: still worse at 3x, by less than
# the extrapolation's error, so the size's 80% interval reaches below zero while the direction's one-sided bound
# (the gap moved toward zero by 0.68 x today's gap and the base's seed sd) stays above it.
SLOWER = log_ppl(24.0, 0.29, EVERY_50, 8)


@pytest.mark.parametrize("base_seeds, kind", [((1,), "too few points"), ((1, 2, 3), "holds")])
def test_status_and_the_report_give_one_verdict_on_the_same_runs(tmp_path, ltfm_here, base_seeds, kind):
    """Issue #64 (10): a two-row sweep with one base seed, where ``--status`` said "holds: +13% [-15, +51] at 3x"
    and the report of the same runs "too few points" (seed noise unknown). ``ltfm sweep FILE --status`` and the
    report's table (its verdict on the records it reads) say the same of the row: with one base seed *too few
    points*; with three, beyond noise, *holds*, with an interval that reaches zero, so both print the one-sided
    bound the call rests on, on today's side of zero."""
    storage = f"sqlite:///{tmp_path / 'results' / 'two.db'}"
    sweep, results, _, _ = sweep_with_runs(
        tmp_path, "two", {"base": {"seeds": list(base_seeds)}, "slower": {}},
        {**{("base", s): CURVES["base", s] for s in base_seeds}, ("slower", 1): SLOWER}, storage)
    p = ltfm_here("sweep", sweep.path, "--status", "--json", "--storage", storage)
    assert p.returncode == 0, p.stderr
    status = {r["variant"]: r for r in json.loads(p.stdout)}["slower"]
    table = ltfm_here("sweep", sweep.path, "--status", "--storage", storage)
    assert table.returncode == 0, table.stderr
    assert status["verdict"] in table.stdout

    report = rd.build_table(rd.load_report_data(sweep.path, results_dir=results, storage=storage), bootstrap=False)
    row = next(r for r in report.rows if r.variant == "slower")
    assert row.ppl_verdict == kind == status["prediction"]["verdict"]
    assert status["verdict"].startswith(f"{kind}: ")
    assert row.ppl_noise == ("unknown" if len(base_seeds) == 1 else "beyond") and row.delta_ppl > 0
    gap = status["prediction"]
    assert gap["low"] < 0 < gap["point"] and gap["bound"] > 0       # the interval reaches zero, the bound does not
    if kind == "holds":
        assert f"bound {pct(gap['bound'], 0)}" in status["verdict"]
        assert row.ppl_verdict_why.endswith(f"; direction bound {pct(gap['bound'])}")
    else:
        assert status["verdict"] == f"too few points: {row.ppl_verdict_why}"


def test_a_failed_attempt_says_which_trial_runs_its_row_again_and_why_it_failed():
    """--status notes: a failed attempt names the trial that runs its row again (the study's retry, or the row
    queued again by a later ltfm sweep) before its error; one the study failed when its worker stopped beating has
    no error of its own and says so; a retry names what it retries; a closed duplicate is not a retried row."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from lightning_tfm.sweep.status import trial_rows

    study = optuna.create_study()
    dist = {"x": FloatDistribution(0, 1)}

    def add(state, key, value=None, system=None, **attrs):
        study.add_trial(create_trial(state=state, params={"x": 0.5}, distributions=dist, value=value,
                                     user_attrs={"grid_key": key, **attrs}, system_attrs=system or {}))

    add(TrialState.FAIL, "a", status="interrupted", error="interrupted")   # 0: stopped by Ctrl-C
    add(TrialState.FAIL, "b")                                              # 1: its worker was killed
    add(TrialState.COMPLETE, "c", value=1.0)                               # 2
    add(TrialState.WAITING, "a")                                           # 3: row a queued again
    add(TrialState.WAITING, "b", system={"failed_trial": 1, "retry_history": [1]})   # 4: the study's retry
    add(TrialState.FAIL, "c", skip="duplicate", reason="duplicate of trial 2")      # 5
    add(TrialState.FAIL, "d", error="exit code 1")                         # 6: failed, nothing runs it again
    notes = [r["note"] for r in trial_rows(study.get_trials(deepcopy=False))]
    assert notes == ["retried as trial 3: interrupted", "retried as trial 4: its worker stopped (no heartbeat)",
                     None, None, "retry of trial 1", "duplicate of trial 2", "exit code 1"]


def test_a_stopped_row_shows_the_step_it_resumes_from_and_the_validated_steps_that_run_again():
    """A trial stopped harder than Ctrl-C (killed before it wrote last.ckpt) validated past its newest checkpoint:
    --status gives the checkpoint's step as its steps (what the next run resumes from) and says which validated
    steps run again; one stopped before any checkpoint says it starts again; a Ctrl-C'd one (the two equal) adds
    nothing."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from lightning_tfm.sweep.held import stop_note
    from lightning_tfm.sweep.status import trial_rows

    study = optuna.create_study()
    for stopped_at, validated in ((500, 800), (0, 400), (300, 300)):
        study.add_trial(create_trial(
            state=TrialState.WAITING, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
            intermediate_values={s: 4.0 for s in range(100, validated + 1, 100)},
            user_attrs={"status": "stopped", "stopped_at": stopped_at, "reason": stop_note(stopped_at)}))
    rows = trial_rows(study.get_trials(deepcopy=False))
    assert [(r["state"], r["steps"]) for r in rows] == [("stopped", 500), ("stopped", 0), ("stopped", 300)]
    assert [r["note"] for r in rows] == [
        "stopped at step 500: the same command resumes it first; validated to step 800, past its checkpoint: "
        "steps 500-800 run again",
        "stopped before its first checkpoint: the same command starts it again first; validated to step 400, past "
        "its checkpoint: steps 0-400 run again",
        "stopped at step 300: the same command resumes it first"]
