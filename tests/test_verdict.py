"""The report's budget verdict (finding / still moving / within noise) and equal-compute deltas, on synthetic
learning curves and hand-computed cases (no training); the sweep file's ``report:`` section."""
from __future__ import annotations

import math
import re

import pytest
import yaml

from conftest import ltfm, write_sweep
from lightning_tfm import report as rd
from lightning_tfm.report import compare, compute, verdict
from lightning_tfm.sweep import REPORT_DEFAULTS, load_sweep
from lightning_tfm.model.transformer import train_flops_per_step
from lightning_tfm.training.bench import DEFAULTS
from lightning_tfm.training.errors import UserError

STEPS = range(100, 700, 100)  # validations at 100 .. 600: the budget is 600, its last third from step 400


def curve(fn) -> dict[int, float]:
    return {s: fn(s) for s in STEPS}


BASE = curve(lambda s: 3000.0 / s)  # 30 .. 5


def test_a_stable_gap_is_a_finding():
    row = curve(lambda s: 1.2 * BASE[s])  # 20% worse at every validation: the log gap is flat
    v = rd.curve_verdict(row, BASE, delta=1.0, noise="beyond")
    assert v["verdict"] == "finding" and v["crossing"] is None
    widening = curve(lambda s: BASE[s] * (1 + s / 1000))
    assert rd.curve_verdict(widening, BASE, delta=3.0, noise="beyond")["verdict"] == "finding"


def test_a_recent_crossing_is_still_moving():
    # worse until step 400, better from step 500: the gap changed sign within the last third
    row = {**curve(lambda s: 1.3 * BASE[s]), 500: 0.95 * BASE[500], 600: 0.9 * BASE[600]}
    v = rd.curve_verdict(row, BASE, delta=-0.5, noise="beyond")
    assert v["verdict"] == "still moving" and "step 400" in v["why"]
    # a crossing before the window (sign steady over steps 400-600) is no longer "recent"
    early = {**curve(lambda s: 0.8 * BASE[s]), 100: 1.5 * BASE[100], 200: 1.2 * BASE[200]}
    assert rd.curve_verdict(early, BASE, delta=-1.0, noise="beyond")["verdict"] == "finding"


def test_a_converging_pair_is_still_moving_and_the_horizon_decides():
    # log gap 0.5 at step 400, 0.4 at 500, 0.3 at 600: its line reaches 0 at step 900 = 1.5 x the budget
    gaps = {100: 0.8, 200: 0.7, 300: 0.6, 400: 0.5, 500: 0.4, 600: 0.3}
    row = {s: BASE[s] * math.exp(g) for s, g in gaps.items()}
    v = rd.curve_verdict(row, BASE, delta=1.0, noise="beyond")
    assert v["verdict"] == "still moving" and v["crossing"] == pytest.approx(900.0)
    # the sweep file's horizon: 1.4 budgets (840 steps) is shorter than 900: closing slowly, a finding
    v = rd.curve_verdict(row, BASE, delta=1.0, noise="beyond", settings={"horizon": 1.4})
    assert v["verdict"] == "finding" and "900" in v["why"]
    # a window of the last 10% of the budget holds step 600 only: widened to the last min_points (500, 600)
    assert rd.curve_verdict(row, BASE, 1.0, "beyond", {"last_fraction": 0.1})["crossing"] == pytest.approx(900.0)
    # min_points 3 over the last 10%: steps 400-600, the same line
    assert rd.curve_verdict(row, BASE, 1.0, "beyond", {"last_fraction": 0.1, "min_points": 3})["verdict"] == \
        "still moving"


def test_noise_decides_first_and_unknowns_are_said():
    row = curve(lambda s: 1.01 * BASE[s])
    assert rd.curve_verdict(row, BASE, delta=0.05, noise="within")["verdict"] == "within noise"
    assert rd.curve_verdict(row, BASE, delta=0.05, noise="unknown")["verdict"] == "unknown"
    assert rd.curve_verdict({600: 5.5}, BASE, delta=0.5, noise="beyond")["verdict"] == "unknown"  # one point
    assert rd.curve_verdict(row, BASE, delta=None, noise=None) is None  # the base, or no completed run


