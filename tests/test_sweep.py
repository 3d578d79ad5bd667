"""Optuna sweeps (``ltfm sweep``), end to end: real ``ltfm`` processes, real SQLite files, a real PostgreSQL
server (tests/pg.py), real signals. Trainings are shrunk to a few seconds each with TINY overrides. What trains
nothing (dry runs, --status, bad sweep files) runs ``cli.main`` in this process (``ltfm_here``): a new process
spends seconds importing torch and Optuna before it prints a line."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from lightning_tfm.training.config.config import TABLE3_KNOBS, Config, choices, flatten, load_config
from lightning_tfm.training.runs.resume import newest_step

from conftest import ROOT, SMOKE, ltfm, ltfm_in
from pg import pg_url, postgres  # noqa: F401  (fixtures)

optuna.logging.set_verbosity(optuna.logging.WARNING)

# A model and data small enough that one trial trains in seconds; the sweep machinery is what is tested.
# LONG_ROW: the budget of a row a test stops a poll after its first checkpoint (every 10 steps): so many steps
# later that the row is still training when the signal comes, however slow or busy the machine.
TINY = ["wandb.mode=disabled", "train.threads=1", "data.max_train_pairs=200", "data.max_dev_pairs=20",
        "data.vocab_size=200", "data.test_split=null", "model.layers=1", "model.d_model=32", "model.d_ff=64",
        "model.heads=2", "model.d_k=16", "model.d_v=16", "train.batch_tokens=256", "train.warmup=10",
        "train.max_steps=20", "train.val_every_steps=10", "train.checkpoint_every_steps=10", "decode.beam_size=1",
        "decode.max_len_b=10"]
LONG_ROW = 200
PAPER = {r["name"]: r for r in csv.DictReader((ROOT / "lightning_tfm/resources/paper_table3.csv").open())}
ROWS = ["base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "D1", "D2", "D3",
        "D4", "E", "big", "prenorm"]
# The paper's knob columns (CSV name -> config key): the Table 3 knobs the paper's CSV has, but the budget (max_steps)
KNOBS = {k.csv: k.key for k in TABLE3_KNOBS if k.csv in PAPER["base"] and k.key != "train.max_steps"}
NUMBERS = {csv for csv, key in KNOBS.items() if choices(key) is None}  # the others: choices (positional)


def write_sweep(folder: Path, name: str, variants: dict, **extra) -> Path:
    body = {"name": name, "experiment": str(SMOKE), "metric": "dev_loss", "direction": "minimize",
            "pruner": {"type": "none"}, "seeds": [1], "heartbeat": {"interval": 1, "grace": 10, "max_retry": 3},
            "variants": variants, **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def trials_of(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    from lightning_tfm.sweep import open_storage
    return optuna.load_study(study_name=name, storage=open_storage(storage)).get_trials()


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: "), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return lines[0]


def resolved(base: Config, overrides: dict) -> dict:
    """The flat config ({"model.heads": 8, ...}) of ``base`` under a row's overrides."""
    return {**flatten(base), **overrides}


# ------------------------------------------------------------------------------------------------------------
# Sweep files and dry runs (no training)
# ------------------------------------------------------------------------------------------------------------
def test_table3_dry_run_lists_the_paper_rows_with_its_parameter_counts(ltfm_here):
    # The command, word for word.
    p = ltfm_here("sweep", "sweeps/table3.yaml", "--dry-run", "--json", "data.vocab_size=41000")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)
    assert [r["name"] for r in rows] == ROWS
    assert all({"name", "overrides", "params"} <= set(r) for r in rows)
    by = {r["name"]: r for r in rows}
    base_cfg = load_config(ROOT / "experiments/wmt14-base.yaml", ["data.vocab_size=41000"])
    for name, paper in PAPER.items():
        cfg = resolved(base_cfg, by[name]["overrides"])
        for col, key in KNOBS.items():  # the paper's values, row by row
            want = float(paper[col]) if col in NUMBERS else paper[col]
            got = float(cfg[key]) if col in NUMBERS else cfg[key]
            assert got == want, (name, key, got, want)
        assert by[name]["max_steps"] == int(paper["train_steps"]), name
        if paper["params_m"]:
            tolerance = 0.03 if name == "big" else 0.015
            assert abs(by[name]["params"] / (float(paper["params_m"]) * 1e6) - 1) <= tolerance, (name,
                                                                                                 by[name]["params"])
    assert by["prenorm"]["overrides"] == {"model.norm": "pre"}
    for name in ("A1", "A2", "A3", "A4", "D1", "D2", "D3", "D4"):  # h * d_k = d_model: as many weights as base
        assert by[name]["params"] == by["base"]["params"]


def test_longest_rows_are_queued_first_then_the_papers_order(data_dir):
    """With several workers, `big` (3x the steps) must not be the row left running alone at the end."""
    from lightning_tfm.sweep import Plan, enqueue_missing, load_sweep

    sweep = load_sweep(ROOT / "sweeps/table3-cpu.yaml")
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    assert enqueue_missing(study, Plan(sweep, ["train.max_steps=10", f"data.path={data_dir}"])) == len(ROWS) + 2
    queued = [(t.user_attrs["variant"], t.user_attrs["seed"]) for t in study.get_trials(deepcopy=False)]
    # the base at three seeds (its spread is the report's noise), every other row at one
    assert queued == [("big", 1), ("base", 1), ("base", 2), ("base", 3)] + [(r, 1) for r in ROWS
                                                                            if r not in ("big", "base")]
    # nothing queued twice
    assert enqueue_missing(study, Plan(sweep, ["train.max_steps=10", f"data.path={data_dir}"])) == 0


