"""The verdict's back-tests (``ltfm report SWEEP --from-export DIR --backtest FRACTION | --backtest-to LATER``)
rebuilt from the committed CPU reference exports: the numbers of reports/reference/backtest/backtest-{a,b}.json,
and bad input refused in one line (exit 2) with nothing written. No training."""
from __future__ import annotations

import json
import math

import pytest

from lightning_tfm import cli
from lightning_tfm.findings import curves
from lightning_tfm.findings.settings import REPORT_DEFAULTS
from lightning_tfm.report.calibration import HELDOUT_BACKTESTS

from conftest import ROOT

SWEEP = str(ROOT / "sweeps" / "table3-cpu.yaml")
EXPORT = str(ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export")   # validated every 100 steps
EVERY_50 = str(ROOT / "reports" / "reference" / "table3-cpu-2026-11-26" / "export")   # the re-run: every 50 steps
LATER = str(ROOT / "reports" / "reference" / "table3-cpu-continued" / "export")
HELDOUT_SWEEP = str(ROOT / "sweeps" / "table3-cpu-heldout.yaml")   # rows never used to choose the method
HELDOUT = str(ROOT / "reports" / "reference" / "table3-cpu-heldout" / "export")
COMMITTED = ROOT / "reports" / "reference" / "backtest"
KEYS = ["beyond_noise", "called_holds", "kept_sign", "interval_coverage", "level", "sign_level", "rows"]


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


def run_json(capsys, *args, export: str = EXPORT, sweep: str = SWEEP) -> dict:
    assert cli.main(["report", sweep, "--from-export", export, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def listed_backtests() -> list[tuple[str, str, str, list[str]]]:
    """reports/reference/backtest/backtests.txt: (name, sweep, export, arguments), paths made absolute."""
    out = []
    for line in (COMMITTED / "backtests.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sweep, export, *args = line.split()
            args = [str(ROOT / a) if (ROOT / a).exists() else a for a in args]
            out.append((name, str(ROOT / sweep), str(ROOT / export), args))
    return out


def test_every_committed_backtest_is_listed_where_make_rerender_reads_it():
    assert sorted(p.stem[len("backtest-"):] for p in COMMITTED.glob("backtest-*.json")) == sorted(
        name for name, *_ in listed_backtests())


@pytest.mark.parametrize("name, sweep, export, args", listed_backtests())
def test_the_committed_backtests_are_rebuilt_from_the_exports(capsys, tmp_path, monkeypatch, name, sweep, export,
                                                               args):
    monkeypatch.chdir(tmp_path)
    got = run_json(capsys, *args, export=export, sweep=sweep)
    assert list(got) == KEYS
    same(got, json.loads((COMMITTED / f"backtest-{name}.json").read_text()))
    assert not list(tmp_path.iterdir())  # nothing written without --out
    rows = {r["variant"]: r for r in got["rows"]}
    holds = [r for r in got["rows"] if r["verdict"] == "holds"]
    assert got["called_holds"] == len(holds) and got["kept_sign"] == sum(r["sign_kept"] for r in holds)
    assert got["beyond_noise"] == sum(r["noise"] == "beyond" for r in got["rows"])
    assert (got["level"], got["sign_level"]) == (REPORT_DEFAULTS["level"], curves.SIGN_LEVEL)
    if name not in HELDOUT_BACKTESTS:  # in-sample: the held-out ones are reported against the targets, not tested
        # of the rows called holds >= 95% keep their sign; at 3x (issue #51's targets): >= 2/3 of those beyond
        # noise are holds (each export's coverage is in tests/test_calibration.py, over the exports)
        assert got["kept_sign"] >= 0.95 * got["called_holds"]
        if name in ("b", "c-every50", "d-heldout", "d200-heldout"):
            assert got["called_holds"] >= 2 / 3 * got["beyond_noise"]
    assert all(r["width"] == pytest.approx(r["high"] - r["low"], abs=2e-4) for r in got["rows"] if r["low"] is not None)
    assert all((r["settle"] is None) == (r["verdict"] != "may flip") for r in got["rows"])
    # the direction's bound: on today's side exactly for the rows called holds
    assert all((r["bound"] * r["change"] > 0) == (r["verdict"] == "holds") for r in got["rows"]
               if r["noise"] == "beyond" and r["bound"] is not None)
    if name.startswith("a"):  # every row of a 600-step export, each from its curve to step 399 (big: 1199 of 1800)
        assert len(rows) == 20 and (rows["C1"]["step"], rows["C1"]["at_step"]) == (399, 599)
        assert (rows["big"]["step"], rows["big"]["base_step"], rows["big"]["at_step"]) == (1199, 399, 1799)
    elif name.startswith("c"):  # every row's first third (steps <= 199; big: <= 599 of 1800) predicts its end
        assert len(rows) == 20 and (rows["C1"]["step"], rows["C1"]["at_step"]) == (199, 599)
    elif name in HELDOUT_BACKTESTS:  # issue #51's held-out exports: 8 rows each, 600 -> 1,800 (e-), 200 -> 600 (e200-)
        assert sorted(rows) == ["A1", "B1", "C1", "C4", "C6", "D1", "E", "prenorm"]
        steps = (199, 599) if name.startswith("e200-") else (599, 1799)
        assert {(r["step"], r["at_step"]) for r in rows.values()} == {steps}
    elif name.startswith("d200"):  # the same runs read at 600 steps, each from its first 200
        assert sorted(rows) == ["A1", "B1", "C4", "D2", "D4", "prenorm"]
        assert {(r["step"], r["at_step"]) for r in rows.values()} == {(199, 599)}
    elif name.startswith("d"):  # the held-out rows, each from its first 600 steps to 1800
        assert sorted(rows) == ["A1", "B1", "C4", "D2", "D4", "prenorm"]
        assert {(r["step"], r["at_step"]) for r in rows.values()} == {(599, 1799)}
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
        (["--from-export", EXPORT, "--backtest-to", LATER, "--backtest-budget", "600"],
         "--backtest-budget reads the export at an earlier budget for --backtest FRACTION"),
        (["--from-export", EXPORT, "--backtest", "0.5", "--backtest-budget", "six hundred"],
         "--backtest-budget 'six hundred': give a number of updates of at least 2"),
        (["--from-export", EXPORT, "--backtest", "0.5", "--backtest-budget", "2"],
         "--backtest-budget 2: the base's runs have no validation near step 1"),
        (["--from-export", EXPORT, "--backtest-to", str(other), "--out", str(out)],
         "has no run folder in common with 'table3-cpu'"),
        (["--from-export", EXPORT, "--backtest-to", str(stray)], "whose file nowhere.yaml is not beside"),
        (["--from-export", EXPORT, "--backtest-to", str(tmp_path)], "no export there"),
        (["--from-export", EXPORT, "--backtest-to", EXPORT],
         "its budget is not later than this export's: base (step 599, here 599)"),
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


# --------------------------------------------------------------------------------------------------------
# Curves at the edges: a verdict or one line, never a traceback (an export of the re-run, trimmed to a few rows)
# --------------------------------------------------------------------------------------------------------
def edited(export: str, tmp_path, name: str, change=None, rows=None) -> str:
    """The committed export of ``reports/reference/<export>/`` with ``rows`` only (all when None; its sweep's file
    still lists them all), ``change(records by variant)`` applied, written to ``tmp_path/name``; that folder."""
    path = next((ROOT / "reports/reference" / export / "export").glob("*.json"))
    tree = json.loads(path.read_text())
    if rows is not None:
        tree["records"] = [r for r in tree["records"] if r["variant"] in rows]
    if change is not None:
        by = {}
        for r in tree["records"]:
            by.setdefault(r["variant"], []).append(r)
        change(by)
    folder = tmp_path / name
    folder.mkdir()
    (folder / path.name).write_text(json.dumps(tree))
    return str(folder)


def trimmed(tmp_path, name: str, change=None, rows=("base", "A1", "C1", "big")) -> str:
    """The every-50-steps export with ``rows`` only, ``change(records by variant)`` applied; its folder."""
    return edited("table3-cpu-2026-11-26", tmp_path, name, change, rows)


def ppl(recs, value) -> None:
    """Every validation of ``recs`` (and their final numbers) at dev PPL ``value(step)``."""
    for r in recs:
        for h in r["history"]:
            h["dev/ppl"], h["dev/loss"] = value(h["step"]), math.log(value(h["step"]))
        r["dev_ppl"] = value(r["history"][-1]["step"])


def one_line(p, *words) -> None:
    assert p.returncode == 2 and p.stderr.startswith("ltfm: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr and all(w in p.stderr for w in words), p.stderr


def test_a_fraction_before_the_first_validation_is_one_line(ltfm_here):
    for fraction in ("0.05", "1e-300", "0.0833"):  # the re-run validates first at step 49: 50 of 600 updates
        one_line(ltfm_here("report", SWEEP, "--from-export", EVERY_50, "--backtest", fraction, "--json"),
                 f"--backtest {float(fraction):g}: the first", "holds none of its validations (the first is at "
                 "step 49): give a fraction of at least 0.084")
    for fraction in ("-0.5", "1.5", "inf", "nan"):
        one_line(ltfm_here("report", SWEEP, "--from-export", EVERY_50, f"--backtest={fraction}"), "--backtest")


def test_rows_with_too_few_points_get_that_verdict_and_a_lone_base_point_is_one_line(ltfm_here, tmp_path):
    def ends_only(by):  # A1 validated once, at its budget's end; C1 twice (one before the cut)
        by["A1"][0]["history"] = by["A1"][0]["history"][-1:]
        by["C1"][0]["history"] = [h for h in by["C1"][0]["history"] if h["step"] in (349, 599)]
    p = ltfm_here("report", SWEEP, "--from-export", trimmed(tmp_path, "ends", ends_only), "--backtest", "0.667",
                  "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["variant"]: r for r in json.loads(p.stdout)["rows"]}
    assert rows["A1"]["verdict"] == rows["C1"]["verdict"] == "too few points"
    assert (rows["A1"]["step"], rows["A1"]["change"], rows["A1"]["sign_kept"]) == (None, None, None)
    assert rows["A1"]["measured"] == pytest.approx(0.1148, abs=2e-4)   # the later budget is still measured
    assert rows["C1"]["step"] == 349 and rows["C1"]["predicted"] is None and rows["big"]["verdict"] == "holds"
    text = ltfm_here("report", SWEEP, "--from-export", trimmed(tmp_path, "ends2", ends_only), "--backtest", "0.667")
    assert text.returncode == 0 and "| A1 |  | too few points |" in text.stdout

    def lone_base(by):
        for r in by["base"]:
            r["history"] = r["history"][-1:]
    one_line(ltfm_here("report", SWEEP, "--from-export", trimmed(tmp_path, "lone", lone_base), "--backtest", "0.5"),
             "the base's runs have no validation before their last (step 599)", "train.val_every_steps")


def test_a_perplexity_near_a_floats_range_gives_a_result(ltfm_here, tmp_path):
    def huge_base(by):  # every base validation at 1.7e308 (its log 709.7 nats): the seeds' mean overflowed
        ppl(by["base"], lambda s: 1.7e308)
    p = ltfm_here("report", SWEEP, "--from-export", trimmed(tmp_path, "huge", huge_base), "--backtest", "0.667",
                  "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert {r["variant"]: (r["change"], r["noise"], r["measured"]) for r in got["rows"]} == {
        v: (-1.0, "beyond", -1.0) for v in ("A1", "C1", "big")}

    def one_huge_seed(by):  # one base seed ends at 1.7e308: its spread's square overflowed
        by["base"][0]["history"][-1]["dev/ppl"] = by["base"][0]["dev_ppl"] = 1.7e308
    p = ltfm_here("report", SWEEP, "--from-export", trimmed(tmp_path, "one", one_huge_seed), "--backtest", "0.667",
                  "--json")
    assert p.returncode == 0, p.stderr
    assert all(r["measured"] == pytest.approx(-1.0) for r in json.loads(p.stdout)["rows"])


# --------------------------------------------------------------------------------------------------------
# --backtest-to: only this export's rows continued, each to a later budget
# --------------------------------------------------------------------------------------------------------
def later_export(tmp_path, name: str, change) -> str:
    """The continued sweep's export, ``change(records by variant)`` applied; its folder."""
    return edited("table3-cpu-continued", tmp_path, name, change)


def test_backtest_to_refuses_what_is_not_these_rows_continued_to_a_later_budget(ltfm_here, tmp_path):
    def only_the_base_shared(by):  # the rows trained elsewhere (their own run folders), the base continued
        for v, recs in by.items():
            for r in recs:
                r["run"] = r["run"] if v == "base" else f"elsewhere-{r['run']}"

    def other_rows(by):  # C1 at another depth, E renamed: rows this export does not have
        by["C1"][0]["config"]["model.layers"] = 3
        by["E"][0]["variant"] = "E2"

    def backwards(by):  # D1's curve stops at step 299, before this export's 599
        by["D1"][0]["history"] = [h for h in by["D1"][0]["history"] if h["step"] < 300]

    cases = [(only_the_base_shared, "is not this export's rows continued: C1 seed 1 (run "
              "elsewhere-table3-cpu-base-8dae5a66, here "
              "table3-cpu-base-8dae5a66), C2 seed 1"),
             (other_rows, "is not this export's rows continued: C1 seed 1 (model.layers 3, here 1), E2 seed 1 (not in "
              "this export); give the export of a sweep that trained these runs on"),
             (backwards, "its budget is not later than this export's: D1 (step 299, here 599) end no later")]
    for change, words in cases:
        out = tmp_path / f"{change.__name__}.json"
        one_line(ltfm_here("report", SWEEP, "--from-export", EXPORT, "--backtest-to",
                           later_export(tmp_path, change.__name__, change), "--out", out), words)
        assert not out.exists() and not out.with_suffix(".md").exists()
    # the continued export as it is still passes (the rows it continued, each to 1800 steps)
    p = ltfm_here("report", SWEEP, "--from-export", EXPORT, "--backtest-to", LATER, "--json")
    assert p.returncode == 0 and len(json.loads(p.stdout)["rows"]) == 8

    def without_a_default_key(by):  # written by a version before train.clip_norm (at its default in this export)
        for recs in by.values():
            for r in recs:
                del r["config"]["train.clip_norm"]
    p = ltfm_here("report", SWEEP, "--from-export", EXPORT, "--backtest-to",
                  later_export(tmp_path, "older", without_a_default_key), "--json")
    assert p.returncode == 0 and len(json.loads(p.stdout)["rows"]) == 8, p.stderr[-2000:]
