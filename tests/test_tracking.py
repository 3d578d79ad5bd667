"""Experiment tracking: real wandb in offline mode, read back from its run-<id>.wandb files.

Until a test needs the real Transformer, a tiny LightningModule stands in for the model: what is under
test is the W&B run (naming, flat config, history against the step, summary, sample tables, one run per
training, rank zero only, no secrets), not the training.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import wandb
from torch.utils.data import DataLoader, TensorDataset

from lightning_tfm.base import redact
from lightning_tfm.base.errors import UserError
from lightning_tfm.training.config.config import Config, load_config
from lightning_tfm.training.runs import results
from lightning_tfm.training.tracking import tracking

from conftest import DATA, ltfm_in
from wandb_offline import find_run_files, read_records, read_run, read_runs

REPO = Path(__file__).resolve().parents[1]
FAKE_KEY = "fake0api0key0" + "7" * 27  # 40 characters, like a real W&B key
DB_PASSWORD = "Pg-S3cret-pw"
STORAGE = f"postgresql://optuna:{DB_PASSWORD}@db.example.org:5432/studies"


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Offline, silent wandb whose every file (cache, config, artifacts) stays inside tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_NAME",
                "WANDB_RUN_GROUP", "WANDB_JOB_TYPE", "WANDB_TAGS", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for var, sub in (("WANDB_DIR", "wandb_dir"), ("WANDB_CACHE_DIR", "wandb_cache"),
                     ("WANDB_CONFIG_DIR", "wandb_config"), ("WANDB_DATA_DIR", "wandb_data"),
                     ("WANDB_ARTIFACT_DIR", "wandb_artifacts")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    yield tmp_path
    if wandb.run is not None:  # never leave a run open for the next test
        wandb.finish()


def make_cfg(**overrides) -> Config:
    base = {"data.path": "/unused", "run.name": "toy", "model.heads": 4, "model.d_k": 32, "model.d_v": 16}
    return load_config(None, {**base, **overrides})


class Toy(pl.LightningModule):
    """Logs what the real LightningModule logs, under the same keys, at the same points."""

    def __init__(self, cfg: Config):
        super().__init__()
        # what lit.py should do: never hand a secret to save_hyperparameters (hparams.yaml, checkpoints)
        self.save_hyperparameters({"config": redact.scrub(cfg.to_dict()), "vocab_size": 11})
        self.lin = torch.nn.Linear(4, 1)
        self.samples_logged: list[tuple[int, list]] = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log(results.TRAIN_LOSS, loss)
        self.log(results.TRAIN_LR, 0.05)
        self.log(results.TRAIN_TOKENS_PER_S, 1000.0 + self.global_step)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log(results.DEV_LOSS, loss)
        self.log(results.DEV_PPL, loss.exp())
        self.log(results.DEV_BLEU, 10.0 + self.global_step)

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        wb = [lg for lg in self.loggers if isinstance(lg, tracking.TrackingLogger)]
        rows = [(f"src {i}", f"ref {i}", f"hyp {i} at {self.global_step}") for i in range(3)]
        self.samples_logged.append((self.global_step, rows))
        tracking.log_samples(wb[0] if wb else None, self.global_step, rows)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def toy_train(run_dir: Path, cfg: Config, steps: int = 8, status: str = "completed") -> tuple[dict, Toy]:
    """One toy training run the way train.py wires tracking: logger, fit, finish -> summary fields."""
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = tracking.make_wandb_logger(cfg, run_dir.name, run_dir)
    csv_logger = pl.loggers.CSVLogger(run_dir, name="logs")  # logs/version_N/metrics.csv, as train.py
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(max_steps=steps, val_check_interval=4, log_every_n_steps=2, accelerator="cpu",
                         logger=[csv_logger] + ([logger] if logger else []), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    model = Toy(cfg)
    trainer.fit(model, DataLoader(data, batch_size=8), DataLoader(data, batch_size=32))
    summary = {"status": status, "dev_ppl": 3.25, "dev_bleu": 21.5, "test_bleu": 20.0, "params": 5,
               "train_tokens": 1234, "wall_time_s": 9.5, "tokens_per_s": 130.0, "dev_loss": 1.18}
    return tracking.finish(logger, summary, None), model


def csv_steps(run_dir: Path, key: str) -> list[int]:
    """Steps at which the local metrics log (the source of truth) recorded ``key``."""
    steps = []
    for path in sorted(run_dir.glob("logs/version_*/metrics.csv")):
        with open(path) as f:
            steps += [int(r["step"]) for r in csv.DictReader(f) if r.get(key)]
    return steps


def test_offline_run_holds_flat_config_history_summary_and_samples(wandb_env):
    run_dir = wandb_env / "results" / "toy-0001"
    cfg = make_cfg(**{"run.variant": "A2", "run.family": "A", "run.study": "table3-cpu", "run.seed": 3,
                      "wandb.tags": ["cpu"]})
    info, model = toy_train(run_dir, cfg)

    assert info["wandb_mode"] == "offline" and info["wandb_project"] == "lightning_tfm"
    files = find_run_files(run_dir)
    assert len(files) == 1 and files[0].name == f"run-{info['wandb_run_id']}.wandb"
    assert (run_dir / tracking.ID_FILE).read_text().strip() == info["wandb_run_id"]
    assert Path(info["wandb_dir"]) == files[0].parent
    run = read_run(files[0])

    # naming: the paper's rows can be found by group / job_type / name / tags
    assert (run.run_id, run.project, run.group, run.job_type, run.name) == (
        info["wandb_run_id"], "lightning_tfm", "table3-cpu", "A", "A2-s3")
    assert set(run.tags) == {"cpu", "A2", "A"}

    # config: flat paper-knob keys with the resolved values, the local run id, nothing nested
    assert run.config["model.heads"] == 4 and run.config["model.d_k"] == 32 and run.config["model.d_v"] == 16
    assert run.config["model.d_model"] == 512 and run.config["train.label_smoothing"] == 0.1
    assert run.config["model.norm"] == "post" and run.config["model.positional"] == "sinusoidal"
    assert run.config["run.id"] == "toy-0001"
    assert run.config["vocab_size"] == 11  # Lightning's save_hyperparameters arrive flat too
    assert not any(isinstance(v, dict) for v in run.config.values()), "nested config leaked into W&B"
    assert not {"config", "model", "train"} & set(run.config)

    # history: every metric against the trainer step, the same steps as the local metrics.csv
    for key in (results.TRAIN_LOSS, results.TRAIN_LR, results.TRAIN_TOKENS_PER_S,
                results.DEV_LOSS, results.DEV_PPL, results.DEV_BLEU):
        steps = [s for s, _ in run.metric(key)]
        assert steps, f"{key} missing from the W&B history"
        assert steps == sorted(steps) and steps == csv_steps(run_dir, key), key
    assert len(run.metric(results.TRAIN_LOSS)) == 4 and len(run.metric(results.DEV_LOSS)) == 2
    assert [row["_step"] for row in run.history] == list(range(len(run.history)))

    # summary metrics of the finished run
    for key, value in {"dev_ppl": 3.25, "dev_bleu": 21.5, "test_bleu": 20.0, "params": 5, "train_tokens": 1234,
                       "wall_time_s": 9.5, "tokens_per_s": 130.0}.items():
        assert run.summary[key] == value, key
    assert run.exit_code == 0

    # sample translations: one table per dev evaluation, at that evaluation's step
    tables = run.tables[results.DEV_SAMPLES]
    assert [(t["trainer/global_step"], t["data"]) for t in tables] == [
        (step, [list(r) for r in rows]) for step, rows in model.samples_logged]
    assert len(tables) == 2 and all(t["columns"] == ["source", "reference", "hypothesis"] for t in tables)


def test_two_trainings_in_one_process_are_two_runs(wandb_env):
    shared = wandb_env / "shared_wandb"  # a sweep worker writing both runs under one wandb dir
    infos = []
    for i, steps in enumerate((6, 10)):
        cfg = make_cfg(**{"run.variant": f"B{i + 1}", "model.d_k": 16 * (i + 1), "wandb.dir": str(shared)})
        infos.append(toy_train(wandb_env / "results" / f"run{i}", cfg, steps=steps)[0])
    runs = {r.run_id: r for r in read_runs(shared)}
    assert len(runs) == 2 and set(runs) == {i["wandb_run_id"] for i in infos}
    for i, (info, steps) in enumerate(zip(infos, (6, 10))):
        run = runs[info["wandb_run_id"]]
        assert run.config["model.d_k"] == 16 * (i + 1) and run.config["run.id"] == f"run{i}"
        assert run.name == f"B{i + 1}-s1" and run.group == "adhoc" and run.job_type == "adhoc"
        # each run has its own history: own steps, own row counter from 0, nothing of the other
        train_steps = [s for s, _ in run.metric(results.TRAIN_LOSS)]
        assert train_steps == csv_steps(wandb_env / "results" / f"run{i}", results.TRAIN_LOSS)
        assert train_steps == list(range(1, steps, 2))  # log_every_n_steps=2
        assert [row["_step"] for row in run.history] == list(range(len(run.history)))
        assert run.exit_code == 0
    assert len(runs[infos[0]["wandb_run_id"]].history) < len(runs[infos[1]["wandb_run_id"]].history)


def test_a_run_left_open_is_finished_not_reused(wandb_env, capsys):
    leftover = wandb.init(mode="offline", dir=str(wandb_env / "leftover"), project="x")
    leftover.log({"unrelated": 1.0})
    info, _ = toy_train(wandb_env / "results" / "fresh", make_cfg())
    assert info["wandb_run_id"] != leftover.id
    assert "was still open" in capsys.readouterr().err
    old = read_run(wandb_env / "leftover")
    new = read_run(wandb_env / "results" / "fresh")
    assert old.exit_code == 1 and not old.metric(results.TRAIN_LOSS)
    assert new.metric(results.TRAIN_LOSS) and not new.metric("unrelated")


def test_resumed_training_continues_the_same_wandb_run(wandb_env):
    run_dir = wandb_env / "results" / "resumable"
    first, _ = toy_train(run_dir, make_cfg(), steps=4, status="failed")
    second, _ = toy_train(run_dir, make_cfg(), steps=4)
    assert first["wandb_run_id"] == second["wandb_run_id"]
    # offline, wandb writes the resumed segment to a second folder with the same run id; `wandb sync`
    # uploads both into one run
    runs = read_runs(run_dir)
    assert [r.run_id for r in runs] == [first["wandb_run_id"]] * 2
    assert [r.exit_code for r in runs] == [1, 0]


def test_failed_training_marks_the_run_failed(wandb_env):
    info, _ = toy_train(wandb_env / "results" / "bad", make_cfg(), steps=2, status="failed")
    run = read_run(wandb_env / "results" / "bad")
    assert run.exit_code == 1 and run.summary["status"] == "failed" and info["wandb_mode"] == "offline"


def test_secrets_appear_nowhere_in_the_run_folder_or_wandb_files(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    # a sweep trial is launched as `ltfm train ... sweep.storage=URL`; wandb records the command line
    argv = ["ltfm", "train", "experiments/x.yaml", f"sweep.storage={STORAGE}"]
    monkeypatch.setattr(sys, "argv", list(argv))
    run_dir = wandb_env / "results" / "secretive"
    cfg = make_cfg(**{"sweep.storage": STORAGE, "sweep.study": "table3"})
    info, _ = toy_train(run_dir, cfg)
    (run_dir / "summary.json").write_text(json.dumps(redact.scrub({"config": cfg.to_dict(), **info})))
    assert sys.argv == argv  # restored for Lightning's DDP launcher

    checked = 0
    for path in [p for p in wandb_env.rglob("*") if p.is_file()]:
        data = path.read_bytes()
        assert FAKE_KEY.encode() not in data, f"API key in {path}"
        assert DB_PASSWORD.encode() not in data, f"DB password in {path}"
        checked += path.suffix == ".wandb"
    assert checked == 1
    # positive controls: the storage URL is there, masked, in the W&B config and the recorded command line
    run = read_run(run_dir)
    masked = "postgresql://optuna:***@db.example.org:5432/studies"
    assert run.config["sweep.storage"] == masked and run.group == "table3"
    assert run.args == ["train", "experiments/x.yaml", f"sweep.storage={masked}"]


def test_lightning_hyperparameters_are_flattened_and_scrubbed(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    cfg = make_cfg(**{"sweep.storage": STORAGE})
    run_dir = wandb_env / "results" / "hp"
    logger = tracking.make_wandb_logger(cfg, "hp", run_dir)
    # what Lightning does with an unscrubbed save_hyperparameters(config=cfg, ...)
    logger.log_hyperparams({"config": cfg, "vocab_size": 7, "db_password": "hunter2hunter2", "note": FAKE_KEY})
    tracking.finish(logger, {"status": "completed"}, None)
    run = read_run(run_dir)
    assert run.config["vocab_size"] == 7 and run.config["model.heads"] == 4 and "config" not in run.config
    assert run.config["sweep.storage"].endswith(":***@db.example.org:5432/studies")
    assert run.config["db_password"] == "***" and run.config["note"] == "***"
    raw = b"".join(r.SerializeToString() for r in read_records(find_run_files(run_dir)[0]))
    assert DB_PASSWORD.encode() not in raw and b"hunter2hunter2" not in raw and FAKE_KEY.encode() not in raw


def test_scrub_masks_secrets_but_not_lookalike_keys(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-123456789")
    monkeypatch.setenv("PWD", "/work/somewhere")  # not a secret, even though "pwd" names one in a config
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-agent.sock")
    data = {
        "wandb": {"api_key": "abc", "WANDB_API_KEY": "abc", "project": "p"},
        "db": {"password": "pw", "passwordless": True, "url": "mysql+pymysql://u:p@ss@h:3306/db?x=1"},
        "train": {"batch_tokens": 4096, "max_tokens_per_sentence": 256, "keep_checkpoints": 5},
        "model": {"d_k": 64}, "authToken": "xyz", "empty_secret": None,
        "urls": ["postgresql://u:pw@h/db", "sqlite:///results/s.db", "https://h/x?password=pw&a=1"],
        "log": "connected with tok-123456789",
        "data": {"path": "/work/somewhere/data", "sock": "/tmp/ssh-agent.sock"},
    }
    out = redact.scrub(data)
    assert out["wandb"] == {"api_key": "***", "WANDB_API_KEY": "***", "project": "p"}
    assert out["db"]["password"] == "***" and out["db"]["passwordless"] is True
    assert out["db"]["url"] == "mysql+pymysql://u:***@h:3306/db?x=1"
    assert out["train"] == data["train"] and out["model"] == {"d_k": 64}
    assert out["authToken"] == "***" and out["empty_secret"] is None
    assert out["urls"] == ["postgresql://u:***@h/db", "sqlite:///results/s.db", "https://h/x?password=***&a=1"]
    assert out["log"] == "connected with ***"
    assert out["data"] == data["data"]
    assert data["db"]["password"] == "pw"  # a copy, the input is untouched


def test_modes_online_needs_a_key_disabled_gives_no_logger(wandb_env, monkeypatch, capsys):
    cfg = make_cfg()
    monkeypatch.setenv("WANDB_MODE", "online")
    logger = tracking.make_wandb_logger(cfg, "r", wandb_env / "r")
    err = capsys.readouterr().err.strip()
    assert logger.mode == "offline" and len(err.splitlines()) == 1 and "no API key" in err
    assert FAKE_KEY not in err

    netrc = wandb_env / "netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_KEY}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert tracking.has_api_key() and tracking.resolve_mode(cfg) == "online"

    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.make_wandb_logger(cfg, "r", wandb_env / "r") is None
    assert tracking.finish(None, {"status": "completed"}, None)["wandb_mode"] == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert tracking.resolve_mode(make_cfg(**{"wandb.mode": "disabled"})) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(UserError, match="WANDB_MODE='sometimes'"):
        tracking.make_wandb_logger(cfg, "r", wandb_env / "r")
    assert not (wandb_env / "r" / "wandb").exists()


def test_online_without_a_reachable_server_falls_back_to_offline(wandb_env, monkeypatch, capsys):
    import socket
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    run_dir = wandb_env / "results" / "unreachable"
    info, _ = toy_train(run_dir, make_cfg(), steps=4)
    err = capsys.readouterr().err
    assert "W&B online start failed" in err and "logging offline instead" in err
    assert info["wandb_mode"] == "offline"
    run = read_run(run_dir)
    assert run.run_id == info["wandb_run_id"] and run.metric(results.TRAIN_LOSS) and run.exit_code == 0
    for path in [p for p in wandb_env.rglob("*") if p.is_file()]:
        assert FAKE_KEY.encode() not in path.read_bytes(), path
    assert FAKE_KEY not in err


def test_project_and_entity_come_from_the_environment(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_ENTITY", "team-env")
    info = tracking.finish(tracking.make_wandb_logger(make_cfg(**{"wandb.project": "from-cfg"}), "e", wandb_env / "e"),
                           {"status": "completed"}, None)
    run = read_run(wandb_env / "e")
    assert info["wandb_project"] == run.project == "from-env" and run.entity == "team-env"


DDP_SCRIPT = """
import sys, torch, pytorch_lightning as pl
from pathlib import Path
from torch.utils.data import DataLoader, TensorDataset
sys.path.insert(0, {tests!r})
from test_tracking import Toy, make_cfg
from lightning_tfm.training.runs import results
from lightning_tfm.training.tracking import tracking