def test_dashboard_sees_the_metric_name_each_rows_name_family_and_knobs(tmp_path, data_dir):
    """What optuna-dashboard reads, read back through Optuna's API from a real SQLite study: the metric's name
    (not "Objective 0"), each trial's row and family, the Table 3 knobs as params (so Hyperparameter Importance
    has something to rank once rows complete), the worker's machine."""
    from lightning_tfm.sweep import Plan, claim_waiting, enqueue_missing, load_sweep, open_storage, open_study
    from lightning_tfm.sweep.queue import DASHBOARD_KNOBS

    sweep = load_sweep(ROOT / "sweeps/table3-cpu.yaml")
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    storage = open_storage(url)
    study = open_study(sweep, storage)
    assert enqueue_missing(study, Plan(sweep, ["train.max_steps=10", f"data.path={data_dir}"])) == len(ROWS) + 2
    # another budget of the same study (new trials, same knobs): Optuna accepts the same parameters again
    assert enqueue_missing(study, Plan(sweep, ["train.max_steps=20", f"data.path={data_dir}"])) == len(ROWS) + 2
    study_id = storage.get_study_id_from_name(sweep.name)
    rng = {name: i for i, name in enumerate(ROWS)}
    while (claimed := claim_waiting(study, storage, study_id)) is not None:
        trial, _ = claimed
        study.tell(trial.number, 4.0 + 0.1 * rng[trial.user_attrs["variant"]])

    read = optuna.load_study(study_name=sweep.name, storage=url)
    assert read.metric_names == ["dev_loss"]
    assert [k for k in read.user_attrs if k.startswith("ltfm.machine.")] and \
        all(" cores" in v for k, v in read.user_attrs.items() if k.startswith("ltfm.machine."))
    trials = {(t.user_attrs["variant"], t.user_attrs["max_steps"]): t for t in read.get_trials()
              if t.user_attrs["seed"] == 1}
    a1, c4, pre, big = (trials[(v, 10 * (3 if v == "big" else 1))] for v in ("A1", "C4", "prenorm", "big"))
    assert (a1.user_attrs["family"], a1.params["model.heads"], a1.params["model.d_k"]) == ("A", 1, 128)
    assert (c4.params["model.d_model"], c4.params["model.d_k"], c4.params["model.layers"]) == (64, 16, 3)
    assert pre.params["model.norm"] == "pre" and trials[("base", 10)].params["model.norm"] == "post"
    assert big.user_attrs["family"] == "big" and big.params["model.dropout"] == pytest.approx(0.3)
    assert set(a1.params) == set(DASHBOARD_KNOBS) and "model.heads" in a1.params  # every Table 3 knob but the budget
    importances = optuna.importance.get_param_importances(read)
    assert importances and set(importances) <= set(a1.params)


def test_table3_cpu_rows_keep_their_relation_to_the_base(data_dir, ltfm_here):
    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", f"data.path={data_dir}", "--dry-run", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    listed = json.loads(p.stdout)
    rows = {r["name"]: r for r in listed}
    assert list(rows) == ROWS
    assert [r["seed"] for r in listed if r["name"] == "base"] == [1, 2, 3]  # the noise: the base at three seeds
    base = load_config(ROOT / "experiments/table3-cpu-base.yaml", [f"data.path={data_dir}"])
    cpu_base = resolved(base, {})
    assert ([cpu_base[KNOBS[k]] for k in ("layers", "d_model", "d_ff", "heads", "d_k", "d_v")]
            == [3, 128, 512, 4, 32, 32])
    paper_base = PAPER["base"]
    sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
    for name, paper in PAPER.items():
        cfg = resolved(base, rows[name]["overrides"])
        for col, key in KNOBS.items():
            if col not in NUMBERS:  # a choice: changed where the paper changes it
                assert (cfg[key] == cpu_base[key]) == (paper[col] == paper_base[col]), (name, key)
                continue
            # every knob moves in the paper's direction from its base, or stays where the paper keeps it
            assert (sign(float(cfg[key]) - float(cpu_base[key]))
                    == sign(float(paper[col]) - float(paper_base[col]))), (name, key)
        if name.startswith("A") or name in ("C4", "C5"):  # heads * d_k = heads * d_v = d_model, as in the paper
            assert (cfg["model.heads"] * cfg["model.d_k"] == cfg["model.heads"] * cfg["model.d_v"]
                    == cfg["model.d_model"])
        if name in ("D1", "D2", "D3", "D4"):  # the paper's values themselves
            assert (cfg["model.dropout"], cfg["train.label_smoothing"]) == (float(paper["dropout"]),
                                                                            float(paper["label_smoothing"]))
    assert rows["big"]["max_steps"] == 3 * rows["base"]["max_steps"]
    # The budget knob: one override sets every row's steps; big keeps its factor 3.
    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", f"data.path={data_dir}", "train.max_steps=200", "--dry-run",
                  "--json")
    steps = {r["name"]: r["max_steps"] for r in json.loads(p.stdout)}
    assert steps["base"] == steps["C3"] == 200 and steps["big"] == 600


def test_the_continued_rows_resume_the_protocols_run_folders(data_dir, ltfm_here):
    """sweeps/table3-cpu-continued.yaml trains rows of the CPU protocol longer: each of its rows is the protocol's
    row (the same config hash at the end of its run id, so it continues that run folder: tests/test_run_names.py
    trains it) with a larger budget, the base at its three seeds. Each sweep names its folders after its rows."""
    def dry(sweep_file):
        p = ltfm_here("sweep", sweep_file, f"data.path={data_dir}", "--dry-run", "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        return {(r["name"], r["seed"]): r for r in json.loads(p.stdout)}

    protocol, continued = dry("sweeps/table3-cpu.yaml"), dry("sweeps/table3-cpu-continued.yaml")
    assert set(continued) <= set(protocol) and len({n for n, _ in continued}) > 1
    assert sorted(s for n, s in continued if n == "base") == [1, 2, 3]  # the seed noise at the longer budget too
    for (name, seed), row in continued.items():
        digest = protocol[name, seed]["run_id"].rsplit("-", 1)[1]
        assert protocol[name, seed]["run_id"] == f"table3-cpu-{name}-s{seed}-{digest}"
        assert row["run_id"] == f"table3-cpu-continued-{name}-s{seed}-{digest}"
        assert row["max_steps"] > protocol[name, seed]["max_steps"], (name, seed)


def test_search_dry_run_samples_the_space(data_dir, ltfm_here):
    p = ltfm_here("sweep", "sweeps/search.yaml", f"data.path={data_dir}", "--dry-run", "--json", "--n-trials", "6")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)
    assert len(rows) == 6
    from lightning_tfm.sweep import load_sweep

    space = load_sweep(ROOT / "sweeps" / "search.yaml").space
    assert {"model.heads", "model.d_model", "model.positional"} <= set(space)
    for r in rows:
        assert set(r["overrides"]) == set(space)  # every key of the file's space sampled
        assert r["params"] > 0


