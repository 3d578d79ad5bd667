"""A run folder is trained on only with the corpus it trained on, and says what differs as the folder has it: a
folder of the legacy run id (which recorded no content identity) is not continued on a changed corpus; a prepared
corpus is keyed by the files' content, not their size and modification time; a refusal shows the saved value of a
key the hash leaves out at its default (issue #52, items 3, 4 and 9)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids
from lightning_tfm.training.config.config import load_config
from lightning_tfm.training.runs import upgrade

from conftest import SMOKE

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


def legacy(run: Path, cfg) -> Path:
    """The run folder ``run`` (trained by this version) as an earlier version left it: named by the legacy run id,
    its summary without the corpus's content identity, its prepared corpus keyed by the files' sizes and mtimes."""
    from lightning_tfm.training.data import corpus as K

    summary = json.loads((run / "summary.json").read_text())
    old_key = upgrade.corpus_by_stats_key(cfg)
    cache = Path(summary["data_cache"])
    manifest = json.loads((cache / "manifest.json").read_text())
    (cache / "manifest.json").write_text(json.dumps({**manifest, "key": old_key, "hash": K.key_hash(old_key)}))
    summary = {k: v for k, v in summary.items() if k != "corpus"}
    (run / "summary.json").write_text(json.dumps({**summary, "data_cache_hash": K.key_hash(old_key)}))
    return run.rename(run.parent / upgrade.legacy_id(cfg))


def test_a_legacy_folder_is_not_continued_on_a_changed_corpus(tmp_path, ltfm_here):
    """Item 3: a folder of the legacy run id, one line of val.de changed, the same ``ltfm train`` with more steps:
    the run starts afresh in its own folder (the legacy one untouched); unchanged, it continues the folder. With
    run.id naming the folder, it is refused naming the corpus."""
    data, results = corpus(tmp_path / "c"), tmp_path / "results"
    args = [SMOKE, f"data.path={data}", f"run.results_dir={results}", *TINY]
    p = ltfm_here("train", *args)
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = load_config(SMOKE, args[1:])
    old = legacy(results / run_ids.run_id(cfg), cfg)
    shown = ltfm_here("config", *args)
    assert shown.returncode == 0 and shown.stdout.startswith(f"# run id: {old.name} "), shown.stdout[:300]

    (data / "val.de").write_text((data / "val.de").read_text().replace("satz 3", "satz three"))
    before = {f.name: f.stat().st_mtime_ns for f in old.iterdir()}
    p = ltfm_here("train", *args, "train.max_steps=4")
    assert p.returncode == 0, p.stderr[-3000:]
    edited = load_config(SMOKE, [*args[1:], "train.max_steps=4"])
    fresh = results / run_ids.run_id(edited)
    assert fresh != old and json.loads((fresh / "summary.json").read_text())["steps"] == 4
    assert {f.name: f.stat().st_mtime_ns for f in old.iterdir()} == before
    assert json.loads((old / "summary.json").read_text())["steps"] == 2
    refused = ltfm_here("train", *args, "train.max_steps=4", f"run.id={old.name}")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "differing in data.corpus (val.de changed since the run there, sha256:" in refused.stderr, refused.stderr


def test_a_legacy_folder_whose_prepared_corpus_is_gone_is_judged_by_its_hash(tmp_path, ltfm_here):
    """Item 3, a sibling: the prepared corpus the legacy run recorded is gone; its recorded hash (of the files'
    sizes and mtimes) still tells a changed corpus from the same one."""
    import shutil

    data, results = corpus(tmp_path / "c"), tmp_path / "results"
    args = [SMOKE, f"data.path={data}", f"run.results_dir={results}", *TINY]
    assert ltfm_here("train", *args).returncode == 0
    cfg = load_config(SMOKE, args[1:])
    old = legacy(results / run_ids.run_id(cfg), cfg)
    shutil.rmtree(tmp_path / "data-cache")
    assert ltfm_here("config", *args).stdout.startswith(f"# run id: {old.name} ")
    (data / "train.en").write_text((data / "train.en").read_text() + "one more line\n")
    (data / "train.de").write_text((data / "train.de").read_text() + "noch eine zeile\n")
    shown = ltfm_here("config", *args)
    assert shown.returncode == 0 and shown.stdout.startswith(f"# run id: {run_ids.run_id(cfg)} "), shown.stdout[:300]
    assert run_ids.run_id(cfg) != old.name


def test_a_prepared_corpus_is_not_reused_after_an_edit_that_keeps_size_and_mtime(tmp_path, ltfm_here):
    """Item 4: ``ltfm prepare``, then a same-size edit of val.de with its mtime restored: the next ``ltfm prepare``
    builds the edited corpus (its dev text is the new one), not the old one found by size and mtime."""
    data, results = corpus(tmp_path / "c"), tmp_path / "results"
    args = [SMOKE, f"data.path={data}", f"run.results_dir={results}", *TINY]
    p = ltfm_here("prepare", *args)
    assert p.returncode == 0, p.stderr[-2000:]
    (first,) = (tmp_path / "data-cache").glob("c.*[0-9a-f]")
    again = ltfm_here("prepare", *args)
    assert again.returncode == 0 and sorted((tmp_path / "data-cache").glob("c.*[0-9a-f]")) == [first]
    same_size_edit(data / "val.de")
    p = ltfm_here("prepare", *args)
    assert p.returncode == 0, p.stderr[-2000:]
    (second,) = set((tmp_path / "data-cache").glob("c.*[0-9a-f]")) - {first}
    assert "satz 9" in (second / "dev.tgt.txt").read_text().splitlines()[3]
    assert "satz 3" in (first / "dev.tgt.txt").read_text().splitlines()[3]
