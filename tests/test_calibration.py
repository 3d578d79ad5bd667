"""The verdict's two answers calibrated on the committed back-tests (lightning_tfm.findings.calibrate, the command
lightning_tfm.report.calibration, issue #51): findings/calibration.json, the constants and the records the headline
quotes, is what the command computes from the committed back-tests, each export left out in turn, and they meet the
issue's targets; reports/reference/backtest/calibration.md is current.
No training: the back-tests' JSON (rebuilt from the exports by tests/test_backtest.py)."""
from __future__ import annotations

import math

import pytest

from lightning_tfm.findings import backtest, calibrate, curves
from lightning_tfm.report import calibration

from conftest import ROOT

FOLDER = ROOT / "reports" / "reference" / "backtest"


@pytest.fixture(scope="module")
def rows():
    return calibration.load(FOLDER)


@pytest.fixture(scope="module")
def first():
    """The rows of the back-tests the constants were first chosen on, before the held-out exports."""
    return calibration.load(FOLDER, calibration.CHOSEN_ON)


def test_the_verdicts_calibration_file_is_what_the_calibration_command_computes(tmp_path):
    """The file the verdict reads (findings/calibration.json) is what ``python -m lightning_tfm.report.calibration
    DIR --page`` writes from the committed back-tests; the verdict's constants are the file's."""
    import json

    committed = json.loads(curves.CALIBRATION_FILE.read_text(encoding="utf-8"))
    assert calibration.computed(FOLDER) == committed
    assert (curves.SIGN_QUANTILE, curves.EXTRAPOLATION_ERROR, curves.SIZE_RECORD) == (
        committed["SIGN_QUANTILE"], committed["EXTRAPOLATION_ERROR"], tuple(committed["SIZE_RECORD"]))
    written = calibrate.write_calibration(calibration.computed(FOLDER), tmp_path / "calibration.json")
    assert written.read_bytes() == curves.CALIBRATION_FILE.read_bytes()


def test_the_constants_are_the_committed_backtests_calibration(first, rows):
    """The direction's level and quantile are as first chosen (on CHOSEN_ON), the size's error is from every
    back-test, the held-out ones included."""
    assert calibrate.todays_constants(first, rows) == {
        "SIGN_LEVEL": curves.SIGN_LEVEL, "SIGN_QUANTILE": curves.SIGN_QUANTILE,
        "EXTRAPOLATION_ERROR": curves.EXTRAPOLATION_ERROR}
    assert curves.SIGN_QUANTILE == calibrate.constants(first)["SIGN_QUANTILE"]
    assert curves.EXTRAPOLATION_ERROR == calibrate.constants(rows)["EXTRAPOLATION_ERROR"] != \
        calibrate.constants(first)["EXTRAPOLATION_ERROR"]
    # the direction's level is the lowest whose calls, each export left out, kept their sign >= 95% of the time
    for level in curves.SIGN_LEVELS:
        beyond, called, kept = calibrate.totals(calibrate.direction_by_export(first, level))
        if level < curves.SIGN_LEVEL:
            assert called and kept < curves.SIGN_TARGET * called
        if level == curves.SIGN_LEVEL:
            assert called and kept >= curves.SIGN_TARGET * called


def test_the_records_the_headline_quotes_are_counted_from_the_backtests(first, rows):
    record = calibrate.record(first, rows)
    assert record["holds"] == curves.DIRECTION_RECORD and record["size"] == curves.SIZE_RECORD
    assert calibrate.settle_record(rows) == curves.SETTLE_RECORD
    # the targets, each export left out: >= 2/3 of the rows beyond noise called holds, >= 95% of those
    # kept their sign, the size interval's coverage within 10 points of its level
    assert [ok for *_, ok in calibrate.targets(record)] == [True] * 3
    inside, n = record["size"]
    # the direction on four back-tests of three exports, the size on ten of six: an export is left out whole
    assert len({r["export"] for r in first}) == 3 and len({r["export"] for r in rows}) == 6
    assert len(calibrate.sized(rows)) == n == 88 and len(calibrate.directional(first)) == record["holds"][0]


def test_a_quantile_from_one_export_calls_the_others_rows_as_the_rule_says(rows):
    by = calibrate.direction_by_export(rows, 0.8)
    q, beyond, called, kept = by["table3-cpu-heldout"]
    others = [r["sign_score"] for r in calibrate.directional(rows) if r["export"] != "table3-cpu-heldout"]
    assert q == backtest.conformal_quantile(others, 0.8)
    mine = [r for r in calibrate.directional(rows) if r["export"] == "table3-cpu-heldout"]
    by_hand = [r for r in mine if abs(r["log"]["point"]) - q * math.hypot(r["log"]["noise_sd"], r["log"]["now"]) > 0
               and (r["log"]["point"] > 0) == (r["log"]["now"] > 0)]
    assert (beyond, called) == (len(mine), len(by_hand))
    from lightning_tfm.findings.noise import share

    assert share(21, 21) == "21 of 21 (95% CI 84-100%)"


def test_the_committed_calibration_page_is_current(first, rows):
    page = (FOLDER / "calibration.md").read_text(encoding="utf-8")
    assert calibration.text(first, rows) in page and calibration.page_text(FOLDER) in page