@pytest.mark.parametrize("method", ["sample_independent", "sample_relative"])
def test_a_sampler_failing_at_trial_time_fails_its_trial_and_twice_stops_with_one_line(method, tmp_path, data_dir,
                                                                                      ltfm_here, monkeypatch):
    """A sampler that passes the load check (used on a throwaway study) but raises on this study's trials, in its
    relative or its independent sampling: each trial it fails is closed as failed with the error (none is left
    running, which no heartbeat would ever end); the same error twice in a row stops the worker with one line,
    exit 2. Nothing trains."""
    from optuna.samplers import RandomSampler

    real = getattr(RandomSampler, method)

    def broken(self, study, *args, **kwargs):
        if study.study_name == "broken":
            raise ValueError("the model of the sampler broke\nsecond line")
        return real(self, study, *args, **kwargs)

    monkeypatch.setattr(RandomSampler, method, broken)
    results = tmp_path / "results"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({
        "name": "broken", "experiment": str(SMOKE), "metric": "dev_loss", "sampler": {"type": "random", "seed": 1},
        "n_trials": 4, "space": {"model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}}))
    p = ltfm_here("sweep", path, f"data.path={data_dir}", f"run.results_dir={results}", *TINY)
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr, p.stderr[-2000:]
    line = p.stderr.strip().splitlines()[-1]  # after the data's preparation lines
    assert line.startswith("ltfm: error: sampler random failed while sampling: ValueError: the model of the sampler "
                           "broke (two trials in a row failed this way): change the sweep file's sampler"), line
    trials = trials_of(f"sqlite:///{results / 'broken.db'}", "broken")
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2, trials
    assert all("the model of the sampler broke" in t.user_attrs["error"] for t in trials)
    assert "trial 0: failed: sampler random failed while sampling" in p.stdout
    assert not list(results.glob("broken-*")), "no run folder for a point never sampled"


def test_a_new_search_point_of_a_sampler_that_reads_no_trials_takes_its_params(tmp_path):
    """The random sampler reads no trials before its first suggest: the new trial must be known to the study's
    cached storage all the same (Optuna 5 failed it with a KeyError of its id: every random search's first trial)."""
    from lightning_tfm.sweep import open_storage
    from lightning_tfm.sweep.queue import ask_new

    storage = open_storage(f"sqlite:///{tmp_path / 'r.db'}")
    study = optuna.create_study(storage=storage, study_name="r", sampler=optuna.samplers.RandomSampler(seed=5))
    trial, trial_id = ask_new(study, storage, storage.get_study_id_from_name("r"))
    value = trial.suggest_float("model.dropout", 0.0, 0.3)
    assert 0.0 <= value <= 0.3 and storage.get_trial(trial_id).params == {"model.dropout": value}


def test_a_new_search_point_beats_at_once_so_a_worker_killed_while_sampling_leaves_it_to_the_study(tmp_path):
    """ask_new records the trial's first heartbeat before its sampler runs: a worker that dies there (killed,
    stopped) leaves a trial Optuna's fail_stale_trials fails once the grace has passed, not one running forever."""
    from optuna.storages import fail_stale_trials

    from lightning_tfm.sweep import open_storage
    from lightning_tfm.sweep.queue import ask_new

    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}", heartbeat={"interval": 1, "grace": 1, "max_retry": 0})
    study = optuna.create_study(study_name="s", storage=storage)
    trial, trial_id = ask_new(study, storage, study._study_id)
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING
    time.sleep(2.5)  # past the grace: however slow the machine, no later than this
    fail_stale_trials(study)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL


@pytest.mark.parametrize("kind", ["random", "tpe"])
def test_workers_of_a_seeded_search_propose_different_points_and_one_worker_is_reproducible(kind, tmp_path):
    """Every worker builds the file's seeded sampler: two workers asking at once must not replay one random
    sequence (they proposed the same points, closed as duplicates), and one worker alone must sample the same
    points on the same file again."""
    from lightning_tfm.sweep.spec import build_sampler
    from lightning_tfm.sweep.storage import open_storage

    spec = {"type": kind, "seed": 7, **({"n_startup_trials": 10} if kind == "tpe" else {})}
    space = {"x": optuna.distributions.FloatDistribution(0, 1),
             "h": optuna.distributions.CategoricalDistribution([1, 2, 4, 8])}

    def one_worker(db: str, n: int) -> list:
        study = optuna.create_study(storage=open_storage(f"sqlite:///{tmp_path / db}"), sampler=build_sampler(spec))
        return [study.ask(space).params for _ in range(n)]

    assert one_worker("a.db", 4) == one_worker("b.db", 4)  # reproducible
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(storage=open_storage(url), study_name="s")
    workers = [optuna.load_study(study_name="s", storage=open_storage(url), sampler=build_sampler(spec))
               for _ in range(2)]
    points = [w.ask(space).params["x"] for _ in range(3) for w in workers]  # the two ask in turn
    assert len(set(points)) == len(points), points


def test_trial_overrides_reach_the_trial_process_exactly():
    from lightning_tfm.sweep import yaml_value
    from lightning_tfm.training.config.config import parse_override
    for value in [1e-9, 0.1, 3, "pre", "1", "null", None, True, "/a b/c", [1, 2]]:
        assert parse_override(f"k={yaml_value(value)}") == ("k", value), value


def test_bad_sweep_files_and_storage_give_one_line_errors(tmp_path, data_dir, ltfm_here):
    good = {"name": "x", "experiment": str(SMOKE), "variants": {"base": {}}}
    cases = {
        "unknown top-level key": ({**good, "variantz": {}}, "variantz"),
        "not YAML": ("name: [unclosed", "not valid YAML"),
        "variants and space": ({**good, "space": {"model.heads": {"type": "categorical", "choices": [1]}}}, "either"),
        "unknown config key": ({**good, "variants": {"a": {"model.headz": 2}}}, "model.headz"),
        "wrong type": ({**good, "variants": {"a": {"model.heads": "many"}}}, "model.heads"),
        "unknown pruner": ({**good, "pruner": {"type": "sometimes"}}, "pruner"),
        "pruner argument": ({**good, "pruner": {"type": "median", "n_warmup": 3}}, "median"),
        "missing experiment": ({**good, "experiment": "nowhere.yaml"}, "nowhere.yaml"),
        "bad distribution": ({"name": "x", "experiment": str(SMOKE),
                              "space": {"model.dropout": {"type": "float", "low": 0.5, "high": 0.1}}}, "low"),
    }
    for case, (body, needle) in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
        line = one_line_error(ltfm_here("sweep", path, f"data.path={data_dir}", f"run.results_dir={tmp_path / 'r'}"))
        assert needle in line, (case, line)
    assert not (tmp_path / "r").exists()  # nothing written
    ok = write_sweep(tmp_path, "ok", {"base": {}})
    line = one_line_error(ltfm_here("sweep", ok, "run.seed=3", f"data.path={data_dir}"))
    assert "run.seed" in line
    # Storage: unreachable server, malformed URL, unsupported scheme. The password is never shown: the unreachable
    # server in a real process too, where whatever a database library logs or warns would reach its stderr.
    from pg import free_port
    secret = "s3cretPassw0rd"
    for url, needle, run in [(f"postgresql://ltfm:{secret}@127.0.0.1:{free_port()}/sweeps", "cannot open storage",
                              ltfm),
                             (f"postgresql://ltfm:{secret}@127.0.0.1:notaport/sweeps", "storage", ltfm_here),
                             ("definitely not a url", "malformed", ltfm_here),
                             (f"redis://ltfm:{secret}@127.0.0.1/0", "not supported", ltfm_here)]:
        p = run("sweep", ok, f"data.path={data_dir}", f"run.results_dir={tmp_path / 'r2'}", "--storage", url)
        line = one_line_error(p)
        assert needle in line and secret not in p.stderr + p.stdout, line
    p = ltfm_here("sweep", ok, f"run.results_dir={tmp_path / 'r3'}", f"data.path={data_dir}", "--status")
    assert "no sweep database" in one_line_error(p)


# ------------------------------------------------------------------------------------------------------------
# Real sweeps
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_trains_rows_prunes_a_bad_one_and_skips_an_unbuildable_one(tmp_path, data_dir, ltfm_here):
    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "rows", {
        "base": {"wandb.mode": "offline"},                    # (W&B only here: it costs seconds per run)
        "bad": {"family": "lr", "train.lr_scale": 0.0001},  # cannot learn: clearly worse dev loss at step 10
        "odd": {"model.d_model": 33},                          # the model cannot be built (sinusoid pairs)
    }, pruner={"type": "median", "n_startup_trials": 1, "n_warmup_steps": 0, "n_min_trials": 1})
    args = ["sweep", sweep, f"data.path={data_dir}", f"run.results_dir={results}", *TINY, "train.max_steps=30"]
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # each run's own wandb.mode decides
    env.update(WANDB_SILENT="true")
    p = ltfm_in(env, *args)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    storage = f"sqlite:///{results / 'rows.db'}"  # the default storage: <results_dir>/<name>.db
    trials = {t.user_attrs["variant"]: t for t in trials_of(storage, "rows")}
    assert set(trials) == {"base", "bad", "odd"}

    base = trials["base"]
    summary = json.loads((Path(base.user_attrs["run_dir"]) / "summary.json").read_text())
    assert base.state == optuna.trial.TrialState.COMPLETE and base.value == pytest.approx(summary["dev_loss"])
    assert sorted(base.intermediate_values) == [10, 20, 30]  # reported at every validation
    assert summary["config"]["run"]["variant"] == "base" and summary["config"]["run"]["study"] == "rows"
    assert summary["wandb_run_id"] and base.user_attrs["wandb_run_id"] == summary["wandb_run_id"]
    assert list(Path(summary["wandb_dir"]).glob(f"run-{summary['wandb_run_id']}.wandb"))  # the offline W&B run
    # the trial's config was made once by the worker: the run folder's config.yaml, which the trial trained from
    from lightning_tfm.training.config.config import load_config
    from lightning_tfm.training.config.run_id import run_id
    kept = load_config(Path(base.user_attrs["run_dir"]) / "config.yaml")
    assert run_id(kept) == base.user_attrs["run_id"] and kept.sweep.trial == base.number
    assert kept.sweep.storage is None and summary["config"]["sweep"]["storage"] is None  # the URL: environment only

    bad = trials["bad"]
    bad_summary = json.loads((Path(bad.user_attrs["run_dir"]) / "summary.json").read_text())
    assert bad.state == optuna.trial.TrialState.PRUNED
    assert bad_summary["status"] == "pruned" and bad_summary["steps"] < 30  # stopped before its last step
    assert max(bad.intermediate_values) < 30

    odd = trials["odd"]
    assert odd.state == optuna.trial.TrialState.FAIL and odd.user_attrs["skip"] == "unbuildable"
    assert "d_model" in odd.user_attrs["reason"] and "run_dir" not in odd.user_attrs
    assert len([d for d in results.iterdir() if (d / "summary.json").is_file()]) == 2

    status = ltfm_here("sweep", sweep, f"data.path={data_dir}", f"run.results_dir={results}", *TINY,
                       "train.max_steps=30", "--status")
    assert status.returncode == 0, status.stderr
    lines = {line.split()[1]: line for line in status.stdout.splitlines()[1:-1]}
    assert "complete" in lines["base"] and base.user_attrs["run_id"] in lines["base"]
    assert str(results) not in status.stdout  # run folders and the storage relative to the results folder
    assert "pruned" in lines["bad"] and "skipped" in lines["odd"] and "d_model" in lines["odd"]

    again = ltfm_here(*args)  # the same command: nothing left to do
    assert again.returncode == 0 and "training" not in again.stdout, again.stdout
    assert len(trials_of(storage, "rows")) == 3


def _versions(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("logs/version_*"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.long), "postgresql"])
def test_two_workers_share_one_study_and_train_each_variant_once(backend, tmp_path, data_dir, request, ltfm_here):
    results = tmp_path / "results"
    variants = {"base": {}, "prenorm": {"family": "norm", "model.norm": "pre"}}
    sweep = write_sweep(tmp_path, "pair", variants)
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'shared.db'}"
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    outs = [tmp_path / f"worker{i}.out" for i in range(2)]
    procs = [subprocess.Popen(cmd, stdout=o.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT) for o in outs]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, "\n".join(o.read_text()[-3000:] for o in outs)
    text = "".join(o.read_text() for o in outs)

    trials = trials_of(url, "pair")
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs["variant"] for t in done) == sorted(variants)  # each row completed once
    for t in trials:  # anything else is a duplicate enqueue, closed without training
        assert t.state == optuna.trial.TrialState.COMPLETE or t.user_attrs.get("skip") == "duplicate", t
    assert text.count(": training ") == len(variants)
    run_dirs = {Path(t.user_attrs["run_dir"]) for t in done}
    assert len(run_dirs) == len(variants)
    for run_dir in run_dirs:  # each run trained by one process, once
        assert len(_versions(run_dir)) == 1, run_dir
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == 20

    if backend == "postgresql":
        password = url.split(":")[2].split("@")[0]
        status = ltfm_here(*cmd[3:], "--status")
        assert status.returncode == 0 and "complete" in status.stdout, status.stderr
        assert password not in status.stdout + status.stderr + text
        for path in results.rglob("*"):  # configs, summaries, logs, checkpoints' hyper-parameters
            if path.is_file():
                assert password.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_killed_worker_is_detected_and_its_trial_resumes_from_the_checkpoint(tmp_path, data_dir):
    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "kill", {"base": {}, "C1": {"model.d_ff": 32}},
                        heartbeat={"interval": 1, "grace": 5, "max_retry": 3})
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    # A budget far past the step-20 checkpoint the worker is killed at: the row is still training then, on a
    # machine of any speed (the kill comes a poll after the checkpoint, the end of the row many steps later).
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, f"train.max_steps={LONG_ROW}", "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out = tmp_path / "first.out"
    worker = subprocess.Popen(cmd, stdout=out.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    def saved(p):  # a step checkpoint at step 20 or later: each replaces the one before it (keep_checkpoints)
        return int(p.stem.split("=")[1]) >= 20

    while not (found := [p for p in results.glob("*/checkpoints/step=*.ckpt") if saved(p)]):
        assert worker.poll() is None, out.read_text()[-3000:]
        time.sleep(0.2)
    run_dir = found[0].parent.parent
    child_pid = json.loads((run_dir / "summary.json").read_text())["pid"]
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert gone(child_pid), "the trial process outlived its killed worker"
    (first,) = [t for t in trials_of(url, "kill") if t.state == optuna.trial.TrialState.RUNNING]
    assert first.user_attrs["run_dir"] == str(run_dir)
    steps_at_kill = max(first.intermediate_values)

    time.sleep(6)  # past the heartbeat grace period (5 s): the trial is stale now
    again = ltfm_in(env, *cmd[3:])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]

    trials = trials_of(url, "kill")
    by_state = {}
    for t in trials:
        by_state.setdefault(t.state, []).append(t)
    assert [t.number for t in by_state[optuna.trial.TrialState.FAIL]] == [first.number]  # the killed one
    done = {t.user_attrs["variant"]: t for t in by_state[optuna.trial.TrialState.COMPLETE]}
    assert set(done) == {"base", "C1"} and len(trials) == 3
    retry = done[first.user_attrs["variant"]]
    assert retry.system_attrs.get("failed_trial") == first.number  # Optuna's retry of the stale trial
    assert retry.user_attrs["run_dir"] == str(run_dir)
    assert steps_at_kill in retry.intermediate_values  # the history carried over
    # The retry resumed the run: a second attempt whose first logged step is past 0, ending at the budget.
    versions = _versions(run_dir)
    assert len(versions) == 2
    with (versions[1] / "metrics.csv").open() as f:
        steps = [int(float(r["step"])) for r in csv.DictReader(f)]
    assert min(steps) >= 20 - 1
    assert "Restoring states from the checkpoint" in Path(retry.user_attrs["log"]).read_text()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == LONG_ROW


