"""Parallel corpora, the shared BPE vocabulary, and token-budget batches (Section 5.1).

Corpora come through Hugging Face ``datasets``: from the Hub (``data.source=hub``) or from a local
folder of line-aligned files ``{split}.{lang}`` / ``{split}.{lang}.gz`` (``data.source=local``).
"""
from __future__ import annotations

import gzip
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Sampler

from ...base.errors import UserError
from ...model import BOS, EOS, PAD, UNK
from ..config.config import Config
from .corpus_id import split_file  # the corpus folder's file names (corpus_id.py)

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3 = PAD, BOS, EOS, UNK
assert [PAD, BOS, EOS, UNK] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------------------------- corpora
def read_lines(path: str | Path) -> list[str]:
    """Lines of a text file, plain or gzip-compressed, without their line breaks.

    Lines end at "\n" only ("\r\n" is tolerated): ``str.splitlines`` would also split at U+2028,
    U+0085, form feeds etc. inside a sentence and shift the source against the target.
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8", newline="") as f:
            text = f.read()
        if not text:
            return []
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the final line break ends the last line; it does not start an empty one
        return [x[:-1] if x.endswith("\r") else x for x in lines]
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise UserError(f"cannot read {p}: {e.__class__.__name__}: {e}; "
                        "give a UTF-8 text file (optionally .gz)") from None


def read_parallel(folder: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Line-aligned source and target sentences of one split, checked for equal, non-zero length."""
    src_path, tgt_path = split_file(folder, split, src_lang), split_file(folder, split, tgt_lang)
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                        f"source and target files must be line-aligned")
    if not src:
        raise UserError(f"split {split!r} is empty ({src_path}): give files with at least one sentence pair")
    return src, tgt


