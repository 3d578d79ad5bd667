"""Run folders named after their row: a sweep trial's run id is ``<sweep>-<variant>-s<seed>-<hash>``, a plain
``ltfm train`` keeps ``<run.name>-<hash>``, and a sweep finds an earlier run of the same config under another name
(the name every trial had before, ``<run.name>-<hash>``; another sweep's row defined the same way) and trains on
there instead of training again. Run ids survive growth (training/config/run_id.py): a new key at its default renames no
folder, the corpus is hashed by its content (its folder by the legacy id, whose folders are still continued), and
the committed reference exports' run names are reproduced and found. The slow tests run real smoke-scale sweeps
(``ltfm sweep``, a few seconds a trial).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import optuna
import pytest

from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids
from lightning_tfm.training.config.config import load_config
from lightning_tfm.training.config.run_id import config_hash, run_id
from lightning_tfm.training.runs import run_folder, upgrade
from lightning_tfm.training.runs.run_folder import existing_run_id

from conftest import ROOT, SMOKE, ltfm, write_sweep

NO_WANDB = {"WANDB_MODE": "disabled"}  # the W&B run costs seconds per trial; the names are what is tested here


def trial_cfg(results: Path, **overrides) -> config.Config:
    """A config as a sweep trial of row B1 (seed 3) of sweep ``rows`` has it."""
    return load_config(SMOKE, {"data.path": "/x", "run.results_dir": str(results), "run.study": "rows",
                               "run.variant": "B1", "run.family": "B", "run.seed": 3, **overrides})


def write_run(folder: Path, cfg: config.Config, steps: int | None = 10) -> Path:
    """A run folder as ``ltfm train`` leaves it: its config.yaml and (unless ``steps`` is None) its summary."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config.saved_yaml(cfg))
    if steps is not None:
        (folder / "summary.json").write_text(json.dumps({"run_id": folder.name, "status": "completed",
                                                         "steps": steps}))
    return folder


# ------------------------------------------------------------------------------------------------------------
# The names (no training)
# ------------------------------------------------------------------------------------------------------------
def test_a_trial_is_named_after_its_row_and_seed_and_a_plain_run_keeps_its_id(tmp_path):
    cfg = trial_cfg(tmp_path)
    digest = config_hash(cfg)
    assert run_id(cfg) == f"rows-B1-s3-{digest}"
    # the same config outside a sweep: the same hash (the bookkeeping is not hashed), the plain name
    plain = load_config(SMOKE, {"data.path": "/x", "run.results_dir": str(tmp_path), "run.seed": 3})
    assert run_id(plain) == f"multi30k-smoke-{digest}"
    assert run_id(load_config(SMOKE, ["data.path=/x"])) == "multi30k-smoke-9e45a369"  # pinned by test_config too
    # another config is another folder; run.id, when set, is the folder
    assert run_id(trial_cfg(tmp_path, **{"model.heads": 2})) not in (run_id(cfg), f"rows-B1-s3-{digest}")
    assert run_id(trial_cfg(tmp_path, **{"run.seed": 4})).startswith("rows-B1-s4-")
    assert run_id(trial_cfg(tmp_path, **{"run.id": "mine"})) == "mine"


@pytest.mark.parametrize("study,variant", [("my sweep/../x", "a:b\\c"), ("..", "~v"), ("-s", ".hidden")])
def test_odd_study_and_variant_names_still_make_one_plain_folder_name(tmp_path, study, variant):
    cfg = trial_cfg(tmp_path, **{"run.study": study, "run.variant": variant})  # validated: check_run_id passes
    rid = run_id(cfg)
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*-[A-Za-z0-9_][A-Za-z0-9._-]*-s3-[0-9a-f]{8}", rid), rid
    assert (tmp_path / rid).parent == tmp_path