def start_until_checkpoint(cmd: list, env: dict, results: Path, out=subprocess.PIPE) -> tuple[subprocess.Popen, Path]:
    """Start a sweep worker; return it and its trial's run folder once the trial has saved a step checkpoint."""
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    while not (found := list(results.glob("*/checkpoints/step=*.ckpt"))):
        assert proc.poll() is None, "no checkpoint before the worker ended"
        time.sleep(0.2)
    return proc, found[0].parent.parent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state  # a zombie waiting for a reaper is dead


def gone(pid: int, patience: float = 120.0) -> bool:
    """Whether process ``pid`` ends (the kernel's SIGKILL of a dead worker's trial is prompt; this only waits for
    its end to show, however busy the machine)."""
    end = time.monotonic() + patience
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.1)
    return not _alive(pid)


@pytest.mark.slow
def test_search_samples_the_space_and_honours_the_trial_budget(tmp_path, data_dir):
    results = tmp_path / "results"
    path = tmp_path / "srch.yaml"
    path.write_text(yaml.safe_dump({
        "name": "srch", "experiment": str(SMOKE), "metric": "dev_loss",
        "sampler": {"type": "tpe", "seed": 3, "n_startup_trials": 1},
        "pruner": {"type": "hyperband", "min_resource": 10, "max_resource": 20, "reduction_factor": 2},
        "n_trials": 2, "heartbeat": {"interval": 1, "grace": 5},
        "space": {"model.heads": {"type": "categorical", "choices": [1, 2]},
                  "model.dropout": {"type": "float", "low": 0.0, "high": 0.3},
                  "model.norm": {"type": "categorical", "choices": ["post", "pre"]}}}))
    args = ["sweep", path, f"data.path={data_dir}", f"run.results_dir={results}", *TINY]
    first = ltfm(*args, "--n-trials", "1", env={"WANDB_MODE": "disabled"})  # this worker runs one trial
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert len(trials_of(f"sqlite:///{results / 'srch.db'}", "srch")) == 1
    second = ltfm(*args, env={"WANDB_MODE": "disabled"})  # then the study's n_trials: 2 in all
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    trials = trials_of(f"sqlite:///{results / 'srch.db'}", "srch")
    assert len(trials) == 2
    for t in trials:
        assert t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED), t
        assert set(t.params) == {"model.heads", "model.dropout", "model.norm"} and t.intermediate_values
        summary = json.loads((Path(t.user_attrs["run_dir"]) / "summary.json").read_text())
        model = summary["config"]["model"]
        assert (model["heads"], model["norm"]) == (t.params["model.heads"], t.params["model.norm"])
        assert model["dropout"] == pytest.approx(t.params["model.dropout"])
        assert summary["config"]["run"]["family"] == "search"