def load_split(cfg: Config, split: str, limit: int | None = None):
    """One split as a ``datasets.Dataset`` with columns ``src`` and ``tgt``. ``datasets`` is imported here, when a
    corpus is built, not by every run (1.1 s of a run's start, its prepared corpus already cached)."""
    import datasets

    if not cfg.train.progress_bar:  # a log file or a sweep worker's: no progress bars
        datasets.disable_progress_bars()
    d = cfg.data
    if d.source == "local":
        src, tgt = read_parallel(d.path, split, d.src_lang, d.tgt_lang)
        ds = datasets.Dataset.from_dict({"src": src, "tgt": tgt})
    else:
        ds = _load_hub_split(d, split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds


def _load_hub_split(d: dict, split: str):
    """A Hub translation dataset: either a ``translation`` column of {lang: text} (wmt14, iwslt) or one
    column per language (e.g. bentrevett/multi30k)."""
    import datasets

    try:
        ds = datasets.load_dataset(d.hub_name, d.hub_config, split=split)
    except Exception as e:  # offline, unknown name, unknown split: the library's own message, on one line
        msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise UserError(f"cannot load {d.hub_name!r} split {split!r} from the Hugging Face Hub ({msg[:200]}); "
                        f"without internet use local files: data.source=local data.path=FOLDER") from None
    s, t = d.src_lang, d.tgt_lang
    if "translation" in ds.column_names:
        ds = ds.map(lambda b: {"src": [x[s] for x in b["translation"]], "tgt": [x[t] for x in b["translation"]]},
                    batched=True, remove_columns=ds.column_names)
    elif s in ds.column_names and t in ds.column_names:
        ds = ds.rename_columns({s: "src", t: "tgt"}).select_columns(["src", "tgt"])
    else:
        raise UserError(f"Hub dataset {d.hub_name!r} has columns {ds.column_names}, none for {s!r}/{t!r}: "
                        f"check data.src_lang and data.tgt_lang")
    if len(ds) == 0:
        raise UserError(f"split {split!r} of {d.hub_name!r} is empty")
    return ds


# -------------------------------------------------------------------------------------------- vocabulary
def train_tokenizer(texts, vocab_size: int, min_frequency: int = 2):
    """One BPE vocabulary shared by source and target (Sec. 5.1), with Hugging Face ``tokenizers``.

    Metaspace pre-tokenization (SentencePiece style) makes decoding exact, so BLEU is computed on
    detokenized text; punctuation is split off words first (pieces after it carry no "▁", so it
    decodes back in place). NFKC and whitespace folding as SentencePiece's default normaliser does.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(),
                                                  pre_tokenizers.Punctuation(behavior="isolated")])
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(run_dir: str | Path):
    from tokenizers import Tokenizer

    path = Path(run_dir) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{path} not found: is {run_dir} a run folder written by `ltfm train`?")
    return Tokenizer.from_file(str(path))


def encode_lines(tokenizer, lines: list[str]) -> list[list[int]]:
    """BPE ids of each line, without BOS/EOS."""
    return [e.ids for e in tokenizer.encode_batch(list(lines), add_special_tokens=False)]


def decode_ids(tokenizer, ids: list[int]) -> str:
    """Detokenized text of BPE ids (special tokens dropped)."""
    return tokenizer.decode([i for i in ids if i > UNK or i == UNK], skip_special_tokens=True)


# --------------------------------------------------------------------------------------------- batching
class TokenBatchSampler(Sampler[list[int]]):
    """Batches of sentence pairs of similar length under a token budget (Sec. 5.1: "sentence pairs were
    batched together by approximate sequence length", ~25,000 source and 25,000 target tokens).

    A batch of n pairs is padded to its longest source and target; like fairseq's ``max_tokens`` we
    require n * max(padded source width, padded target width) <= ``batch_tokens``. Batches are formed
    once from the length-sorted order (ties broken by a seeded shuffle, as fairseq does); each epoch
    shuffles the order of the batches with ``seed + epoch``, identically on every rank.

    With ``num_replicas`` > 1 the epoch's batches are dealt round-robin to ranks. If their count is not
    a multiple of the world size, the largest batches are halved until it is, so every pair is seen by
    exactly one rank once per epoch, none twice and none dropped, and every rank takes the same number
    of steps (DDP would hang otherwise).

    :meth:`resume_at` makes the next iteration start inside an epoch (a run resumed mid-epoch trains on the batches
    a run never stopped would have: :class:`~lightning_tfm.training.lit.ResumableLoader`).
    """

    def __init__(self, src_lens, tgt_lens, batch_tokens: int, shuffle: bool = True, seed: int = 1,
                 num_replicas: int = 1, rank: int = 0):
        # Lengths are numpy arrays (views of a prepared corpus's offsets): no per-pair Python objects.
        self.src_lens = np.asarray(src_lens, dtype=np.int64)
        self.tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
        self.batch_tokens, self.shuffle, self.seed = batch_tokens, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self._skip = 0  # batches of this epoch the next iteration leaves out (resume_at)
        self.order, self.bounds = self._make_batches()

    def _make_batches(self) -> tuple[np.ndarray, np.ndarray]:
        """The length-sorted pair order and the batch boundaries in it (batch k is order[bounds[k]:bounds[k+1]])."""
        n = len(self.src_lens)
        # The tie-breaking shuffle is Python's, so a seed gives the same batches as it always has.
        perm = list(range(n))
        random.Random(self.seed).shuffle(perm)
        order = np.asarray(perm, dtype=np.int64)
        del perm
        order = order[np.lexsort((self.src_lens[order], self.tgt_lens[order]))]  # stable: shuffled ties
        width = np.maximum(self.src_lens, self.tgt_lens)[order]
        # Greedy packing, one numpy step per batch: from its first pair, a batch of k pairs fits while
        # k * (running max width) <= batch_tokens; that product grows with k, so a binary search finds k.
        bounds, start = [0], 0
        while start < n:
            stop = min(n, start + self.batch_tokens // max(int(width[start]), 1) + 1)
            cost = np.maximum.accumulate(width[start:stop]) * np.arange(1, stop - start + 1)
            k = max(1, int(np.searchsorted(cost, self.batch_tokens, side="right")))
            start += k
            bounds.append(start)
        return order, np.asarray(bounds, dtype=np.int64)

    @property
    def batches(self) -> list[list[int]]:
        return [self.order[a:b].tolist() for a, b in zip(self.bounds[:-1], self.bounds[1:])]

    @property
    def sampler(self) -> "TokenBatchSampler":
        """Itself, as torch's ``BatchSampler.sampler`` is the sampler it draws from: Lightning calls ``set_epoch`` at
        each epoch's start on a loader's ``sampler`` and ``batch_sampler.sampler``, never on the batch sampler (without
        this every epoch repeated the first one's order)."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, batches: int) -> None:
        """The next iteration yields epoch ``epoch``'s batches (this rank's) after its first ``batches``; the one after
        it a whole epoch again."""
        self.epoch, self._skip = epoch, max(0, batches)

    def _epoch_spans(self) -> list[tuple[int, int]]:
        spans = list(zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist()))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(spans)
        while len(spans) % self.num_replicas:
            j = max(range(len(spans)), key=lambda k: (spans[k][1] - spans[k][0] > 1, spans[k][1] - spans[k][0]))
            a, b = spans[j]
            if b - a < 2:
                raise ValueError(f"cannot deal {len(spans)} single-pair batches to {self.num_replicas} ranks")
            spans[j:j + 1] = [(a, a + (b - a) // 2), (a + (b - a) // 2, b)]
        return spans

    def epoch_batches(self) -> list[list[int]]:
        """All batches of the current epoch, in order, before sharding."""
        return [self.order[a:b].tolist() for a, b in self._epoch_spans()]

    def __iter__(self):
        skip, self._skip = self._skip, 0
        for a, b in self._epoch_spans()[self.rank::self.num_replicas][skip:]:
            yield self.order[a:b].tolist()

    def __len__(self) -> int:
        n = len(self.bounds) - 1
        return math.ceil(n / self.num_replicas)


def widths(ids: list[list[int]]) -> list[int]:
    """Padded tensor width of each sequence once BOS or EOS is added."""
    return [len(x) + 1 for x in ids]


@dataclass
class Batch:
    src: torch.Tensor      # (B, S): source ids + EOS, right-padded
    tgt_in: torch.Tensor   # (B, T): BOS + target ids
    tgt_out: torch.Tensor  # (B, T): target ids + EOS
    index: torch.Tensor | None = None  # (B,): positions of the pairs in their dataset

    def to(self, device):
        """The batch on ``device``; from pinned host memory the copies are asynchronous (non_blocking)."""
        return Batch(*(t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out)), self.index)

    def pin_memory(self):
        """The DataLoader's ``pin_memory=True`` calls this: page-locked copies, so ``to(cuda)`` overlaps compute."""
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(), self.index)


def pad(seqs: list[list[int]], device=None) -> torch.Tensor:
    """Right-padded (B, max length) long tensor of token ids: the rows' ids joined once and written through a mask
    of the kept positions (not a tensor per row: reports/timing.md)."""
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    out = np.full((len(seqs), int(lens.max())), PAD, dtype=np.int64)
    out[np.arange(out.shape[1]) < lens[:, None]] = np.fromiter(
        (i for s in seqs for i in s), dtype=np.int64, count=int(lens.sum()))
    out = torch.from_numpy(out)
    return out if device is None else out.to(device)


def collate(pairs: list[tuple]) -> Batch:
    """(src ids, tgt ids) or (index, src ids, tgt ids) pairs -> padded tensors."""
    index = torch.tensor([p[0] for p in pairs]) if len(pairs[0]) == 3 else None
    pairs = [p[-2:] for p in pairs]
    # fairseq appends EOS to the source as well; tensor2tensor does the same.
    src = pad([s + [EOS] for s, _ in pairs])
    tgt_in = pad([[BOS] + t for _, t in pairs])
    tgt_out = pad([t + [EOS] for _, t in pairs])
    return Batch(src, tgt_in, tgt_out, index)
