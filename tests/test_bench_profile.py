"""``ltfm bench --config EXPERIMENT --profile`` (bench/profile.py): a real trial of the experiment, its phases timed and
its training step's operators attributed to the kinds of work the timing page lists; and ``ltfm bench``'s thread
counts. Smoke scale; nothing is timed against a limit."""
from __future__ import annotations

import json

import pytest

from lightning_tfm.base.errors import UserError
from lightning_tfm.bench import profile

from conftest import DATA, SMOKE, TINY, ltfm


def test_profile_of_a_tiny_trial_attributes_the_step_and_times_every_phase(tmp_path):
    overrides = [f"{k}={'null' if v is None else v}" for k, v in TINY.items()
                 if k not in ("train.max_steps", "train.val_every_steps")]
    p = ltfm("bench", "--config", SMOKE, "--profile", "--json", *overrides, f"data.path={DATA}",
             f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=6", "train.val_every_steps=3",
             "model.dropout=0.1", env={"OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    ph, st = r["phases"], r["step"]
    assert ph["steps"] == 6 and ph["validations"] == 2 and st["steps"] == 6
    for key in ("import_lightning_s", "setup_s", "train_steps_s", "validation_s", "closing_s"):
        assert ph[key] > 0, key
    assert ph["import_ltfm_s"] < ph["import_lightning_s"]  # Lightning's import includes torch's
    assert ph["train_steps_s"] + ph["validation_s"] + ph["closing_s"] < ph["total_s"]
    ms = st["ms_per_step"]
    assert list(ms) == list(profile.STEP_KINDS)
    # the model's products, its layer norms and dropout, the loss and Adam each ran inside the steps
    for kind in ("matrix products (model)", "loss: vocabulary projection products", "layer norm", "dropout",
                 "residual add", "embedding gather / scatter", "optimizer step (Adam)"):
        assert ms[kind] > 0, kind
    assert sum(ms.values()) == pytest.approx(st["step_ms"], rel=0.01)  # every microsecond of the step in one row
    # the products' FLOPs a step (the profiler counts them from their shapes), and the large product the MFU is
    # measured against, timed in the same run
    assert st["products_gflop"] > 0 and r["matmul_peak_gflops"] > 0
    assert not list(tmp_path.glob("results*"))  # the trials trained in temporary folders
    table = profile.format_profile(profile.TrialProfile(**{**r, "phases": profile.Phases(**ph),
                                                           "step": profile.StepProfile(**st)}))
    assert "| training steps (6: " in table and "| optimizer step (Adam) |" in table
    assert "The step's matrix products: " in table and "the MFU a step would reach" in table


@pytest.mark.parametrize("args,words", [
    ([], "--profile profiles a trial of an experiment"),
    ([str(SMOKE), "bench.batch=8"], "bench.batch=8: --profile runs the experiment's own trial"),
])
def test_profile_without_an_experiment_or_with_bench_shapes_is_one_line(args, words):
    import argparse
    a = argparse.Namespace(config=None, overrides=args, json=True)
    with pytest.raises(UserError) as e:
        profile.bench_profile_cli(a)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bench_measures_one_thread_and_every_core_unless_told_a_count():
    """``ltfm bench`` on a CPU: one thread (a sweep's trial) and then torch's default (here 2), one result each; with
    ``bench.threads=N`` that count alone, as one result (what ``--json`` always gave)."""
    small = ["bench.batch=4", "bench.src_len=6", "bench.tgt_len=6", "bench.out_len=6", "bench.reps=1",
             "bench.train_steps=1", "bench.layers=1", "bench.d_model=16", "bench.d_ff=16", "bench.heads=2",
             "bench.vocab=100", "--dtypes", "fp32", "--device", "cpu", "--json"]
    p = ltfm("bench", *small, env={"OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stderr[-2000:]
    runs = json.loads(p.stdout)
    assert [r["threads"] for r in runs] == [1, 2] and all(r["ours"]["fp32"]["train_tokens_per_s"] > 0 for r in runs)
    p = ltfm("bench", *small, "bench.threads=1", env={"OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stderr[-2000:]
    one = json.loads(p.stdout)
    assert isinstance(one, dict) and one["threads"] == 1