def test_the_heldout_record_is_what_the_first_constants_printed_on_the_heldout_backtests():
    """HELDOUT_RECORD is the held-out back-tests' record as it was reported once: with the constants chosen on the
    four earlier back-tests alone (restated from each row's log numbers, whatever today's constants are), and
    calibration.md has that section."""
    first = calibrate.constants(calibration.load(FOLDER, calibration.CHOSEN_ON))
    assert first == {"SIGN_LEVEL": 0.8, "SIGN_QUANTILE": 0.6809, "EXTRAPOLATION_ERROR": 0.1707}   # as reported
    assert first["EXTRAPOLATION_ERROR"] != curves.EXTRAPOLATION_ERROR   # the size's, recalibrated since
    held = calibration.heldout_rows(FOLDER)
    assert {r["backtest"] for r in held} == set(calibration.HELDOUT_BACKTESTS)
    assert calibrate.heldout_record(held) == curves.HELDOUT_RECORD
    page = (FOLDER / "calibration.md").read_text(encoding="utf-8")
    assert calibration.heldout_text(held, first) in page


def test_restating_a_backtest_with_its_own_constants_gives_what_it_printed():
    """as_chosen with today's constants reproduces every committed back-test's verdicts, intervals and coverage (the
    held-out section's restatement with the first constants rests on this); with other constants it moves them."""
    rows = calibration.load(FOLDER)
    today = {"SIGN_QUANTILE": curves.SIGN_QUANTILE, "EXTRAPOLATION_ERROR": curves.EXTRAPOLATION_ERROR}
    same = calibrate.as_chosen(rows, today)
    for r, s in zip(rows, same):
        assert (s["verdict"], s["inside"]) == (r["verdict"], r["inside"]), (r["backtest"], r["variant"])
        if r.get("log"):
            assert abs(s["low"] - r["low"]) <= 2e-4 and abs(s["high"] - r["high"]) <= 2e-4
    assert calibrate.heldout_record(same) == calibrate.heldout_record(rows)
    wide = calibrate.as_chosen(rows, {**today, "SIGN_QUANTILE": 50.0, "EXTRAPOLATION_ERROR": 50.0})
    assert calibrate.heldout_record(wide)["holds"][1] == 0
    assert calibrate.heldout_record(wide)["size"][0] == calibrate.heldout_record(wide)["size"][1]


def test_a_record_counts_what_each_backtest_printed_and_names_its_misses():
    """heldout_record sums the back-tests' own totals (--json: beyond_noise, called_holds, kept_sign,
    interval_coverage); a flipped *holds* and a gap outside its interval are each named; a target is missed below
    it (read on committed back-tests, which are not held out: only the counting is tested)."""
    import json

    names = ("d-heldout", "d200-heldout", "b", "c-every50")
    got = calibrate.heldout_record(calibration.load(FOLDER, names))
    trees = [json.loads((FOLDER / f"backtest-{n}.json").read_text()) for n in names]
    sized = [sum(r["inside"] is not None for r in t["rows"]) for t in trees]
    assert got["holds"] == tuple(sum(t[k] for t in trees) for k in ("beyond_noise", "called_holds", "kept_sign"))
    assert got["size"] == (sum(round(t["interval_coverage"] * n) for t, n in zip(trees, sized)), sum(sized))
    rows = calibration.load(FOLDER, ("d-heldout",))
    holds = next(r for r in rows if r["verdict"] == "holds")
    flipped = {**holds, "sign_kept": False, "measured": -holds["measured"], "inside": False}
    missed = calibration.misses([flipped, *[r for r in rows if r is not holds]])
    assert f"d-heldout {holds['variant']}:" in missed[0] and "its sign did not keep" in missed[0]
    assert any("prenorm" in m and "outside its interval" in m for m in missed)
    assert calibrate.heldout_record([flipped])["holds"] == (1, 1, 0)
    assert [ok for *_, ok in calibrate.targets({"holds": (30, 19, 19), "size": (24, 30)})] == [False, True, True]
    assert [ok for *_, ok in calibrate.targets({"holds": (30, 20, 18), "size": (21, 30)})] == [True, False, True]
    assert [ok for *_, ok in calibrate.targets({"holds": (30, 20, 20), "size": (20, 30)})] == [True, True, False]
    assert [ok for *_, ok in calibrate.targets({"holds": (30, 20, 20), "size": (27, 30)})] == [True, True, True]


def test_make_rerender_rewrites_the_generated_part_of_the_page_and_keeps_the_rest(tmp_path):
    """calibration.write_page (make rerender): the tables and the held-out section between the page's marks are
    regenerated from the back-tests in the folder, the text above and below stays (stand-ins for the held-out
    back-tests here: copies of a committed one)."""
    import shutil

    for f in [*FOLDER.glob("backtest-*.json"), FOLDER / "calibration.md", FOLDER / "backtests.txt"]:
        shutil.copy(f, tmp_path)
    page = tmp_path / "calibration.md"
    committed = page.read_text(encoding="utf-8")
    held = committed.index("## Held out, reported once")
    stale = committed[:held].replace(f"SIGN_QUANTILE {curves.SIGN_QUANTILE:g}", "SIGN_QUANTILE 0.5")
    page.write_text(stale + committed[committed.index(calibration.PAGE_MARKS[1]):], encoding="utf-8")
    calibration.write_page(tmp_path)
    assert page.read_text(encoding="utf-8") == committed
    for name in calibration.HELDOUT_BACKTESTS:
        shutil.copy(FOLDER / "backtest-d-heldout.json", tmp_path / f"backtest-{name}.json")
    calibration.write_page(tmp_path)
    text = page.read_text(encoding="utf-8")
    head, tail = (committed.split(mark)[i] for mark, i in zip(calibration.PAGE_MARKS, (0, 1)))
    assert text != committed and text.startswith(head) and text.endswith(tail)
    assert text.index(calibration.PAGE_MARKS[0]) < text.index("## Held out, reported once") < text.index(
        calibration.PAGE_MARKS[1])
    # (d) as the first constants printed it: 4 beyond noise, 4 called, 4 kept, 5 of 6 inside
    assert "| e200-heldout-s4 | table3-cpu-heldout-s4 | 4 | 4 | 4 | 5/6 |" in text
