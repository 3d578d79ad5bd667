"""Table 2's within-noise pair and when it would settle (report/table2/claims.py, noise.seeds_to_settle): in seeds,
the least seeds a row at which Welch's 90% interval of the BLEU difference would exclude zero, checked against
scipy's own Welch test on samples of exactly the measured means and sds; in steps, Table 3's verdict on the pair's
dev-PPL curves; on synthetic rows and on the committed reference's numbers (reports/reference/table2-cpu/)."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from lightning_tfm.findings.noise import SEEDS_MOST, seeds_to_settle
from lightning_tfm.report.inputs.records import ReportData
from lightning_tfm.report.table2 import table as table2
from lightning_tfm.report.table2.columns import Row
from lightning_tfm.report.table3 import verdict

from conftest import ROOT
from test_table2_report import RNN_KNOBS, TRANSFORMER, record, rnn_tokens_for_equal_flops

REFERENCE = ROOT / "reports" / "reference" / "table2-cpu"


def welch_excludes_zero(delta: float, sd_a: float, sd_b: float, n: int) -> bool:
    """scipy's Welch test (ttest_ind, equal_var=False) on n seeds a row of exactly these means and sample sds: its
    90% interval of the difference excludes zero."""
    z = np.random.default_rng(n).standard_normal(n)
    z = (z - z.mean()) / z.std(ddof=1)  # exactly mean 0, sample sd 1
    ci = sps.ttest_ind(delta + sd_a * z, sd_b * z[::-1], equal_var=False).confidence_interval(0.9)
    return ci.low > 0 or ci.high < 0


@pytest.mark.parametrize("delta, sd_a, sd_b", [(1.8133, 0.6745, 1.5409), (1.0, 1.0, 1.0), (-0.5, 0.2, 0.9),
                                               (3.0, 0.1, 2.5)])
def test_seeds_to_settle_is_where_welchs_interval_first_excludes_zero(delta, sd_a, sd_b):
    n = seeds_to_settle(delta, sd_a, sd_b)
    assert n is not None and 2 <= n <= SEEDS_MOST
    assert welch_excludes_zero(delta, sd_a, sd_b, n)
    assert n == 2 or not welch_excludes_zero(delta, sd_a, sd_b, n - 1)


def test_seeds_to_settle_beyond_the_cap_or_without_numbers():
    assert not welch_excludes_zero(0.05, 1.0, 1.0, SEEDS_MOST)
    assert seeds_to_settle(0.05, 1.0, 1.0) is None
    assert seeds_to_settle(1.0, None, 1.0) is None and seeds_to_settle(0.0, 1.0, 1.0) is None


@pytest.fixture
def sweep(tmp_path):
    from lightning_tfm.sweep import load_sweep

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"run": {"name": "t2"}, "data": {"source": "local"}}))
    (tmp_path / "t2.yaml").write_text(yaml.safe_dump({
        "name": "t2noise", "experiment": "exp.yaml", "metric": "dev_loss", "pruner": {"type": "none"},
        "seeds": [1, 2, 3], "variants": {"transformer": TRANSFORMER, "rnn": {"model.arch": "rnn", **RNN_KNOBS}}},
        sort_keys=False))
    return load_sweep(tmp_path / "t2.yaml")


def within_noise(tmp_path, rnn_ppl=(3700, 3900, 3550)):
    """Three seeds a row, test BLEU 1.8 apart with seed sds 0.65 and 1.37 (within 2 x the larger); dev PPL
    ``a / step`` a seed."""
    rnn, tokens = {"model.arch": "rnn", **RNN_KNOBS}, rnn_tokens_for_equal_flops()
    return ([record(tmp_path, "transformer", s, TRANSFORMER, lambda x, a=a: a / x, None, b)
             for s, a, b in ((1, 3600, 13.5), (2, 3500, 12.2), (3, 3800, 12.9))]
            + [record(tmp_path, "rnn", s, rnn, lambda x, a=a: a / x, None, b, wall=120.0, tokens=tokens)
               for s, a, b in zip((1, 2, 3), rnn_ppl, (12.0, 9.5, 11.7))])


def test_a_pair_within_noise_says_when_it_would_settle(sweep, tmp_path):
    """The claim's (a) line, table2.csv and the notes: in seeds, where Welch's interval first excludes zero (scipy's
    test at n and n - 1); in steps, Table 3's verdict of the rnn's dev-PPL curves against the transformer's."""
    table = table2.build_table2(ReportData(sweep, within_noise(tmp_path), "synthetic", {}))
    t, o = table.rows
    d, sds = t.test_bleu - o.test_bleu, (t.test_bleu_std, o.test_bleu_std)
    n = next(k for k in range(2, SEEDS_MOST + 1) if welch_excludes_zero(d, *sds, k))
    assert n > 3  # not yet at today's 3 seeds
    a = table.claims[0]
    assert "within seed noise (Welch's 90% t interval of the difference at 3 seeds a row, ±" in a, a
    assert "includes zero); predicted to settle" in a, a
    assert f"in seeds, at {n} seeds a row (3 now), where Welch's 90% t interval of the difference would exclude " \
           "zero; in steps, BLEU's curves are not fitted, and the dev-PPL gap of rnn to transformer is" in a, a
    v = verdict.curve_verdict(o.runs, t.runs, o.dev_ppl - t.dev_ppl, "within", sweep.report)
    # a gap within noise gets no settle budget in steps (Table 3's rule since #51), and says why
    assert v.verdict == verdict.WITHIN and v.settle is None
    assert f"is within noise ({v.why}): not predicted in steps (back-tested" in a, a
    rows = list(csv.DictReader(io.StringIO(table2.table2_csv(table))))
    assert (rows[1]["against"], rows[1]["bleu_noise"]) == ("transformer", "within")
    assert rows[1]["bleu_settle_seeds"].startswith(f"at {n} seeds a row") and rows[1]["bleu_settle_steps"] in a
    assert rows[0]["bleu_settle_seeds"] == rows[0]["against"] == ""
    assert "not back-tested" in table2.notes_markdown(table)
    assert table2.summary_numbers(table)["rnn/bleu_settle_seeds"] == rows[1]["bleu_settle_seeds"]


