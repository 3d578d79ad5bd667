"""The report's verdict (holds / may flip / within noise / too few points) in the table, its headline, CSV, notes
and comparison, and equal-compute deltas, on synthetic learning curves and hand-computed cases (no training); the
sweep file's ``report:`` section. The curves' numerics: tests/test_curves.py."""
from __future__ import annotations

import csv
import io
import math
import re

import pytest
import yaml

from lightning_tfm import report as rd
from lightning_tfm.base.errors import UserError
from lightning_tfm.bench.speed import DEFAULTS
from lightning_tfm.model import ModelConfig, train_flops_per_step
from lightning_tfm.report.table3 import columns, compare, compute, verdict
from lightning_tfm.report.views import render
from lightning_tfm.sweep import REPORT_DEFAULTS, load_sweep

from conftest import ROOT, write_sweep

STEPS = range(100, 700, 100)  # validations at 100 .. 600 (the equal-compute cases)
LSTEPS = range(99, 600, 100)  # Lightning's steps of 600 updates (the verdicts)


def curve(fn, steps=STEPS) -> dict[int, float]:
    return {s: fn(s) for s in steps}


BASE = curve(lambda s: 3000.0 / s)  # 30 .. 5


def law(l_inf: float, a: float, alpha: float, shift: float = 0.0) -> dict[int, float]:
    """Dev PPL at Lightning's steps of the log-PPL law L_inf + A t^-alpha (t = updates), moved by ``shift`` nats."""
    return curve(lambda s: math.exp(l_inf + a * (s + 1) ** -alpha + shift), LSTEPS)


LBASE = law(1.5, 30.0, 0.5)  # PPL 90 at step 99 .. 15.3 at step 599


def _records(rows: dict[str, dict[int, float]], base_seeds=(1, 2, 3), base=None) -> list[rd.RunRecord]:
    def rec(variant, seed, curve_):
        last = max(curve_)
        return rd.RunRecord(variant=variant, family=variant[0], seed=seed, status="completed", params=1000,
                            dev_ppl=curve_[last], dev_bleu=10.0, steps=last, config=dict(CFG),
                            history=[{"step": s, "dev/ppl": p} for s, p in sorted(curve_.items())])
    spread = {1: -0.1, 2: 0.0, 3: 0.1}  # the base's seeds: std 0.1 at every step
    out = [rec("base", s, {st: p + spread[s] for st, p in (base or BASE).items()}) for s in base_seeds]
    return out + [rec(v, 1, c) for v, c in rows.items()]


CFG = {"model.layers": 2, "model.d_model": 64, "model.d_ff": 256, "model.heads": 4, "model.d_k": 16,
       "model.d_v": 16, "data.vocab_size": 1000, "train.batch_tokens": 500}

ROWS = {"A1": law(1.5, 30.0, 0.5, 0.5),   # worse by 0.5 nats to the asymptote: holds (paper +0.37: agrees)
        "A2": law(2.3, 60.0, 0.8),        # better at step 599, worse from ~750: may flip (paper +0.08: disagrees)
        "A3": {s: p - 0.01 for s, p in LBASE.items()},   # within noise (paper -0.01)
        "C3": law(1.5, 30.0, 0.5, -0.5)}  # better by 0.5 nats: holds (paper -0.04: agrees)