def _records(rows: dict[str, dict[int, float]], base_seeds=(1, 2, 3)) -> list[rd.RunRecord]:
    def rec(variant, seed, curve_):
        last = max(curve_)
        return rd.RunRecord(variant=variant, family=variant[0], seed=seed, status="completed", params=1000,
                            dev_ppl=curve_[last], dev_bleu=10.0, steps=last, config=dict(CFG),
                            history=[{"step": s, "dev/ppl": p} for s, p in sorted(curve_.items())])
    spread = {1: -0.1, 2: 0.0, 3: 0.1}  # the base's seeds: std 0.1 at every step
    out = [rec("base", s, {st: p + spread[s] for st, p in BASE.items()}) for s in base_seeds]
    return out + [rec(v, 1, c) for v, c in rows.items()]


CFG = {"model.layers": 2, "model.d_model": 64, "model.d_ff": 256, "model.heads": 4, "model.d_k": 16,
       "model.d_v": 16, "data.vocab_size": 1000, "train.batch_tokens": 500}


def test_the_headline_counts_findings_and_names_the_rows_still_moving(tmp_path):
    rows = {"A1": curve(lambda s: 1.2 * BASE[s]),                     # worse, flat gap: finding, paper +0.37
            "A2": {**curve(lambda s: 1.3 * BASE[s]), 600: 0.9 * BASE[600]},   # crossed at the end: still moving
            "A3": curve(lambda s: BASE[s] - 0.01),                    # within noise (paper -0.01)
            "C3": curve(lambda s: 0.8 * BASE[s])}                     # better, flat: finding, paper -0.04
    sweep = load_sweep(write_sweep(tmp_path / "v.yaml", "v", {"base": {"seeds": [1, 2, 3]}, **{v: {} for v in rows}}))
    table = rd.build_table(rd.ReportData(sweep, _records(rows), "synthetic", {}), bootstrap=False)
    by = {r["variant"]: r for r in table["rows"]}
    assert {v: by[v]["ppl_verdict"] for v in rows} == {"A1": "finding", "A2": "still moving", "A3": "within noise",
                                                       "C3": "finding"}
    assert by["base"]["ppl_verdict"] is None
    s = table["summary"]
    assert s["ppl_findings"] == (2, 2) and s["still_moving"] == ["A2"] and s["ppl"] == (3, 4)  # A2: paper +0.08
    md = rd.table_markdown(table)
    assert "- Direction agrees with the paper: dev PPL 3/4 rows (75%)" in md  # over all rows: stays
    # the base (3000 / step, its three seeds around it) still falls by a third over the window, steps 400 to 600
    assert ("- Budget verdicts (dev PPL learning curves against the base's): 2 finding(s), 1 still moving (A2), "
            "1 within noise, 0 unknown; direction agrees with the paper on the findings: dev PPL 2/2 rows (100%). "
            "The base's dev PPL still fell 33% over the verdicts' window (step 400: 7.5 → step 600: 5.0): findings "
            "are of this budget.") in md
    assert "Budget verdict (dev PPL): the gap is log PPL(row) − log PPL(base)" in md  # the rule, in the notes
    assert "the last 0.333 of T" in md and "within 2 × T steps" in md
    csv_rows = {ln.split(",")[0]: ln for ln in rd.render.table_csv(table).splitlines()}
    assert ",still moving,crossed" in csv_rows["A2"] and ",finding," in csv_rows["C3"]
    # a tighter sweep file: A1's gap closes slowly (its line reaches 0 at step 3000, 5 budgets); a horizon of 6
    # budgets makes it still moving
    rows["A1"] = {s: BASE[s] * math.exp(0.3 - 0.0001 * s) for s in STEPS}
    sweep.report = {**sweep.report, "horizon": 6.0}
    tight = rd.build_table(rd.ReportData(sweep, _records(rows), "s", {}), bootstrap=False)
    assert tight["summary"]["still_moving"] == ["A1", "A2"] and "6 × T" in rd.table_markdown(tight)
    sweep.report = dict(REPORT_DEFAULTS)
    assert rd.build_table(rd.ReportData(sweep, _records(rows), "s", {}), bootstrap=False)["summary"]["still_moving"] == ["A2"]


