"""A pipeline check's figures (#52 item 20): runs tagged ``pipeline-check`` (``make ablation QUICK=1``) make every
figure of the report say so across it, the lead figure (changes.png, report/views/lead.py) in its title too; and the
lead figure never shows a change as a share of a base of about nothing (a dev BLEU of 0.004 made a +0.22 change
"+5525%"): "n/a" with the absolute change. Synthetic records, no training."""
from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from lightning_tfm.report.core import plots  # noqa: E402
from lightning_tfm.report.inputs.records import ReportData, RunRecord, is_pipeline_check  # noqa: E402
from lightning_tfm.report.table3.table import build_table  # noqa: E402
from lightning_tfm.report.views import figures, lead  # noqa: E402
from lightning_tfm.sweep import load_sweep  # noqa: E402

from conftest import ROOT  # noqa: E402

CHECK = {"wandb.tags": ["pipeline-check"]}


def data(check: bool, base_bleu: float) -> ReportData:
    curve = [{"step": s, "dev/ppl": 900 / s, "train/loss": 6 - s / 20} for s in range(10, 30, 10)]
    config = CHECK if check else {}
    recs = [RunRecord("base", family="base", seed=s, status="completed", config=dict(config), history=curve,
                      dev_ppl=400.0 + s, dev_bleu=base_bleu + 0.001 * s) for s in (1, 2)]
    recs.append(RunRecord("A1", family="A", seed=1, status="completed", config=dict(config), history=curve,
                          dev_ppl=380.0, dev_bleu=base_bleu + 0.22))
    return ReportData(load_sweep(ROOT / "sweeps" / "table3-cpu.yaml"), recs, "synthetic", {})


def table_of(d: ReportData) -> dict:
    """The table as the report notebook (table3.ipynb) builds it: pipeline_check set from the records."""
    table = build_table(d, bootstrap=False)
    table.pipeline_check = is_pipeline_check(d.records)
    return table


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]


@pytest.mark.parametrize("check", [True, False])
def test_every_figure_of_a_pipeline_check_says_so(monkeypatch, tmp_path, check):
    d = data(check, base_bleu=20.0)
    table = table_of(d)
    made = []
    monkeypatch.setattr(lead, "save_figure", lambda fig, *a, **k: made.append(fig) or "x")
    monkeypatch.setattr(figures, "save_figure", lambda fig, *a, **k: made.append(fig) or "x")
    lead.plot_changes(table, tmp_path / "changes.png")
    figures.plot_dev_ppl_by_family(d, tmp_path / "a.png")
    figures.plot_norm_curves(d, tmp_path / "b.png")
    figures.plot_bleu_vs_params(table, tmp_path / "c.png")
    figures.plot_ppl_vs_flops(table, tmp_path / "d.png")
    assert len(made) == 5
    for fig in made:
        assert (plots.PIPELINE_CHECK_MARK in texts(fig)) is check
    title = made[0]._suptitle.get_text()
    assert title.startswith("PIPELINE CHECK") is check, title
    assert ("Pipeline check" in lead.changes_caption(table)) is check


def test_no_share_of_a_base_of_about_nothing(monkeypatch, tmp_path):
    table = table_of(data(True, base_bleu=0.0025))  # the base's dev BLEU: 0.004 on average
    made = []
    monkeypatch.setattr(lead, "save_figure", lambda fig, *a, **k: made.append(fig) or "x")
    lead.plot_changes(table, tmp_path / "changes.png")
    ppl, bleu, _ = made[0].axes
    shown = [t.get_text() for t in bleu.texts]
    assert "n/a: our base is about 0 (change +0.22)" in shown, shown
    assert not [t for t in shown if re.fullmatch(r"[+-]\d+(\.\d)?%", t) and abs(float(t[:-1])) > 1000], shown
    ours = [p for p in bleu.patches if isinstance(p, matplotlib.patches.Rectangle) and p.get_height() < 1
            and p.get_y() + p.get_height() / 2 < 1 and p.get_facecolor()[:3] != matplotlib.colors.to_rgb(lead.PAPER)]
    assert ours == []  # no bar of ours in the BLEU panel, nor a noise band as a share of the base
    assert not [p for p in bleu.patches if p.get_height() >= 1]
    assert any(re.fullmatch(r"[+-]\d+%", t.get_text()) for t in ppl.texts)  # dev PPL: its shares as before
    assert "n/a" in lead.changes_caption(table) and "dev BLEU is about 0" in lead.changes_caption(table)
    # a base of 1.5 BLEU is a base: its share is shown
    table = table_of(data(False, base_bleu=1.5))
    assert lead.relative_shown(table, "bleu") and lead.relative_shown(table, "ppl")


def test_the_tables_give_no_share_of_a_bleu_below_the_floor():
    """The BLEU table and the CSV, like the lead figure: a change against a base BLEU below BLEU_FLOOR has no share
    (a share of smoothing), the absolute change stays; a base above it keeps its share."""
    from lightning_tfm.report.table3.stats import BLEU_FLOOR

    low = {r.variant: r for r in table_of(data(True, base_bleu=0.0025)).rows}
    assert low["A1"]["delta_bleu"] == pytest.approx(0.2185) and low["A1"]["delta_bleu_rel"] is None
    assert low["A1"]["delta_ppl_rel"] is not None   # dev PPL's share as before
    high = {r.variant: r for r in table_of(data(False, base_bleu=BLEU_FLOOR + 0.5)).rows}
    assert high["A1"]["delta_bleu_rel"] == pytest.approx(high["A1"]["delta_bleu"] / (BLEU_FLOOR + 0.5015))
