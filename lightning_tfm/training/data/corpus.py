"""Prepared corpora: the shared BPE vocabulary and every split's token ids, built once, mapped by every run.

Everything that decides the token ids (the resolved data source with its files' content identity,
:func:`~.corpus_id.fingerprint`, the one the run id hashes, or the Hub dataset name and configuration; the
languages and splits; the pair limits; ``vocab_size``, ``tokenizer_min_frequency``, ``max_tokens_per_sentence``;
the tokenizer's settings and the ``tokenizers`` version) hashes to one folder ``<data.cache_dir>/<name>-<hash>``.
Model and training keys are not part of it, so every row of a sweep (Table 3: one shared vocabulary) and every
rank of a DDP run reads the same folder. It holds:

* ``tokenizer.json``: the BPE vocabulary trained on the training split (source and target together);
* ``{split}.{src,tgt}.ids.npy``: the ids of all sentences of a side, concatenated (uint16 when the
  vocabulary fits, else int32), and ``{split}.{src,tgt}.offsets.npy`` (int64, pairs + 1): sentence i is
  ``ids[offsets[i]:offsets[i+1]]``; the lengths the batch sampler needs are ``np.diff(offsets)``;
* ``{dev,test}.{src,tgt}.txt``: the raw dev/test sentences, the BLEU sources and references;
* ``manifest.json``: the key and its hash, counts, skipped pairs, versions, every file's size and SHA-256.

Arrays are ``.npy`` files opened with ``mmap_mode="r"``: a process touches only the pages of the pairs it
batches, and the ranks of one machine share them through the page cache.

A folder is built under a temporary name and renamed into place; a file lock makes concurrent
workers or ranks build it once while the others wait. A folder whose manifest is missing or whose files
do not have the recorded sizes and contents is rebuilt, never used.

Training pairs with an empty side or more than ``max_tokens_per_sentence`` pieces are dropped when the
corpus is prepared; the limits that depend on the model and the batch (the architecture's max_positions,
:func:`model_positions`; ``train.batch_tokens``) are applied when a run loads it, on the length arrays
(:func:`load_corpus`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ...base import atomic
from ...base.errors import UserError
from ..config.config import Config
from .builds import remove_stale_builds, stoppable_build
from .corpus_id import fingerprint, split_file

FORMAT_VERSION = 1
# The tokenizer's construction in data.train_tokenizer: bump when it changes (a new cache is built).
TOKENIZER_SETTINGS = "bpe;nfkc,ws-fold,strip;metaspace+punct-isolated;specials=pad,s,/s,unk;v1"
CHUNK = 20_000  # sentences per encode_batch call (the tokenizers library parallelises inside a call)


# --------------------------------------------------------------------------------------------- the key
def cache_root(cfg: Config) -> Path:
    """``data.cache_dir``, or by default ``data-cache`` beside the results folder (so results folders hold
    runs only, and several results folders under one parent share their prepared corpora)."""
    d = cfg.data
    if d.cache_dir:
        return Path(d.cache_dir).expanduser().absolute()
    return Path(cfg.run.results_dir).expanduser().absolute().parent / "data-cache"


def splits_of(cfg: Config) -> dict[str, tuple[str, int | None]]:
    """Our split role -> (the corpus's split name, pair limit)."""
    d = cfg.data
    out = {"train": (d.train_split, d.max_train_pairs), "dev": (d.dev_split, d.max_dev_pairs)}
    if d.test_split:
        out["test"] = (d.test_split, d.max_test_pairs)
    return out


def file_stats(cfg: Config) -> dict:
    """{file name: [size, mtime in ns]} of the local corpus's files the config reads."""
    d, files = cfg.data, {}
    for name, _ in splits_of(cfg).values():
        for lang in (d.src_lang, d.tgt_lang):
            st = (f := split_file(Path(d.path).expanduser().resolve(), name, lang)).stat()
            files[f.name] = [st.st_size, st.st_mtime_ns]
    return files


def cache_key(cfg: Config) -> dict:
    """Everything that decides the token ids, as a JSON-able dict (local files: their folder and their content
    identity, :func:`~.corpus_id.fingerprint`: an edit is another corpus even where it keeps the files' sizes and
    modification times; each file's size and mtime where the files cannot be read). The key of earlier versions,
    which the prepared corpora and run folders they made record: :func:`~..runs.upgrade.corpus_by_stats_key`."""
    import tokenizers

    d = cfg.data
    key: dict = {"format": FORMAT_VERSION, "tokenizer": TOKENIZER_SETTINGS, "tokenizers": tokenizers.__version__,
                 "source": d.source, "src_lang": d.src_lang, "tgt_lang": d.tgt_lang,
                 "splits": {role: [name, limit] for role, (name, limit) in splits_of(cfg).items()},
                 "vocab_size": d.vocab_size, "tokenizer_min_frequency": d.tokenizer_min_frequency,
                 "max_tokens_per_sentence": d.max_tokens_per_sentence}
    if d.source == "local":
        key["path"] = str(Path(d.path).expanduser().resolve())
        identity = fingerprint(d)
        if identity is None:  # a file missing (split_file says which) or unreadable: by its size and mtime
            key["files"] = file_stats(cfg)
        else:
            key["corpus"] = identity
    else:  # the Hub: datasets' own cache keeps the revision it downloaded
        key["hub_name"], key["hub_config"] = d.hub_name, d.hub_config
    return key


def key_hash(key: dict) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir(cfg: Config, key: dict | None = None) -> Path:
    key = key or cache_key(cfg)
    d = cfg.data
    stem = Path(key["path"]).name if d.source == "local" else str(d.hub_name).replace("/", "_")
    return cache_root(cfg) / f"{stem}.{d.src_lang}-{d.tgt_lang}-{key_hash(key)}"


# ------------------------------------------------------------------------------------------- checking
def digest(path: Path) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_folder(folder: Path) -> dict | None:
    """The manifest of a complete prepared corpus, or None if it is missing, incomplete or damaged: every file
    must have its recorded size and content (SHA-256), so an edit that keeps a file's size is caught too."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        for name, size in manifest["files"].items():
            if (folder / name).stat().st_size != size:
                return None
        for name, want in (manifest.get("digests") or {}).items():
            if digest(folder / name) != want:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def status(cfg: Config) -> tuple[Path, bool]:
    """(the folder of this config's prepared corpus, whether it is complete)."""
    folder = cache_dir(cfg)
    return folder, check_folder(folder) is not None


# ------------------------------------------------------------------------------------------- building
def _raw_split(cfg: Config, name: str, limit: int | None) -> tuple[list[str], list[str]]:
    from .data import load_split, read_parallel

    d = cfg.data
    if d.source == "local":  # straight from the files: no Arrow copy of a multi-GB corpus
        src, tgt = read_parallel(d.path, name, d.src_lang, d.tgt_lang)
        if limit is not None:
            del src[limit:], tgt[limit:]
        return src, tgt
    ds = load_split(cfg, name, limit)
    return list(ds["src"]), list(ds["tgt"])


def _encode(tokenizer, lines: list[str], dtype, bar) -> tuple[np.ndarray, np.ndarray]:
    """Flat ids and offsets of ``lines``, encoded CHUNK at a time (parallel inside each call)."""
    from itertools import chain

    offsets = np.zeros(len(lines) + 1, dtype=np.int64)
    parts = []
    for a in range(0, len(lines), CHUNK):
        ids = [e.ids for e in tokenizer.encode_batch(lines[a:a + CHUNK], add_special_tokens=False)]
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        offsets[a + 1:a + 1 + len(ids)] = lens
        parts.append(np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lens.sum())))
        if bar is not None:
            bar.update(len(ids))
    np.cumsum(offsets, out=offsets)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)), offsets