def test_an_earlier_run_of_the_same_config_under_another_name_is_found(tmp_path):
    cfg = trial_cfg(tmp_path)
    own, digest = run_id(cfg), config_hash(cfg)
    legacy = f"multi30k-smoke-{digest}"
    assert existing_run_id(cfg) == own  # nothing yet: its own name
    write_run(tmp_path / f"impostor-{digest}", trial_cfg(tmp_path, **{"model.heads": 2}), steps=50)
    write_run(tmp_path / legacy, cfg, steps=None)  # a config.yaml alone holds no run
    assert existing_run_id(cfg) == own
    (tmp_path / legacy / "checkpoints").mkdir()
    (tmp_path / legacy / "checkpoints" / "last.ckpt").write_bytes(b"")  # a checkpoint is a run
    assert existing_run_id(cfg) == legacy
    # of several, the one trained furthest: here another sweep's row of the same config (as
    # sweeps/table3-cpu-continued.yaml's rows are sweeps/table3-cpu.yaml's), with its own budget
    protocol = trial_cfg(tmp_path, **{"run.study": "protocol", "train.max_steps": 30})
    write_run(tmp_path / run_id(protocol), protocol, steps=30)
    assert run_id(protocol) == f"protocol-B1-s3-{digest}" and existing_run_id(cfg) == run_id(protocol)
    # its own folder holding a run comes first
    write_run(tmp_path / own, cfg, steps=5)
    assert existing_run_id(cfg) == own
    assert existing_run_id(trial_cfg(tmp_path, **{"run.id": "mine"})) == "mine"


def test_a_folder_being_trained_now_is_a_run(tmp_path):
    cfg = trial_cfg(tmp_path)
    legacy = write_run(tmp_path / f"multi30k-smoke-{config_hash(cfg)}", cfg, steps=None)
    assert existing_run_id(cfg) == run_id(cfg)
    with run_folder.RunLock(legacy, legacy.name):  # its first attempt has not written its summary yet
        assert existing_run_id(cfg) == legacy.name
    assert existing_run_id(cfg) == run_id(cfg)


# ------------------------------------------------------------------------------------------------------------
# Run ids that survive growth (#45)
# ------------------------------------------------------------------------------------------------------------
REFERENCE = sorted((ROOT / "reports" / "reference").glob("*/export/*.json"))


def reference_runs(export: Path) -> list[tuple[str, config.Config, dict]]:
    """(run name, config, record) of every run of a committed reference export."""
    records = json.loads(export.read_text())["records"]
    return [(r["run"], config.Config.from_dict(config.unflatten(r["config"]), checked=False), r) for r in records]


