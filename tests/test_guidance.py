"""What a command tells its user (issue #44): a training without a progress bar prints a progress line at each
validation (and every 30 s between); every command that makes something ends with ``ltfm: output:`` (where it
went) and ``ltfm: next:`` (the command to run next) on stderr; and ``data.path`` defaults to
``../shared/data/multi30k`` where that folder exists, as the Makefile's DATA does (one default, in
``cli/common.py``)."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from lightning_tfm import cli
from lightning_tfm.cli.common import DEFAULT_DATA
from lightning_tfm.training.config import config
from lightning_tfm.training.config import run_id as run_ids

from conftest import ROOT, SMOKE

SMALL = ["data.max_train_pairs=300", "data.max_dev_pairs=20", "data.max_test_pairs=10"]


def closing(stderr: str) -> tuple[str, str]:
    """The ``ltfm: output:`` and ``ltfm: next:`` lines a command ended with (its last two lines on stderr)."""
    *_, output, then = stderr.strip().splitlines()
    assert output.startswith("ltfm: output: ") and then.startswith("ltfm: next: "), stderr[-2000:]
    return output.removeprefix("ltfm: output: "), then.removeprefix("ltfm: next: ")


def parses(command: str) -> None:
    """A suggested command is one the real parser takes."""
    argv = shlex.split(command)
    assert argv[0] == "ltfm", command
    args, extra = cli.build_parser().parse_known_args(argv[1:])
    assert all("=" in e for e in extra), command


def test_a_training_without_a_terminal_prints_its_progress_and_ends_naming_its_run_folder(smoke_run):
    """The session's smoke training (stderr a pipe): a line at each validation (every 50 of 200 steps), one when
    fitting stops, then where the run is and what to run next."""
    said = (smoke_run.parent.parent / "train.stderr").read_text()
    lines = [ln for ln in said.splitlines() if ln.startswith("ltfm: step ")]
    # each validation's line, in order, with its dev perplexity. A machine of any speed may add lines every 30 s
    # between them (before the first validation without a dev ppl; at a validation's step, just before its own
    # line): their number and place are not asserted on, only their form.
    validations = ["50/200", "100/200", "150/200", "200/200"]
    with_ppl = [ln.split()[2] for ln in lines if "dev ppl" in ln]
    assert list(dict.fromkeys(s for s in with_ppl if s in validations)) == validations, said[-3000:]
    assert lines[-1].split()[2] == "200/200" and "dev ppl" in lines[-1], said[-3000:]
    assert all(re.search(r"^ltfm: step \d+/200 \(\d+%\)(, loss [\d.]+)?(, dev ppl [\d.]+)?; [\d:]+ so far, about "
                         r"[\d:]+ left$", ln) for ln in lines), lines
    assert "ltfm: training stopped at step 200" in said
    output, then = closing(said)
    assert output.startswith(f"{smoke_run}/ ") and "summary.json" in output
    first, second = then.split("   or   ")
    assert first == f"ltfm runs {shlex.quote(str(smoke_run.parent))}"
    assert second.endswith(f"| ltfm translate {shlex.quote(str(smoke_run))}")
    parses(first)
    parses(second.split("| ", 1)[1])


def test_a_sweep_ends_naming_its_results_and_the_status_and_report_commands_that_read_them(swept, ltfm_here):
    output, then = closing((swept["tmp"] / "sweep.stderr").read_text())
    results = swept["results"]
    assert output.startswith(f"{results}/ ") and f"{results}/rep.db" in output
    status, report = then.split("   then   ")
    assert report == f"ltfm report {swept['sweep']} --results {results}"
    parses(report)
    p = ltfm_here(*shlex.split(status)[1:])  # as suggested: it finds the study
    assert p.returncode == 0 and "base" in p.stdout, p.stderr


def test_prepare_ends_naming_the_corpus_and_the_training_that_maps_it(ltfm_here, tmp_path, data_dir):
    p = ltfm_here("prepare", SMOKE, f"data.path={data_dir}", f"run.results_dir={tmp_path / 'results'}", *SMALL)
    assert p.returncode == 0, p.stderr
    output, then = closing(p.stderr)
    assert Path(output).is_dir() and Path(output).parent == tmp_path / "data-cache"
    assert then.startswith(f"ltfm train {SMOKE} ")
    parses(then.split(" (")[0])


def test_average_ends_naming_its_checkpoint_and_the_evaluation_of_it(ltfm_here, tmp_path, smoke_run):
    run = tmp_path / smoke_run.name
    shutil.copytree(smoke_run, run, ignore=shutil.ignore_patterns("wandb"))
    p = ltfm_here("average", run, "--last", "2")
    assert p.returncode == 0, p.stderr
    output, then = closing(p.stderr)
    assert output == str(run / "checkpoints" / "average.ckpt") and Path(output).is_file()
    assert then == f"ltfm evaluate {run} --checkpoint average"
    parses(then)


def _beside_shared(tmp_path: Path, data_dir: Path) -> Path:
    """A checkout with ``../shared/data/multi30k`` beside it (the suite's data), as on the team's machines."""
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "multi30k").symlink_to(data_dir)
    (tmp_path / "checkout").mkdir()
    return tmp_path / "checkout"


def test_data_path_defaults_to_the_shared_multi30k_where_it_exists(ltfm_here, tmp_path, data_dir, monkeypatch):
    """Where ``../shared/data/multi30k`` exists, an experiment that names no data reads it: the run id is that of
    ``data.path=../shared/data/multi30k``; a sweep's rows too. Elsewhere: the one-line error, as before."""
    p = ltfm_here("config", SMOKE)  # the session's stand-in has no ../shared beside it
    assert p.returncode == 2 and "data.path is not set" in p.stderr, p.stderr
    monkeypatch.chdir(_beside_shared(tmp_path, data_dir))
    p = ltfm_here("config", SMOKE)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == f"ltfm: data.path={DEFAULT_DATA} (no data.path given; that folder exists)"
    explicit = run_ids.run_id(config.load_config(SMOKE, [f"data.path={DEFAULT_DATA}"]))
    assert p.stdout.startswith(f"# run id: {explicit} ")
    results = f"run.results_dir={tmp_path / 'results'}"
    sweep = ROOT / "sweeps" / "table2-smoke.yaml"
    found = ltfm_here("sweep", sweep, "--dry-run", "--json", results)
    given = ltfm_here("sweep", sweep, "--dry-run", "--json", results, f"data.path={DEFAULT_DATA}")
    assert found.returncode == given.returncode == 0 and found.stdout == given.stdout, found.stderr
    assert '"run_id": "table2-smoke-' in found.stdout


def test_the_makefile_reads_its_data_default_from_the_code():
    p = subprocess.run(["make", "-pn", "setup"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    values = [ln.split(" := ", 1)[1] for ln in p.stdout.splitlines() if ln.startswith("DEFAULT_DATA := ")]
    assert values == [DEFAULT_DATA], values


def test_a_finished_training_says_what_it_measured_before_where_it_went(smoke_run):
    """The smoke training's last lines give the numbers the README promises (dev PPL, dev and test BLEU, as in
    summary.json), then where the run is."""
    import json

    said = (smoke_run.parent.parent / "train.stderr").read_text().splitlines()
    summary = json.loads((smoke_run / "summary.json").read_text())
    (line,) = [ln for ln in said if ln.startswith("ltfm: finished at step ")]
    assert line == (f"ltfm: finished at step {summary['steps']}: dev PPL {summary['dev_ppl']:.2f}, dev BLEU "
                    f"{summary['dev_bleu']:.2f}, test BLEU {summary['test_bleu']:.2f}")
    assert said.index(line) < [i for i, ln in enumerate(said) if ln.startswith("ltfm: output: ")][-1]


def test_make_setup_says_each_step_before_it_runs(tmp_path):
    """#52, 20: ``make setup`` was silent for minutes (pip -q): each step is announced before it starts, the torch
    download by name, version and time, and pip shows that download's progress (not -q)."""
    p = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", "PYTHON=false"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    said = [i for i, ln in enumerate(lines) if ln.startswith('echo "setup')]
    steps = [next(i for i, ln in enumerate(lines) if part in ln)
             for part in (" -m venv ", "pip install torch==2.13.0", "pip install -q -e '.[dev]'")]
    assert [lines[i].split()[1] for i in said] == ['"setup', '"setup', '"setup', '"setup:'], lines
    assert [lines[i].split()[2] for i in said[:3]] == ["1/3:", "2/3:", "3/3:"], lines
    assert said[0] < steps[0] < said[1] < steps[1] < said[2] < steps[2] < said[3], lines
    assert "installing torch 2.13.0" in lines[said[1]] and "min" in lines[said[1]], lines
    assert "setup: done" in lines[said[3]] and "bin/activate" in lines[said[3]], lines


#: what Lightning said in every run's log that is no news to a user (#64 item 19): its cloud services' tips and the
#: deprecation torch 2.13 raises inside Lightning's own _pytree.py
NOISE = ("💡 Tip:", "litlogger", "litmodels", "LeafSpec")


def test_a_training_log_holds_no_lightning_tip_or_deprecation(smoke_run):
    said = (smoke_run.parent.parent / "train.stderr").read_text()
    assert "ltfm: training stopped at step 200" in said  # the log is the run's (a control)
    assert [ln for ln in said.splitlines() if any(n in ln for n in NOISE)] == []


def test_every_trial_log_of_a_sweep_holds_no_lightning_tip_or_deprecation(swept):
    logs = sorted((swept["results"] / "sweep-logs").rglob("*.log"))
    assert logs and any("Trainer.fit" in log.read_text() for log in logs), logs
    noisy = {log.name: ln for log in logs for ln in log.read_text().splitlines() if any(n in ln for n in NOISE)}
    assert noisy == {}
