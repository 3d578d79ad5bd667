"""Table 3 where researchers look: ``ltfm report`` of a real sweep (the ``swept`` sweep of tests/conftest.py, shared
with test_report.py) logs the report to W&B as one run of job type ``report`` (read back from its offline files: this
machine has no W&B server) and writes the study's optuna-dashboard note and custom plots (read back through
optuna-dashboard's own loaders)."""
from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from pathlib import Path

import optuna
import pytest

from lightning_tfm import report as rd
from lightning_tfm.report.publish import kinds, optuna_note, published, wandb_run
from lightning_tfm.report.table3.columns import WANDB_BLEU, WANDB_PPL, columns
from lightning_tfm.report.views.render import _duration
from lightning_tfm.sweep import load_sweep

from conftest import ROOT, ltfm, write_sweep
from wandb_offline import read_records, read_runs

RUN_ID = "report-rep-table3"
PPL_COLUMNS, BLEU_COLUMNS = ([c.key for c in columns(view)] for view in (WANDB_PPL, WANDB_BLEU))
PNGS = ("bleu_vs_params.png", "changes.png", "dev_ppl_by_family.png", "norm_curves.png", "positional.png",
        "ppl_vs_flops.png")  # no outlook.png: the swept runs validate twice, too few points for a curve


def copy_db(src: Path, dest: Path) -> None:
    """A consistent copy of the sweep's SQLite study (test_report.py may be writing the shared one's note)."""
    with sqlite3.connect(src) as a, sqlite3.connect(dest) as b:
        a.backup(b)


@pytest.fixture(scope="module")
def reported(swept, tmp_path_factory):
    """The shared sweep's study copied into a results folder of this module (the report writes there: the W&B
    run's files, the study's note), and its report."""
    tmp = tmp_path_factory.mktemp("dashboards")
    results = tmp / "results"
    results.mkdir()
    copy_db(swept["results"] / "rep.db", results / "rep.db")
    out = tmp / "build"
    p = ltfm("report", swept["sweep"], "--results", results, "--out", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "warning" not in p.stderr, p.stderr
    return {"sweep": swept["sweep"], "results": results, "out": out, "stdout": p.stdout, "stderr": p.stderr,
            "args": ["report", swept["sweep"], "--results", results, "--out", out]}


def report_runs(results: Path):
    return read_runs(results / "wandb-report")


def csv_rows(out: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((out / "table3.csv").read_text())))


def same_cell(text: str, value) -> bool:
    """A W&B table cell holds what table3.csv says: empty = None, True/False, numbers, text."""
    if text == "":
        return value is None
    if text in ("True", "False"):
        return value is (text == "True")
    try:
        number = float(text)
    except ValueError:
        return value == text
    return not isinstance(value, bool) and value == pytest.approx(number, rel=1e-9)


def study_attrs(results: Path) -> dict:
    storage = optuna.storages.RDBStorage(f"sqlite:///{results / 'rep.db'}")
    return storage.get_study_system_attrs(storage.get_study_id_from_name("rep"))


