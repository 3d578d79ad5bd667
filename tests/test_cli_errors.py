"""A mistyped argument of ``ltfm`` (lightning_tfm/cli/, #52 item 20): one line with one ``ltfm: error:`` prefix,
naming the argument, the closest flag of that command (or the closest command) as "did you mean", and the
command's --help; exit 2, nothing written."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, said", [
    (["report", "sweeps/table3-cpu.yaml", "--from-exprt", "x"],
     "unrecognized arguments: --from-exprt x; did you mean --from-export? (see ltfm report --help)"),
    (["report", "sweeps/table3-cpu.yaml", "--from-exprt=x"],
     "unrecognized arguments: --from-exprt=x; did you mean --from-export? (see ltfm report --help)"),
    (["sweep", "sweeps/table3-cpu.yaml", "--wokers", "2"],
     "unrecognized arguments: --wokers 2; did you mean --workers? (see ltfm sweep --help)"),
    (["reprt", "sweeps/table3-cpu.yaml"], "did you mean report? (see ltfm --help)"),
    (["sweep", "--n-trials", "x"], "argument --n-trials: invalid int value: 'x' (see ltfm sweep --help)"),
])
def test_a_mistyped_argument_says_so_once_with_the_closest_flag(ltfm_here, tmp_path, argv, said):
    p = ltfm_here(*argv, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == "", p
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: ") and lines[0].endswith(said), p.stderr
    assert lines[0].count("ltfm:") == 1 and "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_argument_like_no_flag_gets_no_guess(ltfm_here, tmp_path):
    p = ltfm_here("report", "sweeps/table3-cpu.yaml", "--zzzzzz", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip() == "ltfm: error: unrecognized arguments: --zzzzzz (see ltfm report --help)"


@pytest.mark.parametrize("command", [["runs"], ["runs", "--wandb"], ["evaluate"], ["translate"], ["average"],
                                     ["config"], ["train"]])
def test_a_path_the_file_system_cannot_take_is_one_line(ltfm_here, tmp_path, command):
    """#52, the class of item 13: a name over 255 bytes or a NUL, given where any command reads a path, is one line
    naming it and the way out (exit 2), not OSError's or ValueError's traceback; nothing is written."""
    before = sorted(tmp_path.iterdir())
    for bad in (str(tmp_path / ("x" * 300)), str(tmp_path / "a\x00b")):
        p = ltfm_here(*command, bad, cwd=tmp_path)
        assert p.returncode == 2, (command, p.stderr)
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ltfm: error: ") and "Traceback" not in p.stderr, p.stderr
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("argv", [["config", "--keys"], ["sweep", "--keys"],
                                  ["config", "experiments/multi30k-smoke.yaml", "data.path=tests/data"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(argv):
    """``ltfm config --keys | head -1``: the reader closes the pipe before the command writes; the command ends
    with exit 0 and says nothing of it (a BrokenPipeError is an OSError: it once reached the OSError handler,
    which re-raised it as a traceback)."""
    import os
    import subprocess
    import sys

    from conftest import WORK

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command starts
    p = subprocess.run([sys.executable, "-m", "lightning_tfm", *argv], stdout=write, stderr=subprocess.PIPE, text=True,
                       env=env, cwd=WORK, timeout=600)
    os.close(write)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr


@pytest.mark.parametrize("command", [["config", "experiments/multi30k-smoke.yaml"],
                                     ["train", "experiments/multi30k-smoke.yaml"], ["sweep", "sweeps/smoke.yaml"]])
def test_an_override_without_a_value_is_said_back_with_the_form_it_needs(ltfm_here, tmp_path, command):
    """#64 item 15: the hint ``dotted.key=value`` is the program's own text, not a secret key's value: it is shown as
    written (it read ``dotted.key=***``), while the user's text in the same line is still masked."""
    from conftest import ROOT

    command = [command[0], ROOT / command[1]]
    p = ltfm_here(*command, "model.heads", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr == "ltfm: error: override 'model.heads' is not of the form dotted.key=value\n"
    p = ltfm_here(*command, "postgresql://u:SECRETPW@h/db", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.endswith(" is not of the form dotted.key=value\n"), p.stderr
    assert "SECRETPW" not in p.stderr and "'postgresql://u:***@h/db'" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []
