"""``ltfm bench`` of the recurrent baseline (bench/speed.py): ``ltfm bench experiments/multi30k-rnn-smoke.yaml``
measures the RNN its experiment builds (training tokens/s, beam-4 decoding, MFU from the RNN class's own
``train_flops_per_token``), and what does not apply to it is a one-line error."""
from __future__ import annotations

import argparse
import json

import pytest

from lightning_tfm.base.errors import UserError
from lightning_tfm.bench import speed as bench
from lightning_tfm.model.rnn import RNN, RNNConfig

from conftest import ROOT, ltfm

RNN_SMOKE = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"
SMALL = ["bench.batch=8", "bench.src_len=8", "bench.tgt_len=8", "bench.out_len=8", "bench.reps=1",
         "bench.train_steps=1", "bench.threads=1"]


def test_bench_of_an_rnn_experiment_prints_tokens_per_s_and_its_mfu():
    p = ltfm("bench", RNN_SMOKE, *SMALL, "--dtypes", "fp32", "--json", env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["arch"] == "rnn" and r["settings"]["vocab"] == 1000 and r["attention_kernel"] is None
    assert r["model"] == "rnn: gru emb 64, encoder 1 x 2 x 64, decoder 1 x 128, attention 64"  # the experiment's
    ours = r["ours"]["fp32"]
    assert ours["train_tokens_per_s"] > 0 and ours["decode_sentences_per_s"] > 0 and "marian" not in r
    # MFU: the RNN's own training FLOPs of a step (8 sentences x 8 target tokens) over the step's time and the peak
    cfg = RNNConfig(emb_size=64, enc_hidden=64, dec_hidden=128, attention_size=64, dropout=0.1)
    flops = RNN.train_flops_per_token(cfg, 1000, 8, 8) * 8 * 8
    step_s = min(ours["train_s_per_step_all_reps"])
    peak = r["matmul_peak_gflops"]["fp32"] * 1e9
    assert ours["mfu"] == pytest.approx(flops / step_s / peak, rel=0.02, abs=2e-4)
    assert ours["train_tokens_per_s"] == pytest.approx(64 / step_s, rel=0.01)
    # the table ltfm bench prints without --json: the RNN's shapes first, then tokens/s and the MFU
    head, columns, row = bench.format_report(r).splitlines()
    assert head.startswith(r["model"] + " vocab=1000 batch=8x8 tokens") and columns.split()[-1] == "MFU"
    assert row.split()[:3] == ["ours", "fp32", f"{ours['train_tokens_per_s']:.0f}"]
    assert row.split()[-1] == f"{ours['mfu']:.1%}"


def args(*overrides, vs="none", config=None) -> argparse.Namespace:
    return argparse.Namespace(config=config, overrides=list(overrides), vs=vs, dtypes=None, device="cpu", json=True)


@pytest.mark.parametrize("a,words", [
    (args(str(RNN_SMOKE), vs="marian"), "--vs marian (a transformer) does not apply to "),
    (args(str(RNN_SMOKE), "bench.d_model=64"), "bench.d_model does not apply to "),
    (args("rnn.dec_hidden=64"), "'rnn.dec_hidden=64' is not a bench.<name>=N setting: config overrides go with an "
                                "experiment"),
    (args(str(RNN_SMOKE), "model.heads=2"), "model.heads does not apply to model.arch=rnn"),
])
def test_what_does_not_apply_is_one_line(a, words):
    with pytest.raises(UserError) as e:
        bench.bench_speed_cli(a)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
