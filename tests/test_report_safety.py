"""``ltfm report`` as an operator and an attacker use it: a storage password never lands in a report's files,
terminal or W&B run; strings from an export are text, never markup, in every page; two reports of one sweep at
once leave one complete W&B report run; a signal mid-notebook leaves nothing behind; a pipeline check
(``make ablation QUICK=1``) never passes for the real sweep in W&B. Real processes, the real notebooks, a real
PostgreSQL server, W&B offline files read back (tests/wandb_offline.py)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from bs4 import BeautifulSoup

from lightning_tfm import report as rd
from lightning_tfm.report.publish import optuna_note, wandb_run
from lightning_tfm.report.views import render

from conftest import ROOT, default_signals, ltfm, write_sweep
from pg import postgres  # noqa: F401  (fixture)
from wandb_offline import read_runs

RUN_ID = "report-rep-table3"


def copy_results(swept, dest: Path) -> Path:
    """The shared sweep's results, copied: a report writes its W&B run and the study's note there."""
    shutil.copytree(swept["results"], dest, ignore=shutil.ignore_patterns("wandb-report"))
    return dest


def every_file_text(*roots: Path) -> dict[Path, bytes]:
    return {f: f.read_bytes() for root in roots if root.exists() for f in root.rglob("*") if f.is_file()}


# ------------------------------------------------------------------------------------------------------------
# A storage password
# ------------------------------------------------------------------------------------------------------------
def test_the_storage_password_is_in_no_report_file_line_or_wandb_run(swept, postgres, tmp_path):  # noqa: F811
    """The study in a password-protected PostgreSQL (--storage, --against-storage): the notebooks still read it
    (the rows, the optuna-dashboard note), and the password is in no file of the report, of its executed
    notebook (papermill's parameters: masked), of the W&B report run, nor on the terminal, a failing notebook's
    error line included."""
    from lightning_tfm.sweep import open_storage

    url = postgres.create_database("reportpw")
    optuna.copy_study(from_study_name="rep", from_storage=open_storage(f"sqlite:///{swept['results'] / 'rep.db'}"),
                      to_storage=open_storage(url))
    results = copy_results(swept, tmp_path / "results")
    (results / "rep.db").unlink()  # the study is in PostgreSQL only
    password = postgres.password.encode()
    out, cmp = tmp_path / "build", tmp_path / "cmp"
    p = ltfm("report", swept["sweep"], "--results", results, "--storage", url, "--out", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "optuna-dashboard: note and 2 plots on study rep" in p.stdout  # the storage was read and written
    md = (out / "table3.md").read_text()
    assert f"Optuna storage postgresql://{postgres.user}:***@127.0.0.1:{postgres.port}/reportpw" in md
    assert re.search(r"^\| A1 \| \d+\.\d\d \|", md, re.M), md  # the rows came from the study
    nb = json.loads((out / "table3.ipynb").read_text())
    assert nb["metadata"]["papermill"]["parameters"]["storage"] == url.replace(postgres.password, "***")
    c = ltfm("report", swept["sweep"], "--results", results, "--storage", url, "--against", swept["sweep"],
             "--against-results", results, "--against-storage", url, "--out", cmp)
    assert c.returncode == 0, c.stdout[-3000:] + c.stderr[-3000:]
    # a storage without the study: the notebook's error is one line, and nothing is left of the report
    empty = postgres.create_database("reportpw_empty")
    e = ltfm("report", swept["sweep"], "--results", results, "--storage", empty, "--out", tmp_path / "none")
    assert e.returncode == 2 and len(e.stderr.strip().splitlines()) == 1, e.stderr
    assert "no study 'rep'" in e.stderr and not list(tmp_path.glob("none*")) and not list(tmp_path.glob(".none*"))
    for proc in (p, c, e):
        assert postgres.password not in proc.stdout + proc.stderr
    files = every_file_text(out, cmp, results)
    assert (out / "table3.ipynb") in files and (cmp / "compare.ipynb") in files
    assert any(f.suffix == ".wandb" for f in files)  # the W&B report run's files are searched too
    leaked = [str(f) for f, data in files.items() if password in data]
    assert not leaked, leaked


# ------------------------------------------------------------------------------------------------------------
# Hostile strings (run folders, W&B runs, exports)
# ------------------------------------------------------------------------------------------------------------
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
LINK = "[click](javascript:alert(3))"
TICKS = "`` <b>bold</b> ``"
DOLLARS = r"$\bogus{$"  # matplotlib's mathtext would fail to parse it


def hostile_results(swept, tmp_path: Path) -> Path:
    """The shared sweep's results in a folder whose name holds a tag, with three more run folders of the study
    (copies of A1's) whose summary.json holds markup: a row named with a script, one with mathtext and code
    ticks, a failed one whose error note holds an image and a javascript: link; their family, machine,
    precision and BLEU signature too. A run folder is what a user (or a results folder from elsewhere) gives the
    report; W&B runs and exports become the same records."""
    results = copy_results(swept, tmp_path / f"res {IMG}")
    a1 = next(d for d in results.iterdir() if (d / "summary.json").is_file()
              and json.loads((d / "summary.json").read_text())["config"]["run"]["variant"] == "A1")
    for i, (variant, family, status, note) in enumerate([(SCRIPT, SCRIPT, "completed", None),
                                                          (f"row {DOLLARS} {TICKS}", DOLLARS, "completed", None),
                                                          (f"bad {LINK}", IMG, "failed", f"{IMG} {LINK}")]):
        run = results / f"stray-{i}"
        shutil.copytree(a1, run, ignore=shutil.ignore_patterns("wandb", "checkpoints"))
        summary = json.loads((run / "summary.json").read_text())
        summary["config"]["run"].update(variant=variant, family=family)
        summary.update(status=status, host=f"box {SCRIPT}", precision=IMG, bleu_signature=f"sig {TICKS} {SCRIPT}",
                       started_at=f"2026-01-0{i + 1}T00:00:00")
        if note:
            summary["error"] = note
        (run / "summary.json").write_text(json.dumps(summary))
    return results


def assert_inert(html: str, where: str) -> None:
    """No element, attribute or link of the page comes from the export: no script, no event handler, no
    javascript: link, no image but the figures; the hostile strings are there as text."""
    soup = BeautifulSoup(html, "html.parser")
    bad = [t for t in soup.find_all(True) if any(a.lower().startswith("on") for a in t.attrs)]
    assert not bad, (where, bad[:3])
    scripts = [s for s in soup.find_all("script") if "alert(" in (s.string or "")]
    assert not scripts, (where, scripts[:3])
    links = [a for a in soup.find_all("a") if "javascript:" in (a.get("href") or "").lower()]
    assert not links, (where, links[:3])
    imgs = [i for i in soup.find_all("img") if not (i.get("src") or "").startswith("data:image/png;base64,")]
    assert not imgs, (where, imgs[:3])
    bold = [b for b in soup.find_all("b") if b.get_text() == "bold"]
    assert not bold, (where, bold)
    text = soup.get_text(" ")
    for needle in (SCRIPT, IMG, LINK):
        assert needle in text, (where, needle)


def test_strings_from_the_runs_are_text_in_every_page_and_figure(swept, tmp_path):
    """Run folders holding markup in every string a report shows, in a results folder whose name holds a tag:
    ``ltfm report`` and ``--against`` write pages where it is text (table3.html, compare.html, the markdown they
    are made from), and figures that draw it as it is (a "$" is no mathtext)."""
    results = hostile_results(swept, tmp_path)
    out, cmp = tmp_path / "build", tmp_path / "cmp"
    p = ltfm("report", swept["sweep"], "--results", results, "--out", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert_inert((out / "table3.html").read_text(encoding="utf-8"), "table3.html")
    md = re.sub(r"(`+)(.+?)(?<!`)\1(?!`)", "", (out / "table3.md").read_text())  # code spans show markup as it is
    for raw in (SCRIPT, IMG, LINK, "<b>"):
        assert raw not in md, raw
    c = ltfm("report", swept["sweep"], "--results", results, "--against", swept["sweep"], "--against-results",
             results, "--out", cmp)
    assert c.returncode == 0, c.stdout[-3000:] + c.stderr[-3000:]
    assert_inert((cmp / "compare.html").read_text(encoding="utf-8"), "compare.html")
    assert SCRIPT not in (cmp / "compare.md").read_text()


def test_the_optuna_dashboard_plots_and_note_hold_run_strings_as_text(swept, tmp_path):
    """optuna-dashboard draws plotly's text as HTML (its pseudo-HTML: links, line breaks) and renders the note as
    markdown: a row's name is escaped in both."""
    data = rd.load_report_data(swept["sweep"], results_dir=swept["results"])
    a1 = next(r for r in data.records if r.variant == "A1")
    data.records.append(rd.RunRecord(**{**a1.__dict__, "variant": '<a href="javascript:alert(1)">x</a>'}))
    data.records.append(rd.RunRecord(variant=IMG, family="A", seed=1, status="failed", note=SCRIPT))
    family, curves = optuna_note.plotly_dev_ppl_by_family(data), optuna_note.plotly_learning_curves(data)
    texts = [t.name for fig in (family, curves) for t in fig.data]
    texts += [b["args"][1]["title.text"] for b in family.layout.updatemenus[0].buttons]
    assert any("&lt;a href=" in t for t in texts) and not any("<a " in t or "<img" in t for t in texts), texts
    assert any("&lt;img src=x onerror=alert(2)&gt;" in t for t in texts), texts
    note = optuna_note.note_text(rd.build_table(data, bootstrap=False), str(tmp_path / "a`b"))
    assert "<a href" not in note and IMG not in note and "&lt;img src=x onerror=alert(2)&gt;" in note


# ------------------------------------------------------------------------------------------------------------
# Two reports at once
# ------------------------------------------------------------------------------------------------------------
def _reader(stream, lines: list[str], seen: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if "waiting for another `ltfm report`" in line:
            seen.set()


@pytest.mark.long  # make test-long; make test keeps a second report replacing the first's W&B run
# (test_dashboards.py::test_a_second_report_replaces_the_wandb_run_and_the_note_and_a_wandb_error_is_a_warning)
def test_two_reports_of_one_sweep_at_once_leave_one_complete_wandb_run(swept, tmp_path):
    """Two ``ltfm report`` of one sweep into one folder, started together while this test holds the W&B report
    lock of their results folder: one waits for the report folder, the other for the lock; released, they
    publish one after the other. Both succeed, the report folder is complete, and the W&B report run that is
    left is the last one's, complete, in the folder it printed (the first one's was superseded, as by a rerun)."""
    from filelock import FileLock

    results = copy_results(swept, tmp_path / "results")
    out = tmp_path / "build"
    args = [sys.executable, "-m", "lightning_tfm", "report", str(swept["sweep"]), "--results", str(results), "--out",
            str(out)]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    lock = FileLock(str(wandb_run.publish_lock(results)))
    lock.acquire()
    procs, outputs, waiting, readers = [], [], [], []
    try:
        for _ in range(2):
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                    cwd=ROOT)
            lines: list[str] = []
            seen = threading.Event()
            readers.append(threading.Thread(target=_reader, args=(proc.stdout, lines, seen), daemon=True))
            readers[-1].start()
            procs.append(proc)
            outputs.append(lines)
            waiting.append(seen)
        for proc, seen, lines in zip(procs, waiting, outputs):  # both wait: for the report folder, for the lock
            while not seen.wait(0.2):
                assert proc.poll() is None, "".join(lines)
        lock.release()
        codes = [proc.wait(timeout=600) for proc in procs]
    finally:
        if lock.is_locked:
            lock.release()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for reader in readers:
        reader.join(timeout=60)
    texts = ["".join(lines) for lines in outputs]
    assert codes == [0, 0], texts
    printed = []
    for text in texts:
        m = re.search(rf"W&B: report run {RUN_ID}, offline in (\S+) \(upload: wandb sync (\S+)\)", text)
        assert m and m.group(1) == m.group(2), text
        printed.append(Path(m.group(1)))
    # the one that waited for the report folder published second: its run is the one left, where it said
    (second,) = [i for i, text in enumerate(texts) if "finish with the report folder" in text]
    wandb_dir = results / "wandb-report" / "wandb"
    assert wandb_run.run_folders(wandb_dir, RUN_ID) == [printed[second]] and printed[second].is_dir()
    assert not printed[1 - second].exists()  # the first one's, superseded as by a second report after it
    assert [p for p in wandb_dir.iterdir() if p.is_dir() and not p.is_symlink()] == [printed[second]]
    (run,) = read_runs(results / "wandb-report")
    assert run.exit_code == 0 and run.run_id == RUN_ID and set(run.tables) == {"table3/dev_ppl", "table3/dev_bleu"}
    assert run.config["report.folder"] == str(out)
    assert (out / "table3.md").is_file() and (out / "table3.html").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build.") and p.name != ".build.lock"]


# ------------------------------------------------------------------------------------------------------------
# Signals
# ------------------------------------------------------------------------------------------------------------
# SIGINT in make test-long: one handler serves both (make test keeps SIGTERM)
@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.long), (signal.SIGTERM, 143)])
def test_a_signal_mid_notebook_leaves_nothing_behind(swept, tmp_path, sig, code):
    """SIGINT or SIGTERM once the notebook's kernel runs (its setup cell has printed): exit 130 / 143 and one
    line; no staging folder, no report folder, no kernelspec or connection file in the temporary folder, no
    kernel left running."""
    out = tmp_path / "build"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "lightning_tfm", "report", str(swept["sweep"]), "--results",
                             str(swept["results"]), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, preexec_fn=default_signals)
    executed = tmp_path / f".build.tmp-{proc.pid}" / "table3.ipynb"
    mark = f"kernel python: {sys.executable}"
    try:
        while True:  # the kernel has run the setup cell: papermill saved the notebook with its output
            assert proc.poll() is None, proc.communicate()
            try:
                cells = json.loads(executed.read_text())["cells"]
            except (OSError, ValueError):  # not there yet, or being written
                cells = []
            time.sleep(0.05)
            if any(mark in "".join(o.get("text", "")) for c in cells for o in c.get("outputs", [])):
                break
        kernels = [p.name for p in tmp.iterdir() if p.name.startswith("ltfm-kernel-")]
        assert kernels  # the kernelspec is there while the notebook runs
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children  # the kernel
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, (proc.returncode, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: "), stderr
    assert "Traceback" not in stdout + stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no staging, no report folder
    assert not [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")], list(tmp.iterdir())
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


# ------------------------------------------------------------------------------------------------------------
# A pipeline check
# ------------------------------------------------------------------------------------------------------------
def quick_overrides() -> list[str]:
    """The overrides ``make ablation QUICK=1`` gives ``ltfm sweep`` (make -n: the Makefile's own line), less the
    data and results folders, which the test sets."""
    p = subprocess.run(["make", "--no-print-directory", "-n", "ablation", "QUICK=1", "SWEEP=sweeps/table3-cpu.yaml",
                        "DATA=/nonexistent"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if re.search(r"ltfm sweep \S+ --workers", ln)]
    words = shlex.split(re.split(r"\|\||;", line)[0])  # the command itself, before what the recipe does after it
    return [w for w in words if "=" in w and not w.startswith(("data.path=", "data.source=", "run.results_dir="))]


@pytest.mark.slow
@pytest.mark.long  # make test-long; make test keeps each part without a sweep: the group
# (test_tracking.py::test_a_pipeline_checks_runs_have_a_group_of_their_own), the report run's own id
# (test_dashboards.py) and the report's title and figures (test_pipeline_check_figures.py)
def test_a_pipeline_check_is_its_own_group_and_report_run_and_says_so(tmp_path, data_dir):
    """``make ablation QUICK=1``'s overrides on a one-row sweep: its training run is tagged and grouped as a
    pipeline check (so ``--from-wandb`` of the real sweep, which reads group = sweep name, never reads it), its
    report says in its title and first line that its numbers say nothing, and its W&B report run has an id,
    group and tags of its own (the real report's run is never overwritten)."""
    quick = quick_overrides()
    assert "wandb.tags=[pipeline-check]" in quick, quick
    sweep = write_sweep(tmp_path / "rep.yaml", "rep", {"base": {}})
    results = tmp_path / "results"
    p = ltfm("sweep", sweep, f"data.path={data_dir}", f"run.results_dir={results}", *quick)  # TINY, then QUICK
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "quick-rep"
    r = ltfm("report", sweep, "--results", results, "--out", out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    md = (out / "table3.md").read_text()
    assert md.startswith("# Pipeline check, not a result: sweep `rep`\n"), md[:300]
    first = next(ln for ln in md.splitlines() if ln.startswith("- "))
    assert first.startswith("- Pipeline check (runs tagged `pipeline-check`): its numbers say nothing"), first
    assert first[2:] in r.stdout  # the terminal's headline says it too
    runs = {run.job_type: run for run in read_runs(results)}
    train, report_run = runs["base"], runs["report"]
    assert train.group == "rep-pipeline-check" and "pipeline-check" in train.tags
    assert report_run.run_id == "report-rep-pipeline-check-table3" != RUN_ID
    assert report_run.group == "rep-pipeline-check" and "pipeline-check" in report_run.tags
    assert report_run.name == "rep table3 (pipeline-check)"
    assert "W&B: report run report-rep-pipeline-check-table3, offline in" in r.stdout
    # the page (its title and first heading), the LaTeX table's caption and the study's note say it too
    soup = BeautifulSoup((out / "table3.html").read_text(encoding="utf-8"), "html.parser")
    assert soup.title.string == soup.find("h1").get_text().rstrip("¶") == "Pipeline check, not a result: sweep rep"
    assert r"\caption{Pipeline check, not a result" in (out / "table3.tex").read_text()
    import optuna_dashboard as od  # the dev extra has it
    note = od.get_note(optuna.load_study(study_name="rep", storage=f"sqlite:///{results / 'rep.db'}"))
    assert "# Pipeline check, not a result: sweep `rep`" in note and first in note


def test_a_pipeline_checks_report_says_so_in_every_title_headline_and_tag(tmp_path):
    """The committed reference's export with its runs tagged ``pipeline-check`` (as ``make ablation QUICK=1`` tags
    them), rebuilt as ``ltfm report`` rebuilds a report folder's table (no training, no kernel): table3.md's title
    and first line, the terminal's headline, table3.tex's caption, the HTML page's title, the optuna-dashboard note
    and the W&B report run's name, group and tags all say "pipeline check"."""
    from lightning_tfm.report.publish import notebooks
    from lightning_tfm.report.table3.table import rebuilt_table
    from lightning_tfm.report.views.latex import table_latex
    from lightning_tfm.report.views.render import headline_text, write_table
    from lightning_tfm.sweep import load_sweep

    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    export = ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"
    tree = json.loads((export / "table3-cpu.json").read_text())
    for rec in tree["records"]:
        rec["config"]["wandb.tags"] = ["pipeline-check"]
    out = tmp_path / "quick-table3-cpu"
    (out / "export").mkdir(parents=True)
    (out / "export" / "table3-cpu.json").write_text(json.dumps(tree))
    table = rebuilt_table(sweep, out)
    assert table.pipeline_check is True
    write_table(table, out)
    md = (out / "table3.md").read_text()
    assert md.startswith("# Pipeline check, not a result: sweep `table3-cpu`\n")
    said = "Pipeline check (runs tagged `pipeline-check`): its numbers say nothing about the paper's claims"
    assert next(ln for ln in md.splitlines() if ln.startswith("- ")) == "- " + render.PIPELINE_CHECK_LINE
    assert headline_text(table).startswith(said)
    assert r"\caption{Pipeline check, not a result (runs tagged pipeline-check)" in table_latex(table)
    assert optuna_note.note_text(table).split("\n\n")[1].startswith("# Pipeline check, not a result")
    # the HTML page: its <title> is the report's heading
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/markdown": md.split("\n## ")[0]})])])
    nbformat.write(nb, out / "table3.ipynb")
    notebooks.export_html(out / "table3.ipynb", out / "table3.html", notebooks.heading(out / "table3.md"))
    soup = BeautifulSoup((out / "table3.html").read_text(encoding="utf-8"), "html.parser")
    assert soup.title.string == "Pipeline check, not a result: sweep table3-cpu"
    # the W&B report run (offline, read back from its files): its own id, group, name and tag
    results = tmp_path / "results"
    info = wandb_run.log_wandb_report(sweep, out, results, table, {"mode": "offline", "project": "p", "entity": None},
                                       table.pipeline_check)
    assert info["run_id"] == "report-table3-cpu-pipeline-check-table3"
    (run,) = read_runs(results / wandb_run.WANDB_DIR)
    assert run.name == "table3-cpu table3 (pipeline-check)" and "pipeline-check" in run.tags
    assert run.group == "table3-cpu-pipeline-check" and run.config.get("report.pipeline_check") is True
