"""Attention you can look at (report/views/attention.py): the Transformer's cross-attention weights on request
(``features(..., need_attention=True)``) against a hand computation, the alignment figure of a finished run (the
smoke run; an untrained RNN run folder), and the positional figure (sinusoids; a learned-positions run; what a
report falls back to)."""
from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_tfm.model import BOS, EOS, PAD, ModelConfig, Transformer, build_model, sinusoid_table
from lightning_tfm.report.inputs.records import RunRecord
from lightning_tfm.report.views import attention as att
from lightning_tfm.training.config import config

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

V = 30


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(layers=2, d_model=16, d_ff=32, heads=2, d_k=8, d_v=8, dropout=0.0), **kw})


def png_size(path) -> tuple[int, int]:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


# ------------------------------------------------------------------------------------------ the weights
@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_transformer_gives_its_last_cross_attention_on_request(kernel):
    """The weights are softmax(Q K^T / sqrt(d_k)) of the last decoder layer's encoder-decoder attention written out
    from that layer's own inputs: every row sums to 1 over the unpadded source and is 0 at padding; the states are
    the default path's (SDPA's rounding aside), and the layer is back on its default path afterwards."""
    torch.manual_seed(0)
    model = Transformer(tiny(attention_kernel=kernel), V).eval()
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    tgt_in = torch.tensor([[BOS, 11, 12], [BOS, 13, PAD]])
    cross = model.decoder[-1].cross_attn
    seen = {}
    hook = cross.register_forward_pre_hook(lambda m, args, kwargs: seen.update(query=args[0], memory=args[1],
                                                                                mask=kwargs["mask"]),
                                           with_kwargs=True)
    with torch.no_grad():
        states, alpha = model.features(src, tgt_in, need_attention=True)
        default = model.features(src, tgt_in)
    hook.remove()

    assert alpha.shape == (2, 2, 3, 5)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 2, 3))
    assert (alpha[1, :, :, 3:] == 0).all() and (alpha[1, :, :, :3] > 0).all()
    w, b = cross.in_proj.weight, cross.in_proj.bias
    q = (seen["query"] @ w[:16].T + b[:16]).view(2, 3, 2, 8).transpose(1, 2)
    k = (seen["memory"] @ w[16:32].T + b[16:32]).view(2, 5, 2, 8).transpose(1, 2)
    by_hand = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~seen["mask"], float("-inf")).softmax(-1)
    torch.testing.assert_close(alpha, by_hand)
    if kernel == "matmul":
        assert torch.equal(states, default)
    torch.testing.assert_close(states, default, atol=1e-5, rtol=1e-5)
    assert not cross.keep_weights and cross.attention_weights is None


# ------------------------------------------------------------------------------------ a run folder by hand
def write_run(folder: Path, overrides: dict) -> Path:
    """A run folder as ``ltfm train`` leaves it (config.yaml, tokenizer.json, checkpoints/last.ckpt) of an
    untrained model: what :func:`~lightning_tfm.training.runs.checkpoints.load_model` reads, without training."""
    from lightning_tfm.training.data.data import train_tokenizer

    lines = ["a man rides a bike .", "two dogs play in the snow .", "ein Mann fährt Fahrrad .",
             "zwei Hunde spielen im Schnee ."] * 5
    tok = train_tokenizer(lines, vocab_size=60, min_frequency=1)
    cfg = config.load_config(overrides={"data.path": str(folder), "decode.beam_size": 1, "decode.max_len_b": 4,
                                        **overrides}, checked=False)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.get_vocab_size())
    (folder / "checkpoints").mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.yaml").write_text(config.saved_yaml(cfg))
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "global_step": 1,
                "hyper_parameters": {"config": cfg.to_dict(), "vocab_size": tok.get_vocab_size()}},
               folder / "checkpoints" / "last.ckpt")
    return folder


def test_alignment_figure_of_an_rnn_run(tmp_path):
    """Either architecture: an RNN run's alignment is its additive attention, one image per sentence, no head grid;
    its rows sum to 1 over the source pieces."""
    run = write_run(tmp_path / "rnn-run", {"model.arch": "rnn", "rnn.emb_size": 8, "rnn.enc_hidden": 6,
                                           "rnn.dec_hidden": 8, "rnn.attention_size": 5})
    aligns, meta = att.alignments(run, ["a man rides a bike .", "two dogs ."])
    assert meta == {"arch": "rnn", "decode": "greedy", "checkpoint": "last", "run": "rnn-run",
                    "attention": "additive attention alpha_ij", "heads": False}   # what the RNN class declares
    for a in aligns:
        assert a.source[-1] == a.output[-1] == "</s>"
        assert a.weights.shape == (1, len(a.output), len(a.source))
        torch.testing.assert_close(a.mean.sum(-1), torch.ones(len(a.output)))
    pngs = att.alignment_figure(run, ["a man rides a bike ."], tmp_path / "fig" / "rnn.png")
    assert pngs == [str(tmp_path / "fig" / "rnn.png")]
    png_size(pngs[0])