def corpus(folder: Path, lines: int = 6, **edit) -> Path:
    """A tiny corpus as the smoke experiment reads it (train, val, test_2016_flickr; en and de); ``edit``:
    {file name: (line, new text)}."""
    folder.mkdir(parents=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            text = [f"{split} {lang} sentence {i}" for i in range(lines)]
            line, new = edit.get(f"{split}.{lang}", (None, None))
            if line is not None:
                text[line] = new
            (folder / f"{split}.{lang}").write_text("\n".join(text) + "\n")
    return folder


@pytest.mark.parametrize("export", REFERENCE, ids=lambda p: p.parent.parent.name)
def test_the_reference_exports_run_names_are_reproduced_and_found(tmp_path, export, request):
    """Every run of a committed reference export keeps its name: its hash is the legacy hash of its config (the
    corpus by its folder) for the runs named before the corpus was identified by its content, else today's hash
    (the corpus by its content, wherever its files are); and a sweep trial of that config finds its folder (built
    from the export: config.yaml and summary.json) whatever the run id now names. Today's hashes need Multi30k's
    own files (the held-out rows': skipped without them)."""
    runs = reference_runs(export)
    assert len(runs) >= 9  # the smallest committed reference (the held-out rows) has 9 runs
    legacy = {}
    for name, cfg, record in runs:
        legacy[name] = name.endswith("-" + upgrade.legacy_hash(cfg))
        if not legacy[name]:  # named by today's code: the same files here give the same content identity
            cfg.data.path = str(request.getfixturevalue("multi30k"))
            assert name == run_ids.run_id(cfg), name
        write_run(tmp_path / name, cfg, steps=record["steps"])
    for name, cfg, _ in runs:
        cfg.run.results_dir = str(tmp_path)
        assert existing_run_id(cfg) == name
        assert run_folder.reuse_problem(cfg, tmp_path / name) is None
        if legacy[name] and run_ids.hashed(cfg).get(run_ids.CORPUS_KEY):  # its id now is another, the folder found
            assert run_ids.run_id(cfg) != name
    # the references made before the corpus's content identity are legacy-named; the held-out exports' and the
    # settled reference's (table3-cpu/, trained from 2026-12-02) are today's
    name = export.parent.parent.name
    assert all(legacy.values()) != (name.startswith("table3-cpu-heldout") or name == "table3-cpu")
    assert any(legacy.values()) == all(legacy.values())


def add_field(monkeypatch, kind: type, name: str, default) -> None:
    """A new field of section dataclass ``kind`` with ``default``, as a later version would add one (every
    instance, made before or after, has it at its default)."""
    import dataclasses

    new = dataclasses.fields(dataclasses.make_dataclass("New", [(name, type(default), dataclasses.field(
        default=default, metadata={"help": "a knob added later"}))]))[0]
    monkeypatch.setitem(kind.__dataclass_fields__, name, new)
    monkeypatch.setitem(kind.__annotations__, name, type(default).__name__)
    monkeypatch.setattr(kind, name, default, raising=False)
    monkeypatch.setattr(config.SCHEMA, "_schemas", {})  # the schema as generated from the fields now


@pytest.mark.parametrize("section,kind", [("train", config.TrainConfig), ("model", config.ModelConfig),
                                          ("data", config.DataConfig)])
def test_a_new_field_at_its_default_changes_no_run_id(tmp_path, monkeypatch, section, kind):
    """A field added with a default that keeps today's behaviour renames no run folder (every reference export's
    run, the smoke run, a trial, the recurrent baseline, the plateau schedule); given another value, it is another
    run; a folder saved before the field existed is still trained on, and a refusal shows the default it trained
    with."""
    small = corpus(tmp_path / "small")
    made = [load_config(SMOKE, [f"data.path={small}"]), load_config(SMOKE, ["data.path=/x"]), trial_cfg(tmp_path),
            load_config(ROOT / "experiments" / "multi30k-rnn-smoke.yaml", ["data.path=/x"]),
            load_config(SMOKE, ["data.path=/x", "train.lr_schedule=plateau", "train.lr=0.001"]),
            *(cfg for export in REFERENCE for _, cfg, _ in reference_runs(export))]
    before = [(run_ids.run_id(c), upgrade.legacy_id(c)) for c in made]
    old = write_run(tmp_path / "old", made[0])  # config.yaml without the new key
    add_field(monkeypatch, kind, "new_knob", 3)
    assert f"{section}.new_knob" in config.flatten(made[0]) and "new_knob" in config.SCHEMA[section]
    assert [(run_ids.run_id(c), upgrade.legacy_id(c)) for c in made] == before
    assert run_folder.reuse_problem(made[0], old) is None and existing_run_id(made[0], others=False) != "old"
    other = load_config(SMOKE, [f"data.path={small}", f"{section}.new_knob=4"])
    assert run_ids.run_id(other) != before[0][0]
    assert run_folder.reuse_problem(other, old) == (f"run folder {old} holds a run of another config, differing in "
                                                    f"{section}.new_knob (3 there, 4 asked): give another "
                                                    f"run.id (or run.results_dir), or delete the folder to train "
                                                    f"there anew")


def test_a_key_removed_from_the_schema_keeps_its_frozen_default(monkeypatch):
    """A key hashed since the first run ids, removed later, is hashed at its frozen default where the config would
    have saved it: the runs trained at its default keep their ids (and a key of an absent section is not added)."""
    cfg = load_config(SMOKE, ["data.path=/x"])
    before = run_ids.digest({**run_ids.hashed(cfg), "train.gone": 0.5})
    monkeypatch.setitem(run_ids.KEYS_V1, "train.gone", 0.5)
    monkeypatch.setitem(run_ids.KEYS_V1, "toy.gone", 1)
    assert run_ids.config_hash(cfg) == before


def test_the_corpus_is_identified_by_its_content_not_its_folder(tmp_path):
    """The same corpus in another folder, or compressed, is the same run; one line changed is another; a corpus
    that cannot be read (not there, the Hub) is hashed by its name as before (the pinned ids: test_config.py)."""
    import gzip

    def rid(folder, *more):
        return run_ids.run_id(load_config(SMOKE, [f"data.path={folder}", *more]))

    a, copy = corpus(tmp_path / "a"), tmp_path / "elsewhere" / "b"
    shutil.copytree(a, copy)
    packed = corpus(tmp_path / "packed")
    for f in packed.iterdir():
        f.with_name(f.name + ".gz").write_bytes(gzip.compress(f.read_bytes()))
        f.unlink()
    edited = corpus(tmp_path / "edited", **{"train.de": (3, "ein anderer Satz")})
    assert rid(a) == rid(copy) == rid(packed) != rid(edited)
    assert rid(a) != rid(a, "model.dropout=0.3") and rid(a) == rid(a, "train.max_steps=7")
    assert len({upgrade.legacy_id(load_config(SMOKE, [f"data.path={f}"])) for f in (a, copy, packed)}) == 3
    # only the files read: the dev and test splits count, another language does not
    assert rid(corpus(tmp_path / "test-edited", **{"test_2016_flickr.en": (0, "x")})) != rid(a)
    (copy / "train.fr").write_text("un\n")
    assert rid(copy) == rid(a)
    # nothing to read: the folder stands for it, as before
    missing = load_config(SMOKE, [f"data.path={tmp_path / 'none'}"])
    assert run_ids.run_id(missing) == upgrade.legacy_id(missing)
    hub = load_config(SMOKE, ["data.source=hub", "data.hub_name=bentrevett/multi30k"], data=False)
    assert run_ids.run_id(hub) == upgrade.legacy_id(hub)


def test_a_legacy_folder_is_continued_and_a_folder_is_checked_by_its_corpus(tmp_path, ltfm_here):
    """``ltfm train`` (and ``ltfm config``'s line) continue a run in the folder of its legacy id when its own holds
    none; a folder's saved config is compared by the corpus's content: a copy elsewhere passes, one line changed
    does not, and a corpus moved away is known by what the run recorded (else its folder is compared)."""
    a, results = corpus(tmp_path / "a"), tmp_path / "results"
    cfg = load_config(SMOKE, [f"data.path={a}", f"run.results_dir={results}"])
    legacy = write_run(results / upgrade.legacy_id(cfg), cfg)
    assert legacy.name != run_ids.run_id(cfg) and existing_run_id(cfg, others=False) == legacy.name
    shown = ltfm_here("config", SMOKE, f"data.path={a}", f"run.results_dir={results}")
    assert shown.returncode == 0 and shown.stdout.startswith(f"# run id: {legacy.name} "), shown.stderr[-2000:]
    done = ltfm_here("train", SMOKE, f"data.path={a}", f"run.results_dir={results}", "train.max_steps=10")
    assert done.returncode == 0 and f"run {legacy.name} is already completed" in done.stderr, done.stderr[-2000:]
    assert sorted(d.name for d in results.iterdir()) == [legacy.name]
    # a legacy folder of another config is not taken: the run starts in its own
    other = load_config(SMOKE, [f"data.path={a}", f"run.results_dir={results}", "model.dropout=0.3"])
    write_run(results / upgrade.legacy_id(other), cfg)
    assert existing_run_id(other, others=False) == run_ids.run_id(other)
    # its own folder, once it holds a run, comes first
    own = write_run(results / run_ids.run_id(cfg), cfg)
    assert existing_run_id(cfg, others=False) == own.name

    copy = tmp_path / "b"
    shutil.copytree(a, copy)
    there = load_config(SMOKE, [f"data.path={copy}", f"run.results_dir={results}"])
    assert run_folder.reuse_problem(there, own) is None
    edited = load_config(SMOKE, [f"data.path={corpus(tmp_path / 'c', **{'val.en': (1, 'x')})}",
                                 f"run.results_dir={results}"])
    assert "differing in data.corpus (sha256:" in run_folder.reuse_problem(edited, own)
    # the corpus the run trained on moved away: what it recorded speaks; without a record, its folder
    summary = json.loads((own / "summary.json").read_text())
    (own / "summary.json").write_text(json.dumps({**summary, "corpus": run_ids.hashed(cfg)[run_ids.CORPUS_KEY]}))
    shutil.rmtree(a)
    assert run_folder.reuse_problem(there, own) is None
    assert run_folder.reuse_problem(edited, own).startswith(f"run folder {own} holds a run of another config, "
                                                             "differing in data.corpus (sha256:")
    (own / "summary.json").write_text(json.dumps(summary))
    assert f"data.path ({a} there, {copy} asked)" in run_folder.reuse_problem(there, own)


def test_the_reference_sweeps_dry_run_continues_its_folders_and_starts_changed_rows_afresh(tmp_path, data_dir,
                                                                                              ltfm_here):
    """``make reference``'s dry run over folders of the committed reference runs (config.yaml and summary.json
    from the export, the corpus at this checkout's data.path): each row continues its folder under its legacy
    name; a row whose folder holds a really changed config starts afresh under its own id."""
    export = ROOT / "reports" / "reference" / "table3-cpu-2026-11-26" / "export" / "table3-cpu.json"
    results, placed = tmp_path / "results", {}
    data_dir = data_dir.resolve()  # as a run's config holds it (config.resolve_paths): ../shared may be a symlink
    for name, cfg, record in reference_runs(export):
        if record["variant"] in ("base", "C1", "big", "E") and record["seed"] == 1:
            cfg.data.path = str(data_dir)
            if str(data_dir) == "/work/shared/data/multi30k":  # where the reference ran: the same names
                assert upgrade.legacy_id(cfg) == name
            changed = record["variant"] == "E"
            if changed:
                cfg.model.dropout = 0.3
            placed[record["variant"]] = (write_run(results / upgrade.legacy_id(cfg), cfg, steps=record["steps"]),
                                         changed)
    dry = ltfm_here("sweep", ROOT / "sweeps" / "table3-cpu.yaml", "--dry-run", "--json", f"data.path={data_dir}",
                    f"run.results_dir={results}")
    assert dry.returncode == 0, dry.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(dry.stdout) if r["seed"] == 1}
    assert len(placed) == 4
    for variant, (folder, changed) in placed.items():
        row = rows[variant]
        if changed:
            assert row["run_id"] != folder.name and row["trained_steps"] is None, row
        else:
            assert row["run_id"] == folder.name and row["trained_steps"] == row["max_steps"], row
    assert all(rows[v]["trained_steps"] is None for v in ("A1", "D1"))


