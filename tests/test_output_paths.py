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
def test_checkpoints_of_runs_with_the_same_folder_name_never_share_a_hypotheses_file(tmp_path, data_dir,
                                                                                       vocabularies,  # noqa: F811
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


def test_a_checkpoint_with_long_names_gets_a_default_name_that_fits(tmp_path, data_dir, vocabularies,  # noqa: F811
                                                                     sources, ltfm_here):
    run = tiny_run(tmp_path / "results" / "mine", data_dir, vocabularies["de"])
    elsewhere = tmp_path / ("f" * 200) / ("c" * 200 + ".ckpt")  # a checkpoint outside any run folder
    elsewhere.parent.mkdir()
    shutil.copy(run / "checkpoints" / "last.ckpt", elsewhere)
    src, ref = sources
    p = ltfm_here("evaluate", run, "--checkpoint", elsewhere, "--src", src, "--ref", ref)
    assert p.returncode == 0, p.stderr[-2000:]
    (hyps,) = (run / "hyps").iterdir()
    assert len(os.fsencode(hyps.name)) <= 255 and hyps.name.startswith("val.en-") and "f" * 40 + "-" in hyps.name


def test_sources_of_the_same_name_never_share_a_hypotheses_file(tmp_path, data_dir, vocabularies,  # noqa: F811
                                                                sources, ltfm_here):
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


def test_an_average_in_memory_is_named_by_how_many_checkpoints_it_averages(tmp_path, data_dir,
                                                                           vocabularies,  # noqa: F811
                                                                           sources, ltfm_here):
    run = tiny_run(tmp_path / "results" / "mine", data_dir, vocabularies["de"])
    for step in (1, 2, 3):  # step checkpoints to average (the tiny run has only last.ckpt)
        shutil.copy(run / "checkpoints" / "last.ckpt", run / "checkpoints" / f"step={step:06d}.ckpt")
    src, ref = sources
    names = set()
    for n in (2, 3):
        p = ltfm_here("evaluate", run, "--checkpoint", "average", f"decode.average_last={n}", "--src", src,
                      "--ref", ref)
        assert p.returncode == 0, p.stderr[-2000:]
        names.add(Path(next(ln for ln in p.stdout.splitlines() if ln.startswith("hypotheses: ")).split()[1]).name)
    assert len(names) == 2 and all(".average-last" in n for n in names), names


# ------------------------------------------------------------------------------------------------------------
# 11, 13. Every path a command writes, checked before the work
# ------------------------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
BACKTEST_SWEEP = "sweeps/table3-cpu.yaml"
EXPORT = ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"
#: the commands that take --out, each with the suffix its file takes ("": a folder) and the files it writes
#: beside it (a back-test's .md and .png)
OUTPUTS = {"average": ".ckpt", "evaluate": ".txt", "backtest": ".json", "report": ""}


@pytest.fixture
def work(tmp_path, data_dir, vocabularies, sources):  # noqa: F811
    """(the command line of each command that writes ``out``, the folder everything lives in)."""
    run = tiny_run(tmp_path / "results" / "tiny", data_dir, vocabularies["de"])
    src, ref = sources

    def line(command: str, out) -> list:
        return {"average": ["average", run, "--last", "1", "--out", out],
                "evaluate": ["evaluate", run, "--src", src, "--ref", ref, "decode.max_len_b=3", "--out", out],
                "backtest": ["report", BACKTEST_SWEEP, "--from-export", EXPORT, "--backtest", "0.667", "--out", out],
                "report": ["report", "sweeps/smoke.yaml", "--results", tmp_path / "results", "--out", out]}[command]
    return line, tmp_path


def read_only_folder(tmp_path: Path) -> Path:
    """A folder no one may write in: a read-only tmpfs where mounting is allowed, else a folder of mode 0555 (which
    root writes in anyway: then the test is skipped)."""
    import subprocess

    folder = tmp_path / "read-only"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)]
    if subprocess.run(mount, capture_output=True).returncode:
        if os.geteuid() == 0:
            pytest.skip("no read-only folder for root here: cannot mount a read-only tmpfs, and root writes anywhere")
        folder.chmod(0o555)
    return folder