def test_the_report_section_of_a_sweep_file_is_checked(tmp_path):
    path = write_sweep(tmp_path / "r.yaml", "r", {"base": {}})
    assert load_sweep(path).report == REPORT_DEFAULTS
    tree = yaml.safe_load(path.read_text())
    tree["report"] = {"last_fraction": 0.5, "horizon": 3}
    path.write_text(yaml.safe_dump(tree))
    assert load_sweep(path).report == {"last_fraction": 0.5, "horizon": 3.0, "min_points": 2}
    for bad, words in (({"last_fraction": 0}, "report.last_fraction must be a number in (0, 1]"),
                       ({"last_fraction": 1.5}, "report.last_fraction"), ({"horizon": 0.5}, "report.horizon must"),
                       ({"horizon": "2x"}, "report.horizon"), ({"min_points": 1}, "report.min_points must"),
                       ({"min_points": 2.5}, "report.min_points"), ({"window": 3}, "unknown key 'window'"),
                       ([1, 2], "report must be a mapping")):
        tree["report"] = bad
        path.write_text(yaml.safe_dump(tree))
        with pytest.raises(UserError, match=re.escape(words)):
            load_sweep(path)
    p = ltfm("report", path)  # the command line: one line, exit 2, before anything runs
    assert p.returncode == 2 and p.stderr.startswith("ltfm: error: sweep file") and "report must be a mapping" in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr


# --------------------------------------------------------------------------------------------------------
# Equal compute
# --------------------------------------------------------------------------------------------------------
def test_interpolation_is_log_ppl_linear_in_log_flops():
    # (1e12, 100) and (4e12, 25): at 2e12, halfway in log FLOPs, log PPL halfway: sqrt(100 * 25) = 50
    assert rd.interpolate([(1e12, 100.0), (4e12, 25.0)], 2e12) == (pytest.approx(50.0), None)
    # at 1.5e12 of (1e12, 64) and (3e12, 16): t = log 1.5 / log 3 = 0.369; 64 x 4^-t = 38.37
    t = math.log(1.5) / math.log(3)
    assert rd.interpolate([(3e12, 16.0), (1e12, 64.0)], 1.5e12)[0] == pytest.approx(64 * 4 ** -t)
    assert rd.interpolate([(3e12, 16.0), (1e12, 64.0)], 1.5e12)[0] == pytest.approx(38.37, abs=0.01)
    assert rd.interpolate([(1e12, 100.0), (4e12, 25.0)], 4e12) == (pytest.approx(25.0), None)  # at a validation
    value, why = rd.interpolate([(1e12, 100.0), (4e12, 25.0)], 5e12)
    assert value is None and why.startswith("beyond its curve: never reached")
    value, why = rd.interpolate([(1e12, 100.0), (4e12, 25.0)], 5e11)
    assert value is None and "never spent that little" in why


def test_flops_per_step_is_bench_count_at_the_rows_shapes():
    # bench's count is unchanged where h * d_k = d_model, and counts narrower heads as narrower
    assert train_flops_per_step({**DEFAULTS, "d_k": 64, "d_v": 64}) == train_flops_per_step(DEFAULTS)
    assert train_flops_per_step({**DEFAULTS, "d_k": 16}) < train_flops_per_step(DEFAULTS)
    rec = rd.RunRecord("B1", status="completed", config=dict(CFG), vocab_size=900, effective_batch_tokens=600,
                       src_len=12.0, tgt_len=15.0)
    shapes, measured = compute.row_shapes(rec)
    assert measured and shapes == {"layers": 2, "d_model": 64, "d_ff": 256, "heads": 4, "d_k": 16, "d_v": 16,
                                   "vocab": 900, "batch": 40.0, "src_len": 12.0, "tgt_len": 15.0}
    # by hand: encoder 2 x (4 x 64 x 64 + 2 x 64 x 256), decoder 2 x (8 x 64 x 64 + 2 x 64 x 256), softmax 64 x 900
    enc, dec = 2 * (4 * 64 * 64 + 2 * 64 * 256), 2 * (8 * 64 * 64 + 2 * 64 * 256)
    dense = 6 * (enc * 40 * 12 + dec * 40 * 15 + 64 * 900 * 40 * 15)
    attn = 6 * 128 * 40 * 2 * (12 * 12 + 15 * 15 + 15 * 12)
    assert compute.flops_per_step([rec]) == (pytest.approx(dense + attn), True)
    # without the corpus's lengths: bench's default lengths, said so
    assert compute.row_shapes(rd.RunRecord("x", config=dict(CFG)))[0]["tgt_len"] == DEFAULTS["tgt_len"]
    assert compute.flops_per_step([rd.RunRecord("x", status="failed", config=dict(CFG))]) == (None, False)


