"""The verdict's back-tests (``ltfm report SWEEP --from-export DIR --backtest FRACTION | --backtest-to LATER``)
rebuilt from the committed CPU reference exports: the numbers of reports/reference/backtest/backtest-{a,b}.json,
and bad input refused in one line (exit 2) with nothing written. No training."""
from __future__ import annotations

import json

import pytest

from conftest import ROOT
from lightning_tfm import cli

SWEEP = str(ROOT / "sweeps" / "table3-cpu.yaml")
EXPORT = str(ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export")   # validated every 100 steps
EVERY_50 = str(ROOT / "reports" / "reference" / "table3-cpu" / "export")            # the re-run: every 50 steps
LATER = str(ROOT / "reports" / "reference" / "table3-cpu-continued" / "export")
COMMITTED = ROOT / "reports" / "reference" / "backtest"
KEYS = ["beyond_noise", "called_holds", "kept_sign", "interval_coverage", "rows"]


def same(got, want) -> None:
    """Equal, floats to the committed 4 decimals (a last-digit rounding of another BLAS is no change)."""
    if isinstance(want, float):
        assert got == pytest.approx(want, abs=2e-4)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            same(got[k], want[k])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    else:
        assert got == want


def run_json(capsys, *args, export: str = EXPORT) -> dict:
    assert cli.main(["report", SWEEP, "--from-export", export, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name, export, args", [("a", EXPORT, ["--backtest", "0.667"]),
                                                ("b", EXPORT, ["--backtest-to", LATER]),
                                                ("a-every50", EVERY_50, ["--backtest", "0.667"])])
def test_the_committed_backtests_are_rebuilt_from_the_exports(capsys, tmp_path, monkeypatch, name, export, args):
    monkeypatch.chdir(tmp_path)
    got = run_json(capsys, *args, export=export)
    assert list(got) == KEYS
    same(got, json.loads((COMMITTED / f"backtest-{name}.json").read_text()))
    assert not list(tmp_path.iterdir())  # nothing written without --out
    rows = {r["variant"]: r for r in got["rows"]}
    holds = [r for r in got["rows"] if r["verdict"] == "holds"]
    assert got["called_holds"] == len(holds) and got["kept_sign"] == sum(r["sign_kept"] for r in holds)
    assert got["beyond_noise"] == sum(r["noise"] == "beyond" for r in got["rows"])
    # the targets: of the rows called holds >= 90% keep their sign; >= half of those beyond noise are holds
    assert got["kept_sign"] >= 0.9 * got["called_holds"] and got["called_holds"] >= got["beyond_noise"] / 2
    if name.startswith("a"):  # every row of a 600-step export, each from its curve to step 399 (big: 1199 of 1800)
        assert len(rows) == 20 and (rows["C1"]["step"], rows["C1"]["at_step"]) == (399, 599)
        assert (rows["big"]["step"], rows["big"]["base_step"], rows["big"]["at_step"]) == (1199, 399, 1799)
    else:  # the 8 rows the continued sweep trained on, from 600 steps to 1800
        assert sorted(rows) == ["C1", "C2", "C3", "C5", "C6", "C7", "D1", "E"]
        assert {(r["step"], r["at_step"]) for r in rows.values()} == {(599, 1799)}


def test_the_printed_table_and_out(capsys, tmp_path):
    assert cli.main(["report", SWEEP, "--from-export", EXPORT, "--backtest-to", LATER]) == 0
    text = capsys.readouterr().out
    assert text == (COMMITTED / "backtest-b.md").read_text()
    assert "| C1 | -41.5% at 600 | holds |" in text and "- kept their sign: 6/6 (100%)" in text
    out = tmp_path / "bt" / "b.json"
    assert cli.main(["report", SWEEP, "--from-export", EXPORT, "--backtest-to", LATER, "--out", str(out)]) == 0
    assert capsys.readouterr().out == text
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.json", "b.md", "b.png"]
    assert list(json.loads(out.read_text())) == KEYS and (out.parent / "b.md").read_text() == text
    assert (out.parent / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    tree = json.loads((ROOT / "reports/reference/table3-cpu-continued/export/table3-cpu-continued.json").read_text())
    for r in tree["records"]:  # the same rows, trained in other run folders: not a continuation of these runs
        r["run"] = f"elsewhere-{r['run']}"
    (other / "table3-cpu-continued.json").write_text(json.dumps(tree))
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "x.json").write_text(json.dumps({**tree, "sweep": "nowhere", "sweep_file": "nowhere.yaml"}))
    out = tmp_path / "out.json"
    cases = [
        (["--backtest", "0.5"], "--backtest reads an export: give --from-export DIR"),
        (["--from-export", str(tmp_path / "none"), "--backtest", "0.5"], "no export of sweep 'table3-cpu' there"),
        (["--from-export", EXPORT, "--backtest", "1"], "--backtest 1: the fraction of the budget"),
        (["--from-export", EXPORT, "--backtest", "0"], "must be between 0 and 1"),
        (["--from-export", EXPORT, "--backtest", "two thirds"], "--backtest 'two thirds': give a fraction"),
        (["--from-export", EXPORT, "--backtest", "0.5", "--backtest-to", LATER], "give one"),
        (["--from-export", EXPORT, "--backtest-to", str(other), "--out", str(out)],
         "has no run folder in common with 'table3-cpu'"),
        (["--from-export", EXPORT, "--backtest-to", str(stray)], "whose file nowhere.yaml is not beside"),
        (["--from-export", EXPORT, "--backtest-to", str(tmp_path)], "no export there"),
        (["--from-export", EXPORT, "--backtest-to", EXPORT], "its base's budget is not later"),
        (["--from-export", EXPORT, "--backtest", "0.5", "--out", str(tmp_path / "x")], "give a path ending in .json"),
        (["--from-export", EXPORT, "--backtest", "0.5", "--against", SWEEP], "--against with a back-test"),
        (["--from-export", EXPORT, "--json"], "--json prints a back-test"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, words in cases:
        assert cli.main(["report", SWEEP, *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("ltfm: error: ") and words in err and err.count("\n") == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not out.exists()  # nothing written
