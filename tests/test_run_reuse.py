"""A run folder trains one config, and a checkpoint decodes with its own vocabulary and model.

``ltfm train`` refuses a folder whose saved config differs from the one asked for (``run.id`` reused, a hash-named
folder of another config), in one line, touching nothing; ``translate``/``evaluate`` refuse a checkpoint of another
vocabulary (even of the same size) or of another run's model; ``evaluate`` of another run's checkpoint writes its
hypotheses under a label naming that checkpoint; ``average`` and a resume refuse checkpoints of another vocabulary.
The run folders are laid out here as ``ltfm train`` lays them out, with tiny random models: no training.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from lightning_tfm.model import build_model
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids
from lightning_tfm.training.data.data import read_lines, train_tokenizer

from conftest import ROOT, SMOKE

RNN_SMOKE = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"
TOKENIZER = "tokenizer_sha256"  # the hyper-parameter naming a checkpoint's vocabulary (checkpoints.TOKENIZER)
TINY = {"decode.beam_size": 2, "decode.max_len_b": 5, "data.max_test_pairs": 8, "train.threads": 1}
TRANSFORMER = {"model.layers": 1, "model.d_model": 16, "model.d_ff": 32, "model.heads": 2, "model.d_k": 8,
               "model.d_v": 8, "model.max_positions": 128}
RNN = {"model.arch": "rnn", "rnn.emb_size": 16, "rnn.enc_hidden": 16, "rnn.dec_hidden": 16, "rnn.attention_size": 16}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the lock file too) by its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(p, *words, after: str | None = None) -> str:
    """The one-line error of ``p`` (exit 2) holding ``words``; ``after``: progress lines starting so may precede it."""
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    lines = [line for line in p.stderr.strip().splitlines() if not (after and line.startswith(after))]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------------------
# 1. run.id (or a hash-named folder) of another config
# ------------------------------------------------------------------------------------------------------------
def finished_run(folder: Path, cfg: config.Config, steps: int = 200) -> Path:
    """A finished run as ``ltfm train`` leaves one: config.yaml, summary.json, checkpoints, tokenizer, logs."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "logs" / "version_0").mkdir(parents=True)
    (folder / "config.yaml").write_text(config.saved_yaml(cfg))
    (folder / "summary.json").write_text(json.dumps({"run_id": folder.name, "status": "completed", "steps": steps,
                                                     "config": cfg.to_dict()}))
    torch.save({"state_dict": {}, "global_step": steps, "hyper_parameters": {"config": cfg.to_dict()}},
               folder / "checkpoints" / "last.ckpt")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "logs" / "version_0" / "metrics.csv").write_text("step,dev_loss\n200,4.0\n")
    return folder


def test_a_run_id_of_another_configs_folder_is_refused_in_one_line_and_nothing_in_it_changes(
        tmp_path, data_dir, ltfm_here):
    results = tmp_path / "results"
    common = [f"data.path={data_dir}", f"run.results_dir={results}", "run.id=shared", "data.max_train_pairs=300",
              "data.max_dev_pairs=10", "data.vocab_size=200"]
    run = finished_run(results / "shared", config.load_config(SMOKE, common))
    before = snapshot(run)
    # the recurrent baseline in the Transformer's folder (main: a state_dict traceback, then its summary overwritten)
    line = one_line(ltfm_here("train", RNN_SMOKE, *common, "train.max_steps=8"), "model.arch (transformer there, rnn "
                    "asked)", "another run.id", "delete the folder")
    assert "rnn.cell (unset there, gru asked)" in line and "more" in line
    # another dropout (main: resumed the old checkpoint silently and recorded the new config)
    one_line(ltfm_here("train", SMOKE, *common, "model.dropout=0.3"),
             "differing in model.dropout (0.1 there, 0.3 asked): give another run.id")
    assert snapshot(run) == before
    # a folder whose records were deleted by hand: its checkpoint's config speaks, before the folder is written
    for name in ("config.yaml", "summary.json", "tokenizer.json"):
        (run / name).unlink()
    before = snapshot(run)
    one_line(ltfm_here("train", SMOKE, *common, "model.dropout=0.3"), "cannot resume", "model.dropout (0.1 "
             "checkpoint, 0.3 run)", after="ltfm prepare: ")
    assert snapshot(run) == before


