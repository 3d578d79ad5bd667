"""The model registry: an architecture is one file. A toy architecture defined here (a registry entry with its own
config section) is trained by the function ``ltfm train`` calls, decoded with beam 4 through the
incremental-decoder protocol, evaluated, and listed by the unchanged runs table and report; the config keeps the
transformer's run ids and refuses knobs of another architecture in one line."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from lightning_tfm.base.errors import UserError
from lightning_tfm.cli import main as cli_main
from lightning_tfm.model import (
    EOS,
    PAD,
    EncoderDecoder,
    ModelConfig,
    Section,
    Transformer,
    build_model,
    register,
    registry,
)
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import SMOKE, ltfm

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@dataclass
class ToyConfig(Section):
    hidden: int = field(default=32, metadata={"help": "width of the toy's embeddings and of its GRU state"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the toy's embeddings"})

    def problem(self):
        return f"toy.hidden={self.hidden} must be a positive width" if self.hidden < 1 else None


class Toy(EncoderDecoder):
    """A bag of embeddings as the encoder (the mean of the source's), a one-layer GRU decoder fed each target
    embedding beside it and started from it; the pre-softmax projection is the embedding matrix. Its decoder
    state is the GRU's hidden state."""

    def __init__(self, cfg: ToyConfig, vocab_size: int):
        super().__init__()
        self.vocab_size, self.d_model, self.max_positions = vocab_size, cfg.hidden, 1024
        self.embed = nn.Embedding(vocab_size, cfg.hidden, padding_idx=PAD)
        self.gru = nn.GRU(2 * cfg.hidden, cfg.hidden, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed.weight

    def encode(self, src):
        keep = (src != PAD).unsqueeze(-1).to(self.embed.weight.dtype)
        return (self.drop(self.embed(src)) * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, hidden)

    def _gru(self, tokens, summary, h):
        x = self.drop(self.embed(tokens))
        return self.gru(torch.cat([x, summary[:, None].expand(-1, x.shape[1], -1)], -1), h)

    def features(self, src, tgt_in):
        summary = self.encode(src)
        return self._gru(tgt_in, summary, summary[None].contiguous())[0]

    def reorder_encoder_out(self, encoder_out, index):
        return encoder_out.index_select(0, index)

    def init_state(self, encoder_out):
        return {"h": encoder_out[None].contiguous()}

    def decode_step(self, tokens, encoder_out, state):
        if state is None:  # the whole prefix
            return self._gru(tokens, encoder_out, encoder_out[None].contiguous())[0][:, -1]
        out, state["h"] = self._gru(tokens, encoder_out, state["h"])
        return out[:, -1]

    def reorder_state(self, state, index, encoder_index=None):
        state["h"] = state["h"].index_select(1, index)


@pytest.fixture(autouse=True)
def toy_registered():
    """``model.arch: toy`` for this file's tests only: registered as an architecture file does it, and removed
    afterwards (the other test files of this process see the registry as shipped)."""
    register("toy", ToyConfig)(Toy)
    yield
    registry.ARCHITECTURES.pop("toy", None)


def toy_experiment(tmp_path, data_dir, study="toys") -> str:
    """A toy experiment at the tests' tiny scale, as a user writes it: model.arch plus a toy section."""
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({
        "run": {"name": "toy", "results_dir": str(tmp_path / "results"), "study": study, "variant": "base"},
        "data": {"path": str(data_dir), "vocab_size": 200, "max_train_pairs": 300, "max_dev_pairs": 30,
                 "test_split": None},
        "model": {"arch": "toy"}, "toy": {"hidden": 24},
        "train": {"batch_tokens": 512, "warmup": 10, "max_steps": 20, "val_every_steps": 10,
                  "checkpoint_every_steps": 10, "log_every_steps": 5, "threads": 1, "progress_bar": False},
        "decode": {"beam_size": 4, "max_len_b": 10}, "wandb": {"mode": "offline"}}, sort_keys=False))
    return str(path)


def test_a_toy_architecture_trains_decodes_and_is_reported(tmp_path, data_dir, monkeypatch):
    from lightning_tfm import report as rd
    from lightning_tfm.report.views import render
    from lightning_tfm.training.data.data import pad
    from lightning_tfm.training.decode import beam_search
    from lightning_tfm.training.runs.checkpoints import load_model
    from lightning_tfm.training.runs.runs import format_table, list_runs
    from lightning_tfm.training.train import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = config.load_config(toy_experiment(tmp_path, data_dir))
    assert isinstance(build_model(cfg.model, 50), Toy) and cfg.toy.hidden == 24
    saved = yaml.safe_load(config.saved_yaml(cfg))
    assert saved["model"] == {"arch": "toy"} and saved["toy"] == {"hidden": 24, "dropout": 0.0}
    assert list(saved).index("toy") == list(saved).index("model") + 1

    summary = train(cfg)  # what `ltfm train` runs, through Lightning, ending with the final evaluation
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["dev_ppl"] > 1 and summary["dev_bleu"] is not None
    run_dir = tmp_path / "results" / run_ids.run_id(cfg)
    assert summary["params"] == Toy.count_parameters(cfg.toy, summary["vocab_size"])

    # the checkpoint comes back as a Toy; beam 4 through the protocol, incremental state against the prefix
    model, saved_cfg, tokenizer = load_model(run_dir)
    assert isinstance(model, Toy) and saved_cfg.model.arch == "toy" and saved_cfg.toy.hidden == 24
    src = pad([tokenizer.encode(s).ids + [EOS] for s in ("A man is riding a bike .", "Two dogs .")], "cpu")
    cached = beam_search(model, src, beam_size=4, max_len_a=0.0, max_len_b=8)
    plain = beam_search(model, src, beam_size=4, max_len_a=0.0, max_len_b=8, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in plain]
    assert [h.score for h in cached] == pytest.approx([h.score for h in plain], abs=1e-4)

    # the runs table and the report read it as any run
    (row,) = list_runs(tmp_path / "results")
    assert row["id"] == run_dir.name and row["status"] == "completed" and row["dev_ppl"] == summary["dev_ppl"]
    assert run_dir.name in format_table([row])
    sweep_file = tmp_path / "toys.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "toys", "experiment": str(tmp_path / "toy.yaml"),
                                          "metric": "dev_loss", "seeds": [1], "variants": {"base": {}}}))
    table = rd.build_table(rd.load_report_data(sweep_file, results_dir=tmp_path / "results"), bootstrap=False)
    (base,) = [r for r in table.rows if r["variant"] == "base"]
    assert base["dev_ppl"] == pytest.approx(summary["dev_ppl"])
    assert f"{summary['dev_ppl']:.2f}" in rd.table_markdown(table)
    (csv_base,) = [r for r in csv.DictReader(io.StringIO(render.table_csv(table))) if r["variant"] == "base"]
    assert float(csv_base["dev_ppl"]) == pytest.approx(summary["dev_ppl"], rel=5e-6)  # the CSV's 6 digits

    # no attention weights from a toy: the alignment figure names the registered architectures that give them
    from lightning_tfm.report.views.attention import alignments

    seeing = type("SeeingToy", (Toy,), {"features": lambda self, src, tgt_in, need_attention=False: None,
                                        "ATTENTION": "the toy's attention"})  # declared on the class
    monkeypatch.setitem(registry.ARCHITECTURES, "seeing", registry.Architecture("seeing", seeing, ToyConfig))
    with pytest.raises(UserError, match=r"architecture 'toy' does not give its attention weights .*alignments are "
                                        r"drawn for runs of transformer, rnn, seeing$"):
        alignments(run_dir, ["A man ."])


