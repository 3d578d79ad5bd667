"""Report notebooks (``ltfm report``), end to end: a real smoke-scale sweep (``ltfm sweep`` processes, SQLite,
offline W&B files), the real notebooks executed by papermill on this venv's kernel, HTML from nbconvert."""
from __future__ import annotations

import base64
import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import optuna
import pytest
import yaml
from bs4 import BeautifulSoup
from PIL import Image

from lightning_tfm import report as rd
from lightning_tfm.base.errors import UserError
from lightning_tfm.findings import noise
from lightning_tfm.report.publish import notebooks
from lightning_tfm.sweep import load_sweep

from conftest import ROOT, SMOKE, ltfm, write_sweep
from wandb_offline import read_runs

optuna.logging.set_verbosity(optuna.logging.WARNING)

# The sweep of these tests (`swept`, `write_sweep`: tests/conftest.py, shared with tests/test_dashboards.py).
ORDER = ["base", "A1", "D1", "prenorm", "odd", "crash"]     # paper order, then the file's other rows
PNGS = ("changes.png", "dev_ppl_by_family.png", "ppl_vs_flops.png", "bleu_vs_params.png", "norm_curves.png",
        "positional.png")  # no outlook.png: 2 validations a run, no curve to fit (the report says so in its place)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def summaries(results: Path) -> dict[str, dict]:
    out = {}
    for f in results.glob("*/summary.json"):
        s = json.loads(f.read_text())
        out[s["config"]["run"]["variant"]] = s
    return out


def md_rows(text: str, section: str) -> tuple[list[str], dict[str, dict]]:
    """The table under ``## section`` of a report's markdown: row names, and row -> {column: cell}."""
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in body.splitlines() if ln.startswith("| ")]
    split = lambda ln: [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln)[1:-1]]  # noqa: E731
    head = split(lines[0])
    rows = [dict(zip(head, split(ln))) for ln in lines[1:]]
    return [r["row"] for r in rows], {r["row"]: r for r in rows}


