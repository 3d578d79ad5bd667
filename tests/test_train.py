"""`ltfm train` end to end on real Multi30k data: run folder, summary, resume, and bad input.

Bad input is checked with ``cli.main`` in this process (``ltfm_here``: a new ``ltfm`` process spends seconds
importing torch and Lightning before it refuses anything), and once in a real process."""
import json
import subprocess

import pytest
import torch
import yaml

from lightning_tfm.training.runs.results import ATTEMPT_ENV, read_metrics

from conftest import SMOKE, ltfm

SUMMARY_KEYS = {"run_id", "status", "config", "params", "dev_loss", "dev_ppl", "steps", "train_tokens", "wall_time_s"}


def test_smoke_run_writes_a_complete_run_folder(smoke_run):
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["status"] == "completed" and summary["run_id"] == smoke_run.name
    cfg = yaml.safe_load((smoke_run / "config.yaml").read_text())
    assert cfg == summary["config"] and cfg["model"]["heads"] == 4  # resolved, nested
    assert summary["steps"] == cfg["train"]["max_steps"] and summary["train_tokens"] > 0
    assert isinstance(summary["params"], int) and summary["params"] > 0
    assert (smoke_run / "tokenizer.json").is_file()
    dev = [r["dev/ppl"] for r in read_metrics(smoke_run) if "dev/ppl" in r]
    assert len(dev) >= 3 and dev[-1] < dev[0]  # dev perplexity falls during training
    assert summary["dev_ppl"] == pytest.approx(dev[-1], rel=1e-4)


def test_checkpoints_load_with_weights_only(smoke_run):
    ckpts = sorted((smoke_run / "checkpoints").glob("*.ckpt"))
    assert {"last.ckpt", "best.ckpt"} <= {p.name for p in ckpts}
    for path in ckpts:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        assert "model.embed.weight" in ck["state_dict"]
        assert ck["hyper_parameters"]["config"]["model"]["d_model"] == 64


@pytest.mark.slow
@pytest.mark.long  # make test-long; make test keeps a run resumed from its last step by the same command at a
# larger budget (test_stop_resume.py::test_a_larger_budget_goes_on_from_the_last_step_on_the_same_batches) and
# after a stop (its SIGTERM-mid-epoch case)
def test_rerunning_the_same_command_resumes_from_the_saved_step(tmp_path, data_dir):
    args = ["train", SMOKE, f"data.path={data_dir}", f"run.results_dir={tmp_path}", "data.max_train_pairs=600",
            "train.val_every_steps=10", "train.checkpoint_every_steps=10"]
    first = ltfm(*args, "train.max_steps=20")
    assert first.returncode == 0, first.stderr[-2000:]
    (run_dir,) = list(tmp_path.iterdir())
    assert torch.load(run_dir / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 20
    tokenizer = (run_dir / "tokenizer.json").read_text()
    assert "attempt" not in json.loads((run_dir / "summary.json").read_text())  # no sweep worker started it
    # same run id: the budget is not part of it; started as a sweep worker starts a trial (its attempt's token)
    second = ltfm(*args, "train.max_steps=30", env={ATTEMPT_ENV: "0123abcd"})
    assert second.returncode == 0, second.stderr[-2000:]
    assert list(tmp_path.iterdir()) == [run_dir]
    assert "Restoring states from the checkpoint" in second.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["attempt"] == "0123abcd"  # how the worker knows it is this attempt's



    import csv
    with (run_dir / "logs/version_1/metrics.csv").open() as f:
        resumed_steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert resumed_steps and min(resumed_steps) >= 20  # the second attempt starts at the saved step
    all_steps = [r["step"] for r in read_metrics(run_dir)]
    assert min(all_steps) < 20 and max(all_steps) >= 29  # and the history of both attempts is kept
    assert (run_dir / "tokenizer.json").read_text() == tokenizer  # the run's vocabulary is reused
    third = ltfm(*args, "train.max_steps=30")
    assert third.returncode == 0 and "already completed" in third.stderr


BAD = [
    (["model.norm=middle"], "model.norm"),
    (["model.bogus=1"], "model.bogus"),
    (["model.heads=four"], "model.heads"),
    (["train.label_smoothing=2"], "train.label_smoothing"),
    (["data.path=/nonexistent/folder"], "/nonexistent/folder"),
    (["data.test_split=nosuchsplit"], "nosuchsplit"),
    (["run.results_dir=/proc/forbidden"], "not writable"),
]


def _refused(p: subprocess.CompletedProcess, named: str, results) -> None:
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ltfm: error:") and named in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not results.exists()  # nothing half-written


@pytest.mark.parametrize("overrides,named", BAD)
def test_bad_input_stops_with_one_line_and_exit_2(tmp_path, data_dir, overrides, named, ltfm_here):
    results = tmp_path / "results"
    p = ltfm_here("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", *overrides)
    _refused(p, named, results)


def test_bad_input_ends_a_real_process_with_exit_2_and_one_line(tmp_path, data_dir):
    """One of the cases above in a real ``ltfm train`` process: its exit status, and nothing else on its stderr (no
    traceback, no warning a library prints as it is imported)."""
    results = tmp_path / "results"
    p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", "data.test_split=nosuchsplit")
    _refused(p, "nosuchsplit", results)


def test_misaligned_and_empty_files_are_rejected(tmp_path, data_dir, ltfm_here):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.en").write_text("a b\nc d\n")
    (folder / "train.de").write_text("x y\n")
    (folder / "val.en").write_text("")
    (folder / "val.de").write_text("")
    p = ltfm_here("train", SMOKE, f"data.path={folder}", f"run.results_dir={tmp_path / 'r'}", "data.test_split=null")
    assert p.returncode == 2 and "train.en has 2 lines but" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    (folder / "train.de").write_text("x y\nz w\n")
    p = ltfm_here("train", SMOKE, f"data.path={folder}", f"run.results_dir={tmp_path / 'r'}", "data.test_split=null")
    assert p.returncode == 2 and "split 'val' is empty" in p.stderr
    assert not (tmp_path / "r").exists()


def test_cli_errors_are_one_line(tmp_path, ltfm_here):
    for args, named in [(["train"], "config"), (["train", tmp_path / "missing.yaml"], "missing.yaml"),
                        (["frobnicate"], "frobnicate")]:
        # argument errors in a real process (it imports no torch before them), the file's errors in this one
        p = ltfm(*args) if len(args) == 1 else ltfm_here(*args)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and named in p.stderr, p.stderr
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model:\n  heads: [1,\n")
    p = ltfm_here("train", bad_yaml)
    assert p.returncode == 2 and "not valid YAML" in p.stderr