def test_a_dev_ppl_gap_beyond_noise_holds_and_a_pair_beyond_noise_gets_no_prediction(sweep, tmp_path):
    table = table2.build_table2(ReportData(sweep, within_noise(tmp_path, (7000, 7100, 6900)), "synthetic", {}))
    a = table.claims[0]
    assert "the dev-PPL gap of rnn to transformer holds its direction (" in a and "nothing to settle in steps" in a, a
    for r in table.rows:
        r.test_bleu_std = 0.1  # now beyond noise: no prediction
    assert "beyond seed noise" in table2.claim_lines(table.rows)[0]
    assert "predicted to settle" not in table2.claim_lines(table.rows)[0]


def reference_rows() -> dict[str, Row]:
    """The committed reference's rows (table2.csv: means, sds and seeds of a completed run of the protocol)."""
    text = (REFERENCE / "table2.csv").read_text()
    num = ("test_bleu", "test_bleu_std", "dev_ppl", "dev_ppl_std")
    return {r["variant"]: Row(r["variant"], arch=r["arch"], seeds_completed=int(r["seeds_completed"]),
                              **{k: float(r[k]) for k in num})
            for r in csv.DictReader(io.StringIO(text)) if r["source"] == "ours"}


def test_the_reference_pair_within_noise_would_settle_at_the_seeds_welch_says():
    """sweeps/table2-cpu.yaml's transformer against rnn-params (1.81 BLEU, 3 seeds): within noise as the committed
    table2.md says, and the seeds a row at which the interval excludes zero are scipy's Welch test's; rnn is
    beyond noise. The reference has no export (its run folders are not committed): no curves, said so."""
    rows = reference_rows()
    md = (REFERENCE / "table2.md").read_text()
    t, o = rows["transformer"], rows["rnn-params"]
    noise, seeds, steps = table2.pair_settle(t, o)
    assert noise == "within" and "rnn-params 11.07 ± 1.54 test BLEU" in md and "within seed noise" in md
    d, sds = t.test_bleu - o.test_bleu, (t.test_bleu_std, o.test_bleu_std)
    n = next(k for k in range(2, SEEDS_MOST + 1) if welch_excludes_zero(d, *sds, k))
    assert not welch_excludes_zero(d, *sds, 3) and seeds.startswith(f"at {n} seeds a row (3 now)")
    assert steps.endswith("not predicted, no dev-PPL curves of both rows' runs")
    assert table2.pair_settle(t, rows["rnn"]) == ("beyond", None, None)


@pytest.mark.parametrize("sds", [(0.5, 0.5), (0.3, 0.45), (1.0, 0.2)])
def test_one_rule_decides_a_pair_and_its_line_says_one_thing(sweep, tmp_path, sds):
    """12.00 and 11.10 test BLEU at 3 seeds a row (#52, 6): twice the larger sd (1.00) would call 0.90 within noise
    while Welch's interval at those 3 seeds already excludes zero. One rule (claims.pair_noise) decides: its verdict
    is scipy's Welch test at the seeds done; a pair within noise is predicted to settle at more seeds than done,
    and a pair beyond it gets no prediction. The line never says both."""
    rnn = {"model.arch": "rnn", **RNN_KNOBS}
    z = np.array([-1.0, 0.0, 1.0])  # mean 0, sample sd 1
    recs = ([record(tmp_path, "transformer", s, TRANSFORMER, lambda x: 3600 / x, None, 12.0 + sds[0] * z[s - 1])
             for s in (1, 2, 3)]
            + [record(tmp_path, "rnn", s, rnn, lambda x: 3700 / x, None, 11.1 + sds[1] * z[s - 1], wall=120.0,
                      tokens=rnn_tokens_for_equal_flops()) for s in (1, 2, 3)])
    table = table2.build_table2(ReportData(sweep, recs, "synthetic", {}))
    a = table.claims[0]
    beyond = welch_excludes_zero(0.9, *sds, 3)
    noise = table2.pair_settle(*table.rows)[0]
    assert noise == ("beyond" if beyond else "within"), a
    assert ("beyond seed noise" in a) == beyond and ("within seed noise" in a) == (not beyond), a
    assert "already" not in a and "2 x the larger" not in a
    if beyond:
        assert "predicted to settle" not in a, a
    else:
        n = next(k for k in range(2, SEEDS_MOST + 1) if welch_excludes_zero(0.9, *sds, k))
        assert n > 3 and f"in seeds, at {n} seeds a row (3 now)" in a, a
    assert "Welch's 90% t interval of the difference of the two rows' means at the seeds done" in \
        table2.notes_markdown(table)
