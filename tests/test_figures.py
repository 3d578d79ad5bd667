"""The report's figures from synthetic records and the committed reference export (no training): what a reader sees
in each panel, the lead figure, the figures' file formats, and `ltfm report --formats` end to end."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path  # noqa: E402
from xml.etree import ElementTree  # noqa: E402

import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from lightning_tfm.base.errors import UserError  # noqa: E402
from lightning_tfm.report.core import plots  # noqa: E402
from lightning_tfm.report.inputs.records import ReportData, RunRecord  # noqa: E402
from lightning_tfm.report.table3.columns import Row  # noqa: E402
from lightning_tfm.report.table3.table import LearningCurves, Table3, build_table  # noqa: E402
from lightning_tfm.report.views import figures, lead  # noqa: E402
from lightning_tfm.sweep import load_sweep  # noqa: E402

from conftest import ROOT, SMOKE, TINY, ltfm  # noqa: E402


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


def kept(saved: list, real=None):
    """A stand-in for figures.save_figure that keeps each figure in ``saved`` (and writes it with ``real``)."""
    def save(fig, path, formats=("png",), empty=None):
        saved.append(fig)
        return real(fig, path, formats, empty) if real else str(path)
    return save


def _data(seeds=(1, 2, 3)) -> ReportData:
    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    def curve(scale):
        return [{"step": s, "dev/ppl": scale * 100 / s, "train/loss": scale * (5 - s / 100) + (s % 20) / 10}
                for s in range(10, 310, 10)]

    recs = [RunRecord("base", family="base", seed=s, status="completed", history=curve(1 + s / 50)) for s in seeds]
    recs.append(RunRecord("A1", family="A", seed=1, status="completed", history=curve(1.3)))
    recs.append(RunRecord("prenorm", family="norm", seed=1, status="completed", config={"model.norm": "pre"},
                          history=curve(0.9)))
    return ReportData(sweep=sweep, records=recs, source="synthetic", planned={})


def _legends(fig) -> list[list[str]]:
    return [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend()]


def test_the_base_is_one_legend_entry_with_its_seeds_shaded(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "save_figure", kept(saved))
    figures.plot_dev_ppl_by_family(_data(), tmp_path / "f.png")
    legends = _legends(saved[-1])
    assert legends and all(sum(t.startswith("base") for t in entries) == 1 for entries in legends)
    assert "base (mean of 3 seeds, their range shaded)" in legends[0]
    assert any(ax.collections for ax in saved[-1].axes)  # the shaded range
    figures.plot_dev_ppl_by_family(_data(seeds=(1,)), tmp_path / "g.png")
    assert "base" in _legends(saved[-1])[0]


def test_training_loss_is_smoothed_with_the_raw_points_faint(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "save_figure", kept(saved))
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
    monkeypatch.setattr(figures, "save_figure", kept(saved))
    table = Table3(sweep="s", rows=[Row("base", flops_per_step=2e9), Row("big", flops_per_step=6e9),
                                    Row("A1", flops_per_step=None)],
                   curves=LearningCurves(rows={"base": {100: 50.0, 200: 30.0}, "big": {100: 60.0, 200: 25.0, 600: 10.0},
                                               "A1": {100: 55.0}}),
                   compute={"base_flops": 4e11})
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



def test_a_log_axis_keeps_its_numbers_while_names_stay_literal(tmp_path):
    """The formatters' tick labels (a log axis writes 10^2 as mathtext) are drawn as numbers, never as the raw
    ``$\\mathdefault{10^{2}}$``; tick labels set as names and every other text are literal."""
    fig, axes = plots.new_figure(1, 1, 4, 3)
    ax = axes[0][0]
    ax.plot([1, 2, 3], [10, 100, 1000])
    ax.set_yscale("log")
    ax.set_xticks([1, 2], ["x$\\bogus{$", "b"])
    ax.set_title("row $\\frac{$")
    plots.save_figure(fig, tmp_path / "f.png")
    numbers = [t for t in ax.get_yticklabels() if t.get_text()]
    assert numbers and all(t.get_parse_math() and t.get_text().startswith("$") for t in numbers)
    assert not any(t.get_parse_math() for t in ax.get_xticklabels()) and not ax.title.get_parse_math()

# ------------------------------------------------------------------------------------------ the lead figure
REFERENCE = ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"


@pytest.fixture(scope="module")
def reference_table():
    """The committed reference run's table (21 rows, the base at 3 seeds), rebuilt from its export."""
    from lightning_tfm import report as rd
    return rd.build_table(rd.load_report_data(ROOT / "sweeps" / "table3-cpu.yaml", export_dir=REFERENCE))


