"""The README works as pasted: its first screen's commands run from a clean copy of the tree, and every ``ltfm``
example in it (and in ``reports/README.md``) is parsed by the real parser, so a renamed option breaks a test.

The clean copy is what ``git clone`` gives plus the files not yet committed: every file git lists (tracked, and
new ones it does not ignore) copied into a tmp folder, with ``../shared/data/multi30k`` beside it (a symlink to
the suite's data). ``make ablation`` and ``make test`` are checked with ``make -n`` there (an hour and the whole
suite otherwise). The environment ``make setup`` would build is built without the network: a venv of the copy's
own whose path reaches the suite's installed packages (torch and the rest), into which pip installs the copy
editable, as ``make setup`` does; the README's environment block is then pasted into bash, and its ``ltfm`` and
``import lightning_tfm`` must be the copy's, never the checkout's.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from lightning_tfm import cli

from conftest import ROOT

README = ROOT / "README.md"
# the README and the pages it sends a newcomer to for the rest (the guide keeps the README short)
DOCS = (README, *(ROOT / "reports" / f"{page}.md" for page in ("README", "gpu", "performance", "soak", "testing")))
FIRST_SCREEN = 40  # lines after the title: what a reader sees before scrolling
CHEAP = ("--help", "--dry-run", "--keys")  # options that read no data and train nothing
# what a clean shell keeps of the suite's environment: no MAKEFLAGS (`make test QUICK=1` would pass QUICK on to
# the copy's make), no VENV/SWEEP/... (the Makefile's ?= variables), no VIRTUAL_ENV or PYTHONPATH
KEEP_ENV = ("HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TERM")


def _blocks(text: str) -> list[list[str]]:
    """The fenced ```bash blocks of a markdown text, each as its lines."""
    return [m.group(1).splitlines() for m in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S)]


def _commands(lines: list[str]) -> list[list[str]]:
    """A shell block's simple commands as argv lists: continuations joined, comments dropped, pipelines and
    ``&&``/``;`` lists split into their commands."""
    out = []
    for line in "\n".join(lines).replace("\\\n", " ").splitlines():
        argv: list[str] = []
        for word in shlex.split(line, comments=True) + ["|"]:
            if word in ("|", "&&", ";", "||"):
                out.extend([argv] if argv else [])
                argv = []
            else:
                argv.append(word)
    return out


def _first_screen() -> str:
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# "), "the README starts with its title"
    return "\n".join(lines[1:1 + FIRST_SCREEN]) + "\n"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _examples() -> list[tuple[str, list[str]]]:
    """Every ``ltfm`` example of the docs: the commands of their bash blocks, and the inline code spans that
    are a whole command (synopses with ``[...]`` or ``A|B`` are not)."""
    found = []
    for doc in DOCS:
        text, name = doc.read_text(), doc.relative_to(ROOT)
        for block in _blocks(text):
            found += [(f"{name}: {shlex.join(a)}", a[1:]) for a in _commands(block) if a[0] == "ltfm"]
        for span in re.findall(r"`(ltfm [^`]+)`", text):
            if not re.search(r"[\[|]", span):
                found.append((f"{name}: {span}", shlex.split(span)[1:]))
    return sorted(dict(found).items())


def _clean_env() -> dict:
    suite_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != suite_bin]
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.update(PATH=os.pathsep.join(path), WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1")
    return env


def _bash(script: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def _clean_copy(top: Path, data_dir: Path) -> Path:
    """The working tree's files as a clean clone would have them, in ``top``, with ``../shared/data/multi30k``
    beside them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the clean copy is made of the files git lists")
    tree = top / "lightning_tfm"
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the working tree is not in the copy
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)
    (top / "shared" / "data").mkdir(parents=True)
    (top / "shared" / "data" / "multi30k").symlink_to(data_dir)
    return tree


@pytest.fixture(scope="module")
def copy(tmp_path_factory, data_dir) -> Path:
    """A clean copy with no environment yet, as a clone is before its first ``make``."""
    return _clean_copy(tmp_path_factory.mktemp("clone"), data_dir)


@pytest.fixture(scope="module")
def env_copy(tmp_path_factory, data_dir) -> Path:
    """A clean copy with the ``.venv`` that ``make setup`` makes there: the copy's package installed editable,
    its dependencies those of the suite's environment (reached by a ``.pth`` file: no download)."""
    copy = _clean_copy(tmp_path_factory.mktemp("clone-env"), data_dir)
    venv = copy / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_suite_packages.pth").write_text("".join(f"{p}\n" for p in paths))
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check",
                        "-e", str(copy)], capture_output=True, text=True, env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    (venv / ".installed").touch()  # what `make setup` leaves: make sees the environment as up to date
    return copy


def test_the_first_screen_has_the_commands_the_report_and_its_picture():
    screen = _first_screen()
    commands = [shlex.join(a) for block in _blocks(screen) for a in _commands(block)]
    for command in ("make ablation", "make test", "make ablation QUICK=1", "source .venv/bin/activate"):
        assert command in commands, f"the README's first {FIRST_SCREEN} lines have no ```bash block with {command}"
    # the few-minute check leads, before the 43-88 minute run (#52, 20: a new user ran the long one first)
    assert commands[0] == "make ablation QUICK=1" and commands.index("make ablation") > 0, commands
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", screen)
    assert pictures, "the first screen shows a picture of the report"
    committed = subprocess.run(["git", "ls-files", *pictures], cwd=ROOT, capture_output=True, text=True).stdout
    for picture in pictures:
        assert (ROOT / picture).is_file() and picture in committed.split(), f"{picture} is not a committed file"


def test_first_screen_make_commands_are_the_makefiles_and_say_where_the_report_lands(copy):
    """Each ``make`` line of the first screen, dry-run in the clean copy: a target the Makefile defines, setting
    up ``.venv`` first as the README says; and the folders the README names are where its report goes."""
    screen = _first_screen()
    makes = [a for block in _blocks(screen) for a in _commands(block) if a[0] == "make"]
    assert makes
    for argv in makes + [["make", "setup"]]:
        p = _bash(shlex.join(["make", "-n", *argv[1:]]), copy)
        assert p.returncode == 0, f"{shlex.join(argv)}: {p.stderr}"
        assert "-m venv" in p.stdout and " .venv" in p.stdout and "pip install -q -e '.[dev]'" in p.stdout, p.stdout
        report = [line for line in p.stdout.splitlines() if line.startswith(".venv/bin/ltfm report ")]
        if argv[1] == "ablation":
            (line,) = report
            sweep = shlex.split(line)[2]
            out = re.search(r"--out (\S+)", line)
            name = yaml.safe_load((copy / sweep).read_text())["name"]
            folder = out.group(1) if out else f"reports/build/{name}"  # `ltfm report`'s default --out
            assert f"`{folder}/" in screen, f"the first screen does not say that {shlex.join(argv)} writes {folder}/"
            if not out:
                assert f"`{folder}/table3.html`" in screen
        elif argv[1] == "setup":
            assert "ltfm" not in p.stdout  # "make setup does only that"


def test_first_screen_environment_works_as_pasted_in_a_clean_copy(env_copy):
    """The first screen's shell lines other than ``make``, pasted into bash in the copy after ``make setup``:
    ``ltfm`` answers, and it is the copy's ``ltfm`` running the copy's package."""
    screen_blocks = [b for b in _blocks(_first_screen()) if any(a[0] != "make" for a in _commands(b))]
    assert screen_blocks, "the first screen says how to use the environment"
    pasted = "\n".join(line for block in screen_blocks for line in block)
    p = _bash(f"set -e\n{pasted}\necho @@@\ncommand -v ltfm\n"
              "python -c 'import lightning_tfm; print(lightning_tfm.__file__)'", env_copy, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out, where = p.stdout.split("@@@\n")
    assert "start with:" in out  # `ltfm --help`
    ltfm_path, package = where.split()
    assert Path(ltfm_path) == env_copy / ".venv" / "bin" / "ltfm"
    assert Path(package) == env_copy / "lightning_tfm" / "__init__.py"


def test_run_one_model_examples_that_train_nothing_work_as_pasted(env_copy):
    """The commands of "Run one model" that read no data and train nothing (``ltfm config``, ``ltfm runs`` on a
    results folder with no run yet, anything with --help/--dry-run/--keys), as pasted, in the activated copy."""
    cheap = [a for block in _blocks(_section("Run one model")) for a in _commands(block)
             if a[0] == "ltfm" and (a[1] in ("config", "runs") or set(a) & set(CHEAP))
             and not any("RUN" in x for x in a)]  # results/RUN: a placeholder for a run of the reader's
    assert len(cheap) >= 3, cheap
    (env_copy / "results").mkdir(exist_ok=True)  # the folder `make ablation` fills; empty here
    for argv in cheap:
        p = _bash(f"source .venv/bin/activate && {shlex.join(argv)}", env_copy, timeout=120)
        assert p.returncode == 0 and "Traceback" not in p.stderr, f"{shlex.join(argv)}: {p.stderr[-2000:]}"
        assert (p.stdout + p.stderr).strip(), f"{shlex.join(argv)} printed nothing"
        if argv[1:3] == ["config", "--keys"]:
            assert all(line.startswith(argv[3]) for line in p.stdout.splitlines()), p.stdout[:2000]
        elif argv[1] == "config":
            assert p.stdout.startswith("# run id: "), p.stdout[:500]


@pytest.mark.parametrize("example, argv", _examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_ltfm_example_is_accepted_by_the_parser(example, argv, monkeypatch, capsys):
    """The real parser and ``cli.main``'s handling of overrides, the handlers replaced by a no-op."""
    names = {c.name for c in cli.COMMANDS}
    if len(argv) == 1 and not argv[0].startswith("-"):  # a mention of a command (`ltfm runs`): the command exists
        assert argv[0] in names, example
        return
    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, handler=lambda args: 0)
                                               for c in cli.COMMANDS))
    try:
        code = cli.main(argv)
    except SystemExit as e:  # --help
        code = e.code
    assert code == 0, f"{example}: {capsys.readouterr().err.strip()}"


# ----------------------------------------------------------------------------------------------------------------
# Every fenced block of the docs, as pasted
# ----------------------------------------------------------------------------------------------------------------
#: Folders a command writes (conftest's OUTPUTS): a command that reads one needs an earlier step its block names.
WRITTEN = ("results", "results-quick", "reports/build")
#: What writes them, one of which the text from the previous block to the end of this one names.
WRITERS = ("make ablation", "make reference", "ltfm sweep")


def _doc_blocks() -> list[tuple[str, str, list[str]]]:
    """Every ```bash block of the docs: (an id, the text before it since the previous block or heading, the
    block's lines)."""
    out = []
    for doc in DOCS:
        text, end = doc.read_text(), 0
        for i, m in enumerate(re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S)):
            start = max([end] + [h.start() for h in re.finditer(r"^#+ ", text[:m.start()], re.M)])
            out.append((f"{doc.relative_to(ROOT)}#{i}", text[start:m.start()], m.group(1).splitlines()))
            end = m.end()
    return out