def test_a_hash_named_folder_of_another_config_is_never_resumed(tmp_path, data_dir, ltfm_here):
    """The folder a config's run id names holds another config (a hash collision; a folder an older version wrote
    with other defaults): refused as a run.id would be, in ``ltfm train`` and in a sweep's trial."""
    from lightning_tfm.training.runs.run_folder import reuse_problem

    results = tmp_path / "results"
    args = [f"data.path={data_dir}", f"run.results_dir={results}"]
    cfg = config.load_config(SMOKE, args)
    older = config.load_config(SMOKE, [*args, "train.warmup=4000"])
    run = finished_run(results / run_ids.run_id(cfg), older)
    before = snapshot(run)
    one_line(ltfm_here("train", SMOKE, *args), "train.warmup (4000 there, 100 asked)", "delete the folder")
    assert snapshot(run) == before
    # what a run may change when it trains on is not a difference: its budget, its bookkeeping, the sweep training
    # it (sweeps/table3-cpu-continued.yaml continues table3-cpu.yaml's rows in their folders)
    same = finished_run(tmp_path / "other" / "x", cfg)
    on = config.load_config(SMOKE, [*args, "train.max_steps=1800", "run.study=table3-cpu-continued", "run.variant=C1",
                                    "run.family=C", "train.checkpoint_every_seconds=null", "decode.batch_sentences=7",
                                    "train.threads=1", "wandb.mode=disabled"])
    on.sweep.study, on.sweep.trial = "table3-cpu-continued", 3
    assert reuse_problem(on, same) is None and reuse_problem(cfg, tmp_path / "empty") is None


def test_a_sweep_trial_leaves_its_folder_holding_another_config_as_it_is(tmp_path, data_dir, ltfm_here):
    import yaml

    results = tmp_path / "results"
    sweep = tmp_path / "reuse.yaml"
    sweep.write_text(yaml.safe_dump({"name": "reuse", "experiment": str(SMOKE), "metric": "dev_loss",
                                     "pruner": {"type": "none"}, "seeds": [1], "variants": {"base": {}}}))
    args = [f"data.path={data_dir}", f"run.results_dir={results}"]
    dry = ltfm_here("sweep", sweep, "--dry-run", "--json", *args)
    assert dry.returncode == 0, dry.stderr[-2000:]
    (row,) = json.loads(dry.stdout)
    other = config.load_config(SMOKE, [*args, "model.dropout=0.3"])
    run = finished_run(results / row["run_id"], other, steps=5)
    before = snapshot(run)
    p = ltfm_here("sweep", sweep, *args)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "model.dropout (0.3 there, 0.1 asked)" in p.stdout + p.stderr
    assert snapshot(run) == before


# ------------------------------------------------------------------------------------------------------------
# 2. and 3. checkpoints of another vocabulary or model; evaluate's hypotheses of another run's checkpoint
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory, data_dir) -> dict[str, Path]:
    """Two BPE vocabularies of the same size (200 entries): en+de and en+fr."""
    out = {}
    folder = tmp_path_factory.mktemp("vocabularies")
    src = read_lines(data_dir / "train.en.gz")[:1500]
    for lang in ("de", "fr"):
        tok = train_tokenizer(src + read_lines(data_dir / f"train.{lang}.gz")[:1500], vocab_size=200)
        out[lang] = folder / f"{lang}.json"
        tok.save(str(out[lang]))
    sizes = {json.loads(p.read_text())["model"]["vocab"].__len__() for p in out.values()}
    assert len(sizes) == 1, sizes
    return out


