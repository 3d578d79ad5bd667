"""The recurrent baseline (``model.arch: rnn``, model/rnn.py) and the recurrent recipes' schedule
(``train.lr_schedule: plateau``, training/optim.py): Bahdanau's additive attention against a hand computation,
incremental decoding against the teacher-forced pass, beam 1 against greedy, the parameter and FLOPs counts
against the built model and torch's FlopCounterMode, the plateau schedule, the run ids the new keys must not
move, the one-line error for a transformer knob, and one smoke run through train, resume, average, evaluate,
translate and the runs table."""
from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from lightning_tfm.cli import main as cli_main
from lightning_tfm.model import EOS, PAD, EncoderDecoder, build_model
from lightning_tfm.model.rnn import RNN, RNNConfig, additive_attention
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids
from lightning_tfm.training.optim import make_optimizer
from lightning_tfm.training.runs import upgrade

from conftest import ROOT, SMOKE, ltfm

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

RNN_SMOKE = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"
V = 40


def small(**kw) -> RNNConfig:
    sizes = dict(emb_size=6, enc_hidden=5, dec_hidden=7, attention_size=4, dropout=0.0)
    return RNNConfig(**{**sizes, **kw})


def padded_batch(B=3, S=7, T=5, seed=0):
    """Sources of lengths S, S-2, S-4 (right-padded, EOS last) and targets of length T."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    for b in range(B):
        n = max(S - 2 * b, 1)
        src[b, n - 1], src[b, n:] = EOS, PAD
    return src, torch.randint(4, V, (B, T), generator=g)


# ------------------------------------------------------------------------------------------------ the model
def test_additive_attention_is_bahdanaus_eq6_by_hand():
    """e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j), alpha = softmax over the unpadded j, c_i = sum_j alpha_ij h_j,
    written out with floats on a small example whose second row has one padded position."""
    query = torch.tensor([[0.5, -1.0], [0.2, 0.3]])                        # W_a s_{i-1}: (R=2, A=2)
    keys = torch.tensor([[[0.1, 0.2], [-0.3, 0.4], [1.0, -0.5]],
                         [[0.7, 0.1], [0.0, -0.2], [9.0, 9.0]]])            # U_a h_j: (2, S=3, 2)
    values = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]],
                           [[3.0, 1.0], [-1.0, 0.5], [100.0, 100.0]]])      # h_j: (2, 3, C=2)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    v_a = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        v_a.weight.copy_(torch.tensor([[0.8, -0.6]]))
    context, alpha = additive_attention(query, keys, values, mask, v_a)

    for r, n in ((0, 3), (1, 2)):
        e = [0.8 * math.tanh(query[r, 0].item() + keys[r, j, 0].item())
             - 0.6 * math.tanh(query[r, 1].item() + keys[r, j, 1].item()) for j in range(n)]
        a = [math.exp(x) / sum(math.exp(y) for y in e) for x in e] + [0.0] * (3 - n)
        c = [sum(a[j] * values[r, j, k].item() for j in range(n)) for k in range(2)]
        assert alpha[r].tolist() == pytest.approx(a, abs=1e-6)
        assert context[r].tolist() == pytest.approx(c, abs=1e-5)
    assert alpha[1, 2] == 0  # the padded position's weight: its huge key and value change nothing


def test_padding_changes_nothing_and_attention_rows_are_distributions():
    torch.manual_seed(0)
    m = RNN(small(enc_layers=2), V).eval()
    src, tgt = padded_batch()
    with torch.no_grad():
        t, alpha = m.features(src, tgt, need_attention=True)
        longer = torch.cat([src, torch.full((3, 4), PAD)], 1)  # more padding
        assert torch.allclose(m.features(longer, tgt), t, atol=1e-6)
        alone = m.features(src[2:, :3], tgt[2:])  # the shortest sentence alone, unpadded
    assert torch.allclose(alone, t[2:], atol=1e-6)
    assert alpha.shape == (3, 5, 7) and torch.allclose(alpha.sum(-1), torch.ones(3, 5))
    assert (alpha[1, :, 5:] == 0).all() and (alpha[2, :, 3:] == 0).all()


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_step_by_step_decoding_gives_the_teacher_forced_log_probs(cell):
    torch.manual_seed(0)
    m = RNN(small(cell=cell, enc_layers=2, dec_layers=2, tied_embeddings=True), V).eval()
    src, tgt = padded_batch()
    with torch.no_grad():
        full, alpha = m.features(src, tgt, need_attention=True)
        want = m.project(full).log_softmax(-1)
        enc = m.encode(src)
        state = m.init_state(enc)
        steps = []
        for i in range(tgt.shape[1]):
            steps.append(m.project(m.decode_step(tgt[:, i:i + 1], enc, state)).log_softmax(-1))
            assert torch.allclose(state["attention"], alpha[:, i], atol=1e-6)
            prefix = m.project(m.decode_step(tgt[:, :i + 1], enc, None)).log_softmax(-1)  # recomputed
            assert torch.allclose(prefix, want[:, i], atol=1e-5)
    torch.testing.assert_close(torch.stack(steps, 1), want, rtol=1e-5, atol=1e-5)
    # reordering the state's rows and the encoder output's together is decoding the reordered batch
    index = torch.tensor([2, 0, 0])
    state = m.init_state(enc)
    with torch.no_grad():
        m.decode_step(tgt[:, :1], enc, state)
        m.reorder_state(state, index)
        nxt = m.project(m.decode_step(tgt[index, 1:2], m.reorder_encoder_out(enc, index), state)).log_softmax(-1)
        m2 = m.project(m.features(src[index], tgt[index][:, :2])[:, 1]).log_softmax(-1)
    torch.testing.assert_close(nxt, m2, rtol=1e-5, atol=1e-5)


def test_beam_one_is_greedy_and_the_state_matches_the_recomputed_prefix():
    from lightning_tfm.training.decode import beam_search, greedy_decode

    torch.manual_seed(1)
    m = RNN(small(emb_size=16, enc_hidden=8, dec_hidden=16, attention_size=8), V).eval()
    src, _ = padded_batch(B=4, S=6)
    beam1 = beam_search(m, src, beam_size=1, max_len_a=0.0, max_len_b=8)
    with torch.no_grad():
        greedy = greedy_decode(m, src, max_len_a=0.0, max_len_b=8)
    assert [h.tokens for h in beam1] == [h.tokens for h in greedy]
    assert [h.score for h in beam1] == pytest.approx([h.score for h in greedy], abs=1e-4)
    cached = beam_search(m, src, beam_size=4, max_len_a=0.0, max_len_b=8)
    plain = beam_search(m, src, beam_size=4, max_len_a=0.0, max_len_b=8, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in plain]
    assert [h.score for h in cached] == pytest.approx([h.score for h in plain], abs=1e-4)
    assert any(len(h.tokens) > 1 for h in cached)


@pytest.mark.parametrize("kw", [{}, {"cell": "lstm", "enc_layers": 2, "dec_layers": 3},
                                {"shared_embeddings": True}, {"tied_embeddings": True},
                                {"shared_embeddings": True, "tied_embeddings": True}])
def test_the_analytic_parameter_count_is_the_built_models(kw):
    cfg = small(**kw)
    assert RNN.count_parameters(cfg, V) == RNN(cfg, V).num_parameters()
    c = config.load_config(None, ["data.path=/x", "model.arch=rnn", *(f"rnn.{k}={v}" for k, v in kw.items())])
    from lightning_tfm.model.registry import count_parameters
    with torch.device("meta"):  # the defaults' sizes: no memory, no time
        assert count_parameters(c.model, 1000) == build_model(c.model, 1000).num_parameters()
    # the default (joeynmt's IWSLT14 recipe) built on the meta device: 30.7M on an 8,000-piece vocabulary
    on_meta = EncoderDecoder.count_parameters.__func__(RNN, RNNConfig(), 8000)
    assert RNN.count_parameters(RNNConfig(), 8000) == on_meta == 30_739_020


def _encoder_flops(m: RNN, S: int, B: int) -> int:
    """Forward FLOPs of the recurrent encoder, from its weight shapes: 2 per weight and source position."""
    return 2 * B * S * sum(p.numel() for n, p in m.encoder.named_parameters() if n.startswith("weight"))


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_flops_per_token_match_torchs_flop_counter(cell):
    """Training: 3 x forward, less the gradient of the encoder's zero initial states (never computed); decoding:
    the encoder once, then one step a token with the state. torch's FlopCounterMode counts the products of
    aten::gru and of the decoder's cells on the CPU, not those of aten::lstm: the LSTM encoder's are counted from
    its weight shapes instead."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    cfg = small(cell=cell, enc_layers=2, dec_layers=2)
    m, (B, S, T) = RNN(cfg, V), (3, 6, 5)
    src, tgt = torch.randint(4, V, (B, S)), torch.randint(4, V, (B, T))  # unpadded: every position computed
    uncounted = _encoder_flops(m, S, B) if cell == "lstm" else 0
    with FlopCounterMode(display=False) as fc:
        m(src, tgt)
    forward = RNN.train_flops_per_token(cfg, V, S, T) * B * T / 3
    assert fc.get_total_flops() + uncounted == pytest.approx(forward, rel=1e-12)
    with FlopCounterMode(display=False) as fc:
        m(src, tgt).sum().backward()
    if cell == "gru":  # all counted, less W_hh^T dh_0 of the encoder's zero initial states (both directions)
        assert fc.get_total_flops() == 3 * forward - 2 * 3 * cfg.enc_hidden ** 2 * B * 2 * cfg.enc_layers
    else:  # all but the LSTM encoder, which the hand count takes at 3 x its forward
        assert fc.get_total_flops() + 3 * uncounted == 3 * forward
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        enc = m.encode(src)
        state = m.init_state(enc)
        for i in range(T):
            m.project(m.decode_step(tgt[:, i:i + 1], enc, state))
    decode = RNN.decode_flops_per_token(cfg, V, S, T) * B * T
    assert fc.get_total_flops() + uncounted == pytest.approx(decode, rel=1e-12)