def test_the_table_gives_each_row_its_verdict_and_the_headline_counts_them(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path / "v.yaml", "v", {"base": {"seeds": [1, 2, 3]}, **{v: {} for v in ROWS}}))
    table = rd.build_table(rd.ReportData(sweep, _records(ROWS, base=LBASE), "synthetic", {}), bootstrap=False)
    by = {r["variant"]: r for r in table.rows}
    assert {v: by[v]["ppl_verdict"] for v in ROWS} == {"A1": "holds", "A2": "may flip", "A3": "within noise",
                                                       "C3": "holds"}
    assert by["base"]["ppl_verdict"] is None and set(table.outlook) == set(ROWS)
    gap = table.outlook["A1"].gap
    assert by["A1"]["ppl_verdict_why"] == verdict.gap_text(gap) and gap.low > 0 and gap.at_step == 1799
    assert re.fullmatch(r"predicted [-+]\d+\.\d% \[[-+]\d+\.\d, [-+]\d+\.\d\] at 1800 steps; direction bound "
                        r"[-+]\d+\.\d%",
                        by["A3"]["ppl_verdict_why"])
    s = table.summary
    assert s["verdicts"] == {"holds": 2, "may flip": 1, "within noise": 1, "too few points": 0}
    assert s["ppl_findings"] == (2, 2) and s["may_flip"] == ["A2"] and s["ppl"] == (3, 4)
    md = rd.table_markdown(table)
    assert "- Direction agrees with the paper: dev PPL 3/4 rows (75%)" in md  # over all rows: stays
    assert ("- Verdicts (dev PPL learning curves extrapolated to 3 × the budget): 2 hold, 1 may flip (A2), "
            "1 within noise, 0 too few points; direction agrees with the paper on the rows that hold: dev PPL 2/2 "
            "rows (100%).") in md
    assert "Verdict (dev PPL): each run's dev log-PPL after the warmup is fitted with a power law" in md  # the notes
    assert "predicted at 3 × the budget" in md and "80% interval (200 draws, seed 0" in md
    _, cells = _md(md)
    title = {c.key: c.shown[columns.PPL].title for c in columns.COLUMNS if columns.PPL in c.shown}  # as declared
    assert cells["A1"][title["ppl_verdict"]] == f"holds ({verdict.gap_text(gap)})"
    assert cells["A3"][title["ppl_verdict"]] == "within noise"
    csv_rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(render.table_csv(table)))}
    assert csv_rows["A2"]["ppl_verdict"] == "may flip" and csv_rows["A1"]["ppl_verdict"] == "holds"
    assert csv_rows["A1"]["ppl_verdict_why"] == verdict.gap_text(gap)
    # the settle budget: rows that may flip, in the table and the CSV (a row within noise gets none)
    assert by["A1"]["ppl_settle"] is None and csv_rows["A1"]["ppl_settle"] == ""
    assert csv_rows["A2"]["ppl_settle"] == by["A2"]["ppl_settle"] == verdict.settle_text(
        table.outlook["A2"], by["A2"]["flops_per_step"])  # the records have no wall time: no hours
    assert cells["A2"][title["ppl_settle"]] == by["A2"]["ppl_settle"] and by["A3"]["ppl_settle"] is None
    # the sweep file's settings: 2 x the budget, another seed
    sweep.report = {**sweep.report, "k": 2.0, "seed": 5}
    other = rd.build_table(rd.ReportData(sweep, _records(ROWS, base=LBASE), "s", {}), bootstrap=False)
    again = {r["variant"]: r for r in other.rows}
    assert "at 1200 steps; direction" in again["A1"]["ppl_verdict_why"] and "2 × the budget" in rd.table_markdown(other)
    sweep.report = dict(REPORT_DEFAULTS)
    same = rd.build_table(rd.ReportData(sweep, _records(ROWS, base=LBASE), "s", {}), bootstrap=False)
    assert [r["ppl_verdict_why"] for r in same.rows] == [r["ppl_verdict_why"] for r in table.rows]  # seeded


