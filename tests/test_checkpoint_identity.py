"""The checkpoint a command loads is the run's own (issue 52, item 1).

A run resumes from the checkpoint it actually loads (the newest readable of ``last.ckpt`` and the step checkpoints),
so that file is the one checked: one copied in from another run (its recorded run id, vocabulary, config) is refused
in one line naming it and the way out, exit 2, nothing changed. The files ``evaluate``, ``translate`` and
``average`` read back from a run's folder (``best.ckpt``, step checkpoints) are checked the same way. The run
folders are laid out as ``ltfm train`` lays them out, with tiny random models: no training (but one test reads the
smoke run's checkpoints).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from lightning_tfm.model import build_model
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import SMOKE
from test_run_reuse import one_line, snapshot

TOKENIZER = "tokenizer_sha256"
RUN_ID, CORPUS = "ltfm_run_id", "ltfm_corpus"

SMALL = ["data.max_train_pairs=300", "data.max_dev_pairs=10", "data.vocab_size=200", "data.test_split=null",
         "model.layers=1", "model.d_model=16", "model.d_ff=32", "model.heads=2", "model.d_k=8", "model.d_v=8",
         "decode.beam_size=1", "decode.max_len_b=5", "train.threads=1", "wandb.mode=disabled"]


def checkpoint(cfg: config.Config, vocab: int, tokenizer: str | None, run: str | None, step: int, seed: int = 1,
               corpus: str | None = None) -> dict:
    """A random model's checkpoint with what training records in it (config, vocabulary hash, run id, corpus)."""
    torch.manual_seed(seed)
    model = build_model(cfg.model, vocab)
    ck = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "global_step": step,
          "hyper_parameters": {"config": cfg.to_dict(), "vocab_size": vocab,
                               **({TOKENIZER: tokenizer} if tokenizer else {})}}
    ck.update({k: v for k, v in ((RUN_ID, run), (CORPUS, corpus)) if v})
    return ck