# ---------------------------------------------------------------------------------------------- the schedule
def test_the_plateau_schedule_decays_after_patience_stalled_validations(tmp_path):
    cfg = config.load_config(None, ["data.path=/x", "train.lr_schedule=plateau", "train.lr=0.001",
                                    "train.lr_decay_factor=0.5", "train.lr_patience=2", "train.lr_min=0.0002"])
    p = torch.nn.Parameter(torch.zeros(3))
    opt, sched = make_optimizer([p], cfg.train, d_model=64)
    lr = lambda: opt.param_groups[0]["lr"]  # noqa: E731
    assert lr() == 0.001
    rates = []
    for dev_loss in (3.0, 2.0, 2.5, 2.4, 2.1, 2.3, 1.9, 2.0, 2.0):
        sched.step(dev_loss)
        rates.append(lr())
    # 2.0 is the best; 2.5 and 2.4 stall (patience 2), 2.1 is the third: decay; the count restarts, 2.3 stalls, 1.9
    # is a new best; then two stalls: not yet
    assert rates == pytest.approx([1e-3, 1e-3, 1e-3, 1e-3, 5e-4, 5e-4, 5e-4, 5e-4, 5e-4])
    for dev_loss in (2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0):
        sched.step(dev_loss)
    assert lr() == pytest.approx(2e-4)  # 5e-4 -> 2.5e-4 -> never below lr_min
    # its state goes into the checkpoint: plain values torch.load(weights_only=True) reads
    torch.save({"lr_plateau": sched.state_dict()}, tmp_path / "s.pt")
    back = torch.load(tmp_path / "s.pt", weights_only=True)["lr_plateau"]
    assert back["best"] == 1.9 and back["num_bad_epochs"] == sched.num_bad_epochs
    # the paper's schedule stays the default
    opt, sched = make_optimizer([p], config.load_config(None, ["data.path=/x"]).train, d_model=64)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)