def test_the_headline_says_how_much_longer_a_run_would_settle_how_many_rows():
    """The committed CPU reference rebuilt from its export: the headline's settle line counts, at each multiple of
    the budget that changes the count, the rows that may flip whose ``ppl_settle`` is at most that multiple, by
    kind and side, and quotes each kind's back-tested record; the record line, how many rows beyond noise hold and
    how often such calls kept their sign, with the size interval's coverage (counted here from the committed
    back-tests); the terminal's headline has both."""
    from lightning_tfm.findings import calibrate, curves
    from lightning_tfm.findings.noise import share
    from lightning_tfm.report import calibration
    from lightning_tfm.report.views.render import headline_lines, headline_text

    table = rd.build_table(rd.load_report_data(ROOT / "sweeps" / "table3-cpu.yaml",
                                               export_dir=ROOT / "reports" / "reference" / "table3-cpu" / "export"))
    unsettled = [r.ppl_settle for r in table.rows if r.ppl_verdict == "may flip"]
    assert unsettled and all(unsettled)
    assert all(r.ppl_settle is None for r in table.rows if r.ppl_verdict in ("within noise", "holds"))
    ks = [float(m.group(1)) for t in unsettled if (m := re.search(r" at ([\d.]+)x: ", t))]
    not_within = sum(t == "not within 10x" for t in unsettled)
    assert len(ks) + not_within == len(unsettled)
    lines = headline_lines(table)
    (line,) = [ln for ln in lines if "may flip" in ln and ("A run " in ln or "No run " in ln)]
    if ks:
        want, last = [], 0
        for m in verdict.SETTLE_AT:
            if (n := sum(k <= m for k in ks)) > last:
                want.append((m, n))
                last = n
        head = re.match(r"A run ([\d.]+)x as long would settle (\d+) of the (\d+) rows? that may flip((?:, [\d.]+x "
                        r"\d+)*)", line)
        got = [(float(head.group(1)), int(head.group(2)))] + [
            (float(m), int(n)) for m, n in re.findall(r", ([\d.]+)x (\d+)", head.group(4))]
        assert got == want and int(head.group(3)) == len(unsettled)
        flips = sum(t.startswith("flips to") for t in unsettled)
        assert (f"{flips} by flipping to the other" in line) == bool(flips)
    assert (f"; {not_within} not within 10x" in line) == bool(not_within)
    assert line.endswith(f"'holds' {curves.SETTLE_RECORD['holds'][0]} of {curves.SETTLE_RECORD['holds'][1]}; "
                         f"'flips' {curves.SETTLE_RECORD['flips'][0]} of {curves.SETTLE_RECORD['flips'][1]} (rows "
                         "within noise get none: theirs came true no more often than saying nothing).")
    # the record line: the counts and their confidence intervals, as the committed back-tests give them
    folder = ROOT / "reports" / "reference" / "backtest"
    rec = calibrate.record(calibration.load(folder, calibration.CHOSEN_ON), calibration.load(folder))
    (_, called, kept), (inside, n) = rec["holds"], rec["size"]
    held = calibrate.heldout_record(calibration.heldout_rows(folder))
    holds = sum(r.ppl_verdict == "holds" for r in table.rows)
    flip = sum(r.ppl_verdict == "may flip" for r in table.rows)
    (record,) = [ln for ln in lines if "hold their direction" in ln]
    assert record.startswith(f"{holds} of the {holds + flip} rows beyond noise hold their direction at 3x "
                             f"({100 * curves.SIGN_LEVEL:g}% one-sided bound")  # the level the verdict reads
    assert f"kept their sign in {share(kept, called)} back-tested rows" in record
    assert f"each export left out, and in {share(held['holds'][2], held['holds'][1])} held out" in record
    assert f"its 80% interval that held {share(inside, n)} measured gaps" in record
    assert f"where the interval before held {share(*held['size'])}" in record
    assert f"\n{line}\n" in headline_text(table) and f"\n- {record}\n" in rd.table_markdown(table)
    # none of the rows unsettled: no line; none settled by 10x: says so
    gap = table.outlook["A1"].gap
    assert not verdict.settle_summary({"A1": verdict.Verdict("holds", "", gap)})["unsettled"]
    table.summary["settle"] = verdict.settle_summary({"A1": verdict.Verdict("may flip", "", gap)})
    (line,) = [ln for ln in headline_lines(table) if "to settle" in ln or "would settle" in ln]  # not "unsettled"
    assert line.startswith("No run up to 10x as long is predicted to settle any of the 1 row that may flip; 1 not "
                           "within 10x. These are predictions") or line.startswith(
        "No run up to 10x as long is predicted to settle any of the 1 row that may flip. These are predictions")


