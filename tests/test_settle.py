"""The settle loop, ``ltfm sweep FILE --settle`` (issue 61, item 3), at smoke scale through the commands a user types:
real ``ltfm`` processes, real SQLite studies, real signals, the real planner (:mod:`lightning_tfm.findings.settle`).

A row's answer comes from real training only. Where a test needs an answer to come out a chosen way it uses a *twin*
of the base: a row whose only override is one no training reads (``decode.max_len_b``, the beam search's length
at the end), so that each of its seeds trains exactly the base's run of that seed (its own run folder: the run id
hashes the override) and its difference to the base is 0 at every seed: paired by seed, it is *the same* at its
first look, and what the loop does around it depends on the caps alone (``seeds``, ``hours``). The budget extension
needs a gap that
changes with the budget: there the test reads the first pass as the planner will, asks the real planner for the
caps under which it continues the runs, and asserts on what is queued and trained.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from conftest import SMOKE, default_signals, ltfm

optuna.logging.set_verbosity(optuna.logging.WARNING)

# A trial trains in seconds; a validation every 2 steps gives the curves the planner fits points after the warmup
TINY = {"wandb.mode": "disabled", "train.threads": 1, "data.max_train_pairs": 200, "data.max_dev_pairs": 20,
        "data.vocab_size": 200, "data.test_split": None, "model.layers": 1, "model.d_model": 32, "model.d_ff": 64,
        "model.heads": 2, "model.d_k": 16, "model.d_v": 16, "train.batch_tokens": 256, "train.warmup": 4,
        "train.max_steps": 20, "train.val_every_steps": 2, "train.checkpoint_every_steps": 10,
        "decode.beam_size": 1, "decode.max_len_b": 10}
TWIN = {"decode.max_len_b": 11}  # trains the base's run (only the final beam search reads it)


def write_sweep(folder: Path, name: str, variants: dict, settle: dict | None = None) -> Path:
    body = {"name": name, "experiment": str(SMOKE), "metric": "dev_loss", "pruner": {"type": "none"}, "seeds": [1],
            "heartbeat": {"interval": 1, "grace": 10, "max_retry": 1}, "overrides": TINY, "variants": variants}
    if settle is not None:
        body["settle"] = settle
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def sweep_args(path: Path, data_dir: Path, tmp: Path) -> list[str]:
    return ["sweep", path, f"data.path={data_dir}", f"run.results_dir={tmp / 'results'}"]


def trials_of(tmp: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp / 'results' / name}.db").get_trials()


def trained(trials) -> list[tuple[str, int, float]]:
    """(variant, seed, budget multiple) of every completed trial, in trial order."""
    return [(t.user_attrs["variant"], t.user_attrs["seed"], t.user_attrs.get("settle_multiple", 1.0))
            for t in trials if t.state.name == "COMPLETE"]


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------------- no training
def test_settle_values_out_of_range_stop_in_one_line(tmp_path, ltfm_here):
    """A settle: value out of its range stops the dry run and --settle before anything is opened or trained, in one
    line naming the key and what it takes; so does one given on the command line; --settle is refused where it
    cannot act."""
    for settle, key in (({"seeds": 1}, "settle.seeds"), ({"alpha": 0.7}, "settle.alpha"),
                        ({"budget": 0.5}, "settle.budget"), ({"delta": 0}, "settle.delta"),
                        ({"hours": -1}, "settle.hours"), ({"looks": 3}, "looks")):
        path = write_sweep(tmp_path, "bad", {"base": {}, "twin": TWIN}, settle)
        for extra in (["--dry-run"], ["--settle"]):
            line = one_line_error(ltfm_here("sweep", path, *extra, f"run.results_dir={tmp_path / 'r'}"))
            assert key in line and "bad.yaml" in line, line
    assert not (tmp_path / "r").exists()  # nothing written
    path = write_sweep(tmp_path, "ok", {"base": {}, "twin": TWIN}, {"seeds": 2})
    line = one_line_error(ltfm_here("sweep", path, "--dry-run", "settle.base_seeds=1"))
    assert "settle.base_seeds must be an integer from 2" in line, line
    assert "--status" in one_line_error(ltfm_here("sweep", path, "--settle", "--status"))
    assert "--n-trials" in one_line_error(ltfm_here("sweep", path, "--settle", "--n-trials", "2"))
    nobase = write_sweep(tmp_path, "nobase", {"A1": {}, "twin": TWIN})
    assert "base" in one_line_error(ltfm_here("sweep", nobase, "--settle"))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "space", "experiment": str(SMOKE), "space": {
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}}))
    assert "search" in one_line_error(ltfm_here("sweep", space, "--settle"))
    space.write_text(yaml.safe_dump({"name": "space", "experiment": str(SMOKE), "settle": {"seeds": 2}, "space": {
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}}))
    assert "settle" in one_line_error(ltfm_here("sweep", space, "--dry-run"))


def test_the_sweep_keys_list_the_settle_section(ltfm_here):
    p = ltfm_here("sweep", "--keys", "settle.")
    assert p.returncode == 0, p.stderr
    keys = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    assert keys == ["settle.delta", "settle.alpha", "settle.seeds", "settle.base_seeds", "settle.budget",
                    "settle.hours"], p.stdout


def test_the_planners_trials_are_queued_once_each_and_a_failed_one_once_more(tmp_path):
    """What a settle pass queues (real SQLite study, no training): an action asked twice, or asked again by another
    worker's pass, is one trial, keyed by (variant, seed, budget multiple) with the row's definition; a 2x trial is a
    trial of its own, training the row's steps x 2 in the seed's run id; a failed one is queued once more only while
    its key is in ``again`` (once per worker process)."""
    from lightning_tfm.findings.settle import Action
    from lightning_tfm.sweep.plan import Plan
    from lightning_tfm.sweep.settle import MULTIPLE, enqueue, entry_of, own_key
    from lightning_tfm.sweep.spec import load_sweep
    from lightning_tfm.sweep.storage import open_storage, open_study
    from lightning_tfm.training.config.run_id import run_id

    sweep = load_sweep(write_sweep(tmp_path, "queue", {"base": {}, "twin": TWIN}))
    plan = Plan(sweep, [f"run.results_dir={tmp_path / 'results'}"], data=False)
    (tmp_path / "results").mkdir()
    study = open_study(sweep, open_storage(f"sqlite:///{tmp_path / 'results' / 'queue.db'}"))
    asked = [Action("twin", 2, 1.0, "a"), Action("twin", 2, 1.0, "a"), Action("twin", 1, 2.0, "b")]
    assert enqueue(study, plan, asked, set())[0] == 2
    added, keys = enqueue(study, plan, asked, set())  # another worker's pass: nothing more
    trials = study.get_trials()
    assert added == 0 and keys == {t.user_attrs["grid_key"] for t in trials} and len(trials) == 2
    longer = trials[1].user_attrs
    assert (longer["seed"], longer[MULTIPLE], longer["max_steps"]) == (1, 2.0, 40) and own_key(plan, trials[1])
    cfg = [plan.config(entry_of(sweep, "twin", 1, m)) for m in (1.0, 2.0)]
    assert cfg[0].train.max_steps == 20 and cfg[1].train.max_steps == 40
    assert run_id(cfg[0]) == run_id(cfg[1])  # the same run folder, trained on
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, trials[0].number)
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING)  # as a worker claims it
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)   # and its training fails
    again = {trials[0].user_attrs["grid_key"]}
    assert enqueue(study, plan, asked[:1], set())[0] == 0  # failed: not again unless this process may
    assert enqueue(study, plan, asked[:1], again)[0] == 1 and not again
    assert enqueue(study, plan, asked[:1], again)[0] == 0


# ------------------------------------------------------------------------------------------------- the loop
@pytest.mark.slow
def test_the_loop_adds_a_seed_and_answers_the_row(tmp_path, data_dir, ltfm_here):
    """The twin's one seed cannot answer it: the loop queues its second seed (the next integer), trains it in a
    run folder of its own, and the twin is then the same as the base within ±5% (its difference is 0 at every
    seed). One line a row, the closing line, and --status's answers say so."""
    path = write_sweep(tmp_path, "adds", {"base": {"seeds": [1, 2]}, "twin": TWIN},
                       {"seeds": 2, "base_seeds": 2, "budget": 1})
    p = ltfm(*sweep_args(path, data_dir, tmp_path), "--settle")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    trials = trials_of(tmp_path, "adds")
    assert trained(trials) == [("base", 1, 1.0), ("base", 2, 1.0), ("twin", 1, 1.0), ("twin", 2, 1.0)]
    added = trials[-1].user_attrs
    assert added["settle_why"].startswith("twin: 1 more seed") and added["max_steps"] == 20, added
    assert Path(added["run_dir"]).name.startswith("adds-twin-s2-")
    assert "settle pass 1: queued 1 trial(s): twin seed 2" in p.stdout, p.stdout
    assert "twin  the same within ±5%" in p.stdout and "took 2 seed(s) to 1x" in p.stdout, p.stdout
    assert "settled 1 of 1 rows (1 the same); base 2 seed(s) to 1x" in p.stdout, p.stdout
    s = ltfm_here(*sweep_args(path, data_dir, tmp_path), "--status")
    assert s.returncode == 0 and "twin  the same within ±5%: +0.0%" in s.stdout, s.stdout
    rows = json.loads(ltfm_here(*sweep_args(path, data_dir, tmp_path), "--status", "--json").stdout)
    assert {(r["variant"], r["answer"]) for r in rows} == {("base", None), ("twin", "the same")}