def test_equal_compute_delta_reads_the_rows_curve_at_the_bases_budget(tmp_path):
    """A row twice as costly a step as the base: at the base's budget (600 base steps) it has done 300 steps;
    a row half as costly never reaches it in its 600 steps."""
    sweep = load_sweep(write_sweep(tmp_path / "c.yaml", "c", {"base": {"seeds": [1, 2, 3]}, "C7": {}, "C6": {}}))
    recs = _records({"C7": curve(lambda s: 2000.0 / s), "C6": curve(lambda s: 2000.0 / s)})
    base_f = compute.flops_per_step([r for r in recs if r.variant == "base"])[0]
    recs[3].config = {**CFG, "train.batch_tokens": 1000}  # C7: the base's shapes, twice its tokens a step
    recs[4].config = {**CFG, "train.batch_tokens": 250}   # C6: half of them
    table = rd.build_table(rd.ReportData(sweep, recs, "synthetic", {}), bootstrap=False)
    by = {r["variant"]: r for r in table["rows"]}
    assert table["compute"]["base_flops"] == pytest.approx(600 * base_f)
    assert by["C7"]["flops_per_step"] == pytest.approx(2 * base_f)
    # C7 at 300 of its steps: 2000 / 300 = 6.667, against the base's 5.0 at 600
    assert by["C7"]["dev_ppl_equal_flops"] == pytest.approx(2000 / 300)
    assert by["C7"]["delta_ppl_equal_flops"] == pytest.approx(2000 / 300 - 5.0)
    assert by["C7"]["delta_ppl"] == pytest.approx(2000 / 600 - 5.0)  # equal steps: better; equal compute: worse
    # C6 reaches the base's budget only at 1200 of its steps; it trained 600: beyond its curve
    assert by["C6"]["dev_ppl_equal_flops"] is None and by["C6"]["equal_flops_note"].startswith("beyond its curve")
    _, cells = _md(rd.table_markdown(table))
    assert cells["C7"]["ΔPPL ours at base FLOPs"] == f"{2000 / 300 - 5:+.2f} ({100 * (2000 / 300 - 5) / 5:+.0f}%)"
    assert cells["C6"]["ΔPPL ours at base FLOPs"].startswith("beyond its curve")
    assert cells["base"]["ΔPPL ours at base FLOPs"] == f"budget {600 * base_f:.3g} FLOPs"
    header = rd.render.table_csv(table).splitlines()[0].split(",")
    assert header[header.index("delta_ppl") + 1] == "delta_ppl_equal_flops"  # beside the equal-steps Δ


def _md(text: str):
    import re
    body = text.split("\n## Dev perplexity\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in body.splitlines() if ln.startswith("| ")]
    split = lambda ln: [c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]]  # noqa: E731
    head = split(lines[0])
    rows = [dict(zip(head, split(ln))) for ln in lines[1:]]
    return [r["row"] for r in rows], {r["row"]: r for r in rows}