def _save(folder: Path, name: str, array: np.ndarray) -> None:
    np.save(folder / name, array, allow_pickle=False)


def build(cfg: Config, folder: Path, key: dict, progress: bool = True) -> dict:
    """Read, train the vocabulary, encode and write every split into ``folder`` (a fresh temporary folder)."""
    from tqdm import tqdm

    from .data import train_tokenizer

    d = cfg.data
    started = time.time()
    raw = {role: _raw_split(cfg, name, limit) for role, (name, limit) in splits_of(cfg).items()}
    say = (lambda m: print(f"ltfm prepare: {m}", file=sys.stderr, flush=True))  # noqa: E731 (one line per stage, always)
    n_train = len(raw["train"][0])
    say(f"read {', '.join(f'{r} {len(s):,}' for r, (s, _) in raw.items())} pairs; training the BPE vocabulary "
        f"({d.vocab_size} pieces) on {2 * n_train:,} sentences")
    stages = {"read_s": round(time.time() - started, 1)}
    tokenizer = train_tokenizer(raw["train"][0] + raw["train"][1], d.vocab_size, d.tokenizer_min_frequency)
    stages["bpe_s"] = round(time.time() - started - stages["read_s"], 1)
    tokenizer.save(str(folder / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    total = sum(2 * len(s) for s, _ in raw.values())
    bar = tqdm(total=total, desc="ltfm prepare: encoding", unit=" sentences", unit_scale=True, file=sys.stderr,
               disable=not progress, mininterval=1.0)
    counts: dict = {}
    try:  # the bar is closed whatever happens, so that an error line starts a line of its own
        for role, (src, tgt) in raw.items():
            s_ids, s_off = _encode(tokenizer, src, dtype, bar)
            t_ids, t_off = _encode(tokenizer, tgt, dtype, bar)
            info = {"name": splits_of(cfg)[role][0], "read_pairs": len(src)}
            if role == "train":  # drop what no model could train on; model/batch limits come at load time
                s_len, t_len = np.diff(s_off), np.diff(t_off)
                limit = d.max_tokens_per_sentence
                keep = (s_len > 0) & (t_len > 0) & (s_len <= limit) & (t_len <= limit)
                info["skipped_pairs"] = int((~keep).sum())
                if not keep.all():
                    s_ids, s_off = _select(s_ids, s_off, keep)
                    t_ids, t_off = _select(t_ids, t_off, keep)
            else:  # dev/test: every pair, with its text for BLEU
                for side, lines in (("src", src), ("tgt", tgt)):
                    # a Hub sentence may hold a line break: one line per sentence keeps the file line-aligned
                    (folder / f"{role}.{side}.txt").write_text("".join(x.replace("\n", " ") + "\n" for x in lines),
                                                               encoding="utf-8")
            info["pairs"] = len(s_off) - 1
            info["src_tokens"], info["tgt_tokens"] = int(s_off[-1]), int(t_off[-1])
            for side, ids, off in (("src", s_ids, s_off), ("tgt", t_ids, t_off)):
                _save(folder, f"{role}.{side}.ids.npy", ids)
                _save(folder, f"{role}.{side}.offsets.npy", off)
            counts[role] = info
    finally:
        bar.close()
    stages["encode_s"] = round(time.time() - started - stages["read_s"] - stages["bpe_s"], 1)
    if counts["train"]["pairs"] == 0:
        raise UserError(f"no training pair has 1..{d.max_tokens_per_sentence} pieces on both sides: "
                        f"check the data files or raise data.max_tokens_per_sentence")
    import tokenizers
    manifest = {"hash": key_hash(key), "key": key, "format": FORMAT_VERSION, "tokenizers": tokenizers.__version__,
                "numpy": np.__version__, "vocab_size": vocab, "dtype": np.dtype(dtype).name, "splits": counts,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "build_time_s": round(time.time() - started, 1),
                "stages": stages, "cpus": os.cpu_count(),
                "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir())},
                "digests": {p.name: digest(p) for p in sorted(folder.iterdir())}}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _select(ids: np.ndarray, offsets: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sentences of a flat array where ``keep`` is true, vectorised."""
    lens = np.diff(offsets)
    mask = np.repeat(keep, lens)
    new_off = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(lens[keep], out=new_off[1:])
    return ids[mask], new_off


def prepare(cfg: Config, progress: bool = True, rebuild: bool = False) -> tuple[Path, dict]:
    """The folder and manifest of this config's prepared corpus, built first if it is missing or damaged
    (one line per stage on stderr; ``progress`` adds a progress bar of the encoding).

    Concurrent callers (sweep workers, the ranks of one run) serialise on a lock file: one builds, the
    others wait and then find it complete. Killed builds' leftovers are removed (:func:`~.builds.remove_stale_builds`).
    """
    from filelock import FileLock

    key = cache_key(cfg)
    folder = cache_dir(cfg, key)
    manifest = None if rebuild else check_folder(folder)
    if manifest is not None:
        remove_stale_builds(folder.parent)
        return folder, manifest
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            manifest = None if rebuild else check_folder(folder)  # another process may have built it meanwhile
            if manifest is not None:
                return folder, manifest
            remove_stale_builds(folder.parent, holding=folder)
            if folder.exists() or folder.is_symlink():
                print(f"ltfm prepare: {folder} is incomplete or damaged: rebuilding it", file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
            tmp = folder.parent / f".{folder.name}.tmp{os.getpid()}"
            with stoppable_build():
                tmp.mkdir()
                try:
                    manifest = build(cfg, tmp, key, progress)
                    os.replace(tmp, folder)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:  # a full, read-only or quota-bound disk: the user's to fix
        why = e.strerror or (str(e).splitlines()[0] if str(e) else e.__class__.__name__)
        raise UserError(f"cannot write the prepared corpus in {folder.parent} ({why}; "
                        f"{atomic.free_space(folder.parent)} free): free space there, or set data.cache_dir to a "
                        "folder you can write") from None
    print(f"ltfm prepare: {folder} ({manifest['splits']['train']['pairs']:,} training pairs, "
          f"vocabulary {manifest['vocab_size']}, {manifest['build_time_s']} s)", file=sys.stderr)
    return folder, manifest


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# -------------------------------------------------------------------------------------------- loading
class MappedPairs:
    """Pairs of a prepared split, read from its memory-mapped arrays.

    ``rows`` picks and orders the split's pairs; item i is (i, source ids, target ids) as Python lists,
    made when a batch asks for it. ``max_len`` cuts longer sentences (dev: the documented truncation).
    """

    def __init__(self, folder: Path, role: str, rows: np.ndarray | None = None, max_len: int | None = None):
        self.folder, self.role = Path(folder), role
        self._open()
        n = len(self.src_off) - 1
        self.rows = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        self.max_len = max_len

    def _open(self) -> None:
        folder, role = self.folder, self.role

        def arr(name):
            return np.load(folder / f"{role}.{name}.npy", mmap_mode="r")
        self.src_ids, self.src_off = arr("src.ids"), np.asarray(arr("src.offsets"))
        self.tgt_ids, self.tgt_off = arr("tgt.ids"), np.asarray(arr("tgt.offsets"))

    def __getstate__(self):  # DataLoader workers started by spawn map the files again rather than copy them
        return {k: v for k, v in self.__dict__.items() if k not in ("src_ids", "src_off", "tgt_ids", "tgt_off")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open()

    def __len__(self):
        return len(self.rows)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        s, t = np.diff(self.src_off)[self.rows], np.diff(self.tgt_off)[self.rows]
        if self.max_len is not None:
            s, t = np.minimum(s, self.max_len), np.minimum(t, self.max_len)
        return s, t

    def widths(self) -> tuple[np.ndarray, np.ndarray]:
        """Padded tensor widths (length + BOS or EOS), as the sampler takes them."""
        s, t = self.lengths()
        return s + 1, t + 1

    def _get(self, ids, off, r) -> list[int]:
        a, b = int(off[r]), int(off[r + 1])
        if self.max_len is not None:
            b = min(b, a + self.max_len)
        return ids[a:b].tolist()

    def __getitem__(self, i):
        r = int(self.rows[i])
        return i, self._get(self.src_ids, self.src_off, r), self._get(self.tgt_ids, self.tgt_off, r)

    def ids(self, side: str) -> list[list[int]]:
        """All ids of one side as lists (tests and small sets only)."""
        ids, off = (self.src_ids, self.src_off) if side == "src" else (self.tgt_ids, self.tgt_off)
        return [self._get(ids, off, int(r)) for r in self.rows]


def read_text(folder: Path, role: str, side: str) -> list[str]:
    from .data import read_lines
    return read_lines(folder / f"{role}.{side}.txt")


def model_positions(cfg: Config) -> int:
    """The longest sequence (BOS or EOS included) the chosen architecture takes: its section's max_positions
    (``model.``, ``rnn.``), else its model's, built on the meta device (no memory, no time)."""
    import torch

    from ...model import registry
    own = getattr(registry.arch_config(cfg.model), "max_positions", None)
    with torch.device("meta"):
        return int(own or registry.build_model(cfg.model, cfg.data.vocab_size).max_positions)


class Corpus:
    """What a run uses of a prepared corpus: vocabulary, training pairs after the model's and batch's
    length limits, dev pairs (truncated to the same limit), and the dev/test text for BLEU.

    Length rule (training, dev and test alike): a sentence may have at most
    ``min(data.max_tokens_per_sentence, max_positions - 1, train.batch_tokens - 1)`` pieces (one
    position goes to BOS/EOS). Training pairs over it are skipped (``skipped_train_pairs``); dev pairs
    over it are truncated to it for the dev loss (``truncated_dev_pairs``), and BLEU sources are cut to
    the model's positions by the decoder while references stay whole (``truncated_test_pairs``): the
    dev and test sets keep every sentence, so their BLEU stays comparable.
    """

    def __init__(self, cfg: Config, progress: bool | None = None):
        from tokenizers import Tokenizer

        d = cfg.data
        show = cfg.train.progress_bar if progress is None else progress
        self.folder, self.manifest = prepare(cfg, progress=show)
        self.hash, self.identity = self.manifest["hash"], fingerprint(d)  # the corpus by its content (run ids)
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.vocab_size = self.tokenizer.get_vocab_size()
        positions = model_positions(cfg)
        self.limit = min(d.max_tokens_per_sentence, positions - 1, cfg.train.batch_tokens - 1)
        full = MappedPairs(self.folder, "train")
        s, t = full.lengths()
        keep = np.flatnonzero((s <= self.limit) & (t <= self.limit))
        if len(keep) == 0:
            raise UserError(f"no training pair fits data.max_tokens_per_sentence={d.max_tokens_per_sentence}, "
                            f"the model's max_positions={positions} and "
                            f"train.batch_tokens={cfg.train.batch_tokens}: raise them")
        self.skipped = self.manifest["splits"]["train"]["skipped_pairs"] + len(s) - len(keep)
        self.train = MappedPairs(self.folder, "train", rows=keep)
        self.dev = MappedPairs(self.folder, "dev", max_len=self.limit)
        self.truncated = {}
        for role in ("dev", "test"):
            if role in self.manifest["splits"]:
                ls, lt = MappedPairs(self.folder, role).lengths()
                self.truncated[role] = int(((ls > self.limit) | (lt > self.limit)).sum())
        self.dev_raw = {"src": read_text(self.folder, "dev", "src"), "tgt": read_text(self.folder, "dev", "tgt")}
        self.test_raw = ({"src": read_text(self.folder, "test", "src"), "tgt": read_text(self.folder, "test", "tgt")}
                         if "test" in self.manifest["splits"] else None)

    def summary(self) -> dict:
        """What summary.json records about the data."""
        out = {"data_cache": str(self.folder), "data_cache_hash": self.hash, "train_pairs": len(self.train),
               "skipped_train_pairs": self.skipped, "length_limit": self.limit, "corpus": self.identity}
        out.update({f"truncated_{role}_pairs": n for role, n in self.truncated.items()})
        return out

    def use_in_run(self, run_dir: Path, write: bool) -> None:
        """A run folder keeps a copy of the vocabulary it was trained with. On resume that copy must be the
        prepared corpus's: ids from another vocabulary would feed the model the wrong embeddings."""
        path = run_dir / "tokenizer.json"
        ours = (self.folder / "tokenizer.json").read_bytes()
        if path.is_file():
            if path.read_bytes() != ours:
                raise UserError(f"{path} differs from the prepared corpus's vocabulary ({self.folder}): the run was "
                                f"trained with another vocabulary and cannot resume on this one; start a new run "
                                f"(another run.id or run.results_dir) or restore the data that run was prepared from")
        elif write:
            atomic.write_bytes(path, ours)