run_dir = Path({run_dir!r})
cfg = make_cfg()
logger = tracking.make_wandb_logger(cfg, run_dir.name, run_dir)
trainer = pl.Trainer(max_steps=4, val_check_interval=2, log_every_n_steps=1, accelerator="cpu", devices=2,
                     strategy="ddp", logger=[logger], enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer.fit(Toy(cfg), DataLoader(data, batch_size=8), DataLoader(data, batch_size=16))
info = tracking.finish(logger, {{"status": "completed", "dev_ppl": 2.0}}, None)
print("RANK", trainer.global_rank, "INFO", info["wandb_run_id"], flush=True)
"""


@pytest.mark.slow
def test_ddp_creates_one_wandb_run_on_rank_zero_only(wandb_env):
    run_dir = wandb_env / "results" / "ddp"
    script = wandb_env / "ddp_train.py"
    script.write_text(DDP_SCRIPT.format(tests=str(REPO / "tests"), run_dir=str(run_dir)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # two processes that import torch and Lightning, then train: no limit but the suite's timeout (a limit of its
    # own, 240 s, raced the machine's speed and load)
    proc = subprocess.run([sys.executable, str(script)], cwd=wandb_env, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = sorted(line.split()[1:4:2] for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert [r for r, _ in ranks] == ["0", "1"]
    assert ranks[0][1] != "None" and ranks[1][1] == "None"  # only rank 0 has a W&B run
    files = find_run_files(wandb_env)
    assert len(files) == 1
    run = read_run(files[0])
    assert run.run_id == ranks[0][1] == (run_dir / tracking.ID_FILE).read_text().strip()
    assert run.summary["dev_ppl"] == 2.0 and [s for s, _ in run.metric(results.TRAIN_LOSS)] == [0, 1, 2, 3]


def read_gz_lines(path: Path, n: int) -> list[str]:
    import gzip
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.mark.slow
def test_smoke_training_is_one_offline_wandb_run(wandb_env):
    """`ltfm train` on the smoke config, WANDB_MODE=offline, read back from the run-<id>.wandb file."""
    results_dir = wandb_env / "results"
    env = {**os.environ, "WANDB_API_KEY": FAKE_KEY, "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_CONSOLE")  # as users run it: wandb captures the console into the run
    args = ["train", str(REPO / "experiments" / "multi30k-smoke.yaml"),
            f"data.path={DATA}", f"run.results_dir={results_dir}", "run.variant=base", "run.family=base",
            "run.study=smoke-study", "wandb.tags=[smoke]",
            # dev BLEU (and its sample table) at each dev evaluation, on a few sentences to stay fast
            "decode.dev_bleu_every_steps=50", "decode.dev_bleu_subset=16", "decode.samples=4"]
    proc = ltfm_in(env, *args, cwd=wandb_env)  # a process of its own, as users run it
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [d for d in results_dir.iterdir() if d.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary.get("wandb_mode") == "offline", "summary.json lacks the W&B fields of tracking.finish()"

    (wandb_file,) = find_run_files(run_dir)
    run = read_run(wandb_file)
    assert run.run_id == summary["wandb_run_id"] and run.project == summary["wandb_project"]
    assert (run.group, run.job_type, run.name) == ("smoke-study", "base", "base-s1") and "smoke" in run.tags

    # the paper's knobs as flat config keys, with the smoke config's values, and the local run id
    cfg = summary["config"]
    for key in ("model.layers", "model.d_model", "model.d_ff", "model.heads", "model.d_k", "model.d_v",
                "model.dropout", "model.positional", "model.norm", "train.label_smoothing"):
        section, name = key.split(".")
        assert run.config[key] == cfg[section][name], key
    assert (run.config["model.heads"], run.config["model.d_k"], run.config["model.layers"]) == (4, 16, 2)
    assert run.config["run.id"] == summary["run_id"] == run_dir.name

    # history against the trainer step: the same steps as the local metrics log
    for key in (results.TRAIN_LOSS, results.TRAIN_LR, results.DEV_LOSS, results.DEV_PPL):
        steps = [s for s, _ in run.metric(key)]
        assert steps and steps == sorted(steps) == csv_steps(run_dir, key), key
    assert len(run.metric(results.DEV_LOSS)) >= 3  # every 50 of 200 steps
    assert max(s for s, _ in run.metric(results.TRAIN_LOSS)) >= 100

    # summary metrics equal summary.json
    for key in ("dev_ppl", "dev_bleu", "test_bleu", "params", "train_tokens", "wall_time_s", "tokens_per_s"):
        assert run.summary[key] == pytest.approx(summary[key]), key
    assert run.exit_code == 0

    # sample translations: source/reference pairs are dev pairs of the corpus
    bleu_steps = [s for s, _ in run.metric(results.DEV_BLEU)]
    # dev BLEU sits on the same x value as Lightning's dev loss (which it logs at global_step - 1)
    assert (bleu_steps == [49, 99, 149, 199] == csv_steps(run_dir, results.DEV_BLEU)
            == csv_steps(run_dir, results.DEV_LOSS))
    tables = run.tables.get(results.DEV_SAMPLES)
    assert tables, "no dev/samples table in the W&B run"
    assert [t["trainer/global_step"] for t in tables] == [49, 99, 149, 199]
    src = read_gz_lines(DATA / "val.en.gz", cfg["data"]["max_dev_pairs"])
    tgt = read_gz_lines(DATA / "val.de.gz", cfg["data"]["max_dev_pairs"])
    pairs = set(zip(src, tgt))
    for table in tables:
        assert table["columns"] == ["source", "reference", "hypothesis"] and len(table["data"]) == 4
        assert all((s, r) in pairs for s, r, _ in table["data"])

    assert "Trainer.fit" in run.output  # the console was captured (and is checked below)
    # the planted API key is nowhere in the run folder (config, summary, logs, checkpoints, W&B files)
    for path in [p for p in run_dir.rglob("*") if p.is_file()]:
        assert FAKE_KEY.encode() not in path.read_bytes(), path


def test_a_pipeline_checks_runs_have_a_group_of_their_own():
    """``make ablation QUICK=1`` tags its runs ``pipeline-check``: they go to ``<study>-pipeline-check``, never
    the study's group (which ``ltfm report --from-wandb`` reads); the report's copy of the tag is the same."""
    from lightning_tfm.report.inputs import records

    real = tracking.run_naming(make_cfg(**{"run.study": "table3-cpu", "run.variant": "A1", "run.family": "A"}))
    check = tracking.run_naming(make_cfg(**{"run.study": "table3-cpu", "run.variant": "A1", "run.family": "A",
                                            "wandb.tags": ["pipeline-check"]}))
    assert real["group"] == "table3-cpu" and check["group"] == "table3-cpu-pipeline-check"
    assert "pipeline-check" in check["tags"] and check["name"] == real["name"]
    assert tracking.wandb_group(None, ["pipeline-check"]) == "adhoc-pipeline-check"
    assert records.PIPELINE_CHECK == tracking.PIPELINE_CHECK


def test_hidden_parameters_reach_the_child_only_through_the_environment(monkeypatch):
    """What a report's notebook is given is masked (papermill writes it down); the kernel reveals the real value
    from the environment, and only for the parameter it was masked from."""

    shown, hidden = redact.hide({"storage": STORAGE, "results_dir": "/r", "against_storage": None,
                                 "other": "sqlite:///x.db?password=hunter2"})
    assert shown["storage"] == STORAGE.replace(DB_PASSWORD, "***") and shown["results_dir"] == "/r"
    assert shown["other"] == "sqlite:///x.db?password=***" and set(hidden) == {"storage", "other"}
    assert DB_PASSWORD not in json.dumps(shown) and redact.reveal("storage", shown["storage"]) == shown["storage"]
    monkeypatch.setenv(redact.HIDDEN_ENV, redact.hidden_environment(hidden))
    assert redact.reveal("storage", shown["storage"]) == STORAGE
    assert redact.reveal("other", shown["other"]) == hidden["other"]
    assert redact.reveal("storage", "postgresql://someone:***@else/db") == "postgresql://someone:***@else/db"
    assert redact.reveal("against_storage", None) is None and redact.reveal("results_dir", "/r") == "/r"
    nested = {"cells": [{"outputs": [{"text": f"could not connect to {STORAGE} ({DB_PASSWORD})"}]}]}
    assert DB_PASSWORD not in json.dumps(redact.scrub(nested, [STORAGE]))
