"""Every file a command writes (issue #52, items 7, 11, 13): a default name that two inputs never share, and a
path checked before any work -- a file where a folder should be, a folder where a file should be, an unwritable
folder, a name over 255 bytes, the temporary name beside it -- refused in one line, exit 2, nothing written.

The run folders are laid out as ``ltfm train`` lays them out, with tiny random models (tests/test_run_reuse.py's
``tiny_run``): no training.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from test_run_reuse import tiny_run, vocabularies  # noqa: F401  (a fixture)


def tree(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: a file by its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def one_line(p, *words) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: ") and "Traceback" not in p.stderr, p.stderr[-3000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture
def sources(tmp_path) -> tuple[Path, Path]:
    src, ref = tmp_path / "in" / "val.en", tmp_path / "in" / "val.de"
    src.parent.mkdir()
    src.write_text("A man rides a bike.\nTwo dogs play in the snow.\n")
    ref.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n")
    return src, ref


# ------------------------------------------------------------------------------------------------------------
# 7. evaluate's hypotheses: one file a checkpoint (and a source)
# ------------------------------------------------------------------------------------------------------------
def test_checkpoints_of_runs_with_the_same_folder_name_never_share_a_hypotheses_file(tmp_path, data_dir, vocabularies,
                                                                                       sources, ltfm_here):
    run = tiny_run(tmp_path / "results" / "mine", data_dir, vocabularies["de"])
    full = tiny_run(tmp_path / "results" / "X", data_dir, vocabularies["de"], seed=2)
    quick = tiny_run(tmp_path / "results-quick" / "X", data_dir, vocabularies["de"], seed=3)
    src, ref = sources
    written = {}
    for other in (full, quick):
        p = ltfm_here("evaluate", run, "--checkpoint", other / "checkpoints" / "last.ckpt", "--src", src, "--ref", ref)
        assert p.returncode == 0, p.stderr[-2000:]
        (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("hypotheses: ")]
        written[other] = Path(line.split()[1])
        kept = written[other].read_bytes()
    assert written[full] != written[quick] and written[full].parent == run / "hyps"
    assert all(f.name.startswith("val.en-") and ".X-" in f.name for f in written.values()), written
    # the first checkpoint's hypotheses are still there, as the first evaluation wrote them
    assert written[full].is_file() and written[quick].read_bytes() == kept
    assert sorted(p.name for p in (run / "hyps").iterdir()) == sorted(f.name for f in written.values())


def test_sources_of_the_same_name_never_share_a_hypotheses_file(tmp_path, data_dir, vocabularies, sources, ltfm_here):
    run = tiny_run(tmp_path / "results" / "mine", data_dir, vocabularies["de"])
    src, ref = sources
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(src, other / "val.en")
    (other / "val.de").write_text(ref.read_text())
    outs = []
    for s, r in ((src, ref), (other / "val.en", other / "val.de")):
        p = ltfm_here("evaluate", run, "--src", s, "--ref", r)
        assert p.returncode == 0, p.stderr[-2000:]
        outs.append(next(ln for ln in p.stdout.splitlines() if ln.startswith("hypotheses: ")).split()[1])
    assert outs[0] != outs[1] and all(Path(o).is_file() for o in outs)


def test_an_average_in_memory_is_named_by_how_many_checkpoints_it_averages(tmp_path, data_dir, vocabularies, sources,
                                                                           ltfm_here):
    run = tiny_run(tmp_path / "results" / "mine", data_dir, vocabularies["de"])
    for step in (1, 2, 3):  # step checkpoints to average (the tiny run has only last.ckpt)
        shutil.copy(run / "checkpoints" / "last.ckpt", run / "checkpoints" / f"step={step:06d}.ckpt")
    src, ref = sources
    names = set()
    for n in (2, 3):
        p = ltfm_here("evaluate", run, "--checkpoint", "average", f"decode.average_last={n}", "--src", src, "--ref", ref)
        assert p.returncode == 0, p.stderr[-2000:]
        names.add(Path(next(ln for ln in p.stdout.splitlines() if ln.startswith("hypotheses: ")).split()[1]).name)
    assert len(names) == 2 and all(f".average-last" in n for n in names), names