@pytest.mark.parametrize("name, before, lines", _doc_blocks(), ids=lambda v: v if isinstance(v, str) and "#" in v
                         and "\n" not in v else "")
def test_every_bash_block_is_valid_shell(name, before, lines):
    p = subprocess.run(["bash", "-n"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    assert p.returncode == 0, f"{name}: {p.stderr}"


def test_every_make_line_of_the_docs_is_a_target_the_makefile_runs(copy):
    """``make -n`` of each make line of every block, in the clean copy (the first screen's are checked further
    above): a target it defines, and a dry run that changes nothing (``make -n reference`` once ran its recipe, which
    replaces ``reports/reference/<sweep>/``)."""
    makes = {shlex.join(a) for _, _, lines in _doc_blocks() for a in _commands(lines) if a[0] == "make"}
    assert len(makes) >= 4, makes
    tree = lambda: sorted((str(p), p.lstat().st_mtime_ns) for p in copy.rglob("*") if ".venv" not in p.parts)  # noqa: E731
    before = tree()
    for line in sorted(makes):
        p = _bash(shlex.join(["make", "-n", *shlex.split(line)[1:]]), copy)
        assert p.returncode == 0 and not p.stderr, f"{line}: {p.stderr[-2000:]}"
        assert tree() == before, f"make -n {shlex.split(line)[1:]} changed the copy"


def _placeholder(value: str) -> bool:
    return any(part.isupper() for part in re.split(r"[/.=]", value) if part)  # RUN, DIR, URL, ENTITY/PROJECT


def test_every_ltfm_command_that_reads_files_works_as_pasted_or_its_block_says_what_comes_first(copy, monkeypatch,
                                                                                                 capfd):
    """In the clean copy, with ``../shared/data/multi30k`` beside it and nothing written yet: each ``ltfm train``
    resolves (``ltfm config`` with the same words: the experiment, the keys and the data found), each ``ltfm sweep``
    dry-runs, and each ``ltfm report`` loads its sweep file and reads folders that exist, or its block says which
    command writes them first (``results/``: ``make ablation``, ...)."""
    from lightning_tfm.sweep import load_sweep

    monkeypatch.chdir(copy)
    checked = []
    for name, before, lines in _doc_blocks():
        said = before + "\n".join(lines)
        for argv in _commands(lines):
            if argv[0] != "ltfm" or len(argv) < 3 or any(_placeholder(w) for w in argv[2:3]):
                continue
            command, words = argv[1], argv[2:]
            if command in ("train", "sweep") and not {"--status", "--keys"} & set(words):
                run = ["config", *words] if command == "train" else ["sweep", *words, "--dry-run", "--json"]
                code = cli.main([w for w in run if w not in ("--workers", "auto", "--settle")])
                assert code == 0, f"{name}: {shlex.join(argv)}: {capfd.readouterr().err.strip()}"
                checked.append(argv)
            elif command == "report":
                args, _ = cli.build_parser().parse_known_args(argv[1:])
                load_sweep(args.sweep_file)
                reads = [getattr(args, k) for k in ("results", "from_export", "against", "against_export",
                                                    "against_results", "backtest_to") if getattr(args, k)]
                if not (args.results or args.from_export or args.from_wandb or args.storage):
                    reads.append("results")  # the default: the sweep's results folder
                for folder in reads:
                    if _placeholder(folder):
                        continue
                    if folder.split("/")[0] in WRITTEN or folder.startswith("reports/build"):
                        assert any(w in said for w in WRITERS), \
                            f"{name}: {shlex.join(argv)} reads {folder}/, which no earlier step in its block writes"
                    else:
                        assert (copy / folder).exists(), f"{name}: {shlex.join(argv)}: {folder} does not exist"
                checked.append(argv)
    assert sum(a[1] == "train" for a in checked) >= 3 and sum(a[1] == "sweep" for a in checked) >= 4, checked
    assert sum(a[1] == "report" for a in checked) >= 6, checked


# a measured time: "3–8 min", "~1 min", "12 min", "in 8 minutes", "a minute or two", "an hour" (a setting such as
# "every 30 s" is no measured time)
_TIME = re.compile(r"\b(?:\d+(?:[–-]\d+)?|a|an) ?(?:min|minutes?|hours?|h)\b", re.I)


def test_every_time_the_readme_gives_points_to_where_it_was_measured():
    """#64 item 18: the smoke run's "a minute or two" was 20 minutes at load 6, and `make test` gave no time. Each
    measured time in the README says where it was measured (reports/), on its line or in its paragraph or block,
    and the command the README times is there; the smoke experiment trains on one thread (reports/timing.md)."""
    text = README.read_text()
    chunks = re.split(r"\n\s*\n", text)
    for chunk in chunks:
        for line in chunk.splitlines():
            if _TIME.search(line):
                assert "reports/" in chunk, f"a time without where it was measured: {line}"
    timing = (ROOT / "reports" / "timing.md").read_text()
    for command in ("make test", "ltfm train experiments/multi30k-smoke.yaml", "make ablation QUICK=1"):
        assert f"`{command}" in timing, command
    smoke = yaml.safe_load((ROOT / "experiments" / "multi30k-smoke.yaml").read_text())
    assert smoke["train"]["threads"] == 1


def test_the_reference_pages_agreement_with_the_paper_is_the_committed_pages():
    """#64 item 19: reports/reference/README.md said the rows that hold agree with the paper on "none of the 4"
    where its table3.md says 3/8. Each section's count of rows that hold and agree is its page's."""
    reference = ROOT / "reports" / "reference"
    text = (reference / "README.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    checked = 0
    for section in sections:
        name = section.split(":", 1)[0].split(",", 1)[0].strip()
        page = reference / name / "table3.md"
        flat = section.replace("**", "").replace("\n  ", " ")
        claims = re.findall(r"(\d+|none) of the (\d+)(?: rows that hold| of them that have one)", flat)
        if not page.is_file() or not claims:
            continue
        agree, held = re.search(r"rows that hold: dev PPL (\d+)/(\d+)", page.read_text()).groups()
        for n, m in claims:
            assert (n.replace("none", "0"), m) == (agree, held), f"{name}: {n} of {m} against the page's {agree}/{held}"
            checked += 1
    assert checked >= 2


def test_the_readme_syncs_a_sweeps_wandb_runs_in_one_command(data_dir, ltfm_here):
    """#64 item 19: one ``wandb sync`` for a sweep's offline runs: each trial's (in its run folder, named after the
    sweep) and the report run's (``wandb-report/`` of the results folder)."""
    import json
    from fnmatch import fnmatch

    from lightning_tfm.report.publish.wandb_run import WANDB_DIR

    (line,) = [m.group(1) for m in re.finditer(r"`(wandb sync [^`]*wandb-report[^`]*)`", README.read_text()
                                                .replace("\n  ", " "))]
    trials, report = shlex.split(line)[2:]
    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", "--dry-run", "--json", f"data.path={data_dir}")
    run_ids = [r["run_id"] for r in json.loads(p.stdout)]
    assert run_ids and all(fnmatch(f"results/{rid}/wandb/offline-run-20261202_1-x", trials) for rid in run_ids)
    assert fnmatch(f"results/{WANDB_DIR}/wandb/offline-run-20261202_1-x", report)
    assert not fnmatch("results/other-base-s1-0123abcd/wandb/offline-run-x", trials)  # another sweep's


def test_every_link_of_the_docs_points_to_a_file_a_clone_has():
    """Every relative link of the markdown a reader opens on the repository's page (README.md, reports/**/*.md, the
    committed pages among them) points to a file or folder git tracks (or a new one it does not ignore), never to a
    built page that only ``make pages`` or ``make reference`` writes (the reference pages' HTML is not committed)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: what a clone has is what git lists")
    files = {f for f in listed.stdout.split("\0") if f and (ROOT / f).exists()}
    folders = {p.as_posix() for f in files for p in Path(f).parents}
    docs = sorted(f for f in files if f.endswith(".md") and (f == "README.md" or f.startswith("reports/")))
    assert len(docs) > 10
    broken = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / doc).read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:|#", target):
                continue  # a URL, an anchor of the page itself
            path = os.path.normpath(Path(doc).parent / target.split("#")[0]).replace(os.sep, "/")
            if path not in files and path not in folders:
                broken.append(f"{doc}: {target}")
    assert broken == []