@pytest.mark.slow
@pytest.mark.long
def test_a_trial_killed_by_sigkill_is_recorded_as_killed_and_queued_again(tmp_path, data_dir):
    """The out-of-memory killer's SIGKILL leaves no summary error and a log ending in whatever Lightning last
    printed: the trial's error says it was killed, and by what; the worker queues the row again (Optuna's retry,
    with its history) and its retry resumes the run from the checkpoint, without a second command."""
    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "oom", {"base": {}})
    url = f"sqlite:///{tmp_path / 'oom.db'}"
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, f"train.max_steps={LONG_ROW}", "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    worker, run_dir = start_until_checkpoint(cmd, env, results)  # killed a poll after its first checkpoint
    os.kill(json.loads((run_dir / "summary.json").read_text())["pid"], signal.SIGKILL)
    out, _ = worker.communicate()  # its retry trains the whole row: no limit but the suite's timeout
    assert worker.returncode == 0 and "Traceback" not in out, out[-3000:]
    killed, retry = trials_of(url, "oom")
    assert killed.state == optuna.trial.TrialState.FAIL and killed.user_attrs["exit_code"] == -9
    assert killed.user_attrs["error"].startswith("killed by SIGKILL (the out-of-memory killer"), killed.user_attrs
    assert "killed by SIGKILL" in out and "queued again (retry 1" in out
    assert retry.state == optuna.trial.TrialState.COMPLETE
    assert retry.system_attrs["retry_history"] == [killed.number]
    assert "error" not in retry.user_attrs and retry.user_attrs["run_dir"] == str(run_dir)
    assert "Restoring states from the checkpoint" in Path(retry.user_attrs["log"]).read_text()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == LONG_ROW


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.long)])
def test_a_schedulers_signal_to_a_worker_stops_its_trial_like_ctrl_c(sig, tmp_path, data_dir):
    """SIGTERM (preemption) and SIGUSR1 (SLURM's warning before it) reach the worker alone: it stops its trial
    as Ctrl-C would (the trial saves its summary and checkpoint), puts it back in the queue as stopped at that
    step (resumed first by the next run: test_sweep_ctrl_c.py) and exits 130; nothing is left running. The
    worker starts as a script's background job does, with SIGINT ignored, which its trial must not inherit (it
    would not stop, and be killed 30 s later without a summary)."""
    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "sig", {"base": {}})
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, "train.max_steps=100000", "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    background = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]  # `cmd &` in a script: SIGINT ignored, then exec
    worker, run_dir = start_until_checkpoint([*background, *cmd], env, results)
    trial_pid = json.loads((run_dir / "summary.json").read_text())["pid"]
    worker.send_signal(sig)
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 130 and "Traceback" not in out, out[-3000:]
    assert not _alive(trial_pid)
    (trial,) = trials_of(url, "sig")
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["status"] == "stopped" and stopped["error"].startswith("interrupted (SIGINT)"), stopped
    assert trial.state == optuna.trial.TrialState.WAITING and trial.user_attrs["status"] == "stopped", trial
    assert trial.user_attrs["stopped_at"] == stopped["steps"] == newest_step(run_dir) >= 10
    assert f"trial 0 base seed 1: stopped at step {stopped['steps']}; the same command resumes it first" in out