def _lead(table, tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(lead, "save_figure", lambda fig, path, formats=("png",): saved.append(fig) or str(path))
    lead.plot_changes(table, tmp_path / "changes.png")
    plots.literal_text(saved[-1])
    return saved[-1]


def _bars(ax) -> dict[float, object]:
    """The horizontal bars of a panel by their centre line (the shaded noise band is no bar: it spans the axes)."""
    from matplotlib.patches import Rectangle
    return {round(p.get_y() + p.get_height() / 2, 3): p for p in ax.patches
            if isinstance(p, Rectangle) and p.get_height() < 1}


def _annotations(ax) -> dict[float, str]:
    return {round(t.xy[1], 3): t.get_text() for t in ax.texts if hasattr(t, "xy")}


def test_the_lead_figure_sets_each_rows_change_beside_the_papers(reference_table, tmp_path, monkeypatch):
    table = reference_table
    fig = _lead(table, tmp_path, monkeypatch)
    ppl, bleu, verdicts = fig.axes
    rows = [r for r in table.rows if r.variant != "base"]
    # every row but the base, in the table's order, under its family's title; named with the knobs it sets apart
    labels = [t.get_text() for t in ppl.get_yticklabels()]
    bold = [t.get_text() for t in ppl.get_yticklabels() if t.get_fontweight() == "bold"]
    assert bold == [figures.FAMILY_TITLES[f] for f in ("A", "B", "C", "D", "E", "big", "norm")]
    assert [ln.split(":")[0] for ln in labels if ln not in bold] == [r.variant for r in rows]
    assert labels[:2] == [figures.FAMILY_TITLES["A"], "A1: h 1, d_k 128, d_v 128"] and "E: learned positions" in labels
    y = {ln.split(":")[0]: i for i, ln in enumerate(labels) if ln not in bold}
    # per row: ours (above) and the paper's (below) as a share of each side's base, in %
    for ax, metric in ((ppl, "ppl"), (bleu, "bleu")):
        bars = _bars(ax)
        for r in rows:
            ours, paper = bars.get(round(y[r.variant] - 0.19, 3)), bars.get(round(y[r.variant] + 0.19, 3))
            assert ours.get_width() == pytest.approx(100 * r[f"delta_{metric}_rel"]), (metric, r.variant)
            if r.in_paper:
                assert paper.get_width() == pytest.approx(100 * r[f"paper_delta_{metric}_rel"]), (metric, r.variant)
            else:
                assert paper is None and _annotations(ax)[round(y[r.variant] + 0.19, 3)] == "not in the paper"
    # the colour says whether our direction is the paper's; pale: within seed noise
    by = {r.variant: r for r in rows}
    bars = _bars(ppl)
    colour = lambda v: bars[round(y[v] - 0.19, 3)]  # noqa: E731
    assert by["B1"].ppl_agrees and by["B1"].ppl_noise == "beyond"
    assert colour("B1").get_facecolor()[:3] == pytest.approx(to_rgb(lead.AGREES)) and colour("B1").get_alpha() == 1
    assert by["C3"].ppl_agrees is False and colour("C3").get_facecolor()[:3] == pytest.approx(to_rgb(lead.OPPOSITE))
    assert by["A1"].ppl_noise == "within" and colour("A1").get_alpha() == lead.PALE
    # the seed noise shaded: 2 x the base's std over its 3 seeds, as a share of its dev PPL
    base = table.rows[0]
    band = 100 * 2 * base.dev_ppl_std / base.dev_ppl
    assert lead.noise_band(table, "ppl") * 100 == pytest.approx(band) and 5 < band < 15
    (shade,) = [p for p in ppl.patches if p.get_x() == pytest.approx(-band)]
    assert shade.get_width() == pytest.approx(2 * band)
    # the verdict marked beside each row (the table's budget verdict)
    marked = {round(t.get_position()[1], 3): t.get_text() for t in verdicts.texts}
    assert [marked[round(y[r.variant] - 0.19, 3)] for r in rows] == [r.ppl_verdict for r in rows]
    assert "37.10 ± 1.93 (3 seeds); paper 4.92" in ppl.get_title() and "dev BLEU" in bleu.get_title()


def test_rows_without_a_change_say_no_data_in_place_of_a_bar(tmp_path, monkeypatch):
    data = _data()
    for r in data.records:  # the base at three seeds, A1 and prenorm completed; every other row of the file missing
        r.dev_ppl = r.history[-1]["dev/ppl"]
    table = build_table(data, bootstrap=False)
    fig = _lead(table, tmp_path, monkeypatch)
    assert len(fig.axes) == 2  # no BLEU in any row: the dev-PPL panel and the verdicts
    ppl = fig.axes[0]
    labels = [t.get_text() for t in ppl.get_yticklabels()]
    y = {ln.split(":")[0]: i for i, ln in enumerate(labels)}
    notes = _annotations(ppl)
    assert notes[round(y["A2"] - 0.19, 3)] == "no data (missing)"
    assert notes[round(y["big"] - 0.19, 3)] == "no data (missing)"
    assert round(y["A1"] - 0.19, 3) in _bars(ppl) and notes[round(y["A1"] - 0.19, 3)] == "+25%"  # its bar's value
    # no completed base: no change of any row, each says so
    data.records = [r for r in data.records if r.variant != "base"]
    table = build_table(data, bootstrap=False)
    ppl = _lead(table, tmp_path, monkeypatch).axes[0]
    assert not [p for p in _bars(ppl).values() if p.get_facecolor()[:3] != pytest.approx(to_rgb(lead.PAPER))]
    assert "no data" in _annotations(ppl)[round(y["A1"] - 0.19, 3)] and "no completed base run" in ppl.get_title()


def test_an_empty_panel_says_no_data_and_a_figure_with_nothing_to_show_is_left_out(tmp_path, monkeypatch):
    saved, real = [], figures.save_figure  # the real one marks the empty panels as it saves
    monkeypatch.setattr(figures, "save_figure", kept(saved, real))
    figures.plot_dev_ppl_by_family(_data(), tmp_path / "f.png")  # family D: its rows never ran, the base alone
    panel = next(ax for ax in saved[-1].axes if ax.get_title().startswith(figures.FAMILY_TITLES["D"]))
    assert "no data: no row of this family has a curve" in [t.get_text() for t in panel.texts]
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    # nothing at all to draw (a base without a curve, no pre-norm row): no figure, and why
    data = _data(seeds=(1,))
    data.records = [RunRecord("base", family="base", seed=1, status="failed")]
    table = build_table(data, bootstrap=False)
    for name, plot, arg in (("n", figures.plot_norm_curves, data), ("d", figures.plot_dev_ppl_by_family, data),
                            ("f", figures.plot_ppl_vs_flops, table), ("o", figures.plot_outlook, table)):
        left = plot(arg, tmp_path / "empty" / f"{name}.png")
        assert isinstance(left, plots.LeftOut) and left.name == f"{name}.png" and left.why, name
    assert not (tmp_path / "empty").exists()
    assert figures.plot_norm_curves(data, tmp_path / "n.png").why == ("neither the base nor a pre-norm row has a "
                                                                      "training curve")


def test_figures_in_paper_formats(tmp_path):
    assert plots.parse_formats(None) == plots.parse_formats("png") == ("png",)
    assert plots.parse_formats("PDF, svg") == plots.parse_formats(["svg", "pdf", "png"]) == ("png", "svg", "pdf")
    for bad, words in (("png,tiff", "unknown format 'tiff'"), ("", "an empty format"), ("png,", "an empty format")):
        with pytest.raises(UserError) as e:
            plots.parse_formats(bad)
        assert str(e.value).startswith(f"--formats {bad!r}: {words}; choose from png, svg, pdf"), str(e.value)
    written = {}
    for run in ("a", "b"):
        fig, axes = plots.new_figure(1, 1, 4, 3)
        axes[0][0].plot([1, 2, 3], [3, 1, 2], label="row $x")
        path = plots.save_figure(fig, tmp_path / run / "f.png", formats=("png", "svg", "pdf"))
        assert path == str(tmp_path / run / "f.png")
        written[run] = {f: (tmp_path / run / f"f.{f}").read_bytes() for f in ("png", "svg", "pdf")}
    files = written["a"]
    assert files["png"][:8] == b"\x89PNG\r\n\x1a\n" and files["pdf"][:5] == b"%PDF-"
    assert ElementTree.fromstring(files["svg"]).tag == "{http://www.w3.org/2000/svg}svg"
    assert b"/FontFile2" in files["pdf"] and b"/Subtype /Type3" not in files["pdf"]  # TrueType fonts, not Type 3
    assert written["a"] == written["b"]  # no date in them: the same figure is the same bytes
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["f.pdf", "f.png", "f.svg"]


# ------------------------------------------------------------------------------------ ltfm report, end to end
def test_the_report_leads_with_its_picture_and_writes_every_figure_in_paper_formats(tmp_path, ltfm_here):
    """A report rebuilt from the committed reference export: changes.png first after the headline in table3.html and
    table3.md, every figure also as SVG and PDF with --formats; a bad format writes nothing."""
    import base64

    from bs4 import BeautifulSoup

    out = tmp_path / "report"
    p = ltfm("report", "sweeps/table3-cpu.yaml", "--from-export", REFERENCE, "--out", out, "--formats", "png,svg,pdf",
             env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    pngs = sorted(f.name for f in out.glob("*.png"))
    assert "changes.png" in pngs and len(pngs) == 7
    assert f"figures: {', '.join(pngs)} (each also as svg, pdf)" in p.stdout
    for png in pngs:
        stem = out / png[:-4]
        assert ElementTree.parse(f"{stem}.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg", png
        assert Path(f"{stem}.pdf").read_bytes()[:5] == b"%PDF-", png
    # table3.html: the headline, then the lead figure (its first image, the PNG embedded), then the tables
    soup = BeautifulSoup((out / "table3.html").read_text(encoding="utf-8"), "html.parser")
    text = soup.get_text(" ", strip=True)
    assert text.index("Direction agrees with the paper") < text.index(lead.TITLE) < text.index("Dev perplexity")
    first = soup.find("img")["src"]
    assert first.startswith("data:image/png;base64,")
    assert base64.b64decode(first.split(",", 1)[1]) == (out / "changes.png").read_bytes()

    # an unknown format: one line, exit 2, nothing written
    before = sorted(tmp_path.iterdir())
    p = ltfm_here("report", "sweeps/table3-cpu.yaml", "--from-export", REFERENCE, "--out", tmp_path / "bad",
                  "--formats", "png,eps")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith(
        "ltfm: error: --formats 'png,eps': unknown format 'eps'; choose from png, svg, pdf"), p.stderr
    assert sorted(tmp_path.iterdir()) == before

    # table3.md: the same order, the figure linked
    md = (out / "table3.md").read_text(encoding="utf-8")
    assert md.index("- Direction agrees with the paper") < md.index(f"![{lead.TITLE}](changes.png)") \
        < md.index("## Dev perplexity"), md[:3000]


def test_formats_come_from_the_option_and_only_a_table3_report_takes_them():
    import argparse

    from lightning_tfm.cli.report import _formats
    from lightning_tfm.sweep import load_sweep

    table3, search = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml"), load_sweep(ROOT / "sweeps" / "search.yaml")
    args = lambda formats, against=None: argparse.Namespace(formats=formats, against=against)  # noqa: E731
    assert _formats(args(None), table3) == ("png",) and _formats(args("svg,pdf"), table3) == ("png", "svg", "pdf")
    assert _formats(args("png"), search) == ("png",)
    with pytest.raises(UserError, match=r"^--formats 'png,tiff': unknown format 'tiff'"):
        _formats(args("png,tiff"), table3)
    with pytest.raises(UserError, match="a search report writes its figures as PNG only; drop --formats"):
        _formats(args("pdf"), search)
    with pytest.raises(UserError, match=r"a comparison \(--against\) writes its figures as PNG only"):
        _formats(args("svg", against="b.yaml"), load_sweep(ROOT / "sweeps" / "table3-cpu.yaml"))


# ------------------------------------------------------------------------------- a pipeline check's figures
# The Makefile's QUICK_ARGS budget (every row 20 steps, validated and checkpointed once) with the protocol's
# log interval (experiments/multi30k-cpu.yaml: train.log_every_steps 50), on the report tests' tiny model.
QUICK = {**TINY, "train.max_steps": 20, "train.warmup": 20, "train.val_every_steps": 20,
         "train.checkpoint_every_steps": 20, "train.log_every_steps": 50, "data.test_split": "null"}


def test_a_pipeline_checks_runs_log_their_loss_and_its_report_draws_only_what_it_has(ltfm_here, data_dir, tmp_path,
                                                                                     monkeypatch):
    """`make ablation QUICK=1`'s 20 steps log the training loss often enough for the loss panels
    (results.MIN_LOSS_POINTS points); a figure with nothing to show (one validation: no curve to fit) is not
    written, and the report shows why in its place."""
    from lightning_tfm.training.runs import results

    monkeypatch.setenv("WANDB_MODE", "disabled")
    p = ltfm_here("train", SMOKE, *(f"{k}={v}" for k, v in QUICK.items()), f"data.path={data_dir}",
                  f"run.results_dir={tmp_path / 'results'}")
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    history = results.read_metrics(run_dir)
    losses = [row["step"] for row in history if results.TRAIN_LOSS in row]
    assert len(losses) >= results.MIN_LOSS_POINTS and losses[-1] == 19, losses
    assert [row["step"] for row in history if results.DEV_PPL in row] == [19]
    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    recs = [RunRecord(v, family=f, seed=1, status="completed", history=history, dev_ppl=history[-1][results.DEV_PPL],
                      config={"model.norm": "pre"} if v == "prenorm" else {})
            for v, f in (("base", "base"), ("A1", "A"), ("prenorm", "norm"))]
    data = ReportData(sweep=sweep, records=recs, source="a pipeline check", planned={})
    saved = []
    monkeypatch.setattr(figures, "save_figure", kept(saved, figures.save_figure))
    # the loss panels have curves (none says "no data"); every panel is drawn
    path = figures.plot_norm_curves(data, tmp_path / "norm_curves.png")
    assert path == str(tmp_path / "norm_curves.png") and (tmp_path / "norm_curves.png").is_file()
    full, first, dev = saved[-1].axes
    for ax in (full, first):
        assert [len(line.get_xdata()) for line in ax.lines if not line.get_label().startswith("_")] \
            and not [t.get_text() for t in ax.texts], ax.get_title()
    assert max(len(line.get_xdata()) for line in full.lines) >= results.MIN_LOSS_POINTS
    # one validation a run: no curve to fit, so no outlook figure, and a line saying why in its place
    table = build_table(data, bootstrap=False)
    left = figures.plot_outlook(table, tmp_path / "outlook.png")
    assert left == plots.LeftOut("outlook.png", left.why) and not (tmp_path / "outlook.png").exists()
    assert left.why == ("no row's learning curve could be fitted and extrapolated (a fit needs 3 validations after "
                        "the warmup; the base has 1 in all)"), left.why
    assert plots.shown(left).data == f"*outlook.png is left out: {left.why}.*"
    assert plots.shown(path).data == (tmp_path / "norm_curves.png").read_bytes()


def test_the_outlook_figures_titles_overlap_nothing(reference_table, tmp_path, monkeypatch):
    """Each panel's title (its verdict and why, a clause a line) clears the other panels' titles, every panel's
    axes and tick labels, the figure's title and its edges: the 21-row reference, 6 rows of 4 panels, whose *within
    noise* rows carry the longest titles."""
    saved = []
    monkeypatch.setattr(figures, "save_figure", kept(saved, figures.save_figure))
    assert figures.plot_outlook(reference_table, tmp_path / "outlook.png") == str(tmp_path / "outlook.png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = saved[-1]
    r = FigureCanvasAgg(fig).get_renderer()
    fig.draw(r)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(reference_table.outlook) > 8
    titles = [ax.title.get_window_extent(r) for ax in panels]
    boxes = [ax.get_window_extent(r) for ax in panels] + [ax.xaxis.get_tightbbox(r) for ax in panels]
    top = fig.get_suptitle() and fig._suptitle.get_window_extent(r)
    for i, t in enumerate(titles):
        where = panels[i].get_title().splitlines()[0]
        assert fig.bbox.x0 <= t.x0 and t.x1 <= fig.bbox.x1 and t.y1 <= fig.bbox.y1, where
        assert not t.overlaps(top), where
        assert not [panels[j].get_title() for j, o in enumerate(titles) if j != i and t.overlaps(o)], where
        assert not any(t.overlaps(b) for b in boxes), where