def test_the_report_is_one_wandb_run_with_the_tables_headline_figures_and_files(reported):
    results, out = reported["results"], reported["out"]
    (run,) = report_runs(results)
    folder = run.path.parent
    assert folder.parent == results / "wandb-report" / "wandb" and folder.name.endswith(RUN_ID)
    assert f"W&B: report run {RUN_ID}, offline in {folder}" in reported["stdout"]
    assert (run.run_id, run.job_type, run.group, run.project, run.exit_code) == (RUN_ID, "report", "rep",
                                                                                "lightning_tfm", 0)
    assert run.config["report.sweep"] == "rep" and run.config["report.folder"] == str(out)

    # the two tables: every row of table3.csv, in its order, with the columns of their views and the CSV's values
    rows = csv_rows(out)
    assert [r["variant"] for r in rows] == ["base", "A1", "D1", "prenorm", "odd", "crash"]
    for key, cols in (("table3/dev_ppl", PPL_COLUMNS), ("table3/dev_bleu", BLEU_COLUMNS)):
        (table,) = run.tables[key]
        assert table["columns"] == list(cols)
        assert {"variant", "delta_ppl", "paper_delta_ppl", "ppl_agrees", "ppl_noise"} <= set(cols) \
            if key.endswith("ppl") else {"paper_dev_bleu", "delta_bleu", "paper_delta_bleu", "bleu_agrees"} <= set(cols)
        assert len(table["data"]) == len(rows)
        for row, cells in zip(rows, table["data"]):
            bad = [(c, row[c], v) for c, v in zip(cols, cells) if not same_cell(row[c], v)]
            assert not bad, (row["variant"], bad)
    a1 = dict(zip(PPL_COLUMNS, run.tables["table3/dev_ppl"][0]["data"][1]))
    assert a1["paper_dev_ppl"] == 5.29 and a1["paper_delta_ppl"] == pytest.approx(0.37)
    assert a1["ppl_noise"] == "unknown" and isinstance(a1["ppl_agrees"], bool)

    # the summary: the headline's numbers, counted here from table3.csv and read in table3.md's headline
    s = run.summary
    for metric in ("ppl", "bleu"):
        judged = [r for r in rows if r[f"{metric}_agrees"] != ""]
        agree = sum(r[f"{metric}_agrees"] == "True" for r in judged)
        beyond = [r for r in judged if r[f"{metric}_noise"] == "beyond"]
        assert (s[f"dev_{metric}/agree_rows"], s[f"dev_{metric}/compared_rows"]) == (agree, len(judged)) == (agree, 1)
        assert s[f"dev_{metric}/agreement"] == agree / len(judged)
        assert s[f"dev_{metric}/rows_beyond_noise"] == len(beyond) == 0  # one seed: the noise is unknown
        assert s[f"dev_{metric}/rows_noise_unknown"] == sum(r[f"{metric}_noise"] == "unknown" for r in rows) == 2
        assert s[f"dev_{metric}/compared_rows_beyond_noise"] == 0 and f"dev_{metric}/agreement_beyond_noise" not in s
    md = (out / "table3.md").read_text()
    first = next(ln for ln in md.splitlines() if ln.startswith("- Direction agrees with the paper: "))
    for metric, label in (("ppl", "PPL"), ("bleu", "BLEU")):
        k, n = re.search(rf"dev {label} (\d+)/(\d+) rows", first).groups()
        assert (s[f"dev_{metric}/agree_rows"], s[f"dev_{metric}/compared_rows"]) == (int(k), int(n))
    assert s["wall_time_s"] > 0 and f"wall time {_duration(s['wall_time_s'])} (first start to last end)" in md
    assert (s["completed_runs"], s["runs"]) == (3, 5) and "Sweep: 3 completed run(s) of 5" in md
    # the report names its W&B run: the one folder its pattern matches, and the command that publishes it
    from lightning_tfm.report.views.render import PUBLISHED_TITLE
    section = md.split(PUBLISHED_TITLE, 1)[1]
    pattern = re.search(r"\(offline\), in `(\S+)`", section).group(1)
    assert sorted(map(str, Path("/").glob(pattern.lstrip("/")))) == [str(folder)], pattern
    assert f"`wandb sync {pattern}`" in section
    assert f"`optuna-dashboard sqlite:///{results / 'rep.db'}` opens the study `rep`" in section
    assert "wandb sync" in (out / "table3.html").read_text(encoding="utf-8")

    # every figure of the report as an image, the same bytes
    (logged,) = [h for h in run.history if any(k.startswith("figures/") for k in h)]
    assert sorted(k for k in logged if k.startswith("figures/")) == [f"figures/{Path(p).stem}" for p in PNGS]
    for name in PNGS:
        image = logged[f"figures/{Path(name).stem}"]
        assert image["_type"] == "image-file" and image["format"] == "png"
        assert (folder / "files" / image["path"]).read_bytes() == (out / name).read_bytes()

    # table3.md/.csv/.html as one artifact of type report, staged inside the run's folder (wandb sync takes it)
    (artifact,) = [r.artifact for r in read_records(run.path) if r.WhichOneof("record_type") == "artifact"
                   and r.artifact.type == "report"]
    assert artifact.name == "table3-rep" and list(artifact.aliases) == ["latest"]
    files = {c.path: Path(c.local_path) for c in artifact.manifest.contents}
    assert sorted(files) == ["table3-standalone.tex", "table3.csv", "table3.html", "table3.md", "table3.tex"]
    for name, staged in files.items():
        assert folder in staged.parents and staged.read_bytes() == (out / name).read_bytes(), name
    assert json.loads(artifact.metadata)["dev_ppl/compared_rows"] == 1


