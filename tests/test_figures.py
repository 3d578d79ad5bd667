"""The report's figures from synthetic records (no training): what a reader sees in each panel."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from conftest import ROOT  # noqa: E402
from lightning_tfm.report import figures  # noqa: E402
from lightning_tfm.report.records import ReportData, RunRecord  # noqa: E402
from lightning_tfm.sweep import load_sweep  # noqa: E402


def test_ema_removes_the_startup_bias_and_smooths():
    assert figures.ema([4.0]) == [4.0]  # debiased: the first point is itself, not 0.4 x itself
    out = figures.ema([4.0, 0.0], smoothing=0.5)
    assert out == pytest.approx([4.0, (0.5 * 0.5 * 4.0) / (0.5 * 0.5 + 0.5)])
    jagged = [5.0, 1.0] * 10
    smooth = figures.ema(jagged)
    assert max(smooth[5:]) - min(smooth[5:]) < 0.5 * (max(jagged) - min(jagged))


def test_seed_band_is_mean_min_max_at_common_steps():
    recs = [RunRecord("base", seed=s, history=[{"step": 10, "dev/ppl": v}, {"step": 20, "dev/ppl": v - 1}])
            for s, v in ((1, 30.0), (2, 34.0), (3, 32.0))]
    recs[0].history.append({"step": 30, "dev/ppl": 20.0})  # a step only one seed reached is left out
    assert figures.seed_band(recs, "dev/ppl") == ([10, 20], [32.0, 31.0], [30.0, 29.0], [34.0, 33.0])


def _data(seeds=(1, 2, 3)) -> ReportData:
    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    curve = lambda scale: [{"step": s, "dev/ppl": scale * 100 / s, "train/loss": scale * (5 - s / 100) + (s % 20) / 10}
                           for s in range(10, 310, 10)]  # noqa: E731
    recs = [RunRecord("base", family="base", seed=s, status="completed", history=curve(1 + s / 50)) for s in seeds]
    recs.append(RunRecord("A1", family="A", seed=1, status="completed", history=curve(1.3)))
    recs.append(RunRecord("prenorm", family="norm", seed=1, status="completed", config={"model.norm": "pre"},
                          history=curve(0.9)))
    return ReportData(sweep=sweep, records=recs, source="synthetic", planned={})


def _legends(fig) -> list[list[str]]:
    return [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend()]


def test_the_base_is_one_legend_entry_with_its_seeds_shaded(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: saved.append(fig) or str(path))
    figures.plot_dev_ppl_by_family(_data(), tmp_path / "f.png")
    legends = _legends(saved[-1])
    assert legends and all(sum(t.startswith("base") for t in entries) == 1 for entries in legends)
    assert "base (mean of 3 seeds, their range shaded)" in legends[0]
    assert any(ax.collections for ax in saved[-1].axes)  # the shaded range
    figures.plot_dev_ppl_by_family(_data(seeds=(1,)), tmp_path / "g.png")
    assert "base" in _legends(saved[-1])[0]


def test_training_loss_is_smoothed_with_the_raw_points_faint(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: saved.append(fig) or str(path))
    figures.plot_norm_curves(_data(), tmp_path / "n.png")
    full = saved[-1].axes[0]
    assert "smoothed" in full.get_title()
    labelled = [ln for ln in full.lines if not ln.get_label().startswith("_")]
    faint = [ln for ln in full.lines if (ln.get_alpha() or 1) < 0.5]
    assert faint and all((ln.get_alpha() or 1) == 1 for ln in labelled)
    assert sum(ln.get_label().startswith("base") for ln in labelled) == 1
    pre = next(ln for ln in labelled if ln.get_label().startswith("prenorm"))
    ys = list(pre.get_ydata())
    assert max(abs(a - b) for a, b in zip(ys, ys[1:])) < 1.0  # the raw curve jumps by up to 1.9 every point


def test_dev_ppl_against_training_compute_marks_the_bases_budget(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: saved.append(fig) or str(path))
    table = {"sweep": "s", "rows": [{"variant": "base", "flops_per_step": 2e9}, {"variant": "big", "flops_per_step": 6e9},
                                    {"variant": "A1", "flops_per_step": None}],
             "curves": {"rows": {"base": {100: 50.0, 200: 30.0}, "big": {100: 60.0, 200: 25.0, 600: 10.0},
                                 "A1": {100: 55.0}}},
             "compute": {"base_flops": 4e11}}
    figures.plot_ppl_vs_flops(table, tmp_path / "f.png")
    ax = saved[-1].axes[0]
    lines = {ln.get_label(): ln for ln in ax.lines}
    assert list(lines["base"].get_xdata()) == [2e11, 4e11] and list(lines["big"].get_xdata()) == [6e11, 12e11, 36e11]
    assert list(lines["base budget (4e+11 FLOPs)"].get_xdata()) == [4e11, 4e11]  # the vertical line
    assert ax.get_xscale() == "log" and "no FLOP count: A1" in ax.get_title()


def test_a_name_with_dollars_is_drawn_as_it_is(tmp_path):
    """A row's name, family or status holding "$" (from a run or an export) is text, not mathtext: a figure never
    fails on one that does not parse."""
    data = _data(seeds=(1,))
    data.records.append(RunRecord(r"x$\bogus{$", family=r"$\bogus{$", seed=1, status="completed",
                                  history=[{"step": 10, "dev/ppl": 50.0}, {"step": 20, "dev/ppl": 40.0}]))
    data.records.append(RunRecord("y", family="A", seed=1, status=r"failed: $\frac{$"))
    path = figures.plot_dev_ppl_by_family(data, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG" and path == str(tmp_path / "f.png")
