"""The settle loop replayed on the committed exports (``ltfm report SWEEP --settle-replay EXPORT_DIR ...``,
lightning_tfm/report/settle_replay.py): the committed pages are what the commands make rerender runs write, and bad
input is one line and exit 2."""
from __future__ import annotations

import shlex

import pytest

from conftest import ROOT

RERENDER = ROOT / "reports" / "reference" / "rerender.sh"


def replay_commands() -> list[list[str]]:
    """The settle-replay commands of make rerender (reports/reference/rerender.sh), their $DE expanded: the
    arguments after ``report``."""
    lines, de = RERENDER.read_text().replace("\\\n", " ").splitlines(), ""
    out = []
    for line in lines:
        if line.startswith("DE="):
            de = shlex.split(line.partition("=")[2].replace("$DE", de))[0]
        if line.startswith('"$LTFM" report') and "--settle-replay" in line:
            words = shlex.split(line.split(">")[0].replace("$DE", de))
            out.append(words[2:])
    assert len(out) == 2, out
    return out


@pytest.mark.parametrize("args", replay_commands(), ids=["en-de", "en-fr"])
def test_the_committed_replay_is_what_the_command_writes(args, tmp_path, ltfm_here):
    at = args.index("--out")
    committed = ROOT / args[at + 1]
    out = tmp_path / "replay.md"
    r = ltfm_here("report", *args[:at], "--out", str(out), *args[at + 2:])
    assert r.returncode == 0, r.stderr
    assert out.read_text() == committed.read_text(), "run make rerender"
    assert r.stdout.startswith(committed.read_text())


def test_the_en_de_replay_answers_every_row_its_exports_hold():
    """The measurements the defaults and the choice of the paired interval rest on (findings/settings.py,
    findings/answers.py): the grid's rows are the defaults over the keys it varies, whatever the sweep file's
    settle: section."""
    page = (ROOT / "reports" / "reference" / "settle-replay.md").read_text()
    assert "Paired narrower in 12 of 16; median width ratio paired/unpaired" in page
    assert "| 0.05 | 0.1 | 3 | 1 | 8 of 14 | 1.77 |" in page  # the defaults: the 8 rows held at 3 seeds answered
    assert "| 0.05 | 0.05 | 3 | 1 | 4 of 14 | 1.56 |" in page
    assert "| 0.05 | 0.1 | 3 | 3 | 5 of 14 | 3.20 |" in page
    assert "| 0.05 | 0.1 | 2 | 1 | 4 of 14 | 1.28 |" in page


@pytest.mark.parametrize("args,message", [
    (["--settle-replay", "nowhere"], "--settle-replay 'nowhere': no export there"),
    (["--settle-replay", "reports/reference/table3-cpu-heldout/export", "--out", "x.txt"], "ending in .md"),
    (["--settle-grid"], "give it with --settle-replay"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, ltfm_here):
    r = ltfm_here("report", "sweeps/table3-cpu.yaml", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
