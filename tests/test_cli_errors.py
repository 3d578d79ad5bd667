"""A mistyped argument of ``ltfm`` (lightning_tfm/cli.py, #52 item 20): one line with one ``ltfm: error:`` prefix,
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