def laid_out_run(results: Path, cfg: config.Config, tokenizer: Path, steps=(4,), seed: int = 1) -> Path:
    """A run folder as a stopped ``ltfm train`` leaves it: config.yaml, tokenizer.json, summary.json, step
    checkpoints and last.ckpt (of the last step), each recording the run's id and vocabulary."""
    from tokenizers import Tokenizer

    run = results / run_ids.run_id(cfg)
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(config.saved_yaml(cfg))
    (run / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    (run / "summary.json").write_text(json.dumps({"run_id": run.name, "status": "failed", "steps": steps[-1],
                                                  "config": cfg.to_dict()}))
    vocab, sha = Tokenizer.from_file(str(tokenizer)).get_vocab_size(), hashlib.sha256(tokenizer.read_bytes())
    for step in steps:
        ck = checkpoint(cfg, vocab, sha.hexdigest()[:16], run.name, step, seed)
        torch.save(ck, run / "checkpoints" / f"step={step:06d}.ckpt")
    shutil.copy2(run / "checkpoints" / f"step={steps[-1]:06d}.ckpt", run / "checkpoints" / "last.ckpt")
    return run


@pytest.fixture
def prepared(tmp_path, data_dir):
    """(the smoke config's arguments, its config, its prepared corpus's tokenizer.json) of a small corpus."""
    from lightning_tfm.training.data.corpus import Corpus

    args = [f"data.path={data_dir}", f"run.results_dir={tmp_path / 'results'}", f"data.cache_dir={tmp_path / 'cache'}",
            *SMALL, "train.max_steps=20"]
    cfg = config.load_config(SMOKE, args)
    return args, cfg, Corpus(cfg).folder / "tokenizer.json"


@pytest.mark.parametrize("records", ["run id", "vocabulary", "config"])
def test_a_resume_checks_the_checkpoint_it_loads_not_last_ckpt(prepared, tmp_path, data_dir, records, ltfm_here):
    """Another run's step=000008.ckpt copied into a run stopped at step 4: the resume would load it (newer than
    last.ckpt, which the check used to read) and train on to 'completed' on its weights. Refused in one line naming
    the file and the way out, whatever tells it apart (the run id it records; an older version's checkpoint: its
    vocabulary, its config); nothing in the folder changes."""
    args, cfg, tokenizer = prepared
    run = laid_out_run(tmp_path / "results", cfg, tokenizer)
    vocab = json.loads(tokenizer.read_text())["model"]["vocab"].__len__()
    own_sha = hashlib.sha256(tokenizer.read_bytes()).hexdigest()[:16]
    other = config.load_config(SMOKE, [*args, "data.tgt_lang=fr"] if records == "config" else args)
    theirs = checkpoint(other, vocab, "0" * 16 if records == "vocabulary" else own_sha,
                        "multi30k-smoke-0123abcd" if records == "run id" else None, 8, seed=2)
    foreign = run / "checkpoints" / "step=000008.ckpt"
    torch.save(theirs, foreign)
    before = snapshot(run)
    line = one_line(ltfm_here("train", SMOKE, *args), "checkpoint " + str(foreign), "cannot resume",
                    f"move step=000008.ckpt out of {foreign.parent}", after="ltfm prepare: ")
    assert {"run id": "was written by run multi30k-smoke-0123abcd", "vocabulary": "another vocabulary",
            "config": "data.tgt_lang (fr checkpoint, de run)"}[records] in line
    assert snapshot(run) == before


def test_a_resume_behind_a_damaged_newest_checkpoint_checks_the_one_it_falls_back_to(prepared, tmp_path, ltfm_here):
    """The newest step checkpoint truncated (a kill mid-copy) and the one before it another run's: the resume would
    set the damaged one aside and load the foreign one; refused before either is touched."""
    args, cfg, tokenizer = prepared
    run = laid_out_run(tmp_path / "results", cfg, tokenizer, steps=(4,))
    ck = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    ck[RUN_ID], ck["global_step"] = "somebody-else-0123abcd", 8
    torch.save(ck, run / "checkpoints" / "step=000008.ckpt")
    damaged = run / "checkpoints" / "step=000012.ckpt"
    damaged.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes()[:5000])
    before = snapshot(run)
    one_line(ltfm_here("train", SMOKE, *args), "step=000008.ckpt was written by run somebody-else-0123abcd",
             after="ltfm prepare: ")
    assert snapshot(run) == before


def test_a_resume_of_its_own_newer_step_checkpoint_goes_ahead(prepared, tmp_path, ltfm_here):
    """The check refuses only another run's: the run's own newer step checkpoint (killed between writing it and
    last.ckpt) is resumed from, as before."""
    from lightning_tfm.training.runs import resume
    from lightning_tfm.training.runs.checkpoints import tokenizer_hash

    args, cfg, tokenizer = prepared
    run = laid_out_run(tmp_path / "results", cfg, tokenizer, steps=(4, 8))
    shutil.copy2(run / "checkpoints" / "step=000004.ckpt", run / "checkpoints" / "last.ckpt")
    resume.check(resume.pick(run / "checkpoints"), run, cfg, tokenizer_hash(tokenizer))  # no error


@pytest.fixture
def two_runs(prepared, tmp_path):
    """Two runs of one model and vocabulary, other seeds (so other weights): a and b, step checkpoints 10 and 20."""
    args, cfg, tokenizer = prepared
    b_cfg = config.load_config(SMOKE, [*args, "run.seed=2"])
    return (laid_out_run(tmp_path / "results", cfg, tokenizer, steps=(10, 20)),
            laid_out_run(tmp_path / "results", b_cfg, tokenizer, steps=(10, 20), seed=2))