def tiny_run(folder: Path, data_dir: Path, tokenizer: Path, lang: str = "de", seed: int = 1, records: bool = True,
             model: dict = TRANSFORMER, **overrides) -> Path:
    """A trained-looking run: config.yaml, tokenizer.json, a random model's last.ckpt whose hyper-parameters are
    what training writes (``records``: with the vocabulary's hash; else as an older version wrote them)."""
    from tokenizers import Tokenizer

    cfg = config.load_config(None, {"run.name": folder.name, "data.path": str(data_dir), "data.tgt_lang": lang,
                                    "data.test_split": "test_2016_flickr", **TINY, **model, **overrides})
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(config.saved_yaml(cfg))
    (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    torch.manual_seed(seed)
    model = build_model(cfg.model, vocab)
    hp = {"config": cfg.to_dict(), "vocab_size": vocab}
    if records:
        hp[TOKENIZER] = hashlib.sha256(tokenizer.read_bytes()).hexdigest()[:16]
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "hyper_parameters": hp,
                "global_step": 10}, folder / "checkpoints" / "last.ckpt")
    return folder


def test_a_checkpoint_of_another_vocabulary_of_the_same_size_is_refused(tmp_path, data_dir, vocabularies, ltfm_here):
    de = tiny_run(tmp_path / "de", data_dir, vocabularies["de"])
    fr = tiny_run(tmp_path / "fr", data_dir, vocabularies["fr"], "fr")
    old = tiny_run(tmp_path / "old-de", data_dir, vocabularies["de"], records=False)  # an older version's checkpoint
    src = "A man is riding a bike.\n"
    for other in (de, old):
        ck = str(other / "checkpoints" / "last.ckpt")
        one_line(ltfm_here("translate", fr, "--checkpoint", ck, input=src), "another vocabulary", "give a checkpoint "
                 f"of this run, or run this command on its own run folder {other}")
        one_line(ltfm_here("evaluate", fr, "--checkpoint", ck), "another vocabulary")
    assert not (fr / "hyps").exists()
    ok = ltfm_here("translate", de, "--checkpoint", str(old / "checkpoints" / "last.ckpt"), input=src)
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 1, ok.stderr[-2000:]  # one vocabulary, one model


def test_a_checkpoint_of_another_model_is_refused_without_a_traceback(tmp_path, data_dir, vocabularies, ltfm_here):
    run = tiny_run(tmp_path / "run", data_dir, vocabularies["de"])
    rnn = tiny_run(tmp_path / "rnn", data_dir, vocabularies["de"], model=RNN)
    dropout = tiny_run(tmp_path / "dropout", data_dir, vocabularies["de"], **{"model.dropout": 0.3})
    one_line(ltfm_here("translate", run, "--checkpoint", str(rnn / "checkpoints" / "last.ckpt"), input="A dog.\n"),
             "another model", "model.arch (rnn checkpoint, transformer run)")
    one_line(ltfm_here("evaluate", run, "--checkpoint", str(dropout / "checkpoints" / "last.ckpt")),
             "model.dropout (0.3 checkpoint, 0.1 run)")
    # the transformer's checkpoint given to the recurrent run
    one_line(ltfm_here("translate", rnn, "--checkpoint", str(run / "checkpoints" / "last.ckpt"), input="A dog.\n"),
             "model.arch (transformer checkpoint, rnn run)")


