"""Corpora, the shared BPE vocabulary and token-budget batching."""
import gzip
import random

import pytest
import torch

from lightning_tfm.base.errors import UserError
from lightning_tfm.model import BOS, EOS, PAD
from lightning_tfm.training.config.config import load_config
from lightning_tfm.training.data.data import (
    TokenBatchSampler,
    collate,
    decode_ids,
    encode_lines,
    load_split,
    pad,
    read_lines,
    read_parallel,
    train_tokenizer,
    widths,
)


def lengths(n=500, seed=0):
    r = random.Random(seed)
    return [r.randint(2, 40) for _ in range(n)], [r.randint(2, 45) for _ in range(n)]


@pytest.mark.parametrize("budget", [64, 300, 1000])
def test_no_batch_exceeds_its_token_budget(budget):
    src, tgt = lengths()
    s = TokenBatchSampler(src, tgt, budget, seed=3)
    seen = []
    for b in s:
        assert len(b) * max(max(src[i] for i in b), max(tgt[i] for i in b)) <= budget
        seen += b
    assert sorted(seen) == list(range(500))  # every pair once per epoch


def test_batches_group_similar_lengths_and_shuffle_per_epoch():
    src, tgt = lengths()
    s = TokenBatchSampler(src, tgt, 400, seed=3)
    spread = sum(max(tgt[i] for i in b) - min(tgt[i] for i in b) for b in s) / len(s)
    assert spread <= 2  # sorted by length: pads are few
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    assert list(s) != e0 and sorted(map(tuple, s)) == sorted(map(tuple, e0))
    s.set_epoch(0)
    assert list(s) == e0  # seeded: identical on every rank and every restart


def test_sharding_deals_every_batch_to_exactly_one_rank():
    src, tgt = lengths(333)
    for world in (2, 3, 4):
        shards = [list(TokenBatchSampler(src, tgt, 256, seed=1, num_replicas=world, rank=r)) for r in range(world)]
        assert len({len(sh) for sh in shards}) == 1  # same number of steps on every rank
        flat = [i for sh in shards for b in sh for i in b]
        assert sorted(flat) == list(range(333))  # disjoint, and together the whole epoch
        assert all(len(b) * max(max(src[i], tgt[i]) for i in b) <= 256 for sh in shards for b in sh)


def test_collate_adds_bos_and_eos_and_pads_right():
    b = collate([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])])
    assert b.src.tolist() == [[5, 6, 7, EOS], [5, EOS, PAD, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 8, 9, PAD, PAD], [BOS, 8, 9, 10, 11]]
    assert b.tgt_out.tolist() == [[8, 9, EOS, PAD, PAD], [8, 9, 10, 11, EOS]]
    assert widths([[1, 2], [3]]) == [3, 2]


def test_pad_writes_each_row_then_padding_for_any_batch():
    """pad over random batches (sizes 1-64, rows of 0-40 ids, an empty row among them): row i holds its ids, then
    PAD to the longest row; a long tensor, contiguous, as the model and the loss take it."""
    rng = random.Random(7)
    for _ in range(200):
        seqs = [[rng.randrange(4, 8000) for _ in range(rng.randrange(0, 41))] for _ in range(rng.randrange(1, 65))]
        seqs[rng.randrange(len(seqs))].append(rng.randrange(4, 8000))  # never all empty
        out = pad(seqs)
        width = max(len(s) for s in seqs)
        assert out.dtype == torch.long and out.is_contiguous() and out.shape == (len(seqs), width)
        assert out.tolist() == [s + [PAD] * (width - len(s)) for s in seqs]


def test_shared_bpe_vocabulary_round_trips(data_dir):
    src, tgt = read_parallel(data_dir, "val", "en", "de")
    tok = train_tokenizer(src + tgt, vocab_size=400)  # a size the toy corpus reaches too (tests/data)
    assert tok.get_vocab_size() == 400
    assert [tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]
    ids = encode_lines(tok, tgt[:50] + src[:50])
    assert [decode_ids(tok, x) for x in ids] == [" ".join(s.split()) for s in tgt[:50] + src[:50]]
    # shared: English and German words are both in the one vocabulary
    assert tok.token_to_id("▁Ein") is not None and tok.token_to_id("▁A") is not None


def test_local_split_through_datasets(data_dir):
    cfg = load_config(None, [f"data.path={data_dir}", "data.src_lang=en", "data.tgt_lang=fr"])
    ds = load_split(cfg, "test_2016_flickr")
    en, fr = (gzip.decompress((data_dir / f"test_2016_flickr.{lang}.gz").read_bytes()).decode().split("\n")[:-1]
              for lang in ("en", "fr"))
    assert len(ds) == len(en) == len(fr) > 0 and ds.column_names == ["src", "tgt"]
    assert [ds[0]["src"], ds[0]["tgt"], ds[-1]["src"], ds[-1]["tgt"]] == [en[0], fr[0], en[-1], fr[-1]]


def test_bad_data_is_a_user_error(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("x\n")
    (tmp_path / "val.en").write_text("")
    (tmp_path / "val.de").write_text("")
    with pytest.raises(UserError, match="has 2 lines but"):
        read_parallel(tmp_path, "train", "en", "de")
    with pytest.raises(UserError, match="empty"):
        read_parallel(tmp_path, "val", "en", "de")
    with pytest.raises(UserError, match="missing data file"):
        read_parallel(tmp_path, "test", "en", "de")


@pytest.mark.slow
def test_hub_route_fails_offline_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the libraries read these variables when first imported: an earlier test of this process may have imported
    # them online, and the test would then wait for the Hub's connection retries (23 s in the suite)
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = load_config(None, ["data.source=hub", "data.hub_name=wmt14", "data.hub_config=de-en"])
    with pytest.raises(UserError, match="Hugging Face Hub.*data.source=local"):
        load_split(cfg, "validation")


def test_read_lines_splits_on_line_feeds_only(tmp_path):
    f = tmp_path / "x.en"
    f.write_bytes("one\u2028still one\r\ntwo \u0085 too\x0cand\x1c this\nthree\n".encode())
    assert read_lines(f) == ["one\u2028still one", "two \u0085 too\x0cand\x1c this", "three"]
    f.write_bytes(b"no final newline\n\nx")
    assert read_lines(f) == ["no final newline", "", "x"]
    # and a corpus with them stays line-aligned
    (tmp_path / "train.en").write_text("a\u2028b\nc\n")
    (tmp_path / "train.de").write_text("x\ny\n")
    assert read_parallel(tmp_path, "train", "en", "de") == (["a\u2028b", "c"], ["x", "y"])