def test_evaluate_translate_and_average_refuse_another_runs_checkpoint_copied_into_the_folder(two_runs, ltfm_here):
    """b's checkpoint copied in as a's best.ckpt or as a step checkpoint passed for a's (same model, same
    vocabulary): evaluate wrote b's hypotheses under a's label, average mixed the two runs. Refused in one line naming
    the file and the run that wrote it; the same file given by its path in b's folder is still decoded."""
    a, b = two_runs
    shutil.copy2(b / "checkpoints" / "last.ckpt", a / "checkpoints" / "best.ckpt")
    before = snapshot(a)
    for cmd in (("evaluate", a, "--checkpoint", "best"), ("translate", a, "--checkpoint", "best")):
        one_line(ltfm_here(*cmd, input="A dog.\n"), f"checkpoint {a / 'checkpoints' / 'best.ckpt'} was written by "
                 f"run {b.name}", "move best.ckpt out of")
    (a / "checkpoints" / "best.ckpt").unlink()
    shutil.copy2(b / "checkpoints" / "last.ckpt", a / "checkpoints" / "step=000030.ckpt")
    one_line(ltfm_here("average", a, "--last", "2"), f"was written by run {b.name}", "average checkpoints of one run")
    assert not (a / "hyps").exists() and not (a / "checkpoints" / "average.ckpt").exists()
    (a / "checkpoints" / "step=000030.ckpt").unlink()
    assert snapshot(a) == {k: v for k, v in before.items() if k != "checkpoints/best.ckpt"}
    ok = ltfm_here("translate", a, "--checkpoint", b / "checkpoints" / "last.ckpt", input="A dog.\n")
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 1, ok.stderr[-2000:]


def test_a_renamed_run_folder_reads_its_own_checkpoints_and_still_refuses_another_runs(two_runs, ltfm_here):
    """``mv RUN mymodel``: its checkpoints record the id it was trained under, not its folder's new name; they are its
    own by what was trained (its config.yaml's run id and hash), so translate and average read them (issue 64, item
    8: refused as written by another run). Another run's checkpoint copied in is still refused."""
    a, b = two_runs
    mine = a.rename(a.parent / "mymodel")
    ok = ltfm_here("translate", mine, input="A dog.\n")
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 1, ok.stderr[-2000:]
    assert ltfm_here("average", mine, "--last", "2").returncode == 0
    shutil.copy2(b / "checkpoints" / "last.ckpt", mine / "checkpoints" / "best.ckpt")
    one_line(ltfm_here("translate", mine, "--checkpoint", "best", input="A dog.\n"),
             f"was written by run {b.name}, not by run {mine}", "move best.ckpt out of")


def test_a_damaged_best_checkpoint_or_replaced_vocabulary_is_one_line(two_runs, ltfm_here):
    """Siblings: a truncated best.ckpt, and a run whose tokenizer.json was replaced by another vocabulary's."""
    a, b = two_runs
    best = a / "checkpoints" / "best.ckpt"
    best.write_bytes((a / "checkpoints" / "last.ckpt").read_bytes()[:4000])
    one_line(ltfm_here("evaluate", a, "--checkpoint", "best"), f"cannot read checkpoint {best}", "truncated")
    best.unlink()
    tok = json.loads((b / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first, second = sorted((k for k, v in vocab.items() if v > 10), key=vocab.get)[:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # another vocabulary of the same size
    (b / "tokenizer.json").write_text(json.dumps(tok))
    one_line(ltfm_here("translate", b, input="A dog.\n"), "another vocabulary", "give a checkpoint of this run")


@pytest.mark.slow
def test_training_records_its_run_and_corpus_in_every_checkpoint(smoke_run):
    from lightning_tfm.training.runs.checkpoints import load_checkpoint

    summary = json.loads((smoke_run / "summary.json").read_text())
    for path in (smoke_run / "checkpoints").glob("*.ckpt"):
        ck = load_checkpoint(path)
        assert ck[RUN_ID] == smoke_run.name and ck[CORPUS] == summary["corpus"], path
