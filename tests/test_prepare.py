"""Prepared corpora: built once, keyed on what decides the ids, identical to the per-run pipeline they replace."""
import gzip
import json
import math
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lightning_tfm.training.config.config import load_config
from lightning_tfm.training.config.run_id import run_id
from lightning_tfm.training.data import corpus as K
from lightning_tfm.training.data.data import TokenBatchSampler, encode_lines, read_parallel, train_tokenizer, widths

from conftest import ROOT, SMOKE, default_signals


# ------------------------------------------------------------------ the pipeline before prepared corpora
class OldTokenBatchSampler:
    """TokenBatchSampler as it was (per-pair Python lists), kept here to pin today's batches."""

    def __init__(self, src_lens, tgt_lens, batch_tokens, shuffle=True, seed=1, num_replicas=1, rank=0):
        self.src_lens, self.tgt_lens = list(src_lens), list(tgt_lens)
        self.batch_tokens, self.shuffle, self.seed = batch_tokens, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self.batches = self._make_batches()

    def _width(self, i):
        return max(self.src_lens[i], self.tgt_lens[i])

    def _make_batches(self):
        order = list(range(len(self.src_lens)))
        random.Random(self.seed).shuffle(order)
        order.sort(key=lambda i: (self.tgt_lens[i], self.src_lens[i]))
        batches, cur, cur_max = [], [], 0
        for i in order:
            w = max(cur_max, self._width(i))
            if cur and w * (len(cur) + 1) > self.batch_tokens:
                batches.append(cur)
                cur, w = [], self._width(i)
            cur.append(i)
            cur_max = w
        if cur:
            batches.append(cur)
        return batches

    def epoch_batches(self):
        batches = [list(b) for b in self.batches]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(batches)
        while len(batches) % self.num_replicas:
            j = max(range(len(batches)), key=lambda k: (len(batches[k]) > 1, len(batches[k])))
            b = batches.pop(j)
            batches[j:j] = [b[: len(b) // 2], b[len(b) // 2:]]
        return batches

    def __iter__(self):
        return iter(self.epoch_batches()[self.rank::self.num_replicas])

    def __len__(self):
        return math.ceil(len(self.batches) / self.num_replicas)


def old_pipeline(cfg):
    """The per-run Corpus before this module: BPE on the run's training text, filtered id lists."""
    d = cfg.data
    src, tgt = read_parallel(d.path, d.train_split, d.src_lang, d.tgt_lang)
    src, tgt = src[:d.max_train_pairs], tgt[:d.max_train_pairs]
    tok = train_tokenizer(src + tgt, d.vocab_size, d.tokenizer_min_frequency)
    s_ids, t_ids = encode_lines(tok, src), encode_lines(tok, tgt)
    limit = min(d.max_tokens_per_sentence, cfg.model.max_positions - 1)
    keep = [i for i in range(len(s_ids)) if 0 < len(s_ids[i]) <= limit and 0 < len(t_ids[i]) <= limit
            and max(len(s_ids[i]), len(t_ids[i])) + 1 <= cfg.train.batch_tokens]
    dsrc, dtgt = read_parallel(d.path, d.dev_split, d.src_lang, d.tgt_lang)
    dsrc, dtgt = dsrc[:d.max_dev_pairs], dtgt[:d.max_dev_pairs]
    return tok, [s_ids[i] for i in keep], [t_ids[i] for i in keep], encode_lines(tok, dsrc), encode_lines(tok, dtgt)


def cfg_for(tmp_path, data, *extra):
    return load_config(SMOKE, [f"data.path={data}", f"run.results_dir={tmp_path / 'results'}", *extra])


@pytest.mark.parametrize("budget", [300, 2048])
def test_ids_and_batches_are_those_of_the_per_run_pipeline(tmp_path, data_dir, budget):
    # max_tokens_per_sentence 20 and a small budget make the filters and the batch packing do real work
    cfg = cfg_for(tmp_path, data_dir, "data.max_train_pairs=6000", "data.max_tokens_per_sentence=20",
                  f"train.batch_tokens={budget}")
    tok, s_ids, t_ids, dev_s, dev_t = old_pipeline(cfg)
    c = K.Corpus(cfg, progress=False)
    assert c.tokenizer.to_str() == tok.to_str()
    assert c.train.ids("src") == s_ids and c.train.ids("tgt") == t_ids
    assert c.skipped == len(read_parallel(data_dir, "train", "en", "de")[0][:6000]) - len(s_ids) > 0
    # dev pairs follow the training length rule by truncation (the old pipeline kept them whole)
    dev_s, dev_t = [x[:c.limit] for x in dev_s], [x[:c.limit] for x in dev_t]
    assert c.dev.ids("src") == dev_s and c.dev.ids("tgt") == dev_t
    assert [c.train[i][1:] for i in (0, 17, len(s_ids) - 1)] == [(s_ids[i], t_ids[i]) for i in (0, 17, len(s_ids) - 1)]
    sw, tw = c.train.widths()
    for world in (1, 2, 3):
        for rank in range(world):
            new = TokenBatchSampler(sw, tw, budget, seed=7, num_replicas=world, rank=rank)
            old = OldTokenBatchSampler(widths(s_ids), widths(t_ids), budget, seed=7, num_replicas=world, rank=rank)
            assert len(new) == len(old)
            for epoch in (0, 1):
                new.set_epoch(epoch)
                old.epoch = epoch
                assert list(new) == list(old)
    dev_new = TokenBatchSampler(*c.dev.widths(), budget, shuffle=False)
    assert list(dev_new) == list(OldTokenBatchSampler(widths(dev_s), widths(dev_t), budget, shuffle=False))


def test_only_what_decides_the_ids_makes_a_new_cache(tmp_path, data_dir):
    base = cfg_for(tmp_path, data_dir)
    folder = K.cache_dir(base)
    assert folder.parent == (tmp_path / "data-cache")  # default: beside the results folder
    same = ["model.heads=8", "train.max_steps=7", "train.batch_tokens=100", "model.max_positions=64",
            "run.seed=3", "run.name=other", "train.label_smoothing=0", f"run.results_dir={tmp_path / 'results2'}"]
    for o in same:
        assert K.cache_dir(cfg_for(tmp_path, data_dir, o)) == folder, o
    different = ["data.vocab_size=1200", "data.max_train_pairs=3999", "data.max_dev_pairs=10", "data.test_split=null",
                 "data.tokenizer_min_frequency=3", "data.max_tokens_per_sentence=100", "data.tgt_lang=fr",
                 "data.dev_split=test_2016_flickr"]
    folders = {K.cache_dir(cfg_for(tmp_path, data_dir, o)) for o in different}
    assert len(folders) == len(different) and folder not in folders
    # the input files: a copy elsewhere is another source; a file rewritten is the same corpus if its text is the
    # same (the key is the content identity, not the size and mtime), another if it is not
    copy = tmp_path / "copy"
    copy.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            shutil.copy2(data_dir / f"{split}.{lang}.gz", copy / f"{split}.{lang}.gz")
    c1 = K.cache_dir(cfg_for(tmp_path, copy))
    assert c1 != folder
    (copy / "val.de.gz").write_bytes((copy / "val.de.gz").read_bytes())
    assert K.cache_dir(cfg_for(tmp_path, copy)) == c1
    (copy / "val.de.gz").write_bytes(gzip.compress(gzip.decompress((copy / "val.de.gz").read_bytes()) + b"x\n"))
    assert K.cache_dir(cfg_for(tmp_path, copy)) != c1
    assert K.cache_dir(cfg_for(tmp_path, data_dir, f"data.cache_dir={tmp_path / 'elsewhere'}")).parent == \
        tmp_path / "elsewhere"


def small_corpus(folder, n=300):
    folder.mkdir(parents=True, exist_ok=True)
    r = random.Random(0)
    words = "the a man dog runs on street with red ball in park der ein Mann Hund läuft auf Straße mit rot".split()
    for split, k in (("train", n), ("val", 20), ("test_2016_flickr", 10)):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text(
                "".join(" ".join(r.choice(words) for _ in range(r.randint(3, 12))) + "\n" for _ in range(k)))
    return folder


@pytest.mark.slow
def test_two_processes_asking_at_once_build_once(tmp_path):
    data = small_corpus(tmp_path / "data", n=20000)  # large enough that the two overlap
    cmd = [sys.executable, "-m", "lightning_tfm", "prepare", str(SMOKE), f"data.path={data}",
           f"run.results_dir={tmp_path / 'results'}", "data.max_train_pairs=null", "data.vocab_size=200"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    builds = sum(err.count("training the BPE vocabulary") for _, err in outs)
    assert builds == 1, outs
    assert outs[0][0].splitlines()[0] == outs[1][0].splitlines()[0]  # the same folder
    (folder,) = [p for p in (tmp_path / "data-cache").iterdir() if p.is_dir()]  # no temporary folder left
    assert K.check_folder(folder)["splits"]["train"]["pairs"] == 20000


def test_a_damaged_cache_is_rebuilt_not_used(tmp_path, capfd):
    cfg = cfg_for(tmp_path, small_corpus(tmp_path / "data"), "data.max_train_pairs=null", "data.vocab_size=100")
    folder, manifest = K.prepare(cfg, progress=False)
    good = np.load(folder / "train.src.ids.npy")
    capfd.readouterr()
    for damage in ("truncate", "same size", "manifest", "missing"):
        if damage == "truncate":
            with open(folder / "train.src.ids.npy", "r+b") as f:
                f.truncate(f.seek(0, 2) - 6)
        elif damage == "same size":  # an edit that keeps the size: caught by the content digest
            with open(folder / "train.src.ids.npy", "r+b") as f:
                f.seek(-4, 2)
                last = f.read(4)
                f.seek(-4, 2)
                f.write(bytes(b ^ 0xFF for b in last))
        elif damage == "manifest":
            (folder / "manifest.json").unlink()
        else:
            (folder / "dev.tgt.offsets.npy").unlink()
        assert K.check_folder(folder) is None
        assert K.status(cfg) == (folder, False)
        folder2, _ = K.prepare(cfg, progress=False)
        assert folder2 == folder and "incomplete or damaged: rebuilding" in capfd.readouterr().err
        assert np.array_equal(np.load(folder / "train.src.ids.npy"), good)
        assert K.check_folder(folder) is not None


@pytest.mark.slow
def test_a_long_dev_line_is_truncated_and_counted(tmp_path, ltfm_here, monkeypatch):
    data = small_corpus(tmp_path / "data")
    lines = (data / "val.en").read_text().splitlines()
    lines[3] = " ".join(["word"] * 5000)
    (data / "val.en").write_text("\n".join(lines) + "\n")
    results = tmp_path / "results"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # what is tested is the data, not tracking
    p = ltfm_here("train", SMOKE, f"data.path={data}", f"run.results_dir={results}", "data.max_train_pairs=null",
                  "data.vocab_size=100", "model.max_positions=64", "train.max_steps=2", "train.val_every_steps=2",
                  "train.accelerator=cpu", "train.precision=32", "decode.beam_size=1", "decode.max_len_b=5")
    assert p.returncode == 0, p.stderr[-2000:]
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    s = json.loads((run / "summary.json").read_text())
    assert s["truncated_dev_pairs"] == 1 and s["truncated_test_pairs"] == 0 and s["length_limit"] == 63
    assert s["dev_loss"] is not None and s["dev_bleu"] is not None
    assert len((run / "hyps" / "dev.de.txt").read_text().splitlines()) == 20  # every dev sentence decoded
    c = K.Corpus(load_config(run / "config.yaml"), progress=False)
    assert max(len(c.dev[i][1]) for i in range(len(c.dev))) == 63
    # the run keeps its vocabulary and the hash of the corpus it trained on
    assert (run / "tokenizer.json").read_bytes() == (c.folder / "tokenizer.json").read_bytes()
    assert s["data_cache_hash"] == c.hash


def test_resume_on_another_vocabulary_is_refused(tmp_path):
    cfg = cfg_for(tmp_path, small_corpus(tmp_path / "data"), "data.max_train_pairs=null", "data.vocab_size=100")
    c = K.Corpus(cfg, progress=False)
    run = tmp_path / "run"
    run.mkdir()
    c.use_in_run(run, write=True)
    c.use_in_run(run, write=False)  # the same vocabulary: fine
    other = K.Corpus(load_config(SMOKE, [f"data.path={cfg.data.path}", f"run.results_dir={tmp_path}",
                                         "data.max_train_pairs=null", "data.vocab_size=90"]), progress=False)
    with pytest.raises(K.UserError, match="another vocabulary"):
        other.use_in_run(run, write=False)


def test_prepare_command_and_sweep_dry_run_report_the_cache(tmp_path, ltfm_here):
    data = small_corpus(tmp_path / "data")
    args = [f"data.path={data}", f"run.results_dir={tmp_path / 'results'}"]
    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", *args, "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "prepared corpus:" in p.stdout and "does not exist yet" in p.stdout
    p = ltfm_here("prepare", "experiments/multi30k-cpu.yaml", *args)  # the experiment alone has a test split
    assert p.returncode == 0, p.stderr
    assert "training pairs" in p.stderr and "vocabulary" in p.stdout
    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", *args, "--dry-run")
    assert "does not exist yet" in p.stdout, p.stdout
    p = ltfm_here("prepare", "sweeps/table3-cpu.yaml", *args)  # a sweep file: its trials' corpus
    assert p.returncode == 0, p.stderr
    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", *args, "--dry-run")
    assert "exists (every trial maps it)" in p.stdout, p.stdout
    p = ltfm_here("prepare", SMOKE, f"data.path={tmp_path / 'nowhere'}")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "does not exist" in p.stderr


def test_data_path_is_one_run_whatever_its_spelling(tmp_path, monkeypatch):
    small_corpus(tmp_path / "small")
    monkeypatch.chdir(tmp_path)
    ids = {run_id(load_config(SMOKE, [f"data.path={p}"])) for p in ("small", "./small", str(tmp_path / "small"),
                                                                     "small/")}
    assert len(ids) == 1
    assert load_config(SMOKE, ["data.path=small"]).data.path == str((tmp_path / "small").resolve())


def test_a_killed_builds_temporary_folder_is_removed(tmp_path, capfd):
    cfg = cfg_for(tmp_path, small_corpus(tmp_path / "data"), "data.max_train_pairs=null", "data.vocab_size=100")
    folder, _ = K.prepare(cfg, progress=False)
    stale = folder.parent / f".{folder.name}.tmp99999"  # what a build killed mid-way leaves
    (stale / "part").mkdir(parents=True)
    K.prepare(cfg, progress=False)
    assert not stale.exists() and "left by a build that was stopped" in capfd.readouterr().err
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []


SIGNALLED_BUILD = """
import os, signal, sys
from lightning_tfm.training.data import corpus as K
from lightning_tfm.cli import main

real = K.build
def build(cfg, folder, key, progress=True):
    (folder / "part.npy").write_bytes(b"half")  # a build stopped mid-way
    os.kill(os.getpid(), signal.{sig})          # handled at once: the rest of the build never runs
    return real(cfg, folder, key, progress)
K.build = build
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_prepare_stopped_by_a_signal_leaves_no_temporary_folder(tmp_path, sig):
    import signal

    data = small_corpus(tmp_path / "data")
    p = subprocess.run([sys.executable, "-c", SIGNALLED_BUILD.replace("{sig}", sig), "prepare", str(SMOKE),
                        f"data.path={data}", f"data.cache_dir={tmp_path / 'cache'}"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, preexec_fn=default_signals)
    number = getattr(signal, sig)
    assert p.returncode in (-number, 128 + number), (p.returncode, p.stderr[-2000:])  # ended as the signal ends it
    assert "Traceback" not in p.stderr, p.stderr
    assert [x.name for x in (tmp_path / "cache").iterdir() if not x.name.endswith(".lock")] == []


def test_a_killed_builds_leftovers_of_any_corpus_are_removed_by_the_next_prepare(tmp_path):
    """SIGKILL leaves a build's temporary folder: the next prepare of any corpus removes it once the process
    that made it is gone, and never one whose process lives or whose corpus is being built (its lock held)."""
    cfg = cfg_for(tmp_path, small_corpus(tmp_path / "data"), "data.vocab_size=100")
    folder, _ = K.prepare(cfg, progress=False)
    root = folder.parent
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    live = subprocess.Popen(["sleep", "600"])
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from filelock import FileLock; "
                               f"lock = FileLock({str(root / 'busy.en-de-2')!r} + '.lock'); lock.acquire(); "
                               "print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        dead = root / f".other.en-de-1.tmp{gone.pid}"
        alive = root / f".other.en-de-1.tmp{live.pid}"
        busy = root / f".busy.en-de-2.tmp{gone.pid}"  # its maker gone, but a build of that corpus is running
        for d in (dead, alive, busy):
            (d / "part").mkdir(parents=True)
        K.prepare(cfg, progress=False)  # another corpus, already built
        assert not dead.exists() and alive.exists() and busy.exists()
    finally:
        live.kill()
        live.wait()
        holder.communicate(timeout=60)