def one_line_error(p: subprocess.CompletedProcess, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: "), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return lines[0]


# ------------------------------------------------------------------------------------------------------------
# The Table 3 report, end to end
# ------------------------------------------------------------------------------------------------------------
def test_report_rebuilds_table3_with_figures_html_and_the_same_table_twice(swept):
    out = swept["tmp"] / "build"
    args = ["report", swept["sweep"], "--results", swept["results"], "--out", out]
    p = ltfm(*args)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"report: {out / 'table3.md'}" in p.stdout and "Direction agrees with the paper" in p.stdout
    assert {f.name for f in out.iterdir()} == {"table3.md", "table3.csv", "table3.tex", "table3-standalone.tex",
                                               "table3.html", "table3.ipynb", *PNGS, "export", ".ltfm-report"}
    assert [f.name for f in (out / "export").iterdir()] == ["rep.json"]
    assert f"export: {out / 'export' / 'rep.json'}" in p.stdout

    # table3.md: one row per variant of the sweep file, in the paper's order, ours beside the paper's
    md = (out / "table3.md").read_text()
    # the headline comes first: agreement, seed noise (one seed: unknown), wall time, the worker's machine
    head_lines = md.split("\n## ")[0].splitlines()
    assert head_lines[0] == "# Table 3 replica: sweep `rep`"
    facts = [ln for ln in head_lines if ln.startswith("- ")]
    assert facts[0].startswith("- Direction agrees with the paper: dev PPL ")
    assert facts[1].startswith("- Beyond seed noise: unknown, the base row has 1 completed seed(s)")
    # one base seed: no row's verdict can be more than too few points (A1 and prenorm; the others have no change)
    assert facts[2].startswith("- Verdicts (dev PPL learning curves extrapolated to 3 × the budget): 0 hold, 0 may "
                               "flip, 0 within noise, 2 too few points; direction agrees with the paper on the rows "
                               "that hold")
    # each row's own answer: none of one seed is a controlled answer
    assert facts[3].startswith("- Answers from each row's own seeds paired with the base's: 0 better, 0 worse, 0 the "
                               "same within ±5%, 2 unsettled (2 of one seed: no controlled answer"), facts[3]
    assert re.search(r"^- Sweep: 3 completed run\(s\) of 5; wall time [\d.]+ (s|min) \(first start", facts[4]), facts[4]
    assert re.search(r"^- Machine: .+, \d+ cores \(", facts[5]), facts[5]  # CPU model, recorded by the sweep
    assert re.search(r"; trained in (fp32|bf16 \(mixed\))\.$", facts[5]), facts[5]  # what train.precision auto became
    assert [ln[2:] for ln in facts] == p.stdout.split("report: ")[0].strip().splitlines()[-len(facts):]
    # three tables that fit a screen: PPL, BLEU, the configuration
    tables = {sec: md_rows(md, sec) for sec in ("Dev perplexity", "Dev BLEU", "Configuration")}
    assert all(names == ORDER for names, _ in tables.values())
    _, ppl = tables["Dev perplexity"]
    _, bleu = tables["Dev BLEU"]
    _, conf = tables["Configuration"]
    # each table's header is its view's columns, in the declared order (tests/test_columns.py pins that order)
    from lightning_tfm.report.table3 import columns

    for table, view in ((ppl, columns.PPL), (bleu, columns.BLEU), (conf, columns.CONFIG)):
        assert list(table["base"]) == [c.title for c in columns.shown(view)]
    rows = {v: {**conf[v], **ppl[v], **bleu[v]} for v in ORDER}
    s = summaries(swept["results"])
    assert {"base", "A1", "prenorm"} <= set(s)
    base, a1 = s["base"], s["A1"]
    assert rows["base"]["dev PPL ours"] == f"{base['dev_ppl']:.2f}" and rows["base"]["dev PPL paper"] == "4.92"
    assert rows["base"]["dev BLEU ours"] == f"{base['dev_bleu']:.2f}" and rows["base"]["dev BLEU paper"] == "25.8"
    assert rows["base"]["params ours (M)"] == f"{base['params'] / 1e6:.2f}" and rows["base"]["params paper (M)"] == "65"
    assert (rows["A1"]["h"], rows["A1"]["d_k"], rows["A1"]["N"]) == ("1", "32", "1")
    assert rows["A1"]["dev PPL paper"] == "5.29" and rows["A1"]["ΔPPL paper"] == "+0.37 (+8%)"  # 0.37 / 4.92
    d = a1["dev_ppl"] - base["dev_ppl"]
    assert rows["A1"]["ΔPPL ours"] == f"{d:+.2f} ({100 * d / base['dev_ppl']:+.0f}%)"
    assert rows["A1"]["PPL agrees"] == ("yes" if a1["dev_ppl"] > base["dev_ppl"] else "no")
    assert rows["A1"]["PPL beyond noise"] == rows["A1"]["BLEU beyond noise"] == "unknown"  # one seed
    assert rows["A1"]["budget verdict"] == "too few points (seed noise unknown: one base seed)"
    assert re.fullmatch(r"budget \d\.\d+e\+\d+ FLOPs", rows["base"]["ΔPPL ours at base FLOPs"])
    assert rows["base"]["PPL beyond noise"] == "noise unknown (1 seed)"
    assert rows["A1"]["ΔBLEU ours"].rstrip("*").startswith(f"{a1['dev_bleu'] - base['dev_bleu']:+.2f}")
    assert re.fullmatch(r"identical outputs \(30 sentences\)|"
                        r"(not tested: .+ \(|p [=<] [\d.]+, )\d+/30 sentences differ\)?",
                        rows["A1"]["paired bootstrap"]), rows["A1"]["paired bootstrap"]
    assert rows["prenorm"]["norm"] == "pre" and rows["prenorm"]["dev PPL paper"] == ""
    # rows without a completed run stay, with their status and no numbers
    assert rows["D1"]["status"].startswith("missing") and rows["D1"]["P_drop"] == "0"
    assert rows["odd"]["status"].startswith("skipped") and "d_model" in rows["odd"]["status"]
    assert rows["crash"]["status"].startswith("failed") and "max_tokens_per_sentence" in rows["crash"]["status"]
    for name in ("D1", "odd", "crash"):
        assert rows[name]["dev PPL ours"] == rows[name]["dev BLEU ours"] == ""
    assert "Not compared (no completed run): D1 (missing" in md
    ppl_judged = 1  # A1 is the only paper row with a completed run besides the base
    assert re.search(rf"dev PPL {int(rows['A1']['PPL agrees'] == 'yes')}/{ppl_judged} rows", md), md
    assert "paired bootstrap" in md and "test-set sampling noise only" in md

    # table3.csv: the same rows, machine-readable
    table = list(csv.DictReader(io.StringIO((out / "table3.csv").read_text())))
    assert [r["variant"] for r in table] == ORDER
    by = {r["variant"]: r for r in table}
    assert float(by["A1"]["dev_ppl"]) == pytest.approx(a1["dev_ppl"], rel=1e-5)
    assert float(by["A1"]["paper_dev_ppl"]) == 5.29 and int(by["A1"]["params"]) == a1["params"]
    assert 0 < float(by["A1"]["bleu_p_value"]) <= 1 and by["A1"]["ppl_noise"] == "unknown"
    assert 0 <= int(by["A1"]["bleu_differing"]) <= int(by["A1"]["bleu_sentences"]) == 30
    assert by["A1"]["ppl_verdict"] == "too few points"
    assert float(by["A1"]["flops_per_step"]) == float(by["base"]["flops_per_step"])
    # A1 (h 1, d_k 32 = d_model) costs the base's FLOPs a step: at equal compute, the equal-steps change
    assert float(by["A1"]["delta_ppl_equal_flops"]) == pytest.approx(float(by["A1"]["delta_ppl"]), rel=1e-4)
    assert float(by["prenorm"]["train_flops"]) > 0 and by["D1"]["flops_per_step"] == ""

    # table3.tex: the same rows (tests/test_latex.py: its columns, escaping, pdflatex)
    tex = (out / "table3.tex").read_text()
    assert r"\label{tab:rep}" in tex and r"\input{table3}" in (out / "table3-standalone.tex").read_text()
    assert [ln.split(" ")[0] for ln in tex.splitlines() if re.match(r"[\w-]+( \(.*\))? &", ln)] == ORDER

    # figures: valid PNG files
    for name in PNGS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        with Image.open(out / name) as im:
            im.verify()
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200

    # the HTML export is for readers: no code, the headline first, the three tables, every figure embedded
    html = (out / "table3.html").read_text(encoding="utf-8")
    soup = BeautifulSoup(html, "html.parser")
    assert soup.title.string == "Table 3 replica: sweep rep"  # the report's heading, not the notebook's name
    assert not soup.select(".jp-CodeCell .jp-InputArea, .jp-InputPrompt, .jp-Editor, .highlight")
    assert "rd.build_table" not in html
    assert "kernel python" not in html and "sweep_file" not in html  # hidden cells (parameters, setup, loading)
    text = soup.get_text(" ", strip=True)
    assert text.index("Direction agrees with the paper") < text.index("Dev perplexity") < text.index("Dev BLEU") \
        < text.index("Learning curves")
    html_tables = soup.find_all("table")
    assert len(html_tables) == 4
    # every row in the tables; the learning curves of the rows that trained (odd, crash and D1 did not)
    rows_of = (ORDER, ORDER, ["base", "A1", "prenorm"], ORDER)
    for html_table, want, order in zip(html_tables, ("dev PPL paper", "dev BLEU paper", "step 9", "d_model"), rows_of):
        cells = [[c.get_text(strip=True) for c in tr.find_all(["td", "th"])] for tr in html_table.find_all("tr")]
        assert want in cells[0] and [r[0] for r in cells[1:]] == order
    embedded = [base64.b64decode(img["src"].split(",", 1)[1]) for img in soup.find_all("img")
                if img.get("src", "").startswith("data:image/png;base64,")]
    assert sorted(embedded) == sorted((out / name).read_bytes() for name in PNGS)  # each figure, as written
    assert "outlook.png is left out: no row's learning curve could be fitted and extrapolated" in soup.get_text()

    # the executed notebook ran on this venv's Python
    nb = nbformat.read(out / "table3.ipynb", as_version=4)
    texts = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"(prefix {sys.prefix})" in texts
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]

    # running the report again (into the same folder, replacing it) gives the same table
    first_md, first_csv = md, (out / "table3.csv").read_text()
    again = ltfm(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "table3.md").read_text() == first_md and (out / "table3.csv").read_text() == first_csv