@pytest.mark.slow  # the session's smoke run (one training), then trained on 10 steps from a copy of its corpus
def test_a_trained_run_records_its_corpus_and_trains_on_from_a_copy_of_it(tmp_path, smoke_run, data_dir):
    cfg = load_config(smoke_run / "config.yaml")
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["corpus"] == run_ids.hashed(cfg)[run_ids.CORPUS_KEY] and smoke_run.name == run_ids.run_id(cfg)
    copy, results = tmp_path / "copy", tmp_path / "results"
    shutil.copytree(data_dir, copy)
    shutil.copytree(smoke_run, results / smoke_run.name)
    p = ltfm("train", SMOKE, f"data.path={copy}", f"run.results_dir={results}",
             f"train.max_steps={summary['steps'] + 10}", env=NO_WANDB)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [d.name for d in results.iterdir()] == [smoke_run.name]  # resumed there (the vocabulary rebuilt alike)
    after = json.loads((results / smoke_run.name / "summary.json").read_text())
    assert after["steps"] == summary["steps"] + 10 and after["corpus"] == summary["corpus"]
    assert after["config"]["data"]["path"] == str(copy) and len(after["attempts"]) == 1


# ------------------------------------------------------------------------------------------------------------
# Real sweeps
# ------------------------------------------------------------------------------------------------------------
def sweep(tmp_path: Path, name: str, variants: dict, results: Path, data_dir: Path, *args, storage: str | None = None):
    path = write_sweep(tmp_path / f"{name}.yaml", name, variants)
    p = ltfm("sweep", path, f"data.path={data_dir}", f"run.results_dir={results}", *args,
             *(["--storage", storage] if storage else []), env=NO_WANDB)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    db = storage or f"sqlite:///{results / f'{name}.db'}"
    return p, {(t.user_attrs["variant"], t.user_attrs["seed"]): t
               for t in optuna.load_study(study_name=name, storage=db).get_trials()}