def test_evaluating_another_runs_checkpoint_keeps_the_runs_own_hypotheses(tmp_path, data_dir, vocabularies,
                                                                          ltfm_here):
    a = tiny_run(tmp_path / "a", data_dir, vocabularies["de"], seed=1)
    b = tiny_run(tmp_path / "b", data_dir, vocabularies["de"], seed=2, **{"run.seed": 2})  # same model, other weights
    own = ltfm_here("evaluate", a)
    assert own.returncode == 0, own.stderr[-2000:]
    mine = a / "hyps" / "test_2016_flickr.last.beam2.txt"
    kept = mine.read_bytes()
    theirs = ltfm_here("evaluate", a, "--checkpoint", str(b / "checkpoints" / "last.ckpt"))
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    assert mine.read_bytes() == kept
    (named,) = [h for h in (a / "hyps").glob("test_2016_flickr.b-*.last.beam2.txt")]  # b-<hash of its path>
    assert named.is_file() and named.read_bytes() != kept and f"hypotheses: {named}" in theirs.stdout
    # the run's own checkpoint by its path is its own label
    again = ltfm_here("evaluate", a, "--checkpoint", str(a / "checkpoints" / "last.ckpt"))
    assert again.returncode == 0 and mine.read_bytes() == kept and f"hypotheses: {mine}" in again.stdout


# ------------------------------------------------------------------------------------------------------------
# Siblings: average, resume
# ------------------------------------------------------------------------------------------------------------
def test_average_refuses_checkpoints_of_another_vocabulary_and_another_runs_folder(tmp_path, data_dir, vocabularies,
                                                                                   ltfm_here):
    run = tiny_run(tmp_path / "run", data_dir, vocabularies["de"])
    ck = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    for step in (1, 2):
        ck["global_step"] = step
        if step == 2:  # written after the run's tokenizer.json was replaced by one of the same size
            ck["hyper_parameters"][TOKENIZER] = hashlib.sha256(vocabularies["fr"].read_bytes()).hexdigest()[:16]
        torch.save(ck, run / "checkpoints" / f"step={step:06d}.ckpt")
    (run / "checkpoints" / "last.ckpt").unlink()
    one_line(ltfm_here("average", run, "--last", "2"), "another vocabulary", "average checkpoints of one run")
    assert not (run / "checkpoints" / "average.ckpt").exists()
    # nor is an average written into another run's checkpoints, where it would pass for one of that run's
    other = tiny_run(tmp_path / "other", data_dir, vocabularies["de"])
    (run / "checkpoints" / "step=000002.ckpt").unlink()
    out = other / "checkpoints" / "average.ckpt"
    one_line(ltfm_here("average", run, "--last", "1", "--out", out), "run other's averaged checkpoint")
    assert not out.exists()


def test_a_resume_from_a_checkpoint_of_another_vocabulary_is_refused(tmp_path, data_dir, vocabularies, ltfm_here):
    """A folder whose tokenizer.json was deleted keeps checkpoints of its old vocabulary: resuming them on the
    prepared corpus's would feed them other words. Refused before the run folder is written."""
    results = tmp_path / "results"
    args = [f"data.path={data_dir}", f"run.results_dir={results}", "data.max_train_pairs=300", "data.max_dev_pairs=10",
            "data.vocab_size=200", "data.test_split=null", "train.max_steps=2"]
    cfg = config.load_config(SMOKE, args)
    run = finished_run(results / run_ids.run_id(cfg), cfg, steps=1)
    (run / "summary.json").unlink()
    (run / "tokenizer.json").unlink()
    ck = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    ck["hyper_parameters"][TOKENIZER] = "0" * 16
    torch.save(ck, run / "checkpoints" / "last.ckpt")
    before = snapshot(run)
    one_line(ltfm_here("train", SMOKE, *args), "another vocabulary", "cannot resume", after="ltfm prepare: ")
    assert snapshot(run) == before


@pytest.mark.slow
def test_training_records_its_vocabulary_in_every_checkpoint(smoke_run):
    from lightning_tfm.training.runs.checkpoints import TOKENIZER as KEY
    from lightning_tfm.training.runs.checkpoints import load_checkpoint, tokenizer_hash

    assert KEY == TOKENIZER
    want = tokenizer_hash(smoke_run / "tokenizer.json")
    for path in (smoke_run / "checkpoints").glob("*.ckpt"):
        assert load_checkpoint(path)["hyper_parameters"][KEY] == want, path