def test_wandb_runs_give_the_same_table_as_the_local_results(swept):
    """--from-wandb's conversion (wandb_record) on the runs the sweep logged to W&B, read back from their offline
    files (this machine has no W&B server): the same table as the local source, except what W&B cannot know."""
    sweep = load_sweep(swept["sweep"])
    local = rd.build_table(rd.load_report_data(swept["sweep"], results_dir=swept["results"]), bootstrap=False)
    runs = [r for r in read_runs(swept["results"]) if r.job_type != "report"]  # not the report's own run
    assert {r.group for r in runs} == {"rep"} and len(runs) == 3
    records = rd.latest_per_key([rd.wandb_record(r.config, r.summary, name=r.name, job_type=r.job_type,
                                                 state="finished", run_id=r.run_id, history=r.history) for r in runs])
    data = rd.ReportData(sweep, records, "W&B (offline files)", rd.planned_configs(sweep, records))
    remote = rd.build_table(data, bootstrap=False)
    assert [r["variant"] for r in remote.rows] == [r["variant"] for r in local.rows] == ORDER
    loc = {r["variant"]: r for r in local.rows}
    for row in remote.rows:
        mine = loc[row["variant"]]
        if row["variant"] in ("base", "A1", "prenorm"):
            for key in ("dev_ppl", "dev_bleu", "params", "delta_ppl", "delta_bleu", "ppl_agrees", "bleu_agrees",
                        "paper_dev_ppl", "model.heads", "model.d_k", "model.norm", "train.max_steps", "status"):
                assert row[key] == (pytest.approx(mine[key]) if isinstance(mine[key], float) else mine[key]), key
        else:  # no W&B run: the row stays, as missing
            assert row["status"].startswith("missing") and row["dev_ppl"] is None
    assert remote.rows[ORDER.index("D1")]["model.dropout"] == 0.0
    # the history of the figures comes through too
    base = next(r for r in records if r.variant == "base")
    local_base = next(r for r in rd.load_report_data(swept["sweep"], results_dir=swept["results"]).records
                      if r.variant == "base")
    steps = [h["step"] for h in local_base.history if "dev/ppl" in h]
    assert len(steps) == 2 and [h["step"] for h in base.history if "dev/ppl" in h] == steps


