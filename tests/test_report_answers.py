"""Each row's answer in the report (lightning_tfm/report/table3/answers.py): the committed en->de rows at seeds 1, 3
and 4 beside the base at 1-9 (three exports read as one sweep's records) answer as the findings' planner judges
them; the answer and what it took are in table3.csv, table3.md, the LaTeX, the W&B summary and the note; a row of
one seed is unsettled and says that its verdict is no controlled answer."""
from __future__ import annotations

import csv
import dataclasses
import io

import pytest

from lightning_tfm.findings.answers import ANSWERS, BETTER, UNSETTLED, WORSE
from lightning_tfm.findings.settings import SettleSpec
from lightning_tfm.findings.settle import judge
from lightning_tfm.report.inputs.export import read_export
from lightning_tfm.report.publish import kinds
from lightning_tfm.report.table3.answers import row_runs, settle_spec
from lightning_tfm.report.table3.table import build_table
from lightning_tfm.report.views.render import headline_text, table_csv, table_markdown
from lightning_tfm.sweep import load_sweep

from conftest import ROOT

EXPORTS = ("table3-cpu-heldout", "table3-cpu-heldout-s3", "table3-cpu-heldout-s4")


@pytest.fixture(scope="module")
def seeded():
    """The three held-out exports' records as one report of the first's sweep: A1, B1, C4 and prenorm at seeds 1,
    3 and 4 (the other rows' seeds 3 and 4 are not this sweep's rows: left out), D2 and D4 at seed 1, the base at
    seeds 1-9; its table."""
    sweep = load_sweep(ROOT / "sweeps" / f"{EXPORTS[0]}.yaml")
    datas = [read_export(load_sweep(ROOT / "sweeps" / f"{n}.yaml"), ROOT / "reports" / "reference" / n / "export")
             for n in EXPORTS]
    records = [r for d in datas for r in d.records if r.variant in sweep.variants]
    data = dataclasses.replace(datas[0], records=records)
    return data, build_table(data, bootstrap=False)


def test_each_row_is_answered_as_the_planner_judges_it(seeded):
    data, table = seeded
    by = {r.variant: r for r in table.rows}
    base = row_runs("base", [r for r in data.records if r.variant == "base"])
    assert settle_spec(data.sweep) == SettleSpec()  # the heldout sweep file sets no settle: section
    for v in ("A1", "B1", "C4", "D2", "D4", "prenorm"):
        a = judge(row_runs(v, [r for r in data.records if r.variant == v]), base, SettleSpec())
        assert (by[v].answer, by[v].answer_why, by[v].answer_seeds) == (a.answer, a.why, a.row_seeds)
    assert by["base"].answer is None
    assert [by[v].answer_seeds for v in ("A1", "B1", "C4", "prenorm", "D2", "D4")] == [3, 3, 3, 3, 1, 1]
    assert by["prenorm"].answer == BETTER and by["C4"].answer == WORSE  # -46% and +22% of dev PPL
    assert by["prenorm"].answer_high < 0 < by["C4"].answer_low
    assert by["D2"].answer == UNSETTLED and "one seed" in by["D2"].answer_why
    assert by["D2"].ppl_verdict  # the verdict stays beside it
    assert by["A1"].answer_flops == pytest.approx(3 * by["A1"].train_flops, rel=0.01)


def test_the_answer_and_what_it_took_in_every_view(seeded):
    _, table = seeded
    rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(table_csv(table)))}
    assert rows["prenorm"]["answer"] == "better" and rows["prenorm"]["answer_seeds"] == "3"
    assert float(rows["prenorm"]["answer_high"]) < 0 and float(rows["C4"]["answer_low"]) > 0
    assert rows["base"]["answer"] == "" and rows["D2"]["answer"] == "unsettled"
    md = table_markdown(table)
    ppl = md.split("\n## Dev perplexity\n", 1)[1].split("\n## ", 1)[0]
    assert next(ln for ln in ppl.splitlines() if ln.startswith("| row |")).endswith("| answer |")
    assert "unsettled (one seed: the verdict beside is no controlled answer)" in ppl
    assert "Answer (dev PPL): each row against the base from its own seeds" in md  # the rule, in the notes
    head = headline_text(table)
    counts = {a: sum(r.answer == a for r in table.rows) for a in ANSWERS}
    assert (f"Answers from each row's own seeds paired with the base's: {counts['better']} better, "
            f"{counts['worse']} worse") in head and "every row at 3 seeds and the base at the caps" in head
    numbers = kinds.headline_numbers(table.rows, table.run_info)
    assert {a: numbers[f"dev_ppl/answer_{a.replace(' ', '_')}"] for a in ANSWERS} == counts
    cols, cells = kinds.wandb_tables(table)["table3/dev_ppl"]
    assert {"answer", "answer_low", "answer_high"} <= set(cols)
    assert [c[cols.index("answer")] for c in cells] == [r.answer for r in table.rows]