def runs_in(results: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "summary.json").read_text()) for d in results.iterdir()
            if (d / "summary.json").is_file()}


def versions(run_dir: Path) -> int:
    return len(list(run_dir.glob("logs/version_*")))


def run_folders(results: Path) -> set[str]:
    return {d.name for d in results.iterdir() if (d / "config.yaml").is_file()}


@pytest.mark.slow
@pytest.mark.long  # two sweeps (make test-long); make test keeps what it relies on: the lookup of a folder under
# an earlier name (test_an_earlier_run_of_the_same_config_under_another_name_is_found), a legacy folder continued
# through the command (test_a_legacy_folder_is_continued_and_a_folder_is_checked_by_its_corpus) and the reference
# sweep's dry run (test_the_reference_sweeps_dry_run_continues_its_folders_and_starts_changed_rows_afresh)
def test_sweep_folders_are_named_by_row_and_seed_and_runs_under_their_old_names_are_taken_over(tmp_path, data_dir,
                                                                                               ltfm_here):
    """A sweep names its folders by row and seed; renamed as the version that named every trial
    ``<run.name>-<hash>`` left them, they are taken over by a re-run of the sweep (on a fresh study: the old one
    would not queue its finished rows at all), the finished one as done, the unfinished one resumed. (Another
    sweep's row of the same config, as sweeps/table3-cpu-continued.yaml's, is found the same way:
    test_an_earlier_run_of_the_same_config_under_another_name_is_found.)"""
    results = tmp_path / "results"
    rows = {"base": {}, "D1": {"model.dropout": 0.0, "seeds": [2]}}
    _, trials = sweep(tmp_path, "rows", rows, results, data_dir, "train.max_steps=10")
    runs = runs_in(results)
    assert sorted(re.sub(r"-[0-9a-f]{8}$", "", n) for n in runs) == ["rows-D1-s2", "rows-base-s1"]
    for name, summary in runs.items():
        assert name.endswith(f"-{config_hash(load_config(results / name / 'config.yaml'))}")
        assert summary["run_id"] == name and summary["status"] == "completed"
        a = trials[(summary["config"]["run"]["variant"], summary["config"]["run"]["seed"])].user_attrs
        assert a["run_id"] == name and Path(a["run_dir"]).name == name
    listed = ltfm_here("runs", results)
    assert listed.returncode == 0 and all(name in listed.stdout for name in runs), listed.stdout
    by_row = {re.sub(r"-[0-9a-f]{8}$", "", n): results / n for n in runs}

    # both folders as the earlier version named them
    legacy = {}
    for row in ("rows-base-s1", "rows-D1-s2"):
        new = by_row[row]
        old = results / f"multi30k-smoke-{config_hash(load_config(new / 'config.yaml'))}"
        shutil.move(new, old)
        summary = json.loads((old / "summary.json").read_text())
        (old / "summary.json").write_text(json.dumps({**summary, "run_id": old.name, "run_dir": str(old)}))
        legacy[row] = old
    finished_at = json.loads((legacy["rows-base-s1"] / "summary.json").read_text())["finished_at"]
    before = run_folders(results)

    rows["D1"]["budget"] = 2  # D1 unfinished at the new budget (20 steps); base finished (10)
    p, again = sweep(tmp_path, "rows", rows, results, data_dir, "train.max_steps=10",
                     storage=f"sqlite:///{tmp_path / 'fresh.db'}")
    assert run_folders(results) == before  # no folder of its own for a row that has one under the old name
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in again.values()), p.stdout
    base, d1 = again[("base", 1)], again[("D1", 2)]
    assert Path(base.user_attrs["run_dir"]) == legacy["rows-base-s1"]
    assert Path(d1.user_attrs["run_dir"]) == legacy["rows-D1-s2"]
    # base: done, not trained again
    summary = json.loads((legacy["rows-base-s1"] / "summary.json").read_text())
    assert summary["finished_at"] == finished_at and versions(legacy["rows-base-s1"]) == 1
    assert "already completed" in Path(base.user_attrs["log"]).read_text()
    assert base.value == pytest.approx(summary["dev_loss"])
    # D1: resumed from its step-10 checkpoint in its folder, to 20 steps; its trial process trained there
    summary = json.loads((legacy["rows-D1-s2"] / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["status"] == "completed" and versions(legacy["rows-D1-s2"]) == 2
    assert sorted(d1.intermediate_values) == [10, 20]
    assert load_config(legacy["rows-D1-s2"] / "config.yaml").run.id == legacy["rows-D1-s2"].name


# The keys run_id.py listed as left out of the hash (NOT_HASHED) before each field said it itself (knob(...,
# hashed=False); a whole section: Section.HASHED): the historical record the fields must keep, since a key moved in
# or out of the hash renames every run folder.
NOT_HASHED_BEFORE = {"run.id", "run.results_dir", "run.variant", "run.family", "run.study", "train.progress_bar",
                     "train.max_steps", "train.max_time_minutes", "decode.batch_sentences",
                     "train.num_workers", "train.threads", "train.fused_loss", "train.record_batches",
                     "model.attention_kernel", "model.fast_dropout", "data.cache_dir", "wandb", "sweep",
                     "train.checkpoint_every_seconds"}


def test_the_keys_left_out_of_the_hash_are_said_on_their_fields_as_they_were_listed():
    assert config.NOT_HASHED == NOT_HASHED_BEFORE
    for path in (SMOKE, ROOT / "experiments" / "multi30k-rnn-smoke.yaml"):  # an architecture's own section too
        cfg = load_config(path, checked=False)
        assert run_ids.not_hashed(cfg) == NOT_HASHED_BEFORE, path
        changed = load_config(path, ["train.max_steps=7", "wandb.project=other", "model.fast_dropout=false",
                                     "run.results_dir=elsewhere"], checked=False)
        assert run_ids.config_hash(changed) == run_ids.config_hash(cfg)


def test_one_rule_says_which_keys_a_saved_config_holds():
    """run_id.was_saved: the run id's frozen keys and the report's Table 3 knobs (a key newer than a run reads at
    its default where the run's config would have saved it) read the one rule."""
    from lightning_tfm.report.table3.table import knob_value

    transformer = config.flatten(load_config(SMOKE, checked=False))
    rnn = config.flatten(load_config(ROOT / "experiments" / "multi30k-rnn-smoke.yaml", checked=False))
    assert run_ids.was_saved("model.activation", transformer) and not run_ids.was_saved("model.activation", rnn)
    assert run_ids.was_saved("model.arch", rnn) and not run_ids.was_saved("train.lr", transformer)
    assert not run_ids.was_saved("decode.beam_size", {"model.layers": 6})  # no decode section saved
    old = {k: v for k, v in transformer.items() if k != "model.activation"}
    assert knob_value(old, "model.activation") == "relu" and knob_value(rnn, "model.activation") is None