def test_the_study_note_and_custom_plots_in_optuna_dashboard(reported):
    from optuna_dashboard import get_note
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects
    from optuna_dashboard._note import get_note_from_system_attrs

    results, out = reported["results"], reported["out"]
    assert "optuna-dashboard: note and 2 plots on study rep" in reported["stdout"]
    attrs = study_attrs(results)
    note = get_note_from_system_attrs(attrs, None)["body"]
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{results / 'rep.db'}")
    assert get_note(study) == note
    md = (out / "table3.md").read_text()
    headline = md.split("\n## ", 1)[0]
    assert headline.strip() in note and "## Dev perplexity" in note and "## Dev BLEU" not in note
    ppl_table = [ln for ln in md.split("## Dev perplexity", 1)[1].split("\n## ", 1)[0].splitlines()
                 if ln.startswith("|")]
    assert len(ppl_table) == 2 + len(csv_rows(out))
    for line in ppl_table:  # every row of the table (the headers too), as table3.md has it
        assert line in note.splitlines(), line
    assert str(out / "table3.html") in note

    plots = {k: json.loads(v) for k, v in get_plotly_graph_objects(attrs).items()}
    assert set(plots) == set(optuna_note.GRAPH_IDS.values())
    curves = plots[optuna_note.GRAPH_IDS["curves"]]
    assert [t["name"] for t in curves["data"]] == ["base", "A1", "prenorm"]  # the rows that trained
    # the mean dev PPL at each validation, as the report's learning-curve table
    names, cells = md_rows(md, "Learning curves")
    for trace in curves["data"]:
        assert [f"{y:.1f}" for y in trace["y"]] == [cells[trace["name"]][f"step {x}"] for x in trace["x"]]
    family = plots[optuna_note.GRAPH_IDS["family"]]
    (menu,) = family["layout"]["updatemenus"]
    assert [b["label"] for b in menu["buttons"]] == ["A", "D", "other rows"]  # as the PNG's panels
    shown = {b["label"]: [t["name"] for t, v in zip(family["data"], b["args"][0]["visible"]) if v]
             for b in menu["buttons"]}
    assert shown == {"A": ["base", "A1"], "D": ["base"], "other rows": ["base"]}
    titles = {b["label"]: b["args"][1]["title.text"] for b in menu["buttons"]}
    assert "no curve: D1 (missing)" in titles["D"] and "odd (skipped), crash (failed)" in titles["other rows"]


def md_rows(text: str, section: str) -> tuple[list[str], dict[str, dict]]:
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines = [[c.strip() for c in ln.split("|")[1:-1]] for ln in body.splitlines() if ln.startswith("| ")]
    return [r[0] for r in lines[1:]], {r[0]: dict(zip(lines[0], r)) for r in lines[1:]}


