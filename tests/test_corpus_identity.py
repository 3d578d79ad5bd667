"""A run folder is trained on only with the corpus it trained on, and says what differs as the folder has it: a
folder of the legacy run id (which recorded no content identity) is not continued on a changed corpus; a prepared
corpus is keyed by the files' content, not their size and modification time; a refusal shows the saved value of a
key the hash leaves out at its default (issue #52, items 3, 4 and 9)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import SMOKE
from lightning_tfm.training.config import config, run_id as run_ids
from lightning_tfm.training.config.config import load_config

TINY = ["train.max_steps=2", "train.val_every_steps=2", "train.checkpoint_every_steps=2", "train.log_every_steps=1",
        "data.vocab_size=60", "model.layers=1", "model.d_model=16", "model.d_ff=16", "model.heads=2", "model.d_k=8",
        "model.d_v=8", "train.batch_tokens=256", "decode.beam_size=1", "decode.max_len_b=3", "train.threads=1",
        "data.test_split=null", "wandb.mode=disabled"]


def corpus(folder: Path, lines: int = 12) -> Path:
    """A tiny corpus as the smoke experiment reads it (train and val, en and de)."""
    folder.mkdir(parents=True)
    for split in ("train", "val"):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text("".join(f"{split} {lang} satz {i} wort\n" for i in range(lines)))
    return folder


def same_size_edit(path: Path) -> None:
    """One line of ``path`` changed, its size and modification time kept (as ``cp -p``, ``rsync -t`` restore them)."""
    st = path.stat()
    text = path.read_text()
    path.write_text(text.replace("satz 3", "satz 9", 1))
    assert path.stat().st_size == st.st_size and path.read_text() != text
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_refusal_shows_the_value_the_folder_saved(tmp_path, ltfm_here):
    """Item 9: model.activation (a key hashed only off its default) saved as relu: the refusal says relu there."""
    data, results = corpus(tmp_path / "c"), tmp_path / "results"
    args = [f"data.path={data}", f"run.results_dir={results}", "run.id=mine"]
    saved = load_config(SMOKE, args)
    folder = results / "mine"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config.saved_yaml(saved))
    assert "activation: relu" in (folder / "config.yaml").read_text()
    p = ltfm_here("train", SMOKE, *args, "model.activation=gelu")
    assert p.returncode == 2 and "model.activation (relu there, gelu asked)" in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    # a saved config that predates the key: its default is what that run trained with
    tree = saved.to_dict()
    del tree["model"]["activation"]
    (folder / "config.yaml").write_text(config.dump_yaml(tree))
    p = ltfm_here("train", SMOKE, *args, "model.activation=gelu")
    assert p.returncode == 2 and "model.activation (relu there, gelu asked)" in p.stderr, p.stderr
    assert sorted(x.name for x in folder.iterdir()) == ["config.yaml"]