def test_report_inputs_are_checked_with_one_line_errors(swept, tmp_path, ltfm_here):
    s, res = swept["sweep"], swept["results"]
    # in this process (cli.main): a new process would spend seconds importing before its one line
    assert "not found" in one_line_error(ltfm_here("report", tmp_path / "nope.yaml"))
    assert "results folder" in one_line_error(ltfm_here("report", s, "--results", tmp_path / "none"))
    assert "no sweep database" in one_line_error(ltfm_here("report", s, "--results", res, "--storage",
                                                           f"sqlite:///{tmp_path / 'none.db'}"))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert "not a report" in one_line_error(ltfm_here("report", s, "--results", res, "--out", foreign))
    assert (foreign / "notes.txt").read_text() == "keep me"
    # --from-wandb, in real processes (each its own environment): malformed path, no API key, no network --
    # before any kernel starts
    env = {"WANDB_API_KEY": "", "HOME": str(tmp_path), "NETRC": str(tmp_path / "netrc")}
    assert "ENTITY/PROJECT" in one_line_error(ltfm("report", s, "--from-wandb", "just-a-name", env=env))
    assert "API key" in one_line_error(ltfm("report", s, "--from-wandb", "team/proj", env=env))
    offline = {**env, "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}
    assert "cannot reach W&B" in one_line_error(ltfm("report", s, "--from-wandb", "team/proj", env=offline))
    assert not (ROOT / "reports" / "build" / "rep").exists()


def test_missing_results_are_a_one_line_error(tmp_path, ltfm_here):
    sweep = write_sweep(tmp_path / "never.yaml", "never", {"base": {}})
    p = ltfm_here("report", sweep, cwd=tmp_path)  # default results folder: <cwd>/results, which does not exist
    assert "no results for sweep 'never'" in one_line_error(p)


REFERENCE = ROOT / "sweeps" / "table3-cpu.yaml", ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"


def test_a_report_of_no_completed_run_is_one_line_and_writes_nothing(tmp_path, ltfm_here):
    """An empty results folder, one of failed runs only, an export without a completed run, a search without a
    completed trial, an empty side B: one line naming the sweep, where it looked and the way out (`ltfm sweep`),
    exit 2, before any kernel starts: no report folder, no staging folder, no W&B report run."""
    sweep_file = write_sweep(tmp_path / "never.yaml", "never", {"base": {}, "A1": {}})
    sweep = load_sweep(sweep_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "build"
    line = one_line_error(ltfm_here("report", sweep_file, "--results", empty, "--out", out))
    assert line == (f"ltfm: error: no completed run of sweep never in {empty}: run `ltfm sweep {sweep_file}` first, "
                    "or pass --results DIR (the folder it wrote its runs to)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "never.yaml"]  # no report, staging or lock
    assert not list(empty.iterdir())  # no W&B report run, no study written

    # runs that all failed: what was found is named
    run = empty / "never-base"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "failed", "error": "boom", "config": {
        "run": {"study": "never", "variant": "base", "seed": 1}}}))
    with pytest.raises(UserError,
                       match=r"^no completed run of sweep never in .+ \(1 found: 1 failed\): run `ltfm sweep"):
        notebooks.report_parameters(sweep, str(empty), None, None)

    # an export without a completed run (its records emptied)
    sweep3, export = REFERENCE
    tree = json.loads((export / "table3-cpu.json").read_text())
    tree["records"] = [r for r in tree["records"] if r["status"] != "completed"]
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "table3-cpu.json").write_text(json.dumps(tree))
    with pytest.raises(UserError, match=r"^no completed run of sweep table3-cpu in the export .+table3-cpu\.json: "
                                        r"write it again from the runs \(`ltfm report .+table3-cpu\.yaml`\)$"):
        notebooks.report_parameters(load_sweep(sweep3), None, None, None, str(tmp_path / "export"))
    # the same export with its runs is a report (the check passes)
    assert notebooks.report_parameters(load_sweep(sweep3), None, None, None, str(export))["export_dir"]

    # --against: an empty side B is named by its own option
    p = ltfm_here("report", sweep3, "--from-export", export, "--against", sweep3, "--against-results", empty,
                  "--out", out)
    assert "no completed run of sweep table3-cpu in " in one_line_error(p) and "--against-results DIR" in p.stderr
    assert not out.exists() and not list(tmp_path.glob(".build*"))


