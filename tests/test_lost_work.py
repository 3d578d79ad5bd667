"""No command writes over what it reads or what a run owns (issue #64, items 1, 2, 3, 11, 13, 16): every output
option of every command (found in the parser, so a new one is tested too), pointed at each of its inputs and at
each file of a run and of an export, spelled relative, with ``..`` and through a link, changes nothing and is one
line, exit 2; and the report's messages that name the way out.

The run folder is laid out as ``ltfm train`` lays it out, with a tiny random model (tests/test_run_reuse.py's
``tiny_run``): no training. Every refusal comes before any work (no notebook, no decoding).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from test_output_paths import one_line
from test_run_reuse import tiny_run, vocabularies  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reports" / "reference"
SWEEP = "table3-cpu"


def state(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder`` (links not followed): its content (a file's hash, a link's target) and a file's
    modification time (a folder's changes when a writability probe makes and removes a file in it: its entries are
    compared instead)."""
    out = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(top, name)
            st = p.lstat()
            what = os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest() \
                if p.is_file() else "dir"
            out[str(p.relative_to(folder))] = (what, None if what == "dir" else st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_dir, vocabularies):  # noqa: F811
    """A folder with a run (every file training leaves: config, vocabulary, last, best and a step checkpoint, a
    summary, dev hypotheses, a metrics log), sources, a sweep file and its experiment, and a report folder holding an
    export (a copy of the committed reference's)."""
    tmp = tmp_path_factory.mktemp("lost-work")
    run = tiny_run(tmp / "results" / "tiny", data_dir, vocabularies["de"])
    ckpts = run / "checkpoints"
    os.link(ckpts / "last.ckpt", ckpts / "step=000010.ckpt")  # one step's names are links to one file, as training's
    shutil.copy(ckpts / "last.ckpt", ckpts / "best.ckpt")
    (run / "summary.json").write_text(json.dumps({"run_id": "tiny", "status": "completed", "steps": 10}) + "\n")
    (run / "hyps").mkdir()
    (run / "hyps" / "dev.de.txt").write_text("Ein Mann.\n")
    (run / "logs" / "version_0").mkdir(parents=True)
    (run / "logs" / "version_0" / "metrics.csv").write_text("step,dev/loss\n10,5.0\n")
    (tmp / "in").mkdir()
    (tmp / "in" / "val.en").write_text("A man rides a bike.\nTwo dogs play.\n")
    (tmp / "in" / "val.de").write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen.\n")
    for folder, name in (("sweeps", f"{SWEEP}.yaml"), ("experiments", "table3-cpu-base.yaml")):
        (tmp / folder).mkdir()
        shutil.copy(ROOT / folder / name, tmp / folder / name)
    report = tmp / "report"
    shutil.copytree(REFERENCE / "table3-cpu-2026-11-25" / "export", report / "export")
    (report / ".ltfm-report").write_text("made by `ltfm report`\n")
    (tmp / "links").mkdir()
    return tmp


RUN_FILES = ["config.yaml", "summary.json", "tokenizer.json", "checkpoints/last.ckpt", "checkpoints/best.ckpt",
             "checkpoints/step=000010.ckpt", "hyps/dev.de.txt", "logs/version_0/metrics.csv"]
#: what every output option is pointed at: each file of the run, the export
OWNED = [f"results/tiny/{f}" for f in RUN_FILES] + [f"report/export/{SWEEP}.json"]
REPORT_INPUTS = [f"sweeps/{SWEEP}.yaml", "report/export", "report", "sweeps"]  # an input, or a folder holding one
#: and each command's inputs (a report, which replaces its folder whole: also the folders holding them, and the run's
#: folders; a bench writes its files into a folder: the run's logs)
INPUTS = {"evaluate": ["in/val.en", "in/val.de"], "average": [], "backtest": [f"sweeps/{SWEEP}.yaml"],
          "report": REPORT_INPUTS + ["results/tiny", "results/tiny/checkpoints"], "compare": REPORT_INPUTS,
          "bench": ["results/tiny/logs"]}