def test_a_second_report_replaces_the_wandb_run_and_the_note_and_a_wandb_error_is_a_warning(reported):
    from optuna_dashboard import get_note, save_note

    results = reported["results"]
    wandb_dir = results / "wandb-report" / "wandb"
    (first,) = report_runs(results)
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{results / 'rep.db'}")
    save_note(study, get_note(study) + "\nA person's remark: rerun C2 with 3 seeds.\n")

    # W&B unreachable (online, a key, no server): one warning line, the report succeeds, no run folder added
    env = {"WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9",
           "WANDB_INIT_TIMEOUT": "3"}
    p = ltfm(*reported["args"], env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [x for x in p.stderr.strip().splitlines() if not x.startswith(("ltfm: output:", "ltfm: next:"))]
    assert len(lines) == 1 and lines[0].startswith("ltfm: warning: report not logged to W&B (") and \
        "the report itself is complete" in lines[0], p.stderr
    assert "x" * 40 not in p.stderr + p.stdout and "W&B: report run" not in p.stdout
    assert wandb_run.run_folders(wandb_dir, RUN_ID) == [first.path.parent]

    # offline again: the same run id, the older offline folder removed (one left for `wandb sync`)
    p = ltfm(*reported["args"])
    assert p.returncode == 0 and "warning" not in p.stderr, p.stderr[-2000:]
    (again,) = report_runs(results)
    assert again.run_id == first.run_id == RUN_ID and again.path.parent != first.path.parent
    assert wandb_run.run_folders(wandb_dir, RUN_ID) == [again.path.parent] and not first.path.exists()
    assert [len(t) for t in again.tables.values()] == [1, 1]
    # the note: this report's block once, the person's remark kept after it; the plots under the same ids
    note = get_note(study)
    assert note.count(optuna_note.NOTE_BEGIN) == 1 and note.count("# Table 3 replica: sweep `rep`") == 1
    assert note.index(optuna_note.NOTE_END) < note.index("A person's remark: rerun C2 with 3 seeds.")
    assert note.count("A person's remark") == 1
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects
    assert set(get_plotly_graph_objects(study_attrs(results))) == set(optuna_note.GRAPH_IDS.values())


def test_wandb_target_follows_the_training_runs_and_disabled_logs_nothing(tmp_path, monkeypatch):
    sweep = load_sweep(write_sweep(tmp_path / "t.yaml", "t", {"base": {}}))
    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DISABLED"):
        monkeypatch.delenv(key, raising=False)
    assert wandb_run.wandb_target(sweep) == {"mode": "offline", "project": "lightning_tfm", "entity": None}
    monkeypatch.setenv("WANDB_PROJECT", "ablations")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    target = wandb_run.wandb_target(sweep)
    assert target == {"mode": "disabled", "project": "ablations", "entity": "team"}
    assert wandb_run.log_wandb_report(sweep, tmp_path / "build", tmp_path / "results", {}, target) is None
    assert not (tmp_path / "results").exists()


def test_run_ids_notes_and_headline_numbers():
    assert wandb_run.report_run_id("table3-cpu") == "report-table3-cpu-table3"
    # a pipeline check's report run (make ablation QUICK=1) never overwrites the real one
    assert wandb_run.report_run_id("table3-cpu", pipeline_check=True) == "report-table3-cpu-pipeline-check-table3"
    long = wandb_run.report_run_id("x" * 80)
    assert len(long) <= 64 and long != wandb_run.report_run_id("x" * 79)
    export = ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"
    table = rd.build_table(rd.load_report_data(ROOT / "sweeps" / "table3-cpu.yaml", export_dir=export))
    ours = optuna_note.note_text(table)  # the headline and the dev-perplexity table, not the BLEU table
    assert "- Direction agrees with the paper" in ours and "| row | dev PPL ours |" in ours
    assert "dev BLEU ours" not in ours
    ours = ours.replace("- Direction agrees with the paper", "- fact")
    assert optuna_note.merge_note("", ours) == ours
    kept = optuna_note.merge_note("my words", ours)
    assert kept.startswith(ours) and kept.endswith("my words\n")
    assert optuna_note.merge_note(kept.replace("- fact", "- old fact"), ours) == kept
    from lightning_tfm.report.table3.columns import Row

    rows = [Row("base", in_paper=True, seeds_completed=3, status="completed"),
            *[Row(v, in_paper=True, seeds_completed=1, status="completed", ppl_agrees=a, bleu_agrees=b, ppl_noise=n,
                  bleu_noise="within")
              for v, a, b, n in (("A1", True, False, "beyond"), ("A2", False, False, "beyond"),
                                 ("A3", True, True, "within"))]]
    h = kinds.headline_numbers(rows, {"wall_s": 60.0, "train_s": 100.0, "runs": 4, "records": 4})
    assert (h["dev_ppl/agree_rows"], h["dev_ppl/compared_rows"], h["dev_ppl/agreement"]) == (2, 3, 2 / 3)
    assert (h["dev_ppl/agree_rows_beyond_noise"], h["dev_ppl/compared_rows_beyond_noise"]) == (1, 2)
    assert (h["dev_ppl/rows_beyond_noise"], h["dev_ppl/rows_within_noise"]) == (2, 1)
    assert (h["dev_bleu/agree_rows"], h["dev_bleu/rows_beyond_noise"], h["both/agree_rows"]) == (1, 0, 1)
    assert "dev_bleu/agreement_beyond_noise" not in h and h["wall_time_s"] == 60.0
    # the verdicts (A1 holds and agrees, A2 holds and does not)
    rows[1].ppl_verdict, rows[2].ppl_verdict, rows[3].ppl_verdict = "holds", "holds", "within noise"
    h = kinds.headline_numbers(rows)
    assert (h["dev_ppl/agree_rows_findings"], h["dev_ppl/compared_rows_findings"]) == (1, 2)
    assert (h["dev_ppl/verdict_holds"], h["dev_ppl/verdict_within_noise"], h["dev_ppl/verdict_may_flip"],
            h["dev_ppl/verdict_too_few_points"]) == (2, 1, 0, 0)
    assert h["dev_ppl/rows_within_noise"] == 1  # the noise count, beside the verdicts


def test_a_runs_folders_include_the_one_wandb_starts_in_the_same_second(tmp_path):
    """wandb names a run's folder by its start second and adds ``-<n>`` to one started in the same second: that
    folder is the run's too (a later report supersedes it), a run whose id merely starts alike is not."""
    names = ["offline-run-20260101_000001-report-x-table3-2", "offline-run-20260101_000001-report-x-table3",
             "run-20260101_000000-report-x-table3", "offline-run-20260101_000001-report-x-table3-10",
             "offline-run-20260101_000002-report-x-table3-pipeline", "offline-run-20260101_000003-report-x-table33"]
    for name in names:
        (tmp_path / name).mkdir()
    assert [p.name for p in wandb_run.run_folders(tmp_path, "report-x-table3")] == [names[2], names[1], names[0],
                                                                                   names[3]]
    assert [p.name for p in wandb_run.superseded_folders(tmp_path, "report-x-table3", tmp_path / names[3])] == \
        [names[1], names[0]]


def test_the_family_plot_shows_the_base_as_one_mean_curve_with_its_seeds_range_shaded():
    """As the PNG: the base at three seeds is one legend entry (the mean at each step) over a band from the lowest
    to the highest seed, in every family's view; a row's own curve beside it."""
    from lightning_tfm.report.inputs.records import ReportData, RunRecord

    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    curve = lambda scale: [{"step": s, "dev/ppl": scale * 100 / s} for s in range(10, 110, 10)]  # noqa: E731
    records = [RunRecord("base", family="base", seed=s, status="completed", history=curve(1 + s / 10))
               for s in (1, 2, 3)]
    records += [RunRecord("A1", family="A", seed=1, status="completed", history=curve(1.5)),
                RunRecord("D1", family="D", seed=1, status="completed", history=curve(0.8))]
    fig = optuna_note.plotly_dev_ppl_by_family(ReportData(sweep=sweep, records=records, source="synthetic", planned={}))
    (menu,) = fig.layout.updatemenus
    for button in menu.buttons:
        shown = [t for t, v in zip(fig.data, button.args[0]["visible"]) if v]
        legend = [t.name for t in shown if t.showlegend is not False]
        assert [n for n in legend if n.startswith("base")] == ["base (mean of 3 seeds, their range shaded)"], legend
        mean = next(t for t in shown if t.name.startswith("base (mean"))
        high, low = (next(t for t in shown if t.name == f"base, {b} of 3 seeds") for b in ("highest", "lowest"))
        assert list(mean.x) == list(low.x) == list(high.x) == list(range(10, 110, 10))
        assert list(mean.y) == pytest.approx([1.2 * 100 / s for s in mean.x])
        assert list(low.y) == pytest.approx([1.1 * 100 / s for s in mean.x]) and low.fill == "tonexty"
        assert list(high.y) == pytest.approx([1.3 * 100 / s for s in mean.x]) and high.fill is None
    views = {b.label: [t.name for t, v in zip(fig.data, b.args[0]["visible"]) if v and t.showlegend is not False]
             for b in menu.buttons}
    assert views["A"] == ["base (mean of 3 seeds, their range shaded)", "A1"] and views["D"][-1] == "D1"


def test_a_table2_report_is_its_own_wandb_run_and_study_note(tmp_path):
    """A Table 2 report (sweeps/table2-smoke.yaml, run folders written without training: test_table2_report.py's
    :func:`write_smoke_runs`, and an empty study) published as Table 3's is (:func:`.published.publish`): the W&B run
    ``report-<sweep>-table2`` (read back from its offline files) holds table2.csv's rows as a W&B table, each row's
    numbers and the claim's lines in its summary, the report's figures and files; the study's note gets the claim
    and the rows in a block of its own, a person's note kept; no custom plots."""
    from optuna_dashboard import get_note, save_note
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    from test_table2_report import write_smoke_runs

    results, out = tmp_path / "results", tmp_path / "build"
    sweep = write_smoke_runs(results)
    storage = f"sqlite:///{results / 'table2-smoke.db'}"
    save_note(optuna.create_study(study_name=sweep.name, storage=storage), "A person's remark.\n")
    p = ltfm("report", sweep.path, "--results", results, "--out", out)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = published.publish(sweep, {"sweep_file": str(sweep.path), "results_dir": str(results),
                                       "storage": None}, out)
    (run,) = read_runs(results / "wandb-report")
    folder = run.path.parent
    assert lines == [f"  W&B: report run report-table2-smoke-table2, offline in {folder} (upload: wandb sync "
                     f"{folder})", "  optuna-dashboard: note on study table2-smoke; open it: optuna-dashboard "
                     f"sqlite:///{results / 'table2-smoke.db'}"]
    assert (run.run_id, run.job_type, run.group, run.exit_code) == ("report-table2-smoke-table2", "report",
                                                                    "table2-smoke", 0)
    assert run.config["report.kind"] == "table2" and run.config["report.folder"] == str(out)

    rows = list(csv.DictReader(io.StringIO((out / "table2.csv").read_text())))
    (table,) = run.tables["table2/rows"]
    assert table["columns"] == list(rows[0]) and len(table["data"]) == len(rows) == 2 + 4  # ours, the paper's
    for row, cells in zip(rows, table["data"]):
        bad = [(c, row[c], v) for c, v in zip(table["columns"], cells) if not same_cell(row[c], v)]
        assert not bad, (row["variant"], bad)
    s = run.summary
    assert (s["transformer/test_bleu"], s["rnn/test_bleu"], s["rnn/seeds_completed"]) == (12.0, 9.0, 1)
    assert s["rnn/train_flops"] == pytest.approx(float(rows[1]["train_flops"]))
    md = (out / "table2.md").read_text()
    assert s["claims"].splitlines() == [ln[2:] for ln in md.splitlines() if ln.startswith("- (")] and s["bleu_curves"]

    (logged,) = [h for h in run.history if any(k.startswith("figures/") for k in h)]
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["table2_alignment.png", "table2_curves.png"]
    for name in pngs:
        image = logged[f"figures/{Path(name).stem}"]
        assert (folder / "files" / image["path"]).read_bytes() == (out / name).read_bytes()
    (artifact,) = [r.artifact for r in read_records(run.path) if r.WhichOneof("record_type") == "artifact"
                   and r.artifact.type == "report"]
    assert artifact.name == "table2-table2-smoke"
    assert sorted(c.path for c in artifact.manifest.contents) == ["table2.csv", "table2.html", "table2.md"]

    study = optuna.load_study(study_name=sweep.name, storage=storage)
    note = get_note(study)
    begin, end = optuna_note.NOTES["table2"]
    assert note.startswith(begin + "\n\n# Table 2 at small scale: sweep table2-smoke") and note.count(begin) == 1
    claims = md.split("## The claim checked", 1)[1].split("\n## ", 1)[0]
    assert claims.strip() in note and "| transformer | transformer | 12.00 |" in note
    assert note.index(end) < note.index("A person's remark.") and str(out / "table2.html") in note
    assert get_plotly_graph_objects(study._storage.get_study_system_attrs(study._study_id)) == {}


def test_the_report_ends_with_the_command_that_opens_its_study(reported):
    """#52 item 20: the report named the study but not the command: ``ltfm: next:`` gives it, as the report's
    publishing line does (the storage it read: here an absolute SQLite path, the results being outside the folder
    the command ran in)."""
    command = f"optuna-dashboard sqlite:///{reported['results'] / 'rep.db'}"
    then = [ln for ln in reported["stderr"].splitlines() if ln.startswith("ltfm: next: ")]
    assert len(then) == 1 and f"   or   {command} (the study, its note holds this report)" in then[0], then
    assert f"optuna-dashboard: note and 2 plots on study rep; open it: {command}" in reported["stdout"]


def test_the_dashboard_command_masks_a_password_and_reads_no_study_where_the_report_read_none(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(write_sweep(tmp_path / "rep.yaml", "rep", {"base": {}}))
    (tmp_path / "res").mkdir()
    url = "postgresql://alice:s3cr@t@db.example:5432/sweeps"
    said = published.dashboard_next(sweep, {"results_dir": "res", "storage": url})
    assert said.startswith("optuna-dashboard 'postgresql://alice:***@db.example:5432/sweeps' (the password in "
                           "place of ***)") and "s3cr" not in said
    assert published.dashboard_next(sweep, {"results_dir": "res", "storage": None}) is None  # no rep.db
    (tmp_path / "res" / "rep.db").write_text("")
    assert published.dashboard_next(sweep, {"results_dir": "res"}).startswith("optuna-dashboard sqlite:///res/rep.db")
    assert published.dashboard_next(sweep, {"results_dir": "res", "wandb_path": "a/b"}) is None
    assert published.dashboard_next(sweep, {"export_dir": "e"}) is None


def test_the_report_says_where_its_wandb_run_is_and_how_to_open_its_study(tmp_path, monkeypatch):
    """Offline: the W&B run's folder and the `wandb sync` command that publishes it; online: its URL; the study: the
    optuna-dashboard command with its storage URL, the password masked; a report from an export: published nowhere."""
    from types import SimpleNamespace

    from lightning_tfm.report.publish.published import where_published
    from lightning_tfm.report.views.render import PUBLISHED_TITLE, published_markdown

    monkeypatch.chdir(tmp_path)
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "rep.db").write_text("")
    data = SimpleNamespace(sweep=load_sweep(write_sweep(tmp_path / "rep.yaml", "rep", {"base": {}})),
                           study=SimpleNamespace(study_name="rep"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb_line, study_line = where_published(data, "res", None, pipeline_check=True)
    run = "res/wandb-report/wandb/offline-run-*-report-rep-pipeline-check-table3"
    assert wandb_line == (f"W&B: the report run `report-rep-pipeline-check-table3` (offline), in `{run}`; to publish "
                          f"it: `wandb sync {run}`.")
    assert study_line.startswith("optuna-dashboard: `optuna-dashboard sqlite:///res/rep.db` opens the study `rep`")
    from lightning_tfm.report.table3.table import Table3

    md = published_markdown(Table3(published=[wandb_line, study_line]))
    assert md.startswith(PUBLISHED_TITLE + "\n\n- W&B: ") and published_markdown(Table3()) == ""
    # online, a PostgreSQL study: the run's URL; the command names the storage with its password masked
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_ENTITY", "team")
    url = "postgresql://alice:s3cr@t@db.example:5432/sweeps"
    wandb_line, study_line = where_published(data, "res", url)
    assert wandb_line == ("W&B: the report run `report-rep-table3`: "
                          "<https://wandb.ai/team/lightning_tfm/runs/report-rep-table3>.")
    assert "s3cr" not in study_line and study_line.startswith(
        "optuna-dashboard: `optuna-dashboard 'postgresql://alice:***@db.example:5432/sweeps'` opens the study `rep`")
    assert "put the password in place of `***`" in study_line
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert where_published(data, "res", None)[0].startswith("W&B: not logged")
    assert where_published(data, "res", None, export_dir="e") == [
        "Not published to W&B or optuna-dashboard: a report rebuilt from an export."]