def test_a_search_without_a_completed_trial_is_refused(tmp_path):
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    path = tmp_path / "srch.yaml"
    path.write_text(yaml.safe_dump({"name": "srch", "experiment": str(SMOKE), "metric": "dev_loss", "n_trials": 2,
                                    "space": {"model.heads": {"type": "categorical", "choices": [1, 2]}}}))
    study = optuna.create_study(study_name="srch", storage=f"sqlite:///{tmp_path / 'srch.db'}")
    dists = {"model.heads": CategoricalDistribution([1, 2])}
    for i, state in enumerate((TrialState.FAIL, TrialState.PRUNED)):
        study.add_trial(create_trial(state=state, params={"model.heads": 1 + i}, distributions=dists,
                                     intermediate_values={10: 5.0} if state == TrialState.PRUNED else {},
                                     user_attrs={"variant": f"search-{i:04d}", "seed": 1}))
    with pytest.raises(UserError, match=r"^no completed trial of sweep srch in .+ \(2 found: 1 fail, 1 pruned\)"):
        notebooks.report_parameters(load_sweep(path), str(tmp_path), None, None)


def test_the_machine_line_names_the_precision_as_a_reader_does(tmp_path):
    """summary.json records Lightning's precision string ("32", "bf16-mixed"); the headline says fp32, bf16 (mixed)."""
    from lightning_tfm.report.views.render import headline_lines, precision_name

    assert [precision_name(p) for p in ("32", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "64", "odd-9")] == \
        ["fp32", "fp32", "bf16 (mixed)", "fp16 (mixed)", "bf16", "fp64", "odd-9"]
    sweep = load_sweep(write_sweep(tmp_path / "p.yaml", "p", {"base": {}}))
    recs = [rd.RunRecord(variant="base", seed=1, status="completed", dev_ppl=20.0, dev_bleu=10.0, host="h",
                         precision="32")]
    machine = headline_lines(rd.build_table(rd.ReportData(sweep, recs, "test", {}), bootstrap=False))[-1]
    assert machine.endswith("; trained in fp32."), machine
    table = rd.build_table(rd.load_report_data(REFERENCE[0], export_dir=REFERENCE[1]))
    assert headline_lines(table)[-1].endswith("; trained in bf16 (mixed).")


# ------------------------------------------------------------------------------------------------------------
# Failing cells
# ------------------------------------------------------------------------------------------------------------
def _notebook(path: Path, *sources: str) -> Path:
    cells = [nbformat.v4.new_code_cell("out_dir = None", metadata={"tags": ["parameters"]})]
    cells += [nbformat.v4.new_code_cell(src) for src in sources]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                        "display_name": "Python 3"}})
    nbformat.write(nb, path)
    return path


def test_a_failing_cell_fails_the_command_naming_the_cell(tmp_path, capsys):
    out = tmp_path / "build"
    out.mkdir()
    (out / "table3.md").write_text("the previous report\n")
    nb = _notebook(tmp_path / "bad.ipynb", "# Load\nx = 1", "# Table: divide\nx = 1 / 0")
    assert notebooks.execute(nb, {}, out, "table3") == 1
    err = capsys.readouterr().err.strip().splitlines()
    # In [4]: the parameters cell, papermill's injected parameters, "# Load", then this one
    assert len(err) == 1 and "cell 4" in err[0] and "'# Table: divide'" in err[0] and "ZeroDivisionError" in err[0]
    assert (out / "table3.md").read_text() == "the previous report\n"  # nothing half-written
    failed = tmp_path / "build.failed" / "table3.ipynb"
    assert failed.is_file() and str(failed) in err[0]
    assert not list(tmp_path.glob(".build.tmp-*"))
    # a UserError raised in a cell is the user's input: one line, the CLI's exit code 2
    nb = _notebook(tmp_path / "user.ipynb", "from lightning_tfm.base.errors import UserError\n"
                                            "raise UserError('no study named x: run ltfm sweep first')")
    with pytest.raises(UserError, match="no study named x"):
        notebooks.execute(nb, {}, out, "table3")
    assert (out / "table3.md").read_text() == "the previous report\n"