def wait_for_line(path: Path, text: str, proc: subprocess.Popen) -> str:
    """The output file of ``proc`` once it holds ``text`` (no time limit but the process's own end: a slow or
    busy machine only takes longer)."""
    while text not in (out := path.read_text()):
        assert proc.poll() is None, out[-3000:]
        time.sleep(0.2)
    return out


@pytest.mark.slow
@pytest.mark.long
def test_a_worker_with_nothing_to_claim_waits_and_runs_a_killed_workers_row(tmp_path, data_dir):
    """Worker A claims a row and is killed; worker B, started beside it, trains the other row, then finds nothing
    to claim while A's row is still RUNNING: it waits, and once that row's heartbeat lapses, runs its retry. The
    sweep finishes with no second command.

    No step races a clock: A's trial is held at its start by the test holding its run folder's lock (A waits
    for it, beating its heart), so A's row is still running, with a live heartbeat, whenever B gets to it;
    only then is A killed and the lock let go."""
    from lightning_tfm.sweep import Plan, load_sweep
    from lightning_tfm.training.config.run_id import run_id
    from lightning_tfm.training.runs.run_folder import RunLock

    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "wait", {"base": {}, "C1": {"model.d_ff": 32}},
                        heartbeat={"interval": 1, "grace": 20, "max_retry": 3})
    url = f"sqlite:///{tmp_path / 'wait.db'}"
    overrides = [f"data.path={data_dir}", f"run.results_dir={results}", *TINY, "train.max_steps=30"]
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), *overrides, "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    plan = Plan(load_sweep(sweep), overrides)
    locks = {}
    for entry in plan.sweep.entries():
        rid = run_id(plan.config(entry))
        (results / rid).mkdir(parents=True)
        locks[rid] = RunLock(results / rid, rid).__enter__()  # no trial of either row can start training yet
    first_out, second_out = tmp_path / "first.out", tmp_path / "second.out"
    first = subprocess.Popen(cmd, stdout=first_out.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    second = None
    try:
        out = wait_for_line(first_out, "already running elsewhere", first)  # A holds its row, waiting for the lock
        (held,) = [rid for rid in locks if f"training {rid} " in out]
        for rid in [r for r in locks if r != held]:
            locks.pop(rid).__exit__(None, None, None)  # B may train the other row
        second = subprocess.Popen(cmd, stdout=second_out.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        wait_for_line(second_out, "nothing left to claim; waiting while trial(s)", second)
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        for lock in locks.values():
            lock.__exit__(None, None, None)
        if first.poll() is None:
            first.kill()
    assert second.wait(timeout=1800) == 0, second_out.read_text()[-3000:]
    out = second_out.read_text()
    assert "Traceback" not in out, out[-3000:]
    trials = trials_of(url, "wait")
    (killed,) = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert killed.user_attrs["run_id"] == held
    done = {t.user_attrs["variant"]: t for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert set(done) == {"base", "C1"}
    assert done[killed.user_attrs["variant"]].system_attrs["retry_history"] == [killed.number]
    assert json.loads((results / held / "summary.json").read_text())["steps"] == 30


@pytest.mark.slow
@pytest.mark.long
def test_a_killed_workers_search_point_is_re_run(tmp_path, data_dir):
    """A search sweep's trial whose worker was killed is re-run at the same point by the next worker (Optuna's
    retry of the stale trial), and does not count twice toward n_trials."""
    results = tmp_path / "results"
    path = tmp_path / "srk.yaml"
    path.write_text(yaml.safe_dump({
        "name": "srk", "experiment": str(SMOKE), "metric": "dev_loss", "sampler": {"type": "random", "seed": 5},
        "pruner": {"type": "none"}, "n_trials": 1, "heartbeat": {"interval": 1, "grace": 5, "max_retry": 2},
        "space": {"model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}}))
    url = f"sqlite:///{results / 'srk.db'}"
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(path), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, f"train.max_steps={LONG_ROW}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    worker, _ = start_until_checkpoint(cmd, env, results, out=subprocess.DEVNULL)  # killed mid-row
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    (killed,) = trials_of(url, "srk")
    time.sleep(6)  # past the heartbeat grace
    again = ltfm_in(env, *cmd[3:])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = trials_of(url, "srk")
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]
    rerun = trials[1]
    assert rerun.system_attrs.get("failed_trial") == killed.number and rerun.params == killed.params
    assert json.loads((Path(rerun.user_attrs["run_dir"]) / "summary.json").read_text())["steps"] == LONG_ROW
    # and the study is full: the same command again trains nothing
    third = ltfm_in(env, *cmd[3:])
    assert third.returncode == 0 and "training" not in third.stdout and len(trials_of(url, "srk")) == 2


@pytest.mark.slow
@pytest.mark.long
def test_a_woken_trial_never_reports_its_unfinished_run_as_completed(tmp_path, data_dir):
    """Ctrl-Z (SIGSTOP) a worker and its trial past the heartbeat grace: another worker's retry finds the run
    folder locked and waits for it (never trains it beside the stopped one); woken (SIGCONT), the old trial
    stops short of its budget, never completed (failed when the trial finds the study closed it first, stopped when
    its worker's heartbeat finds it taken over first), its worker going on without a crash; the waiting retry then
    trains the row to its budget."""
    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "wake", {"base": {}}, heartbeat={"interval": 1, "grace": 5, "max_retry": 3})
    url = f"sqlite:///{tmp_path / 'wake.db'}"
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, f"train.max_steps={LONG_ROW}", "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    first, run_dir = start_until_checkpoint(cmd, env, results)
    summary_path = run_dir / "summary.json"
    trial_pid = json.loads(summary_path.read_text())["pid"]
    for pid in (first.pid, trial_pid):
        os.kill(pid, signal.SIGSTOP)
    second_out = tmp_path / "second.out"
    try:
        time.sleep(7)  # past the grace: the trial is stale
        second = subprocess.Popen(cmd, stdout=second_out.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        wait_for_line(second_out, "already running elsewhere", second)  # however long its start takes
        assert "waiting for it to end" in second_out.read_text()
        assert json.loads(summary_path.read_text())["pid"] == trial_pid  # the retry has not touched the run
    finally:
        for pid in (trial_pid, first.pid):
            os.kill(pid, signal.SIGCONT)
    out, _ = first.communicate()  # it may wait for the retry's whole row: the suite's timeout is the only limit
    assert "Traceback" not in out, out[-3000:]
    assert second.wait() == 0, second_out.read_text()[-3000:]
    assert "Traceback" not in second_out.read_text()
    attempts = json.loads(summary_path.read_text())["attempts"]
    woken = [a for a in attempts if a.get("pid") == trial_pid]
    # Which of the two woken processes acts first is the scheduler's choice, and either way the attempt ends short
    # of its budget, never completed: the trial (its next report finds the study closed it: failed, "heartbeat
    # lapsed") or its worker (its heartbeat finds the trial taken over and stops it as Ctrl-C does: stopped).
    assert woken and woken[-1]["steps"] < LONG_ROW, woken
    if woken[-1]["status"] == "failed":
        assert "heartbeat lapsed" in woken[-1]["error"], woken[-1]
    else:
        assert woken[-1]["status"] == "stopped" and "was taken over by another worker" in out, (woken[-1], out[-2000:])
    done = [t for t in trials_of(url, "wake") if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 1 and json.loads(summary_path.read_text())["steps"] == LONG_ROW
    assert json.loads(summary_path.read_text())["status"] == "completed"


@pytest.mark.slow
@pytest.mark.long
def test_a_larger_budget_continues_the_runs_and_its_trials_hold_every_dev_value(tmp_path, data_dir, ltfm_here):
    """A larger train.max_steps makes new trials that resume the same run folders; each new trial holds the
    dev value of every validation, the one at the resumed step too (its checkpoint predates that validation)."""
    results = tmp_path / "results"
    sweep = write_sweep(tmp_path, "more", {"base": {}})
    url = f"sqlite:///{tmp_path / 'more.db'}"
    base = ["sweep", sweep, f"data.path={data_dir}", f"run.results_dir={results}", *TINY, "--storage", url]
    env = {"WANDB_MODE": "disabled"}
    assert ltfm(*base, "train.max_steps=20", env=env).returncode == 0
    # the dry run names the run folder each row continues, and from which step
    [rid] = [d.name for d in results.iterdir() if (d / "summary.json").is_file()]
    assert f"steps 30 (continues {rid} from step 20)" in ltfm_here(*base, "train.max_steps=30", "--dry-run").stdout
    [row] = json.loads(ltfm_here(*base, "train.max_steps=20", "--dry-run", "--json").stdout)
    assert (row["run_id"], row["trained_steps"], row["max_steps"]) == (rid, 20, 20)  # shown as "trained: <run id>"
    p = ltfm(*base, "train.max_steps=30", env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    first, second = sorted(trials_of(url, "more"), key=lambda t: t.number)
    assert sorted(first.intermediate_values) == [10, 20]
    assert sorted(second.intermediate_values) == [10, 20, 30]
    assert second.intermediate_values[20] == pytest.approx(first.intermediate_values[20])
    assert second.user_attrs["run_dir"] == first.user_attrs["run_dir"]  # the same run, continued


# ------------------------------------------------------------------------------------------------------------
# A bad night: a results disk that fills for a while, a database that restarts
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.long
def test_a_full_results_disk_pauses_the_sweep_and_its_trial_is_queued_again(tmp_path, data_dir, tmpfs):
    """The results filesystem fills while a trial trains: the trial fails, the worker records why, queues the
    row again and claims nothing while the disk stays full (one line); freed, the retry resumes the run to its
    budget. The storage is off that disk here (the chaos soak puts SQLite on it too)."""
    results = tmpfs(400_000)
    sweep = write_sweep(tmp_path, "full", {"base": {}}, heartbeat={"interval": 1, "grace": 10, "max_retry": 3})
    url = f"sqlite:///{tmp_path / 'full.db'}"
    cmd = [sys.executable, "-m", "lightning_tfm", "sweep", str(sweep), f"data.path={data_dir}",
           f"run.results_dir={results}", *TINY, "train.max_steps=200", "--storage", url]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out = tmp_path / "worker.out"  # off the full disk, to be read
    worker, run_dir = start_until_checkpoint(cmd, env, results, out=out.open("w"))
    filler = results / "filler"
    with open(filler, "wb", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * (1 << 20))
    try:
        wait_for_line(out, "cannot be written (No space left on device", worker)  # however long it takes
        time.sleep(3)
        assert "training" not in out.read_text().split("cannot be written (No space")[-1]  # nothing claimed
    finally:
        filler.unlink()
    assert worker.wait() == 0, out.read_text()[-3000:]  # the retry trains the row: the suite's timeout only
    text = out.read_text()
    assert "Traceback" not in text and "results folder writable again after" in text, text[-3000:]
    failed, retry = trials_of(url, "full")
    assert failed.state == optuna.trial.TrialState.FAIL and retry.state == optuna.trial.TrialState.COMPLETE
    assert "No space left on device" in failed.user_attrs["error"], failed.user_attrs
    assert retry.system_attrs["retry_history"] == [failed.number]
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["status"] == "completed" and done["steps"] == 200
    assert done["attempts"][-1]["status"] != "completed"  # the attempt the full disk stopped (its summary may
    # still say running: the disk refused its last write)


def test_storage_calls_wait_for_a_database_that_restarts(postgres, pg_url, capsys):  # noqa: F811
    """PostgreSQL stopped for a few seconds: a storage call waits for it (one warning line) and succeeds once it
    is back; a storage that stays down past the patience raises."""
    import threading

    import sqlalchemy

    from lightning_tfm.sweep.storage import open_storage, retry

    study = optuna.create_study(storage=open_storage(pg_url), study_name="restart")
    study.enqueue_trial({})
    postgres.stop("fast")
    back = threading.Timer(4, postgres.start)
    back.start()
    t0 = time.time()
    try:
        trials = retry(study.get_trials, patience=90)
    finally:
        back.join()
    assert len(trials) == 1 and 3 < time.time() - t0 < 90
    err = capsys.readouterr().err
    assert err.count("the sweep storage is not answering") == 1 and "storage reachable again" in err
    postgres.stop("fast")
    try:
        t0 = time.time()
        with pytest.raises((optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)):
            retry(study.get_trials, patience=3)
        assert time.time() - t0 < 30
    finally:
        postgres.start()
    assert len(retry(study.get_trials)) == 1