@pytest.mark.slow
def test_a_row_at_its_cap_stops_the_loop_unsettled(tmp_path, data_dir, ltfm_here):
    """Nothing measured of a seed's difference yet, the cheapest row (the twin) is looked at first: its second seed
    and the base's. Then the hours are spent (0.0001 h: those trials take longer), so the other row, whose plug-in
    could have been read off the twin's pairs, gets no second seed although the seeds cap (2) allows it: the loop
    ends with it unsettled at its cap, and --status says what it waits for. Run again, it trains nothing."""
    variants = {"base": {}, "twin": TWIN, "wider": {"model.d_ff": 128}}
    path = write_sweep(tmp_path, "cap", variants, {"seeds": 2, "base_seeds": 2, "budget": 1, "hours": 0.0001})
    p = ltfm(*sweep_args(path, data_dir, tmp_path), "--settle")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert trained(trials_of(tmp_path, "cap")) == [("base", 1, 1.0), ("twin", 1, 1.0), ("wider", 1, 1.0),
                                                   ("base", 2, 1.0), ("twin", 2, 1.0)]
    assert "every row answered or at its cap" in p.stdout, p.stdout
    assert "settled 1 of 2 rows (1 the same, 1 unsettled)" in p.stdout, p.stdout
    assert "wider  unsettled (one seed)" in p.stdout and "; at its cap: 0.0001 hours spent" in p.stdout
    s = ltfm_here(*sweep_args(path, data_dir, tmp_path), "--status")
    assert "wider  unsettled" in s.stdout and "; at its cap: 0.0001 hours spent" in s.stdout, s.stdout
    assert "waits for at its cap" not in p.stdout + s.stdout
    again = ltfm(*sweep_args(path, data_dir, tmp_path), "--settle")
    assert again.returncode == 0 and ": training " not in again.stdout, again.stdout[-3000:]
    assert len(trials_of(tmp_path, "cap")) == 5


