"""Two budgets of one tiny sweep side by side (``ltfm report A --against B``), and a report rebuilt from its export
alone (``--from-export``): real ``ltfm sweep`` runs, the real notebooks; a flip from synthetic curves through the
same command line."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from lightning_tfm import report as rd
from lightning_tfm.sweep import load_sweep

from conftest import ROOT, ltfm, write_sweep
from test_verdict import BASE, STEPS, _records, curve

# The tiny sweep: the base at two seeds (the seed noise), and a row whose learning rate is a ten-thousandth of
# the base's: it hardly learns, so its gap to the base widens at every budget.
VARIANTS = {"base": {"seeds": [1, 2]}, "slow": {"family": "other", "train.lr_scale": 0.0001}}


def _csv(path: Path) -> dict[str, dict]:
    return {r["variant"]: r for r in csv.DictReader(io.StringIO(path.read_text()))}


def _ok(p) -> None:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def _one_line(p) -> str:
    assert p.returncode == 2 and p.stderr.startswith("ltfm: error: ") and p.stderr.strip().count("\n") == 0, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return p.stderr


@pytest.mark.slow
@pytest.mark.long  # rows read at their own budget: make test keeps test_report_inputs.py's two-budget tests
def test_two_budgets_side_by_side_and_the_export_a_report_writes(tmp_path, data_dir):
    sweep = write_sweep(tmp_path / "bud.yaml", "bud", VARIANTS)
    results = tmp_path / "results"
    args = [f"data.path={data_dir}", f"run.results_dir={results}"]
    _ok(ltfm("sweep", sweep, *args))  # train.max_steps 20 (tests/conftest.py's TINY)
    short = tmp_path / "at20"
    p = ltfm("report", sweep, "--results", results, "--out", short)
    _ok(p)
    export = short / "export" / "bud.json"
    assert export.is_file() and (short / "ppl_vs_flops.png").is_file()
    tree = json.loads(export.read_text())
    assert {(r["variant"], r["seed"]) for r in tree["records"]} == {("base", 1), ("base", 2), ("slow", 1)}
    assert all(r["history"] and r["hyps"] is None and "/" not in r["run"] for r in tree["records"])  # no paths
    assert {r["precision"] for r in tree["records"]} <= {"32-true", "bf16-mixed"}  # what train.precision auto became
    assert not list((short / "export").glob("*.ckpt"))
    by = _csv(short / "table3.csv")
    # 20 steps validated at 9 and 19, a warmup of 10: too few points to fit a curve
    assert by["slow"]["ppl_verdict"] == "too few points" and by["slow"]["ppl_noise"] == "beyond"
    assert by["slow"]["ppl_verdict_why"] == "the row: 1 validation(s) after the warmup (step 10), the fit needs 3"
    assert "0 hold, 0 may flip, 0 within noise, 1 too few points" in p.stdout

    # (the report rebuilt from its export alone: the committed reference's test below)

    # a larger budget continues the same runs (run ids do not depend on train.max_steps)
    folders = sorted(d.name for d in results.iterdir() if (d / "summary.json").is_file())
    _ok(ltfm("sweep", sweep, *args, "train.max_steps=40"))
    assert sorted(d.name for d in results.iterdir() if (d / "summary.json").is_file()) == folders
    assert {json.loads((results / f / "summary.json").read_text())["steps"] for f in folders} == {40}

    # side A: the 40-step runs; side B: the 20-step report's export
    cmp = tmp_path / "cmp"
    p = ltfm("report", sweep, "--results", results, "--against", sweep, "--against-export", short / "export",
             "--out", cmp)
    _ok(p)
    assert {f.name for f in cmp.iterdir()} == {"compare.md", "compare.csv", "compare.json", "compare.html",
                                               "compare.ipynb", "compare_deltas.png", "a_ppl_vs_flops.png",
                                               "b_ppl_vs_flops.png", ".ltfm-report"}
    row = _csv(cmp / "compare.csv")["slow"]
    # A at 40 steps fits three validations (19, 29, 39): its gap holds; B at 20 had too few points to say
    assert (row["a_ppl_verdict"], row["b_ppl_verdict"], row["status"]) == ("holds", "too few points", "unsettled")
    assert float(row["a_delta_ppl"]) > 0 and float(row["b_delta_ppl"]) > 0
    # B is the 20-step table
    assert float(row["b_delta_ppl"]) == pytest.approx(float(by["slow"]["delta_ppl"]), rel=1e-5)
    md = (cmp / "compare.md").read_text()
    assert "- Rows: 0 transfer, 0 flip, 1 unsettled (of 1, the base left out)." in md
    assert "A: bud at 40 steps" in md and "B: bud at 20 steps" in md
    assert "Rows: 0 transfer" in p.stdout and f"report: {cmp / 'compare.md'}" in p.stdout
    html = (cmp / "compare.html").read_text(encoding="utf-8")
    assert "transfers" in html and "rd.compare_tables" not in html  # for readers: no code

    # another sweep file trains "slow" on to 60 steps in its run folder (as sweeps/table3-cpu-continued.yaml does):
    # this sweep's table still reads it at its own budget, 40 steps, beside the base at 40, and says so
    more = write_sweep(tmp_path / "more.yaml", "more", {"slow": VARIANTS["slow"]})
    _ok(ltfm("sweep", more, *args, "train.max_steps=60"))
    data = rd.load_report_data(sweep, results_dir=results)
    slow = next(r for r in data.records if r.variant == "slow")
    assert (slow.steps, slow.config["train.max_steps"]) == (40, 40) and slow.later_attempt == "completed at step 60"
    assert max(h["step"] for h in slow.history) < 40 and any("slow s1 at 40" in n for n in data.notes)
    at40 = {r["variant"]: r for r in rd.build_table(data, bootstrap=False).rows}
    assert at40["slow"]["dev_ppl"] == pytest.approx(float(row["a_dev_ppl"]), rel=1e-5)   # side A above: 40 steps
    assert at40["slow"]["delta_ppl"] == pytest.approx(float(row["a_delta_ppl"]), rel=1e-5)


def test_a_flip_and_the_comparisons_inputs_through_the_command_line(tmp_path, ltfm_here):
    """Two exports of synthetic tables (the same rows at two budgets; A2 better at one, worse at the other), compared
    by the command line; then the mistakes it refuses in one line."""
    sweep_file = write_sweep(tmp_path / "syn.yaml", "syn", {"base": {"seeds": [1, 2, 3]}, "A1": {}, "A2": {}})
    sweep = load_sweep(sweep_file)
    # gaps of 0.5-0.6 nats: beyond the extrapolation's error at 3x (0.38 nats, lightning_tfm.findings.curves)
    sides = {"short": {"A1": curve(lambda s: 1.7 * BASE[s]), "A2": curve(lambda s: 0.6 * BASE[s])},
             "long": {"A1": curve(lambda s: 1.8 * BASE[s]), "A2": {s: BASE[s] * math.exp(0.6) for s in STEPS}}}
    for name, rows in sides.items():
        data = rd.ReportData(sweep, _records(rows), "synthetic", {})
        rd.write_export(data, rd.build_table(data, bootstrap=False), tmp_path / name)
    out = tmp_path / "cmp"
    p = ltfm("report", sweep_file, "--from-export", tmp_path / "short", "--against", sweep_file, "--against-export",
             tmp_path / "long" / "syn.json", "--out", out)
    _ok(p)
    rows = _csv(out / "compare.csv")
    assert {v: r["status"] for v, r in rows.items()} == {"A1": "transfers", "A2": "flips"}
    assert (rows["A2"]["a_ppl_verdict"], rows["A2"]["b_ppl_verdict"]) == ("holds", "holds")
    assert float(rows["A2"]["a_delta_ppl"]) < 0 < float(rows["A2"]["b_delta_ppl"])
    assert "1 flip (A2)" in (out / "compare.md").read_text()

    s, short = sweep_file, tmp_path / "short"

    def refused(*args):  # `ltfm report ARGS` in this process: its one-line error
        return _one_line(ltfm_here("report", *args))

    assert "--against-results belongs to --against" in refused(s, "--against-results", tmp_path)
    assert "drop --results" in refused(s, "--from-export", short, "--results", tmp_path)
    assert "no export of sweep 'syn'" in refused(s, "--from-export", tmp_path / "nowhere")
    other = write_sweep(tmp_path / "other.yaml", "other", {"base": {}})
    assert "exports sweep 'syn', not 'other'" in refused(other, "--from-export", short / "syn.json")
    assert "drop --against-results" in refused(s, "--from-export", short, "--against", s, "--against-export",
                                               tmp_path / "long", "--against-results", tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    assert "not a readable JSON file" in refused(s, "--from-export", tmp_path / "bad.json")


@pytest.mark.slow
def test_the_committed_cpu_reference_and_its_comparison_are_rebuilt_from_their_exports_alone(tmp_path):
    """reports/reference/: the CPU Table 3 references (table3-cpu, the current one; table3-cpu-2026-11-25, the one
    the continued rows and the back-tests start from) and the comparison of the latter with its rows continued to
    1,800 steps, rebuilt by ``ltfm report`` from the committed exports alone (no run folder, no Optuna storage):
    what is committed."""
    ref = ROOT / "reports" / "reference"
    for name in ("table3-cpu",):  # the one the report code of today wrote; the older one's export is compared below
        out = tmp_path / name
        p = ltfm("report", "sweeps/table3-cpu.yaml", "--from-export", ref / name / "export", "--out", out)
        _ok(p)
        assert "not published (a report rebuilt from an export)" in p.stdout  # no W&B run, no optuna-dashboard note
        # the committed tables are the export's rendered by today's report code (provenance.txt: re-rendered)
        assert (out / "table3.csv").read_text() == (ref / name / "table3.csv").read_text(), name
        assert (out / "table3.md").read_text() == (ref / name / "table3.md").read_text(), name
        # the terminal's headline is the page's: the settle budgets' line among it
        settle = next(ln for ln in (out / "table3.md").read_text().splitlines() if ln.startswith("- A run "))
        assert f"\n{settle[2:]}\n" in p.stdout



def test_every_committed_comparison_is_its_exports_compared_by_todays_code():
    """Each committed comparison page (reports/reference/*-vs-*/) is listed in reports/reference/comparisons.txt,
    whence make rerender renders it, and its compare.md and compare.csv are what today's code makes of its two
    exports (as compare.ipynb builds them, in process)."""
    from lightning_tfm import report as rd
    from lightning_tfm.report.table3.compare import comparison_csv

    ref = ROOT / "reports" / "reference"
    listed = [ln.split() for ln in (ref / "comparisons.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert sorted(p.name for p in ref.glob("*-vs-*") if p.is_dir()) == sorted(row[0] for row in listed)
    for page, sweep, export, against, against_export in listed:
        a = rd.load_report_data(ROOT / sweep, export_dir=ROOT / export)
        b = rd.load_report_data(ROOT / against, export_dir=ROOT / against_export)
        cmp = rd.compare_tables(rd.build_table(a, bootstrap=False), rd.build_table(b, bootstrap=False))
        assert rd.comparison_markdown(cmp) == (ref / page / "compare.md").read_text(), f"{page}: run make rerender"
        assert comparison_csv(cmp) == (ref / page / "compare.csv").read_text(), f"{page}: run make rerender"


def test_every_committed_page_is_its_export_rendered_by_todays_code():
    """make rerender (reports/reference/rerender.sh) re-renders each committed reference page from its export: on a
    main whose pages are current it changes nothing. Checked here for each page's tables and headline (the
    markdown, built in process; the HTML, LaTeX and figures are the same report's)."""
    import json

    from lightning_tfm import report as rd

    pages = sorted((ROOT / "reports" / "reference").glob("*/export/*.json"))
    assert len(pages) >= 4
    for export in pages:
        page = export.parent.parent
        sweep = ROOT / "sweeps" / Path(json.loads(export.read_text())["sweep_file"]).name
        md = rd.table_markdown(rd.build_table(rd.load_report_data(sweep, export_dir=export.parent)))
        committed = (page / "table3.md").read_text()
        assert committed.split("\n## W&B and optuna-dashboard\n")[0].rstrip("\n") == md.rstrip("\n"), (
            f"{page.name}: run make rerender")