def test_the_report_section_of_a_sweep_file_is_checked(tmp_path, ltfm_here):
    path = write_sweep(tmp_path / "r.yaml", "r", {"base": {}})
    assert load_sweep(path).report == REPORT_DEFAULTS == {"k": 3.0, "min_points": 3, "level": 0.8,
                                                          "bootstraps": 200, "seed": 0, "family": "power"}
    tree = yaml.safe_load(path.read_text())
    tree["report"] = {"k": 2, "level": 0.9, "family": "saturating"}
    path.write_text(yaml.safe_dump(tree))
    assert load_sweep(path).report == {**REPORT_DEFAULTS, "k": 2.0, "level": 0.9, "family": "saturating"}
    for bad, words in (({"k": 0.5}, "report.k must be a number >= 1"), ({"k": "3x"}, "report.k"),
                       ({"level": 1}, "report.level must be a number in (0, 1)"),
                       ({"min_points": 2}, "report.min_points must be an integer >= 3"),
                       ({"min_points": 3.5}, "report.min_points"), ({"bootstraps": 5}, "report.bootstraps must"),
                       ({"seed": -1}, "report.seed must"),
                       ({"family": "cubic"}, "report.family must be one of power, saturating, exponential"),
                       ({"horizon": 3}, "unknown key 'horizon'"), ([1, 2], "report must be a mapping")):
        tree["report"] = bad
        path.write_text(yaml.safe_dump(tree))
        with pytest.raises(UserError, match=re.escape(words)):
            load_sweep(path)
    p = ltfm_here("report", path)  # the command line: one line, exit 2, before anything runs
    assert p.returncode == 2 and p.stderr.startswith("ltfm: error: sweep file")
    assert "report must be a mapping" in p.stderr
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
    def bench(**heads):
        return train_flops_per_step(ModelConfig(layers=DEFAULTS["layers"], d_model=512, d_ff=DEFAULTS["d_ff"],
                                                heads=8, **heads), DEFAULTS["vocab"], (10.0, 12.0), 1000)

    assert bench(d_k=64, d_v=64) == bench()
    assert bench(d_k=16) < bench() and bench(d_v=16) < bench()
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
    by = {r["variant"]: r for r in table.rows}
    assert table.compute["base_flops"] == pytest.approx(600 * base_f)
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
    header = render.table_csv(table).splitlines()[0].split(",")
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
    short = {"A1": ROWS["A1"], "A2": ROWS["C3"], "A3": ROWS["A3"], "A4": ROWS["A2"]}
    long = {"A1": law(1.5, 30.0, 0.5, 0.45), "A2": ROWS["A1"], "A3": {s: p + 0.01 for s, p in LBASE.items()},
            "A4": ROWS["C3"]}
    a, b = (rd.build_table(rd.ReportData(sweep, _records(r, base=LBASE), "synthetic", {}), bootstrap=False)
            for r in (short, long))
    cmp = rd.compare_tables(a, b)
    by = {r.variant: r for r in cmp.rows}
    assert {v: r.status for v, r in by.items()} == {"A1": "transfers", "A2": "flips", "A3": "transfers",
                                                       "A4": "unsettled"}
    assert cmp.summary["counts"] == {"transfers": 2, "flips": 1, "unsettled": 1}
    assert cmp.summary["flips"] == ["A2"]
    md = rd.comparison_markdown(cmp)
    assert "- Rows: 2 transfer, 1 flip (A2), 1 unsettled (of 4, the base left out)." in md
    assert "may flip: A4." in md and "*flips*: both sides hold with opposite signs" in md
    assert verdict.HOLDS in md and "Not compared" not in md

    # side A continued only A1 and A2 (a longer budget for a few rows): A3 and A4 are shown, not compared
    part = rd.build_table(rd.ReportData(sweep, _records({v: long[v] for v in ("A1", "A2")}, base=LBASE), "synthetic",
                                        {}), bootstrap=False)
    cmp = rd.compare_tables(part, a)
    assert compare.status(None, a.rows[1]) == "only in B" and compare.status(a.rows[1], None) == "only in A"
    assert {r.variant: r.status for r in cmp.rows} == {"A1": "transfers", "A2": "flips", "A3": "only in B",
                                                                "A4": "only in B"}
    assert cmp.summary["counts"] == {"transfers": 1, "flips": 1, "unsettled": 0}
    md = rd.comparison_markdown(cmp)
    assert "- Rows: 1 transfer, 1 flip (A2), 0 unsettled (of 2, the base left out)." in md
    assert "- Not compared, only in B (2): A3, A4." in md
    # the paper: A1 and A2 worse than the base; A (long) agrees on both, B (short) finds A2 better
    assert "- On the 2 rows with a direction in the paper that both sides have: direction agrees A 2/2 (100%), " \
           "B 1/2 (50%)." in md


def test_perplexities_near_a_floats_range_give_numbers_and_verdicts_not_overflow(tmp_path):
    from lightning_tfm.findings.noise import mean_std

    assert mean_std([1.7e308] * 3) == (1.7e308, 0.0)  # the sum overflowed, not the values
    mean, sd = mean_std([1.7e308, 1.0, 1.0])         # the spread's squares overflowed
    assert mean == pytest.approx(1.7e308 / 3) and sd == pytest.approx(1.7e308 / math.sqrt(3))
    # a base seed ending at 1.7e308: the table, its verdicts and its markdown
    sweep = load_sweep(write_sweep(tmp_path / "v.yaml", "v", {"base": {"seeds": [1, 2, 3]}, **{v: {} for v in ROWS}}))
    recs = _records(ROWS, base=LBASE)
    recs[0].history[-1]["dev/ppl"] = recs[0].dev_ppl = 1.7e308
    table = rd.build_table(rd.ReportData(sweep, recs, "synthetic", {}), bootstrap=False)
    by = {r["variant"]: r for r in table.rows}
    assert by["base"]["dev_ppl"] == pytest.approx(1.7e308 / 3) and by["A1"]["ppl_noise"] == "within"
    assert by["A1"]["ppl_verdict"] == "within noise" and "| A1 |" in rd.table_markdown(table)
    # a row whose curve climbs to e^700: the predicted gap at 3 x the budget is beyond a float's exp()
    climbing = {s: math.exp(100 + (s + 1)) for s in LSTEPS}
    v = verdict.curve_verdict([climbing], [LBASE, law(1.5, 30.0, 0.5, 0.01)], 1e300, "beyond")
    assert v.gap.point > 710 and v.verdict == "holds"
    assert v.why == "+inf% [+inf, +inf] at 1800 steps; direction bound +inf%"
    assert verdict.pct(v.gap.point) == "+inf%"