# ---------------------------------------------------------------------------------------------- positions
def test_sinusoid_similarity_depends_on_the_offset_alone():
    """What the positional figure shows of the sinusoids: a position's encoding is most like its own, and the
    similarity of two positions is a function of their offset (a symmetric Toeplitz matrix)."""
    sim = att.cosine_similarity(sinusoid_table(24, 32))
    torch.testing.assert_close(sim.diagonal(), torch.ones(24))
    torch.testing.assert_close(sim, sim.T)
    torch.testing.assert_close(sim[1:, 1:], sim[:-1, :-1], atol=1e-5, rtol=0)
    assert (sim.fill_diagonal_(-1).amax(1) < 1 - 1e-3).all()


def test_positional_figure_sinusoids_and_learned(tmp_path):
    """A report takes row E's run folder: the sinusoids' two panels and a third, the run's learned table; from an
    export, or when that run cannot be loaded, the sinusoids alone at the report's d_model (the caption says why)
    instead of failing."""
    run = write_run(tmp_path / "E-run", {"model.positional": "learned", "model.layers": 1, "model.d_model": 16,
                                         "model.d_ff": 32, "model.heads": 2, "model.d_k": 8, "model.d_v": 8,
                                         "model.max_positions": 40})
    d_model, table = att.learned_positions(run)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert d_model == 16 and torch.equal(table, saved["model.positions.table.weight"])

    def report(source, run_dir):
        wide = RunRecord(variant="C", status="completed", config={"model.d_model": 64})  # not row E's d_model
        rec = RunRecord(variant="E", status="completed", run=str(run_dir),
                        config={"model.positional": "learned", "model.d_model": 16})
        return SimpleNamespace(records=[wide, rec], source=source)

    png, caption = att.report_positional_figure(report("results", run), tmp_path / "r1.png")
    assert "E-run" in caption
    three = png_size(png)
    png, caption = att.report_positional_figure(report("export table3.json (of results)", run), tmp_path / "r2.png")
    assert "alone" in caption and "export" in caption and "d_model 16" in caption
    two = png_size(png)
    assert three[0] > 1.3 * two[0], (two, three)  # a third panel beside the two
    (run / "checkpoints" / "last.ckpt").write_bytes(b"not a checkpoint")
    png, caption = att.report_positional_figure(report("results", run), tmp_path / "r3.png")
    assert "could not be loaded" in caption and png_size(png) == two


# ------------------------------------------------------------------------------------- the smoke run
def test_alignment_figure_of_the_smoke_run(smoke_run, tmp_path):
    """The smoke run's first dev sentences decoded with its decode settings (beam 2), each hypothesis fed back:
    the figure's axes carry the BPE pieces of the source and of the hypothesis (EOS last), the weights are the
    mean over the 4 heads, and a second file holds every head of sentence 1."""
    from lightning_tfm.training.data.data import encode_lines, load_split
    from lightning_tfm.training.decode import translate_ids
    from lightning_tfm.training.runs.checkpoints import load_model

    pngs = att.alignment_figure(smoke_run, 2, tmp_path / "align.png")
    assert pngs == [str(tmp_path / "align.png"), str(tmp_path / "align_heads.png")]
    for png in pngs:
        png_size(png)

    aligns, meta = att.alignments(smoke_run, 2)
    assert meta["arch"] == "transformer" and meta["decode"] == "beam 2"
    model, cfg, tok = load_model(smoke_run, meta["checkpoint"])
    lines = list(load_split(cfg, cfg.data.dev_split, limit=2)["src"])
    ids = encode_lines(tok, lines)
    hyps = translate_ids(model, ids, beam_size=2, alpha=cfg.decode.length_penalty, max_len_a=cfg.decode.max_len_a,
                         max_len_b=cfg.decode.max_len_b, dtype=None)
    fig = att.plot_alignments(aligns, "t")
    images = [ax for ax in fig.axes if ax.images and ax.get_xticklabels()]
    for a, line, src, hyp, ax in zip(aligns, lines, ids, hyps, images):
        assert a.text == line and a.weights.shape == (4, len(hyp.tokens) + 1, len(src) + 1)
        assert a.source == [tok.id_to_token(i) for i in src] + ["</s>"]
        assert a.output == [tok.id_to_token(i) for i in hyp.tokens] + ["</s>"]
        assert [t.get_text() for t in ax.get_xticklabels()] == a.source
        assert [t.get_text() for t in ax.get_yticklabels()] == a.output
        torch.testing.assert_close(a.mean.sum(-1), torch.ones(len(a.output)))
    heads = att.plot_heads(aligns[0], "t")
    assert len([ax for ax in heads.axes if ax.get_visible() and ax.images]) == 4