# ------------------------------------------------------------------------------------------------------------
# Several seeds, significance
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_several_seeds_give_mean_std_and_a_paired_bootstrap_against_base(tmp_path, data_dir):
    refs = [line for line in rd.dev_references({"data.source": "local", "data.path": str(data_dir),
                                                "data.dev_split": "val", "data.src_lang": "en", "data.tgt_lang": "de",
                                                "data.max_dev_pairs": 60})]
    assert len(refs) == 60
    cfg = {"data.source": "local", "data.path": str(data_dir), "data.dev_split": "val", "data.src_lang": "en",
           "data.tgt_lang": "de", "data.max_dev_pairs": 60, "model.heads": 8, "train.max_steps": 100}

    def rec(variant, seed, ppl, bleu, hyps, status="completed"):
        path = tmp_path / f"{variant}-{seed}.txt"
        path.write_text("\n".join(hyps) + "\n")
        return rd.RunRecord(variant=variant, family=variant[0], seed=seed, status=status, config=dict(cfg),
                            params=1000, dev_ppl=ppl, dev_bleu=bleu, hyps=str(path))

    worse = [" ".join(r.split()[: max(1, len(r.split()) // 3)]) for r in refs]  # a third of every reference
    close = worse[:1] + refs[1:]  # one sentence of 60 differs from the base's
    records = [rec("base", 1, 5.0, 40.0, refs), rec("base", 2, 5.2, 42.0, refs),
               rec("A1", 1, 6.0, 20.0, worse), rec("A1", 2, 6.4, 22.0, worse),
               rec("A2", 1, 5.15, 40.0, close), rec("A2", 2, 5.15, 41.0, close),
               rec("A3", 1, 4.0, 30.0, worse), rec("A3", 2, 9.9, 9.9, worse, status="failed")]
    sweep = load_sweep(write_sweep(tmp_path / "seeds.yaml", "seeds", {"base": {}, "A1": {}, "A2": {}, "A3": {},
                                                                      "A4": {}}))
    sweep.seeds = [1, 2]
    table = rd.build_table(rd.ReportData(sweep, records, "test", {}))
    rows = {r["variant"]: r for r in table.rows}
    assert rows["A1"]["dev_ppl"] == pytest.approx(6.2)
    assert rows["A1"]["dev_ppl_std"] == pytest.approx(0.2828427, rel=1e-5)
    assert rows["A1"]["delta_ppl"] == pytest.approx(1.1) and rows["A1"]["ppl_agrees"] is True   # paper: +0.37
    assert rows["A1"]["delta_bleu"] == pytest.approx(-20.0) and rows["A1"]["bleu_agrees"] is True  # paper: -0.9
    assert rows["A1"]["bleu_significant"] is True and rows["A1"]["bleu_test_seeds"] == [1, 2]
    assert rows["A1"]["bleu_differing"] == 120 and rows["A1"]["bleu_sentences"] == 120  # 2 seeds x 60 sentences
    # A2: one sentence of 60 differs per seed: never significant, and its change is within seed noise anyway
    assert rows["A2"]["bleu_significant"] is False and rows["A2"]["bleu_differing"] == 2
    assert rows["A2"]["ppl_agrees"] is True  # +0.05 vs paper +0.08
    # seed noise: base PPL 5.0 / 5.2 (std 0.141), base BLEU 40 / 42 (std 1.41); |Δ| > 2 std is beyond
    assert (rows["A1"]["ppl_noise"], rows["A1"]["bleu_noise"]) == ("beyond", "beyond")
    assert (rows["A2"]["ppl_noise"], rows["A2"]["bleu_noise"]) == ("within", "within")   # +0.05, -0.5
    assert rows["A3"]["ppl_noise"] == "beyond" and rows["base"]["ppl_noise"] is None     # -1.1
    s = table.summary
    assert s["ppl_noise"] == {"beyond": 2, "within": 1, "unknown": 0} and s["ppl_beyond"] == (2, 2)
    # A3: one of two seeds failed: mean over the completed one, tested on the seed both rows have
    assert rows["A3"]["dev_ppl"] == 4.0 and rows["A3"]["dev_ppl_std"] is None and rows["A3"]["bleu_test_seeds"] == [1]
    assert rows["A3"]["status"] == "1/2 seeds completed; seed 2 failed"
    assert rows["A4"]["status"].startswith("missing") and rows["A4"]["dev_ppl"] is None
    md = rd.table_markdown(table)
    _, ppl = md_rows(md, "Dev perplexity")
    _, cells = md_rows(md, "Dev BLEU")
    assert ppl["A1"]["dev PPL ours"] == "6.20 ± 0.28" and cells["A1"]["ΔBLEU ours"] == "-20.00 (-49%)*"
    assert (ppl["A1"]["PPL beyond noise"], ppl["A2"]["PPL beyond noise"]) == ("yes", "no")
    assert ppl["base"]["PPL beyond noise"] == "noise: 2σ = 0.28"
    assert cells["A2"]["ΔBLEU ours"] == "-0.50 (-1%)"
    assert cells["A2"]["paired bootstrap"].endswith("2/120 sentences differ")
    assert cells["base"]["dev BLEU ours"] == "41.00 ± 1.41"
    # PPL: A1 (+), A2 (+), A3 (-; paper A3 -0.01) all agree; A1 and A3 are beyond noise
    assert "dev PPL 3/3 rows (100%)" in md and "Not compared (no completed run): A4 (missing" in md
    assert ("- Rows beyond seed noise: dev PPL 2/3, dev BLEU 2/3 (|Δ| > 2 × the base's seed std: PPL 0.14, "
            "BLEU 1.41") in md
    assert "- Direction agrees with the paper on the rows beyond noise: dev PPL 2/2 rows (100%)" in md
    assert rd.table_markdown(rd.build_table(rd.ReportData(sweep, records, "test", {}))) == md  # deterministic


def test_identical_outputs_are_never_significant_and_clearly_different_ones_are(tmp_path, data_dir):
    """sacreBLEU's bootstrap alone calls two identical outputs different (p = 1/1001): the report's test may not."""
    from lightning_tfm.training.data.data import read_lines

    refs = rd.dev_references({"data.source": "local", "data.path": str(data_dir), "data.dev_split": "val",
                              "data.src_lang": "en", "data.tgt_lang": "de", "data.max_dev_pairs": 200})
    good = [" ".join(r.split()[: max(1, 2 * len(r.split()) // 3)]) for r in refs]  # two thirds of each reference
    files = {"base.txt": good, "same.txt": good, "worse.txt": [r.split()[0] for r in refs]}  # first word only
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    base, same, worse = (read_lines(tmp_path / n) for n in files)

    identical = rd.paired_test(base, same, refs, "de")
    assert identical["differing"] == 0 and identical["p_value"] == 1.0 and identical["tested"] is False
    assert rd.bleu_significant(identical, identical["score"] - identical["base_score"], "unknown") is False

    different = rd.paired_test(base, worse, refs, "de")
    assert different["tested"] and different["differing"] == 200 and different["p_value"] < 0.01
    assert different["score"] < different["base_score"] - 5
    delta = different["score"] - different["base_score"]
    assert rd.bleu_significant(different, delta, "unknown") is True   # one seed: the test stands alone
    assert rd.bleu_significant(different, delta, "within") is False   # several seeds: within their spread


def test_the_base_at_its_own_seeds_and_every_rows_learning_curve(tmp_path):
    """The CPU protocol's shape: the base at three seeds (its spread is the noise), other rows at one; the
    learning-curve table averages the seeds at each validation step and gives a longer row's last value."""
    sweep = load_sweep(write_sweep(tmp_path / "own.yaml", "own", {"base": {"seeds": [1, 2, 3]}, "A1": {},
                                                                   "big": {"family": "big", "budget": 3}}))

    def rec(variant, seed, ppl, curve):
        return rd.RunRecord(variant=variant, family=variant, seed=seed, status="completed", params=1000,
                            dev_ppl=ppl, dev_bleu=10.0 + seed, history=[{"step": st, "dev/ppl": v} for st, v in curve])
    records = [rec("base", 1, 30.0, [(100, 300.0), (200, 60.0)]), rec("base", 2, 31.0, [(100, 310.0), (200, 62.0)]),
               rec("base", 3, 32.0, [(100, 320.0), (200, 64.0)]), rec("A1", 1, 40.0, [(100, 400.0), (200, 80.0)]),
               rec("big", 1, 20.0, [(100, 200.0), (200, 50.0), (300, 40.0), (600, 20.0)])]
    table = rd.build_table(rd.ReportData(sweep, records, "test", {}), bootstrap=False)
    rows = {r["variant"]: r for r in table.rows}
    assert (rows["base"]["seeds_total"], rows["A1"]["seeds_total"]) == (3, 1)
    assert rows["base"]["status"] == "completed (3 seeds)" and rows["A1"]["status"] == "completed"
    assert rows["base"]["dev_ppl"] == pytest.approx(31.0) and rows["A1"]["ppl_noise"] == "beyond"  # 9 > 2 x 1
    curves = table.curves
    assert curves.steps == [100, 200]
    assert curves.rows["base"] == {100: pytest.approx(310.0), 200: pytest.approx(62.0)}
    md = rd.table_markdown(table)
    assert "Base experiment `multi30k-smoke.yaml`; seed 1; base at seeds 1, 2, 3." in md
    names, cells = md_rows(md, "Learning curves")
    assert names == ["base", "A1", "big"]
    assert (cells["base"]["step 100"], cells["base"]["step 200"], cells["base"]["final"]) == \
        ("310.0", "62.0", "62.0 (step 200)")
    assert cells["big"]["final"] == "20.0 (step 600)" and cells["A1"]["step 200"] == "80.0"
    assert "(mean ± std over the completed seeds)" in md


def test_noise_rule():
    assert noise.noise_verdict(0.5, 0.2) == "beyond" and noise.noise_verdict(-0.5, 0.2) == "beyond"  # 2 x 0.2 = 0.4
    assert noise.noise_verdict(0.3, 0.2) == "within" and noise.noise_verdict(0.0, 0.0) == "within"
    assert noise.noise_verdict(0.3, None) == "unknown" and noise.noise_verdict(None, 0.2) is None
    assert "2 ×" in noise.NOISE_RULE and "unknown" in noise.NOISE_RULE


# ------------------------------------------------------------------------------------------------------------
# The search report
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_search_report_shows_every_trial_and_optunas_plots(tmp_path):
    """A search study in a real SQLite storage (its trials written through Optuna: the sweep machinery is tested
    in test_sweep.py); its run folders live on another machine, so values come from the trials' attributes."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import TrialState, create_trial

    path = tmp_path / "srch.yaml"
    path.write_text(yaml.safe_dump({
        "name": "srch", "experiment": str(SMOKE), "metric": "dev_loss", "n_trials": 5,
        "sampler": {"type": "tpe", "seed": 1}, "pruner": {"type": "hyperband", "min_resource": 10},
        "space": {"model.heads": {"type": "categorical", "choices": [1, 2, 4]},
                  "model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}}, sort_keys=False))
    storage = f"sqlite:///{tmp_path / 'srch.db'}"
    study = optuna.create_study(study_name="srch", storage=storage, direction="minimize")
    dists = {"model.heads": CategoricalDistribution([1, 2, 4]), "model.dropout": FloatDistribution(0.0, 0.3)}
    trials = [(TrialState.COMPLETE, 4.2, 1, 0.1), (TrialState.COMPLETE, 3.9, 2, 0.2),
              (TrialState.PRUNED, None, 4, 0.05), (TrialState.COMPLETE, 4.0, 4, 0.25), (TrialState.FAIL, None, 2, 0.0)]
    for i, (state, value, heads, dropout) in enumerate(trials):
        study.add_trial(create_trial(
            state=state, value=value, params={"model.heads": heads, "model.dropout": dropout}, distributions=dists,
            intermediate_values={10: 5.0 - 0.1 * i, 20: 4.5 - 0.1 * i} if state != TrialState.FAIL else {},
            user_attrs={"variant": f"search-{i:04d}", "family": "search", "seed": 1, "run_id": f"r{i}",
                        "run_dir": f"/elsewhere/r{i}", "steps": 20 if state == TrialState.COMPLETE else 10,
                        **({"error": "CUDA out of memory"} if state == TrialState.FAIL else {})}))
    (tmp_path / "results").mkdir()
    out = tmp_path / "build"
    p = ltfm("report", path, "--storage", storage, "--results", tmp_path / "results", "--out", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert {f.name for f in out.iterdir()} == {"search.md", "search.csv", "search.html", "search.ipynb",
                                               "optimization_history.png", "param_importances.png",
                                               "intermediate_values.png", ".ltfm-report"}
    md = (out / "search.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| trial")]
    assert [r.split("|")[3].strip() for r in rows] == ["complete", "complete", "pruned", "complete", "fail"]
    assert "Best: trial 1 (search-0001), dev_loss 3.9000, model.heads=2, model.dropout=0.2." in md
    assert "CUDA out of memory" in md
    for png in ("optimization_history.png", "param_importances.png", "intermediate_values.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    soup = BeautifulSoup((out / "search.html").read_text(encoding="utf-8"), "html.parser")
    assert soup.find("table") is not None and "search-0003" in soup.get_text()


def test_the_notebooks_ship_once_as_package_data():
    """``ltfm report`` runs the package's notebooks (found through importlib.resources, as an installed package
    finds them; the tests above execute them); the repository holds no second copy."""
    keys = ("sweep_file", "results_dir", "storage", "out_dir", "wandb_path")
    for name, more in (("table3", ("export_dir",)), ("search", ()),
                       ("compare", ("export_dir", "against_file", "against_results", "against_storage",
                                    "against_export"))):
        shipped = notebooks.notebook_path(name)
        assert shipped.resolve() == (ROOT / "lightning_tfm" / "resources" / "notebooks" / f"{name}.ipynb").resolve()
        nb = nbformat.read(shipped, as_version=4)
        nbformat.validate(nb)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1
        for key in keys + more:
            assert re.search(rf"^{key} = ", params[0].source, re.M), key
    assert all("build" in p.relative_to(ROOT).parts for p in ROOT.glob("reports/**/*.ipynb"))  # only built ones


def test_a_row_of_another_sweep_file_of_the_same_name_is_left_out(swept, tmp_path):
    """Two sweep files named alike in one storage: the report of one never shows the other's definition of a
    row as its own; it says so in a note."""
    other = yaml.safe_load(Path(swept["sweep"]).read_text())
    other["variants"]["A1"] = {"model.heads": 4, "model.d_k": 8, "model.d_v": 8}  # another A1, same study name
    other_file = tmp_path / "rep.yaml"
    other_file.write_text(yaml.safe_dump(other, sort_keys=False))
    data = rd.load_report_data(other_file, results_dir=swept["results"])
    a1 = [r for r in data.records if r.variant == "A1"]
    assert not a1 or all(r.status == "missing" for r in a1)
    assert any("define rows A1 otherwise than rep.yaml" in n for n in data.notes), data.notes
    same = rd.load_report_data(swept["sweep"], results_dir=swept["results"])  # the file itself: A1 is there
    assert [r.status for r in same.records if r.variant == "A1"] == ["completed"]