# --------------------------------------------------------------------------------------------------------
# Two tables side by side
# --------------------------------------------------------------------------------------------------------
def test_comparison_status_of_each_row(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", "s", {"base": {"seeds": [1, 2, 3]}, "A1": {}, "A2": {},
                                                              "A3": {}, "A4": {}}))
    short = {"A1": curve(lambda s: 1.2 * BASE[s]), "A2": curve(lambda s: 0.8 * BASE[s]),
             "A3": curve(lambda s: BASE[s] + 0.01), "A4": {**curve(lambda s: 1.3 * BASE[s]), 600: 0.9 * BASE[600]}}
    long = {"A1": curve(lambda s: 1.1 * BASE[s]), "A2": curve(lambda s: 1.2 * BASE[s]),
            "A3": curve(lambda s: BASE[s] - 0.01), "A4": curve(lambda s: 0.8 * BASE[s])}
    a, b = (rd.build_table(rd.ReportData(sweep, _records(r), "synthetic", {}), bootstrap=False) for r in (short, long))
    cmp = rd.compare_tables(a, b)
    by = {r["variant"]: r for r in cmp["rows"]}
    assert {v: r["status"] for v, r in by.items()} == {"A1": "transfers", "A2": "flips", "A3": "transfers",
                                                       "A4": "unsettled"}
    assert cmp["summary"]["counts"] == {"transfers": 2, "flips": 1, "unsettled": 1} and cmp["summary"]["flips"] == ["A2"]
    md = rd.comparison_markdown(cmp)
    assert "- Rows: 2 transfer, 1 flip (A2), 1 unsettled (of 4, the base left out)." in md
    assert "still moving: A4." in md and "*flips*: findings on both sides with opposite signs" in md
    assert verdict.FINDING in md and "Not compared" not in md

    # side A continued only A1 and A2 (a longer budget for a few rows): A3 and A4 are shown, not compared
    part = rd.build_table(rd.ReportData(sweep, _records({v: long[v] for v in ("A1", "A2")}), "synthetic", {}),
                          bootstrap=False)
    cmp = rd.compare_tables(part, a)
    assert compare.status(None, a["rows"][1]) == "only in B" and compare.status(a["rows"][1], None) == "only in A"
    assert {r["variant"]: r["status"] for r in cmp["rows"]} == {"A1": "transfers", "A2": "flips", "A3": "only in B",
                                                                "A4": "only in B"}
    assert cmp["summary"]["counts"] == {"transfers": 1, "flips": 1, "unsettled": 0}
    md = rd.comparison_markdown(cmp)
    assert "- Rows: 1 transfer, 1 flip (A2), 0 unsettled (of 2, the base left out)." in md
    assert "- Not compared, only in B (2): A3, A4." in md
    # the paper: A1 and A2 worse than the base; A (long) agrees on both, B (short) finds A2 better
    assert "- On the 2 rows with a direction in the paper that both sides have: direction agrees A 2/2 (100%), " \
           "B 1/2 (50%)." in md


def test_the_window_is_the_last_third_of_the_updates_whether_steps_count_from_0_or_1():
    """Lightning logs the 600th update as step 599: the last third of 600 updates starts at step 399, as it starts
    at step 400 when steps count from 1; the base's fall over that window is measured from its first step."""
    assert [s for s in range(99, 600, 100) if s >= verdict.window_start(599, 1 / 3)] == [399, 499, 599]
    assert [s for s in range(100, 601, 100) if s >= verdict.window_start(600, 1 / 3)] == [400, 500, 600]
    assert [s for s in range(99, 1800, 100) if s >= verdict.window_start(1799, 1 / 3)][0] == 1199
    trend = verdict.base_trend({99: 272.8, 199: 139.2, 299: 79.0, 399: 58.7, 499: 45.5, 599: 37.1})
    assert (trend["from_step"], trend["to_step"]) == (399, 599) and trend["drop"] == pytest.approx(1 - 37.1 / 58.7)
    assert verdict.base_trend({599: 37.1}) is None
    # a row whose gap holds from step 399 on but had the other sign at step 399 is caught now (a 2-point window
    # from step 499 missed it)
    base = {99: 272.8, 199: 139.2, 299: 79.0, 399: 58.7, 499: 45.5, 599: 37.1}
    row = {**{s: 0.9 * p for s, p in base.items()}, 399: 60.0}
    assert verdict.curve_verdict(row, base, -3.7, "beyond")["verdict"] == verdict.MOVING