# ------------------------------------------------------------------------------------- the Table 2 report
def test_table2_alignment_figure_one_panel_per_architecture(tmp_path):
    """A Table 2 report draws the first dev sentences' alignments of each architecture's first row that loads (its
    runs' folders in the results folder), a column each and a row per sentence, and the Transformer's heads of the
    first sentence beside; a report read from W&B (no checkpoints) says in one line that it needs the results
    folder; an unloadable run is a panel saying why, and the figure is still written."""
    tfm = {"model.layers": 1, "model.d_model": 16, "model.d_ff": 32, "model.heads": 2, "model.d_k": 8, "model.d_v": 8}
    rnn = {"model.arch": "rnn", "rnn.emb_size": 8, "rnn.enc_hidden": 6, "rnn.dec_hidden": 8, "rnn.attention_size": 5}
    runs = {"transformer": write_run(tmp_path / "t-run", tfm), "rnn": write_run(tmp_path / "r-run", rnn)}
    for run in runs.values():  # the runs' dev split: its first sentence is the one drawn
        (run / "val.en").write_text("two dogs play in the snow .\na man rides a bike .\n")
        (run / "val.de").write_text("zwei Hunde spielen im Schnee .\nein Mann fährt Fahrrad .\n")
    records = [RunRecord(variant=v, seed=1, status="completed", run=str(run)) for v, run in runs.items()]
    records.insert(0, RunRecord(variant="rnn", seed=2, status="failed", run=str(tmp_path / "nowhere")))
    from lightning_tfm.report.table2.columns import Row

    rows = [Row("transformer", arch="transformer"), Row("rnn", arch="rnn"),
            Row("rnn-params", arch="rnn")]  # one panel per architecture: rnn-params is not drawn
    data = SimpleNamespace(records=records, source="results folder results/")

    png, caption = att.report_alignment_figure(data, rows, tmp_path / "out" / "table2_alignment.png")
    assert png == str(tmp_path / "out" / "table2_alignment.png")
    both = png_size(png)
    assert "transformer (transformer, run t-run, greedy); rnn (rnn, run r-run, greedy)." in caption, caption
    assert "not drawn" not in caption and "rnn-params" not in caption
    assert caption.startswith("Cross-attention of the first 2 dev sentence(s), one per row")  # the split's two
    heads = tmp_path / "out" / "table2_alignment_heads.png"  # the Transformer's 2 heads, sentence 1
    assert png_size(heads) and caption.endswith("Each head of the Transformer's first sentence: "
                                                "`table2_alignment_heads.png`.")
    aligns, _ = att.alignments(runs["rnn"], 1)
    assert aligns[0].text == "two dogs play in the snow ."
    one, _ = att.report_alignment_figure(data, rows, tmp_path / "one" / "table2_alignment.png", sentences=1)
    assert png_size(one)[1] < both[1] and png_size(one)[0] == both[0]  # a row of panels fewer, as wide

    data.source = "W&B team/proj, group t2"
    png, caption = att.report_alignment_figure(data, rows, tmp_path / "out" / "wandb.png")
    assert caption == ("Cross-attention of the first dev sentences per architecture: not drawn, needs the results "
                       "folder (the run folders' checkpoints); this report read W&B team/proj, group t2.")
    png_size(png)

    data.source = "results folder results/"
    (runs["rnn"] / "checkpoints" / "last.ckpt").write_bytes(b"not a checkpoint")
    png, caption = att.report_alignment_figure(data, rows, tmp_path / "out" / "damaged.png")
    assert "transformer (transformer, run t-run, greedy)." in caption
    assert " rnn (rnn) not drawn: its run r-run could not be loaded (" in caption, caption
    assert png_size(png)[1] <= both[1]