# ------------------------------------------------------------------------------------------------ the config
def test_the_new_keys_move_no_run_id():
    """The schedule keys at the paper's schedule are neither saved nor hashed: the smoke run and every run of the
    committed reference report keep their ids."""
    smoke = config.load_config(SMOKE, ["data.path=/work/shared/data/multi30k"])
    explicit = config.load_config(SMOKE, ["data.path=/work/shared/data/multi30k", "train.lr_schedule=noam"])
    assert run_ids.run_id(smoke) == run_ids.run_id(explicit)
    assert upgrade.legacy_id(smoke) == upgrade.legacy_id(explicit) == "multi30k-smoke-3027ec60"  # data.path hashed
    assert "lr_schedule" not in config.saved_yaml(smoke) and "lr_patience" not in config.flatten(smoke)
    export = json.loads((ROOT / "reports/reference/table3-cpu-2026-11-25/export/table3-cpu.json").read_text())
    ids = [(r["run"], upgrade.legacy_hash(config.Config.from_dict(config.unflatten(r["config"]), checked=False)))
           for r in export["records"]]
    assert len(ids) > 20 and all(run.endswith("-" + h) for run, h in ids)
    plateau = config.load_config(SMOKE, ["data.path=/work/shared/data/multi30k", "train.lr_schedule=plateau"])
    assert run_ids.run_id(plateau) != run_ids.run_id(smoke)
    saved = yaml.safe_load(config.saved_yaml(plateau))["train"]
    assert saved["lr_schedule"] == "plateau" and saved["lr"] == 2e-4 and saved["lr_patience"] == 8
    assert run_ids.run_id(config.Config.from_dict(yaml.safe_load(config.saved_yaml(plateau)))) == \
        run_ids.run_id(plateau)