#: ``ltfm sweep`` killed by SIGKILL right after its first settle pass has queued its trials: the signal is real,
#: the moment is chosen by counting (the first enqueue that added a trial), not by a clock.
KILLER = """
import os, signal, sys
from lightning_tfm.sweep import settle
from lightning_tfm.cli import main

queue = settle.enqueue
def enqueue(*args, **kwargs):
    added, keys = queue(*args, **kwargs)
    if added:
        os.kill(os.getpid(), signal.SIGKILL)
    return added, keys
settle.enqueue = enqueue
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_killed_loop_run_again_goes_on_and_trains_nothing_twice(tmp_path, data_dir):
    """Killed (SIGKILL) once its first settle pass has queued the twin's second seed: the same command goes on
    from there, runs the queued trial once, and ends with the row answered; each run folder trained once."""
    path = write_sweep(tmp_path, "killed", {"base": {"seeds": [1, 2]}, "twin": TWIN},
                       {"seeds": 2, "base_seeds": 2, "budget": 1})
    args = [str(a) for a in sweep_args(path, data_dir, tmp_path)]
    p = subprocess.run([sys.executable, "-c", KILLER, *args, "--settle"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "WANDB_MODE": "disabled"}, preexec_fn=default_signals)
    assert p.returncode == -signal.SIGKILL, p.stdout[-3000:] + p.stderr[-3000:]
    waiting = [t for t in trials_of(tmp_path, "killed") if t.state.name == "WAITING"]
    assert [(t.user_attrs["variant"], t.user_attrs["seed"]) for t in waiting] == [("twin", 2)]
    p = ltfm(*args, "--settle")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    trials = trials_of(tmp_path, "killed")
    assert trained(trials) == [("base", 1, 1.0), ("base", 2, 1.0), ("twin", 1, 1.0), ("twin", 2, 1.0)]
    assert len(trials) == 4 and "queued" not in p.stdout, p.stdout  # the killed pass's trial, run as it was
    assert "settled 1 of 1 rows (1 the same)" in p.stdout, p.stdout
    for t in trials:  # every run folder trained by one attempt
        summary = json.loads((Path(t.user_attrs["run_dir"]) / "summary.json").read_text())
        assert summary["status"] == "completed" and not summary.get("attempts"), summary.get("attempts")


@pytest.mark.slow
def test_two_workers_settle_one_study_each_trial_once(tmp_path, data_dir):
    """--workers 2 --settle: both workers plan from the same study, the queue lock keeps each settle trial once,
    and the two take different trials (their logs name disjoint trials); the launcher's finished-row lines carry
    the answers."""
    variants = {"base": {"seeds": [1, 2]}, **{f"twin{i}": {"decode.max_len_b": 10 + i} for i in (1, 2)}}
    path = write_sweep(tmp_path, "two", variants, {"seeds": 2, "base_seeds": 2, "budget": 1})
    p = ltfm(*sweep_args(path, data_dir, tmp_path), "--settle", "--workers", "2", "--every", "5")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    trials = trials_of(tmp_path, "two")
    done = trained(trials)
    assert sorted(done) == sorted([("base", 1, 1.0), ("base", 2, 1.0)] + [(f"twin{i}", s, 1.0) for i in (1, 2)
                                                                          for s in (1, 2)])
    assert all(t.state.name == "COMPLETE" or t.user_attrs.get("skip") == "duplicate" for t in trials)
    logs = [(tmp_path / "results" / "sweep-logs" / "two" / f"worker-{i}.log").read_text() for i in (0, 1)]
    ran = [{line.split(":")[0].split("] ")[1] for line in log.splitlines() if ": training " in line} for log in logs]
    assert ran[0] and ran[1] and not ran[0] & ran[1], ran
    assert "settled 2 of 2 rows (2 the same)" in p.stdout, p.stdout
    assert "finished: twin1 seed 2" in p.stdout and "answer: the same" in p.stdout, p.stdout


def _extension_caps(path: Path, data_dir: Path, tmp: Path) -> dict:
    """The settle: caps (seeds and base seeds 2, budget 2) under which the real planner, reading the first pass as
    the loop does, asks to continue the row's runs to 2x: the level of its intervals (alpha) and delta chosen so
    that the row is unsettled at 1x and its predicted gap at 2x decides it."""
    from lightning_tfm.findings.settings import SettleSpec
    from lightning_tfm.findings.settle import plan
    from lightning_tfm.sweep.plan import Plan
    from lightning_tfm.sweep.settle import read
    from lightning_tfm.sweep.spec import load_sweep

    sweep = load_sweep(path)
    grid = [(a, d) for a in (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.001) for d in (0.0001, 0.001, 0.003, 0.01, 0.03,
                                                                                     0.1, 0.3, 0.9)]
    for alpha, delta in grid:
        sweep.settle = {**sweep.settle, "alpha": alpha, "delta": delta, "seeds": 2, "base_seeds": 2, "budget": 2.0}
        reading = read(Plan(sweep, [f"data.path={data_dir}", f"run.results_dir={tmp / 'results'}"], data=False),
                       trials_of(tmp, sweep.name))
        p = plan(reading.rows, "base", SettleSpec(**sweep.settle))
        if any(a.variant == "slow" and a.budget == 2.0 for a in p.actions):
            return sweep.settle
    pytest.fail("no alpha and delta of the grid make the planner continue the row to 2x")


@pytest.mark.slow
def test_the_loop_continues_a_rows_runs_to_a_longer_budget(tmp_path, multi30k):
    """A row whose gap to the base changes with training (a lower learning rate): where the planner asks for 2x,
    the loop queues the row's and the base's seeds to 2x as trials of 40 steps in their seeds' run folders, each
    resumes its run from step 20, and ends with the weights of a run trained straight to 40 steps; the 20-step
    trials keep their 20-step values. On Multi30k (skipped without it): on the toy corpus of tests/data no alpha
    and delta make the planner ask for 2x (there the row's gap does not change with training)."""
    data_dir = multi30k
    path = write_sweep(tmp_path, "longer", {"base": {"seeds": [1, 2]}, "slow": {"seeds": [1, 2],
                                                                                 "train.lr_scale": 0.5}})
    first = ltfm(*sweep_args(path, data_dir, tmp_path))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    caps = _extension_caps(path, data_dir, tmp_path)
    over = [f"settle.{k}={v}" for k, v in caps.items() if k != "hours"]
    p = ltfm(*sweep_args(path, data_dir, tmp_path), "--settle", *over)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    trials = trials_of(tmp_path, "longer")
    short = {(t.user_attrs["variant"], t.user_attrs["seed"]): t for t in trials[:4]}
    longer = [t for t in trials if t.user_attrs.get("settle_multiple") == 2.0]
    assert {(t.user_attrs["variant"], t.user_attrs["seed"]) for t in longer} == set(short), p.stdout
    for t in longer:
        a, was = t.user_attrs, short[(t.user_attrs["variant"], t.user_attrs["seed"])]
        assert t.state.name == "COMPLETE" and a["max_steps"] == 40 and a["run_dir"] == was.user_attrs["run_dir"]
        assert "from step 20 to 40" in Path(a["log"]).read_text()
        assert was.value == pytest.approx(was.user_attrs["dev_loss"]) and t.value != was.value
    s = ltfm(*sweep_args(path, data_dir, tmp_path), "--status", "--json")
    rows = json.loads(s.stdout)
    for r in rows[:4]:  # the 20-step trials read at their budget
        assert r["steps"] == 20 and r["value"] == pytest.approx(short[(r["variant"], r["seed"])].value), r
    # the continued run ends where a run trained straight to 40 steps ends
    a = longer[0].user_attrs
    cfg = Path(a["log"]).with_suffix(".yaml")
    straight = ltfm("train", cfg, "train.max_steps=40", f"run.results_dir={tmp_path / 'straight'}",
                    env={"WANDB_MODE": "disabled"})
    assert straight.returncode == 0, straight.stderr[-3000:]
    (run,) = [d for d in (tmp_path / "straight").iterdir() if d.is_dir()]
    w = [torch.load(Path(d) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
         for d in (a["run_dir"], run)]
    assert w[0]["global_step"] == w[1]["global_step"] == 40
    assert all(torch.equal(w[0]["state_dict"][k], w[1]["state_dict"][k]) for k in w[1]["state_dict"])