def command_line(command: str, tmp: Path, out: str) -> list:
    """The command line of each output option (each with --out ``out``)."""
    run, sweep, export = tmp / "results" / "tiny", tmp / "sweeps" / f"{SWEEP}.yaml", tmp / "report" / "export"
    return {"evaluate": ["evaluate", run, "--src", tmp / "in" / "val.en", "--ref", tmp / "in" / "val.de",
                         "decode.max_len_b=3", "--out", out],
            "average": ["average", run, "--last", "1", "--out", out],
            "backtest": ["report", sweep, "--from-export", export, "--backtest", "0.5", "--json", "--out", out],
            "report": ["report", sweep, "--from-export", export, "--out", out],
            "compare": ["report", sweep, "--from-export", export, "--against", sweep, "--against-export", export,
                        "--out", out],
            "bench": ["bench", "--layers", "--lengths", "8", "--d-model", "8", "--out", out]}[command]


def test_every_output_option_of_every_command_is_covered_here():
    """Every option of a command that names where it writes (dest ``out``) is one of the command lines above, so an
    output option added later is pointed at the run's files too."""
    from lightning_tfm import cli

    parser = cli.build_parser()
    writing = {name for name, sub in parser.commands.items() for a in sub._actions if a.dest == "out"}
    assert writing == {"evaluate", "average", "report", "bench"}, writing


def spelled(tmp: Path, target: str, how: str) -> str:
    """``target`` (relative to ``tmp``, where the command runs) spelled ``how``: relative, with ``..``, or a link."""
    if how == "relative":
        return target
    if how == "dotdot":
        return f"in/../{target}"
    link = tmp / "links" / target.replace("/", "_")
    if not link.is_symlink():
        link.symlink_to(tmp / target)
    return str(link.relative_to(tmp))


@pytest.mark.parametrize("how", ["relative", "dotdot", "link"])
@pytest.mark.parametrize("command", INPUTS)
def test_no_output_option_writes_over_an_input_or_a_runs_file(command, how, world, ltfm_here):
    for target in OWNED + INPUTS[command]:
        out = spelled(world, target, how)
        before = state(world)
        p = ltfm_here(*command_line(command, world, out), cwd=world)
        line = one_line(p, "--out", "give")
        assert "Traceback" not in p.stdout and not p.stdout.strip(), (target, p.stdout[-2000:])
        assert state(world) == before, (command, how, target, line)


# ------------------------------------------------------------------------------------------------------------
# the examples, as typed
# ------------------------------------------------------------------------------------------------------------
def test_evaluate_never_writes_over_its_source_nor_the_runs_weights(world, ltfm_here):
    """Item 1: --out the source file (main: the hypotheses replaced it), --out the run's last.ckpt (main: 15 KB of
    text, every later evaluate, translate and resume an UnpicklingError)."""
    run = world / "results" / "tiny"
    before = state(world)
    base = ["evaluate", run, "--src", "in/val.en", "--ref", "in/val.de", "decode.max_len_b=3"]
    one_line(ltfm_here(*base, "--out", "in/val.en", cwd=world), "--out in/val.en is --src", "give another path")
    one_line(ltfm_here(*base, "--out", run / "checkpoints" / "last.ckpt", cwd=world), "run tiny's resume point")
    assert state(world) == before
    p = ltfm_here("translate", run, input="A man.\n", cwd=world)  # the run's weights still load
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 1, p.stderr[-2000:]


def test_a_backtest_never_writes_over_the_export_it_reads(world, ltfm_here):
    """Item 2: --out DIR/<sweep>.json with --from-export DIR (main: the back-test's JSON replaced the export)."""
    export = world / "report" / "export"
    before = state(world)
    p = ltfm_here("report", world / "sweeps" / f"{SWEEP}.yaml", "--from-export", "report/export", "--backtest", "0.5",
                  "--json", "--out", f"report/export/{SWEEP}.json", cwd=world)
    one_line(p, f"--out report/export/{SWEEP}.json is the export --from-export names", "which this command reads")
    assert state(world) == before and json.loads((export / f"{SWEEP}.json").read_text())["records"]


@pytest.mark.parametrize("name", ["last.ckpt", "step=000010.ckpt"])
def test_average_never_writes_over_the_resume_point(name, world, ltfm_here):
    """Item 3: --out checkpoints/last.ckpt or step=N.ckpt (main: an average without optimizer state became the
    resume point; the next ltfm train ended in a KeyError)."""
    run = world / "results" / "tiny"
    before = state(world)
    one_line(ltfm_here("average", run, "--last", "1", "--out", run / "checkpoints" / name), "run tiny's",
             f"checkpoints/{name}", "give another path")
    assert state(world) == before