@pytest.mark.parametrize("overrides,words", [
    (["model.heads=4"],
     "model.heads does not apply to model.arch=rnn (transformer knobs): drop it; rnn's knobs are rnn.*"),
    (["rnn.dec_hidden=0"], "rnn.dec_hidden=0 must be a positive integer"),
    (["rnn.dropout=1"], "rnn.dropout=1.0 must be in [0, 1)"),
    (["rnn.cell=rnn"], "rnn.cell='rnn' is not one of: gru | lstm"),
    (["train.lr_schedule=noam"], "train.lr, train.lr_decay_factor, train.lr_patience: only for "
                                 "train.lr_schedule=plateau (the default is noam, Eq. 3): set it, or drop them"),
    (["train.lr_decay_factor=1.5"], "train.lr_decay_factor=1.5 must be in (0, 1)"),
    (["train.lr_patience=-1"], "train.lr_patience=-1 must be 0 or more"),
])
def test_a_bad_knob_on_an_rnn_run_is_a_one_line_error(capsys, overrides, words):
    assert cli_main(["config", str(RNN_SMOKE), "data.path=/x", *overrides]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("ltfm: error: ") and words in err, err


def test_a_plateau_key_on_a_noam_run_is_a_one_line_error(capsys):
    assert cli_main(["config", str(SMOKE), "data.path=/x", "train.lr=0.001"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err == "ltfm: error: train.lr: only for train.lr_schedule=plateau (the default is noam, Eq. 3): set it, " \
                  "or drop it"
    assert cli_main(["config", str(SMOKE), "data.path=/", "train.lr=0.001", "train.lr_schedule=plateau"]) == 0


def test_the_real_command_line_refuses_a_transformer_knob_on_an_rnn_run(tmp_path, ltfm_here):
    p = ltfm_here("train", RNN_SMOKE, f"data.path={tmp_path}", f"run.results_dir={tmp_path}", "model.heads=4")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "model.heads does not apply to model.arch=rnn" in line
    assert not any(tmp_path.iterdir())  # nothing written


# ------------------------------------------------------------------------------------------------ a real run
@pytest.mark.slow
def test_an_rnn_run_trains_resumes_averages_evaluates_and_translates(tmp_path, data_dir, monkeypatch, capsys):
    from lightning_tfm.training.runs.checkpoints import load_checkpoint, load_model
    from lightning_tfm.training.runs.results import read_metrics
    from lightning_tfm.training.train import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    results = tmp_path / "results"
    small_run = [f"data.path={data_dir}", f"run.results_dir={results}", "data.max_train_pairs=400",
                 "data.max_dev_pairs=30", "data.max_test_pairs=20", "data.vocab_size=300", "rnn.emb_size=32",
                 "rnn.enc_hidden=32", "rnn.dec_hidden=48", "rnn.attention_size=32", "train.batch_tokens=512",
                 "train.val_every_steps=10", "train.checkpoint_every_steps=10", "train.log_every_steps=5",
                 "train.threads=1", "train.lr_patience=0", "decode.max_len_b=10", "decode.beam_size=4"]
    cfg = config.load_config(RNN_SMOKE, [*small_run, "train.max_steps=30"])
    summary = train(cfg)  # what `ltfm train` runs
    run_dir = results / run_ids.run_id(cfg)
    assert summary["status"] == "completed" and summary["steps"] == 30 and summary["dev_bleu"] is not None
    assert summary["params"] == RNN.count_parameters(cfg.rnn, summary["vocab_size"])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"] == {"arch": "rnn"}

    def plateau_state():
        """(every validation's dev loss, the plateau schedule's state in last.ckpt); the checkpoint of a step is
        written before that step's validation, so its schedule has seen all but the last dev loss."""
        rows = read_metrics(run_dir)
        dev = [r["dev/loss"] for r in rows if "dev/loss" in r]
        state = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["lr_plateau"]
        assert state["last_epoch"] == len(dev) - 1 and state["best"] == pytest.approx(min(dev[:-1]), rel=1e-6)
        assert [r["train/lr"] for r in rows if "train/lr" in r][-1] == pytest.approx(state["_last_lr"][0])
        return dev, state

    dev, state = plateau_state()
    assert len(dev) == 3 and state["_last_lr"] == [0.002]
    # resume: a larger budget continues the same run from its last checkpoint (step 30) with the schedule's state,
    # and gives the schedule the dev loss of step 30 it had not seen (that validation is not run again)
    more = config.load_config(RNN_SMOKE, [*small_run, "train.max_steps=40"])
    assert run_ids.run_id(more) == run_dir.name
    summary = train(more)
    assert summary["steps"] == 40 and [a["steps"] for a in summary["attempts"]] == [30]  # the earlier attempt
    dev2, state2 = plateau_state()
    assert dev2[:3] == pytest.approx(dev) and len(dev2) == 4 and state2["best"] == pytest.approx(min(dev), rel=1e-6)

    # average the last three step checkpoints; evaluate it (beam 4, length penalty), translate with it
    assert cli_main(["average", str(run_dir), "--last", "3"]) == 0
    model, saved, tokenizer = load_model(run_dir, "average")
    assert isinstance(model, RNN) and saved.model.arch == "rnn" and saved.rnn.dec_hidden == 48
    capsys.readouterr()
    assert cli_main(["evaluate", str(run_dir), "--checkpoint", "average", "decode.length_penalty=1.0"]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "beam 4, alpha 1.0" in out
    hyps = (run_dir / "hyps" / "test_2016_flickr.average.beam4.txt").read_text().splitlines()
    assert len(hyps) == 20 and sum(bool(h.strip()) for h in hyps) >= 15
    p = ltfm("translate", run_dir, "--checkpoint", "average", input="A man rides a bike .\n\nTwo dogs play .\n")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[0].strip() and lines[3] == ""

    assert cli_main(["runs", str(results), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == run_dir.name and row["status"] == "completed" and row["params"] == summary["params"]