def test_the_architectures_section_is_a_config_section_with_help(capsys):
    assert cli_main(["config", "--keys", "toy."]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["toy.hidden", "toy.dropout"]
    assert "width of the toy's embeddings" in out[0]
    assert cli_main(["config", "--keys", "model.arch"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    # the registered architectures, this file's toy too: derived from the registry, not written in the help
    assert "architecture to build" in line and line.endswith("registered: transformer | rnn | toy"), line


def test_the_transformer_keeps_its_run_ids_and_saved_config(tmp_path):
    """model.arch and other architectures' sections are neither saved nor hashed for a transformer config: the
    smoke run's id below is the one computed before the registry existed."""
    plain = config.load_config(SMOKE, ["data.path=/data/multi30k"])
    explicit = config.load_config(SMOKE, ["data.path=/data/multi30k", "model.arch=transformer"])
    assert run_ids.run_id(plain) == run_ids.run_id(explicit) == "multi30k-smoke-924b143a"
    assert config.saved_yaml(plain) == config.saved_yaml(explicit) and "arch" not in config.saved_yaml(plain)
    assert "toy" not in plain.to_dict() and "arch" not in plain.to_dict()["model"]
    assert isinstance(build_model(plain.model, 60), Transformer)
    assert config.Config.from_dict(plain.to_dict()).model.arch == "transformer"
    # a toy run differs from a transformer run of the same file, and from a toy of another size
    toy = config.load_config(None, ["data.path=/data/multi30k", "model.arch=toy"])
    wider = config.load_config(None, ["data.path=/data/multi30k", "model.arch=toy", "toy.hidden=64"])
    base = config.load_config(None, ["data.path=/data/multi30k"])
    assert len({run_ids.config_hash(c) for c in (toy, wider, base)}) == 3


@pytest.mark.parametrize("experiment,overrides,words", [
    ({}, ["model.arch=toy", "model.heads=4"], ["model.heads does not apply to model.arch=toy", "toy.*"]),
    ({"model": {"arch": "toy", "heads": 8}}, [], ["model.heads does not apply to model.arch=toy"]),
    ({"model": {"arch": "toy"}}, ["model.d_k=4", "model.norm=pre"], ["model.d_k, model.norm do not apply"]),
    ({}, ["toy.hidden=8"], ["toy.hidden does not apply to model.arch=transformer", "set model.arch=toy"]),
    ({"toy": {"hidden": 8}}, [], ["toy.hidden does not apply to model.arch=transformer"]),
    ({}, ["model.arch=NOPE"], ["model.arch='NOPE' is not a registered architecture: use one of transformer, rnn, toy"]),
    ({"model": {"arch": "toy"}}, ["toy.hidden=0"], ["toy.hidden=0 must be a positive width"]),
])
def test_a_knob_of_another_architecture_is_a_one_line_error(tmp_path, capsys, experiment, overrides, words):
    """In the YAML or on the command line (even at its default value), a knob the chosen architecture does not
    have stops the command in one line naming the key and the architecture, exit 2."""
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"data": {"path": "/data/multi30k"}, **experiment}))
    assert cli_main(["config", str(path), *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ltfm: error: ") and all(w in err[0] for w in words), err
    with pytest.raises(UserError, match="not apply|not a registered|must be"):
        config.load_config(path, overrides)


def test_the_smoke_file_with_another_architecture_names_its_transformer_knobs(ltfm_here):
    p = ltfm_here("train", SMOKE, "data.path=/data/multi30k", "model.arch=toy")
    assert p.returncode == 2
    (err,) = p.stderr.strip().splitlines()
    knobs = "model.d_ff, model.d_k, model.d_model, model.d_v, model.dropout, model.heads, model.layers"
    assert f"{knobs} do not apply to model.arch=toy" in err


def test_the_real_command_line_names_the_registered_architectures(ltfm_here):
    p = ltfm("config", SMOKE, "data.path=/data/multi30k", "model.arch=NOPE")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("ltfm: error: model.arch='NOPE' is not a registered architecture: use one of "
                           "transformer, rnn")  # every file of model/ registers itself (a subprocess has no toy)
    # in this process (a new one would import torch again to refuse it): the recurrent one's own knobs
    p = ltfm_here("train", SMOKE, "data.path=/data/multi30k", "model.arch=rnn")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "do not apply to model.arch=rnn" in p.stderr and "rnn.*" in p.stderr


def test_registering_needs_a_section_dataclass():
    with pytest.raises(TypeError, match="Section"):
        register("bad", dict)
    assert registry.ARCHITECTURES["toy"].cls is Toy and registry.DEFAULT_ARCH == "transformer"
    assert isinstance(ModelConfig(), Section)


def test_a_sweep_variant_with_a_knob_of_another_architecture_stops_the_sweep(tmp_path, capsys):
    """In a sweep file, a variant giving a knob its architecture lacks is a one-line error before any trial (not
    a row listed as skipped)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "archs", "experiment": str(SMOKE), "seeds": [1],
                                     "variants": {"base": {}, "toy": {"model.arch": "toy"},
                                                  "stray": {"toy.hidden": 8}}}, sort_keys=False))
    assert cli_main(["sweep", str(sweep), "--dry-run", "data.path=/data/multi30k"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "variant toy: model.d_ff, model.d_k" in err and "do not apply to model.arch=toy" in err, err
    sweep.write_text(yaml.safe_dump({"name": "archs", "experiment": str(SMOKE), "seeds": [1],
                                     "variants": {"base": {}, "stray": {"toy.hidden": 8}}}))
    assert cli_main(["sweep", str(sweep), "--dry-run", "data.path=/data/multi30k"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "variant stray: toy.hidden does not apply to model.arch=transformer" in err, err


def test_no_architecture_is_named_outside_its_own_file_and_the_registry():
    """What the report and bench ask of an architecture (its attention, its shapes in words) is declared on its
    class (model/incremental.py's ATTENTION, ATTENTION_HEADS, describe): no module outside model/ names the
    recurrent baseline (the default architecture is ``registry.DEFAULT_ARCH``)."""
    import re

    package = Path(registry.__file__).resolve().parents[1]
    named = [f"{p.relative_to(package)}:{i}" for p in package.rglob("*.py")
             if "model" not in p.relative_to(package).parts
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"""["']rnn["']""", line) and not line.lstrip().startswith("#")]
    assert named == [], named