BAD = ["under-a-file", "in-proc", "in-sys", "kind-at-target", "256-byte-name", "read-only"]


@pytest.mark.parametrize("command", OUTPUTS)
@pytest.mark.parametrize("case", BAD)
def test_a_path_that_cannot_be_written_is_one_line_before_any_work(command, case, work, ltfm_here):
    line, tmp = work
    ext = OUTPUTS[command]
    (tmp / "somefile").write_text("mine\n")
    out = {"under-a-file": tmp / "somefile" / f"x{ext}",
           "in-proc": Path(f"/proc/ltfm-test-{os.getpid()}{ext}"),
           "in-sys": Path(f"/sys/ltfm-test-{os.getpid()}{ext}"),
           "kind-at-target": tmp / f"x{ext}",
           "256-byte-name": tmp / ("n" * (256 - len(ext)) + ext)}.get(case)
    if case == "kind-at-target":  # a folder where the file goes; a file where the report's folder goes
        out.write_text("mine\n") if not ext else out.mkdir()
    if case == "read-only":
        out = read_only_folder(tmp) / f"x{ext}"
    try:
        before = tree(tmp)
        p = ltfm_here(*line(command, out))
        one_line(p, "--out")
        assert not p.stdout.strip(), p.stdout  # refused before any work: nothing computed, nothing printed
        assert tree(tmp) == before
        assert not os.path.lexists(out) or case == "kind-at-target"
    finally:
        if case == "read-only":
            import subprocess
            subprocess.run(["umount", "-l", str(out.parent)], capture_output=True)


@pytest.mark.parametrize("sibling", [".md", ".png"])
def test_a_backtest_checks_every_file_it_writes_before_it_computes(sibling, work, ltfm_here):
    line, tmp = work
    (tmp / f"x{sibling}").mkdir()  # where the back-test's .md (or .png) goes: main wrote x.png, then a traceback
    before = tree(tmp)
    p = ltfm_here(*line("backtest", tmp / "x.json"))
    one_line(p, f"x{sibling} is a folder")
    assert tree(tmp) == before and not p.stdout.strip()


def test_the_default_outputs_are_checked_too(work, ltfm_here):
    line, tmp = work
    run = tmp / "results" / "tiny"
    (run / "hyps").write_text("a file where evaluate's folder goes\n")
    (run / "checkpoints" / "average.ckpt").mkdir()
    before = tree(tmp)
    one_line(ltfm_here(*line("evaluate", "x")[:-2]), "the hypotheses file", "is a file, not a folder")
    one_line(ltfm_here(*line("average", "x")[:-2]), "the averaged checkpoint", "is a folder")
    assert tree(tmp) == before


@pytest.mark.parametrize("command", ["average", "evaluate", "backtest"])
def test_a_long_name_the_filesystem_takes_is_written(command, work, ltfm_here):
    """A name of 250 bytes fits; the writer's temporary name beside it fits too (main: `File name too long` after
    the work, the temporary name being the target's plus a suffix)."""
    line, tmp = work
    ext = OUTPUTS[command]
    out = tmp / "long" / ("n" * (250 - len(ext)) + ext)
    p = ltfm_here(*line(command, out))
    assert p.returncode == 0, p.stderr[-3000:]
    written = [out] + ([out.with_suffix(".md"), out.with_suffix(".png")] if command == "backtest" else [])
    assert all(f.is_file() and f.stat().st_size > 0 for f in written)
    assert sorted(out.parent.iterdir()) == sorted(written)  # no temporary file left beside them


def test_a_report_folder_name_too_long_for_the_folders_beside_it_is_refused_before_any_notebook(work, ltfm_here):
    line, tmp = work
    before = tree(tmp)
    p = ltfm_here(*line("report", tmp / ("r" * 250)))
    one_line(p, "--out", "give a shorter name")
    assert tree(tmp) == before
