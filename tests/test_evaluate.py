"""BLEU, checkpoint loading/averaging and the evaluate / translate / average commands.

The run folder is built here the way ``ltfm train`` lays it out (config.yaml, tokenizer.json, Lightning
checkpoints with ``model.``-prefixed state_dict and the config in ``hyper_parameters``), with a tiny
random model, so these tests do not depend on training. The commands run in real subprocesses where the process
is what is tested (BLEU beside sacreBLEU's command line, stdin to stdout, one bad input's exit status), else with
``cli.main`` in this process (``ltfm_here``), which spares each a new interpreter's seconds of imports.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from lightning_tfm.model import build_model
from lightning_tfm.training.config import config
from lightning_tfm.training.data.data import read_lines, train_tokenizer
from lightning_tfm.training.evaluate import (
    bleu,
    tokenize_compound_split,
    tokenized_bleu_compound_split,
    translate_lines,
)
from lightning_tfm.training.runs.checkpoints import average_checkpoints, load_model, write_average

import conftest

REPO = Path(__file__).resolve().parents[1]
DATA = conftest.DATA  # Multi30k beside the checkout, else the toy corpus of tests/data
SACREBLEU = Path(sys.executable).parent / "sacrebleu"


def ltfm(*args, stdin: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    """conftest's ``ltfm`` (a process of its own) in this process's folder unless ``cwd``, ``stdin`` as its input."""
    return conftest.ltfm(*args, input=stdin, cwd=cwd or os.getcwd(), timeout=300)


def save_checkpoint(path: Path, model: torch.nn.Module, cfg: config.Config, step: int,
                    extra: dict | None = None) -> None:
    """A checkpoint shaped like Lightning's (what training's Seq2SeqModule writes: the config as a plain dict)."""
    state = {"model." + k: v.clone() for k, v in model.state_dict().items()}
    state.update(extra or {})
    torch.save({"state_dict": state, "hyper_parameters": {"config": cfg.to_dict(), "vocab_size": model.vocab_size},
                "global_step": step, "epoch": 0, "pytorch-lightning_version": "2.6.6",
                "optimizer_states": [{"state": {}, "param_groups": []}], "lr_schedulers": []}, path)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("results") / "tiny-run"
    (run / "checkpoints").mkdir(parents=True)
    train_src, train_tgt = read_lines(DATA / "train.en.gz")[:3000], read_lines(DATA / "train.de.gz")[:3000]
    tok = train_tokenizer(train_src + train_tgt, vocab_size=400, min_frequency=2)
    tok.save(str(run / "tokenizer.json"))
    cfg = config.load_config(None, {
        "run.name": "tiny", "data.path": str(DATA), "data.test_split": "test_2016_flickr", "data.max_test_pairs": 20,
        "model.layers": 1, "model.d_model": 32, "model.d_ff": 64, "model.heads": 2, "model.d_k": 16,
        "model.d_v": 16, "model.dropout": 0.0, "model.max_positions": 256, "train.precision": "32",
        "decode.beam_size": 2, "decode.max_len_b": 6, "decode.batch_sentences": 8})
    (run / "config.yaml").write_text(config.dump_yaml(cfg))
    for step in (1, 2, 3):
        torch.manual_seed(step)
        m = build_model(cfg.model, tok.get_vocab_size())
        save_checkpoint(run / "checkpoints" / f"step={step:06d}.ckpt", m, cfg, step,
                        extra={"counter": torch.tensor(step)})  # a non-float entry
    shutil.copy(run / "checkpoints" / "step=000003.ckpt", run / "checkpoints" / "last.ckpt")
    return run


@pytest.fixture(scope="module")
def src_ref(run_dir, tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """12 English sources; references that share n-grams with the model's output (its own greedy
    translations for half the lines, real German for the rest), so BLEU is neither 0 nor 100."""
    d = tmp_path_factory.mktemp("files")
    src = read_lines(DATA / "val.en.gz")[:12]
    real = read_lines(DATA / "val.de.gz")[:12]
    model, cfg, tok = load_model(run_dir)
    greedy, _ = translate_lines(model, tok, src, dataclasses.replace(cfg.decode, beam_size=1))
    refs = [g if i % 2 == 0 else r for i, (g, r) in enumerate(zip(greedy, real))]
    (d / "val.en").write_text("\n".join(src) + "\n")
    (d / "val.de").write_text("\n".join(refs) + "\n")
    return d / "val.en", d / "val.de", refs


# ------------------------------------------------------------------------------------------------ BLEU
def test_bleu_fields_and_paper_style_tokenized_bleu():
    hyps = ["Ein Mann fährt ein rot-weißes Fahrrad.", "Zwei Hunde spielen im Schnee."]
    refs = ["Ein Mann fährt auf einem rot-weißen Fahrrad.", "Zwei Hunde spielen draußen im Schnee."]
    r = bleu(hyps, refs, "de")
    ref = sacrebleu.corpus_bleu(hyps, [refs])
    assert r["score"] == pytest.approx(ref.score)
    assert r["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert r["ratio"] == pytest.approx(r["sys_len"] / r["ref_len"]) and r["ratio"] < 1
    assert r["bp"] == pytest.approx(ref.bp)
    # get_ende_bleu.sh: Moses tokenization, then hyphenated compounds split with ##AT##.
    assert tokenize_compound_split(["Ein rot-weißes Fahrrad, \"neu\"."]) == \
        ["Ein rot ##AT##-##AT## weißes Fahrrad , &quot; neu &quot; ."]
    assert tokenize_compound_split(["a-b-c"]) == ["a ##AT##-##AT## b-c"]  # Perl's s///g does not overlap either
    assert r["bleu_tok_compound_split"] == pytest.approx(tokenized_bleu_compound_split(hyps, refs))
    assert r["bleu_tok_compound_split"] != pytest.approx(r["score"])
    assert tokenized_bleu_compound_split(refs, refs) == pytest.approx(100.0)
    assert "bleu_tok_compound_split" not in bleu(hyps, refs, "fr")  # only for English->German


def printed_bleu(stdout: str) -> float:
    line = next(x for x in stdout.splitlines() if x.startswith("sacreBLEU = "))
    return float(line.split()[2])


def test_evaluate_prints_the_bleu_of_sacrebleus_command_line(run_dir, src_ref):
    src, ref, refs = src_ref
    p = ltfm("evaluate", run_dir, "decode.beam_size=3", "--src", src, "--ref", ref)
    assert p.returncode == 0, p.stderr
    (hyp_file,) = (run_dir / "hyps").glob("val.en-*.last.beam3.txt")  # val.en-<hash of its path>
    hyps = hyp_file.read_text().splitlines()
    assert len(hyps) == len(refs)
    cli = subprocess.run([str(SACREBLEU), str(ref), "-i", str(hyp_file), "-w", "2"], capture_output=True,
                         text=True, check=True)
    cli_json = json.loads(cli.stdout)
    assert 0 < cli_json["score"] < 100
    assert printed_bleu(p.stdout) == pytest.approx(cli_json["score"], abs=0.005)
    assert cli_json["verbose_score"].split("ratio = ")[1].split()[0] in p.stdout  # the same length ratio
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in p.stdout
    assert "tokenized BLEU with compound splitting" in p.stdout  # target is German


def test_evaluate_a_configured_split_and_other_output(run_dir, tmp_path, ltfm_here):
    out = tmp_path / "flickr.txt"
    p = ltfm_here("evaluate", run_dir, "--split", "test_2016_flickr", "--checkpoint", "best", "--out", out)
    assert p.returncode == 2 and "best" in p.stderr  # no best.ckpt recorded in this run
    p = ltfm_here("evaluate", run_dir, "decode.beam_size=1", "--split", "test_2016_flickr", "--out", out)
    assert p.returncode == 0, p.stderr
    assert len(out.read_text().splitlines()) == 20  # the run's data.max_test_pairs
    assert "sacreBLEU = " in p.stdout and "beam 1" in p.stdout


# ----------------------------------------------------------------------------------------- checkpoints
def test_averaging_two_checkpoints_gives_the_mean_of_their_tensors(run_dir, tmp_path, ltfm_here):
    ck = run_dir / "checkpoints"
    a = torch.load(ck / "step=000001.ckpt", weights_only=True)["state_dict"]
    b = torch.load(ck / "step=000002.ckpt", weights_only=True)["state_dict"]
    avg = average_checkpoints([ck / "step=000001.ckpt", ck / "step=000002.ckpt"])
    assert set(avg) == set(a)
    for k, v in a.items():
        if v.is_floating_point():
            assert torch.allclose(avg[k], (v + b[k]) / 2, atol=1e-7), k
            assert avg[k].dtype == v.dtype
    assert int(avg["counter"]) == 2  # non-float entries come from the last checkpoint

    # The command averages the last N step checkpoints by step number, into a loadable checkpoint.
    out = tmp_path / "avg.ckpt"
    p = ltfm_here("average", run_dir, "--last", "2", "--out", out)
    assert p.returncode == 0, p.stderr
    assert "step=000002.ckpt, step=000003.ckpt" in p.stdout
    model, _, _ = load_model(run_dir, str(out))
    c = torch.load(ck / "step=000003.ckpt", weights_only=True)["state_dict"]
    for k, v in model.state_dict().items():
        assert torch.allclose(v, (b["model." + k] + c["model." + k]) / 2, atol=1e-7), k
    saved = torch.load(out, weights_only=True)
    assert saved["averaged_from"] == ["step=000002.ckpt", "step=000003.ckpt"] and "optimizer_states" not in saved
    assert saved["hyper_parameters"]["vocab_size"] == model.vocab_size


def test_load_model_checkpoint_choices(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("hyps"))
    shutil.copy(run / "checkpoints" / "step=000001.ckpt", run / "checkpoints" / "best.ckpt")
    first = torch.load(run / "checkpoints" / "step=000001.ckpt", weights_only=True)["state_dict"]
    best, cfg, tok = load_model(run, "best")
    assert torch.equal(best.embed.weight, first["model.embed.weight"]) and not best.training
    assert cfg.model.d_model == 32 and tok.get_vocab_size() == best.vocab_size
    # "average" without average.ckpt: the last decode.average_last (default 5) checkpoints averaged in memory;
    # loading writes nothing.
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    avg, _, _ = load_model(run, "average")
    ws = [torch.load(run / "checkpoints" / f"step={s:06d}.ckpt", weights_only=True)["state_dict"]["model.embed.weight"]
          for s in (1, 2, 3)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    assert torch.allclose(avg.embed.weight, sum(ws) / 3, atol=1e-7)
    # written once by write_average (ltfm average), the same weights load from the file
    written, _ = write_average(run)
    assert written == run / "checkpoints" / "average.ckpt"
    assert torch.equal(load_model(run, "average")[0].embed.weight, avg.embed.weight)


# ---------------------------------------------------------------------------------------------- translate
def test_translate_round_trips_stdin_to_stdout_line_for_line(run_dir, ltfm_here):
    lines = read_lines(DATA / "test_2016_flickr.en.gz")[:9]
    lines[2] = ""
    lines[5] = "   "
    lines.append("Ein Satz mit Umlauten: äöü ß — und “Anführungszeichen”.")
    p = ltfm("translate", run_dir, "decode.beam_size=2", "decode.batch_sentences=3",
             stdin="\n".join(lines) + "\n")
    assert p.returncode == 0, p.stderr
    out = p.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)  # one line out per line in, newline-terminated
    out = out[:-1]
    assert out[2] == "" and out[5] == ""
    model, cfg, tok = load_model(run_dir)
    expected, _ = translate_lines(model, tok, lines, dataclasses.replace(cfg.decode, beam_size=2))
    assert out == expected
    assert all(out[i] for i in range(len(lines)) if lines[i].strip())
    # The last line needs no trailing newline (in this process: the pipe is tested above).
    p = ltfm_here("translate", run_dir, "decode.beam_size=2", input=lines[0] + "\n" + lines[1])
    assert p.returncode == 0 and p.stdout.split("\n")[:-1] == expected[:2]


# ----------------------------------------------------------------------------------------------- bad input
def one_line_error(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_bad_inputs_exit_2_with_one_line(run_dir, src_ref, tmp_path, ltfm_here):
    src, ref, _ = src_ref
    hyps_before = sorted((run_dir / "hyps").glob("*")) if (run_dir / "hyps").exists() else []
    # A run folder without checkpoints.
    bare = tmp_path / "bare-run"
    bare.mkdir()
    shutil.copy(run_dir / "config.yaml", bare)
    shutil.copy(run_dir / "tokenizer.json", bare)
    one_line_error(ltfm_here("evaluate", bare, "--src", src, "--ref", ref), str(bare), "no checkpoints", "ltfm train")
    one_line_error(ltfm_here("translate", bare, input="A man.\n"), "no checkpoints")
    # A checkpoint from another vocabulary.
    cfg = config.load_config(run_dir / "config.yaml")
    other = tmp_path / "other.ckpt"
    save_checkpoint(other, build_model(cfg.model, 410), cfg, 1)
    one_line_error(ltfm_here("evaluate", run_dir, "--src", src, "--ref", ref, "--checkpoint", other),
                   "vocabulary", "410", "another run")
    # A checkpoint whose stored config is malformed (a key this version does not know, a section not a mapping)
    for bad_config in ({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "nonsense": 1}}, {"model": "big"}):
        broken = tmp_path / "broken.ckpt"
        torch.save({"state_dict": {"model." + k: v for k, v in build_model(cfg.model, 410).state_dict().items()},
                    "hyper_parameters": {"config": bad_config, "vocab_size": 410}}, broken)
        one_line_error(ltfm_here("evaluate", run_dir, "--src", src, "--ref", ref, "--checkpoint", broken),
                       str(broken), "stores a config this version cannot read")
    # Files with different line counts, and an empty input.
    short = tmp_path / "short.de"
    short.write_text("\n".join(ref.read_text().splitlines()[:-1]) + "\n")
    one_line_error(ltfm_here("evaluate", run_dir, "--src", src, "--ref", short), "12 lines", "11")
    empty = tmp_path / "empty.en"
    empty.write_text("")
    one_line_error(ltfm_here("evaluate", run_dir, "--src", empty, "--ref", empty), "empty")
    one_line_error(ltfm_here("translate", run_dir, input=""), "no input")
    one_line_error(ltfm_here("evaluate", run_dir, "model.heads=4", "--src", src, "--ref", ref), "model.heads")
    one_line_error(ltfm_here("average", bare), "no checkpoints")
    # --out naming a folder, or a path under a file: one line before any decoding or averaging
    one_line_error(ltfm_here("evaluate", run_dir, "--src", src, "--ref", ref, "--out", tmp_path), "is a folder")
    one_line_error(ltfm_here("evaluate", run_dir, "--src", src, "--ref", ref, "--out", src / "x.txt"), "is a file")
    made = sorted(tmp_path.rglob("*.ckpt"))
    one_line_error(ltfm_here("average", run_dir, "--out", tmp_path), "is a folder")
    assert sorted(tmp_path.rglob("*.ckpt")) == made
    # Nothing half-written.
    assert not (bare / "hyps").exists() and not (tmp_path / "hyps").exists()
    assert (sorted((run_dir / "hyps").glob("*")) if (run_dir / "hyps").exists() else []) == hyps_before