def test_average_still_writes_its_own_file_and_other_paths(world, tmp_path, ltfm_here):
    """What the check lets through: average's own checkpoints/average.ckpt (again: replaced), a path elsewhere."""
    run = tmp_path / "tiny"
    shutil.copytree(world / "results" / "tiny", run)
    for _ in range(2):
        p = ltfm_here("average", run, "--last", "1")
        assert p.returncode == 0 and (run / "checkpoints" / "average.ckpt").is_file(), p.stderr[-2000:]
    p = ltfm_here("average", run, "--last", "1", "--out", tmp_path / "elsewhere.ckpt")
    assert p.returncode == 0 and (tmp_path / "elsewhere.ckpt").is_file(), p.stderr[-2000:]
    # another run's averaged checkpoint is that run's
    one_line(ltfm_here("average", world / "results" / "tiny", "--last", "1", "--out",
                       run / "checkpoints" / "average.ckpt"), "run tiny's averaged checkpoint")


def test_a_backtest_budget_without_a_backtest_is_refused(world, ltfm_here):
    """Item 11: --backtest-budget alone (main: accepted, and the full-budget report built)."""
    before = state(world)
    one_line(ltfm_here("report", world / "sweeps" / f"{SWEEP}.yaml", "--from-export", "report/export",
                       "--backtest-budget", "300", "--out", "elsewhere", cwd=world),
             "--backtest-budget", "give --backtest too, or drop --backtest-budget")
    assert state(world) == before


@pytest.mark.parametrize("against", [False, True])
def test_a_report_into_the_root_folder_is_one_line(against, world, ltfm_here):
    """Item 13: --out / (main: a traceback, PosixPath('/') has an empty name)."""
    sweep = world / "sweeps" / f"{SWEEP}.yaml"
    extra = ["--against", sweep, "--against-export", "report/export"] if against else []
    one_line(ltfm_here("report", sweep, "--from-export", "report/export", *extra, "--out", "/", cwd=world),
             "--out / is the root folder", "give a folder of its own")


# ------------------------------------------------------------------------------------------------------------
# 16. the README's report commands on a fresh clone, and what a page built from exports says it read
# ------------------------------------------------------------------------------------------------------------
def test_a_missing_export_or_results_names_the_committed_exports(ltfm_here):
    """The README's two report commands as main had them, on a checkout with no report built and no runs of the
    continued sweep: each error names the committed export that works."""
    line = one_line(ltfm_here("report", "sweeps/table3-cpu.yaml", "--from-export", "reports/build/table3-cpu/export"),
                    "no export of sweep 'table3-cpu' there")
    assert "reports/reference/table3-cpu/export" in line, line
    line = one_line(ltfm_here("report", "sweeps/table3-cpu-continued.yaml", "--against", "sweeps/table3-cpu.yaml",
                              "--against-export", "reports/reference/table3-cpu/export"))
    assert "--from-export reports/reference/table3-cpu-continued/export" in line, line


def test_the_readmes_report_commands_read_what_a_fresh_clone_has():
    """The README's --from-export and --against examples read committed exports (they ran as pasted only after a
    report of one's own)."""
    import shlex

    text = (ROOT / "README.md").read_text()
    # each command to the end of its line (its continuation lines joined), its comment left out
    commands = [shlex.split(c.replace("\\\n", " ").split("\n")[0].split("#")[0])
                for c in text.split("\nltfm report ")[1:]]
    exports = [c[c.index(o) + 1] for c in commands for o in ("--from-export", "--against-export") if o in c]
    assert exports and all((ROOT / e).is_dir() and e.startswith("reports/reference/") for e in exports), exports
    against = next(c for c in commands if "--against" in c)
    assert "--from-export" in against, against


def test_a_page_built_from_exports_names_the_exports_it_read():
    """The comparison (and Table 3) page built from exports says which export each side was read from, not only
    the results folder the export was once written from."""
    from lightning_tfm import report as rd

    a = rd.load_report_data(ROOT / "sweeps" / "table3-cpu-continued.yaml",
                            export_dir=REFERENCE / "table3-cpu-continued" / "export")
    b = rd.load_report_data(ROOT / "sweeps" / "table3-cpu.yaml",
                            export_dir=REFERENCE / "table3-cpu-2026-11-25" / "export")
    text = rd.comparison_markdown(rd.compare_tables(rd.build_table(a, bootstrap=False),
                                                    rd.build_table(b, bootstrap=False)))
    line = next(ln for ln in text.splitlines() if ln.startswith("A: "))
    for export in ("table3-cpu-continued/export/table3-cpu-continued.json",
                   "table3-cpu-2026-11-25/export/table3-cpu.json"):
        assert f"export {export}, which a report wrote from results folder" in line, line
