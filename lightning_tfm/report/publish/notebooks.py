"""``ltfm report SWEEP.yaml``: execute the sweep's report notebook headless and write what a person reads.

    ltfm report sweeps/table3-cpu.yaml                   # local results + the sweep's Optuna storage
    ltfm report sweeps/table3-cpu.yaml --results DIR --storage URL --out DIR
    ltfm report sweeps/table3-cpu.yaml --from-wandb ENTITY/PROJECT    # the runs of W&B group = sweep name
    ltfm report sweeps/table3-cpu.yaml --from-export reports/reference/table3-cpu/export   # from an export alone
    ltfm report A.yaml --results R1 --against B.yaml --against-results R2       # two tables side by side

A sweep with ``variants`` gets ``table3.ipynb``, or ``table2.ipynb`` when its rows build more than one architecture
(:func:`notebook_name`); a sweep with a ``space`` gets ``search.ipynb``. The command
runs the notebook with papermill (its ``parameters`` cell: ``sweep_file``, ``results_dir``, ``storage``,
``out_dir``, ``wandb_path``, ``export_dir``, and table3's ``formats``: ``--formats png,svg,pdf`` writes each figure
also as SVG and PDF beside its PNG; the comparison's also ``against_file``, ``against_results``,
``against_storage``, ``against_export``), exports it to HTML with nbconvert (without the code: :func:`export_html`), and
writes into ``reports/build/<sweep
name>/`` (or ``--out``):

- table3: ``table3.ipynb`` (executed), ``table3.html``, ``table3.md``, ``table3.csv``, ``table3.tex`` (booktabs;
  ``table3-standalone.tex`` compiles it on its own: :mod:`.latex`), ``changes.png`` (the lead
  figure, :mod:`.lead`), ``dev_ppl_by_family.png``, ``outlook.png`` (each row's curve fitted and extrapolated:
  the verdict's evidence), ``ppl_vs_flops.png``, ``bleu_vs_params.png``,
  ``norm_curves.png`` (each of these five left out, with a line saying why in its place, when it has nothing to
  show: :class:`.plots.LeftOut`),
  ``positional.png`` (the positional encodings: :mod:`.views.attention`) (each also as ``.svg``/``.pdf`` with
  ``--formats``), and ``export/<sweep name>.json`` (:mod:`.export`: what ``--from-export`` rebuilds the tables from);
- table2 (:mod:`.table2`): ``table2.ipynb``, ``table2.html``, ``table2.md``, ``table2.csv``, ``table2_curves.png``
  (no export, W&B run or optuna-dashboard note);
- compare (``--against``): ``compare.ipynb``, ``compare.html``, ``compare.md``, ``compare.csv``,
  ``compare_deltas.png``, ``a_ppl_vs_flops.png``, ``b_ppl_vs_flops.png`` (:mod:`.compare`);
- search: ``search.ipynb``, ``search.html``, ``search.md``, ``search.csv``, ``optimization_history.png``,
  ``param_importances.png``, ``intermediate_values.png``.

A table3 report (not one rebuilt ``--from-export``) is then also logged to the sweep's W&B project (one run of
job type ``report``) and, read from an Optuna storage, written into the study's optuna-dashboard note and custom plots
(:func:`.published.publish`; a failure there is a one-line warning, the report still succeeds).

Secrets: a parameter holding one (a storage URL's password) is given to papermill masked (it writes the
parameters into the executed notebook twice) and reaches the kernel through the environment
(:func:`lightning_tfm.base.redact.hide`, ``reveal`` in the notebooks' setup cell); the executed notebook and
every error line are scrubbed of it as well.

Two reports into one folder, or of one sweep, at once: the notebooks run side by side; replacing the folder and
publishing it (the lines printed, W&B, optuna-dashboard) hold ``.<out>.lock`` beside it (:func:`out_lock`), then
the sweep's publishing lock (:func:`.wandb_run.publish_lock`), one report after the other.

SIGINT or SIGTERM: the kernel is killed, the staging folder and the temporary kernelspec removed, one line, exit
130 or 143 (:func:`stopped_by_signals`).

A report of nothing is refused before any kernel starts (:func:`require_completed`): a source (results, storage,
W&B group, export) without one completed run (a search: one completed trial) is one line naming where it looked
and the way out (run ``ltfm sweep`` first), exit 2, no report folder and no W&B run.

Nothing half-written: the notebook runs into a staging folder beside the output folder, which replaces the
output folder only when every cell succeeded. A cell that raises ``UserError`` (no such study, no API key,
...) ends the command with that one line and exit code 2; any other failing cell ends it with exit code 1
and one line naming the cell, and the executed notebook with the traceback is kept in ``<out>.failed/``.

Which notebook file: ``lightning_tfm/resources/notebooks/<name>.ipynb``, the package's data, found through
``importlib.resources`` (the one copy: a source checkout and an installed package run the same file; open
it in Jupyter from there to edit it).

Kernel: the notebook runs on this very Python (``sys.executable``, i.e. the virtual environment's), never on
whatever ``python3`` kernel a user-level Jupyter installation registers: a temporary kernelspec named
``python3`` pointing at ``sys.executable`` is put first on ``JUPYTER_PATH`` while papermill runs (no
``ipykernel install``, nothing written outside the staging folder). The notebook prints the kernel's
interpreter in its setup cell.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path

from ...base.errors import UserError
from ..core.text import environment, first_line, waiting_lock

NOTEBOOKS = {"variants": "table3", "space": "search"}
EXPECTED = {"table2": ("table2.md", "table2.csv", "table2_curves.png", "table2_alignment.png"),
            # table3's other figures are left out when they have nothing to show (plots.LeftOut)
            "table3": ("table3.md", "table3.csv", "table3.tex", "table3-standalone.tex", "changes.png",
                       "positional.png", "export"),
            "search": ("search.md", "search.csv", "optimization_history.png", "param_importances.png",
                       "intermediate_values.png"),
            "compare": ("compare.md", "compare.csv", "compare.json", "compare_deltas.png", "a_ppl_vs_flops.png",
                        "b_ppl_vs_flops.png")}


def notebook_name(sweep) -> str:
    """The report notebook of a sweep: ``table2`` for variants of more than one architecture
    (:func:`.table2.table.is_table2`), else :data:`NOTEBOOKS` by its mode."""
    from ..table2.table import is_table2

    return "table2" if is_table2(sweep) else NOTEBOOKS[sweep.mode]


def notebook_path(name: str) -> Path:
    """The package's ``resources/notebooks/<name>.ipynb``."""
    packaged = resources.files("lightning_tfm").joinpath(f"resources/notebooks/{name}.ipynb")
    if packaged.is_file():
        return Path(str(packaged))
    raise UserError(f"report notebook {name}.ipynb not found in the package's resources/notebooks: "
                    "reinstall lightning_tfm")


@contextlib.contextmanager
def venv_kernel():
    """A ``python3`` kernelspec for ``sys.executable``, first on JUPYTER_PATH while the block runs."""
    with tempfile.TemporaryDirectory(prefix="ltfm-kernel-") as tmp:
        spec = Path(tmp) / "kernels" / "python3"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--IPKernelApp.log_level=ERROR"],  # not its "running over TCP without encryption" warning
            "display_name": "Python 3 (ipykernel)", "language": "python", "metadata": {"debugger": True}}))
        old = os.environ.get("JUPYTER_PATH")
        with environment("JUPYTER_PATH", os.pathsep.join([tmp, *([old] if old else [])])):
            yield


# Written into every folder ``ltfm report`` makes; only a folder holding it is ever replaced.
MARKER = ".ltfm-report"


def check_out(out: Path) -> None:
    """``--out`` must be a new or empty folder, or one an earlier ``ltfm report`` made (its marker file):
    the report replaces the whole folder, so a folder of the user's own files is refused (exit 2)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file: give a folder for the report")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(f"--out folder {str(out)!r} is not a report folder made by `ltfm report` (no {MARKER} "
                        "file) and is not empty: give a new or empty folder (the report replaces its contents)")


def _replace_dir(src: Path, dest: Path) -> None:
    """Move ``src`` to ``dest`` (marking it as made by us), replacing a previous ``dest`` report folder."""
    from ...base.atomic import write_text

    try:
        check_out(dest)  # again: the folder may have changed while the notebook ran
        write_text(src / MARKER, "made by `ltfm report`; `ltfm report --out` replaces only folders holding this file\n")
    except BaseException:
        shutil.rmtree(src, ignore_errors=True)
        raise
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(src, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _cell_title(source: str) -> str:
    lines = [ln.strip() for ln in (source or "").splitlines() if ln.strip()]
    return lines[0][:80] if lines else "(empty cell)"


def execute(notebook: Path, parameters: dict, out: Path, name: str, then=None) -> int:
    """Run ``notebook`` with ``parameters`` (``out_dir`` is set here), export HTML, publish into ``out``; then,
    holding ``out``'s lock (:func:`out_lock`: two reports into one folder publish one after the other), run
    ``then()`` (its return value is the command's) once the folder is in place.

    A parameter that holds a secret (a storage URL's password) reaches the kernel through the environment
    (:func:`~lightning_tfm.base.redact.hide`): papermill writes the parameters into the notebook twice (the
    injected cell and its metadata), so it is given them masked; the executed notebook is scrubbed of them as
    well (a traceback may quote one). Interrupted (SIGINT, or SIGTERM under :func:`stopped_by_signals`), the
    kernel and the staging folder go, and the interruption goes on."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    from ...base.redact import HIDDEN_ENV, hidden_environment, hide, scrub

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"cannot write the report folder {str(out.parent)!r} ({e.strerror}): pass --out DIR") from None
    executed = staging / f"{name}.ipynb"
    shown, hidden = hide({**parameters, "out_dir": str(staging)})
    urls = list(hidden.values())
    try:
        try:
            with venv_kernel(), environment(HIDDEN_ENV, hidden_environment(hidden)):
                # "immediate": the kernel is killed at the end (or on an interrupt) instead of being asked to stop
                # while it may still be running a cell
                pm.execute_notebook(str(notebook), str(executed), parameters=shown, kernel_name="python3",
                                    language="python", progress_bar=False, log_output=False, cwd=os.getcwd(),
                                    start_timeout=120, shutdown_kernel="immediate")
        finally:
            _scrub_notebook(executed, urls)
    except PapermillExecutionError as e:
        if e.ename == "KeyboardInterrupt":  # Ctrl-C reached the kernel too (one process group): as an interrupt
            shutil.rmtree(staging, ignore_errors=True)
            raise KeyboardInterrupt from None
        if e.ename == "UserError":  # the user's input, found by the notebook: one line, exit 2
            shutil.rmtree(staging, ignore_errors=True)
            raise UserError(first_line(scrub(e.evalue, urls))) from None
        failed = out.with_name(f"{out.name}.failed")
        shutil.rmtree(failed, ignore_errors=True)
        os.replace(staging, failed)
        print(scrub(f"ltfm: error: notebook {notebook.name} failed in cell {e.exec_count} "
                    f"({_cell_title(e.source)!r}): {e.ename}: {first_line(e.evalue)} "
                    f"(executed notebook with the traceback: {failed / executed.name})", urls), file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - no kernel, kernel died, timeout: one line
        shutil.rmtree(staging, ignore_errors=True)
        print(scrub(f"ltfm: error: could not execute notebook {notebook}: {e.__class__.__name__}: {first_line(e)}",
                    urls), file=sys.stderr)
        return 1
    except BaseException:  # interrupted (SIGINT, SIGTERM): nothing half-written stays
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        missing = [f for f in EXPECTED[name] if not (staging / f).exists()]
        if missing:
            shutil.rmtree(staging, ignore_errors=True)
            print(f"ltfm: error: notebook {notebook.name} ran but wrote no {missing[0]}: the notebook was edited "
                  "into something else; restore it from the repository", file=sys.stderr)
            return 1
        export_html(executed, staging / f"{name}.html", heading(staging / f"{name}.md"))
        with out_lock(out):
            _replace_dir(staging, out)
            return then() if then is not None else 0
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _scrub_notebook(path: Path, urls: list[str]) -> None:
    """The executed notebook (or what papermill wrote of it) with every secret masked: the hidden parameters'
    values wherever a cell printed them, secret environment values, URL passwords (the figures' bytes are left
    as they are)."""
    from ...base.atomic import write_text
    from ...base.redact import scrub

    try:
        text = path.read_text(encoding="utf-8")
        tree = json.loads(text)
    except (OSError, ValueError):
        return
    for cell in tree.get("cells") or []:
        for key in [k for k in cell if k != "outputs"]:
            cell[key] = scrub(cell[key], urls)
        for output in cell.get("outputs") or []:
            for key in list(output):
                if key == "data" and isinstance(output[key], dict):
                    output[key] = {k: v if k.startswith("image/") else scrub(v, urls) for k, v in output[key].items()}
                else:
                    output[key] = scrub(output[key], urls)
    tree["metadata"] = scrub(tree.get("metadata") or {}, urls)
    clean = json.dumps(tree, sort_keys=True, indent=1, ensure_ascii=False) + "\n"  # as nbformat writes it
    if json.loads(clean) != json.loads(text):
        write_text(path, clean)


def out_lock(out: Path):
    """The lock of report folder ``out`` (``.<name>.lock`` beside it), held while a report replaces the folder
    and publishes it: a second report of it waits, saying so in a line."""
    return waiting_lock(out.with_name(f".{out.name}.lock"), f"the report folder {out}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is (a KeyboardInterrupt: papermill and nbclient stop their kernel for it)."""


@contextlib.contextmanager
def stopped_by_signals(out: Path):
    """SIGTERM ends the block as SIGINT does; either is one line on stderr and the conventional exit code
    (130, 143) instead of the block's (:class:`Terminated` is raised; the caller returns :data:`code`)."""
    import signal

    def on_sigterm(signum, frame):  # noqa: ARG001
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    state = {"code": None}
    try:
        yield state
    except KeyboardInterrupt as e:
        which, state["code"] = ("SIGTERM", 143) if isinstance(e, Terminated) else ("SIGINT", 130)
        print(f"ltfm: report stopped by {which}; nothing half-written is left beside {out}", file=sys.stderr,
              flush=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


HIDE_TAG = "report-hide"


def heading(markdown: Path) -> str | None:
    """The first heading of a report's markdown as plain text (``Pipeline check, not a result: sweep rep``), or
    None without one: the HTML page's title."""
    import html
    import re

    try:
        first = next((ln for ln in markdown.read_text(encoding="utf-8").splitlines() if ln.startswith("# ")), None)
    except OSError:
        return None
    if first is None:
        return None
    text = re.sub(r"\\(.)", r"\1", re.sub(r"(?<!\\)`+", "", first[2:]))  # code fences and markdown escapes
    return html.unescape(text).strip() or None


def export_html(notebook: Path, html: Path, title: str | None = None) -> Path:
    """The executed notebook as a page for readers: no code (nbconvert's no-input export), no prompts, cells
    tagged ``report-hide`` (parameters, setup, loading) left out entirely; figures stay embedded as base64 PNG
    (the page can be mailed on its own). The executed notebook beside it keeps the code. ``title``: the page's
    ``<title>`` (the report's first heading; default: the notebook's name)."""
    import logging

    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import TagRemovePreprocessor
    from traitlets.config import Config

    c = Config()
    c.TemplateExporter.exclude_input = True
    c.TemplateExporter.exclude_input_prompt = True
    c.TemplateExporter.exclude_output_prompt = True
    c.TagRemovePreprocessor.remove_cell_tags = {HIDE_TAG}
    c.TagRemovePreprocessor.enabled = True
    exporter = HTMLExporter(config=c)
    exporter.register_preprocessor(TagRemovePreprocessor(config=c), enabled=True)
    exporter.log.setLevel(logging.ERROR)  # "alternative text is missing on N image(s)"
    nb = nbformat.read(str(notebook), as_version=4)
    for cell in nb.cells:  # papermill's injected cell gets a random id: the same report, the same page
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell["id"] = "injected-parameters"
    if title:
        nb.metadata["title"] = title
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": notebook.stem}})
    html.write_text(body, encoding="utf-8")
    return html


def report_parameters(sweep, results: str | None, storage: str | None, wandb_path: str | None,
                      export: str | None = None, against: bool = False) -> dict:
    """The notebook's parameters, checked here first (cheap, before any kernel starts); ``against``: side B of a
    comparison, whose errors name the --against-* options."""
    from ..inputs.records import check_wandb_access, committed_hint, elsewhere_hint, resolve_local

    option = "--against-export" if against else "--from-export"
    local = ("--against-results", "--against-storage") if against else ("--results", "--storage")
    params = {"sweep_file": str(Path(sweep.path).absolute()), "results_dir": None, "storage": None,
              "wandb_path": None, "export_dir": None}
    if export:
        from ..inputs.export import export_file, read_export
        data = read_export(sweep, export, option)  # a wrong or malformed export stops here, before a kernel starts
        params["export_dir"] = str(export_file(sweep, export, option).absolute())
        require_completed(data, f"the export {params['export_dir']}",
                          f"write it again from the runs (`ltfm report {sweep.path}`)")
        return params
    url = None
    if wandb_path:
        check_wandb_access(wandb_path)
        params["wandb_path"] = wandb_path
    else:
        results_dir, url = resolve_local(sweep, results, storage, local)
        params["results_dir"] = str(results_dir)
        params["storage"] = storage  # None: the notebook uses <results_dir>/<name>.db when it exists
    from ...base.redact import mask_url
    from ..inputs.sources import load_report_data

    data = load_report_data(params["sweep_file"], results_dir=params["results_dir"], storage=storage,
                            wandb_path=wandb_path)
    where = (f"W&B {wandb_path} (group {sweep.name})" if wandb_path else
             f"{params['results_dir']}" + (f" or {mask_url(url)}" if url else ""))
    hint = "" if wandb_path else elsewhere_hint(sweep, Path(params["results_dir"]), local[0])
    require_completed(data, where, hint[2:] if hint else f"run `ltfm sweep {sweep.path}` first" + (
        "" if wandb_path else f", or pass {local[0]} DIR (the folder it wrote its runs to)")
        + committed_hint(sweep, option))  # (runs of it elsewhere here: that folder is the way out)
    return params


def require_completed(data, where: str, way_out: str) -> None:
    """A report needs one completed run (a search: one completed trial): else one line naming the sweep, where
    it looked, what it found there and ``way_out``; exit 2 before any kernel starts, nothing written."""
    import collections

    from ..inputs.records import DONE
    from ..table3.table import as_shown

    if data.sweep.mode == "space" and data.study is not None:
        states = collections.Counter(t.state.name.lower() for t in data.study.get_trials(deepcopy=False))
        if states["complete"]:
            return
        what = "completed trial"
    else:
        states = collections.Counter(as_shown(r).status for r in data.records)
        if states[DONE]:
            return
        what = "completed run"
    found = (f" ({sum(states.values())} found: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ")"
             if states else "")
    raise UserError(f"no {what} of sweep {data.sweep.name} in {where}{found}: {way_out}")


def check_sources(args) -> None:
    """One source a side: the local results (+ storage), W&B, or an export; --against-* only with --against."""
    if args.from_wandb and (args.results or args.storage):
        raise UserError("--from-wandb reads the runs from W&B: drop --results/--storage (or drop --from-wandb)")
    if args.from_export and (args.results or args.storage or args.from_wandb):
        raise UserError("--from-export reads the runs from an export: drop --results/--storage/--from-wandb "
                        "(or drop --from-export)")
    given = [o for o, v in (("--against-results", args.against_results), ("--against-storage", args.against_storage),
                            ("--against-export", args.against_export)) if v]
    if given and not args.against:
        raise UserError(f"{given[0]} belongs to --against SWEEP.yaml: add it (or drop {given[0]})")
    if args.against_export and (args.against_results or args.against_storage):
        raise UserError("--against-export reads side B from an export: drop --against-results/--against-storage")


def compare_cli(args, sweep) -> int:
    """``ltfm report A.yaml --against B.yaml``: the comparison notebook (``compare.ipynb``), side A read as
    ``ltfm report A.yaml`` reads it, side B from ``--against-results``/``--against-storage`` or
    ``--against-export``; into ``reports/build/<A>-vs-<B>/`` (or ``--out``)."""
    from ...sweep import load_sweep

    other = load_sweep(args.against)
    if sweep.mode != "variants" or other.mode != "variants":
        raise UserError("--against compares two Table 3 reports: both sweep files need variants (not a space)")
    from ..table2.table import is_table2
    for side in (s for s in (sweep, other) if is_table2(s)):
        raise UserError(f"--against compares two Table 3 reports (Transformer rows): sweep {side.name!r} has rows of "
                        "another architecture, a Table 2 report: report it alone (ltfm report SWEEP, no --against)")
    out = Path(args.out or Path("reports") / "build" / f"{sweep.name}-vs-{other.name}").absolute()
    check_out(out)
    a = report_parameters(sweep, args.results, args.storage, args.from_wandb, args.from_export)
    b = report_parameters(other, args.against_results, args.against_storage, None, args.against_export, against=True)
    parameters = {**a, "against_file": b["sweep_file"], "against_results": b["results_dir"],
                  "against_storage": b["storage"], "against_export": b["export_dir"]}
    notebook = notebook_path("compare")
    print(f"comparison of sweep {sweep.name} with {other.name}: executing {notebook.name}", flush=True)

    def published() -> int:
        from ..table3.compare import read_headline
        print("".join(f"{line}\n" for line in read_headline(out)), end="")
        pngs = sorted(p.name for p in out.glob("*.png"))
        print(f"report: {out / 'compare.md'}\n  html: {out / 'compare.html'}\n  notebook: {out / 'compare.ipynb'}\n"
              f"  csv: {out / 'compare.csv'}\n  figures: {', '.join(pngs)}", flush=True)
        return 0

    with stopped_by_signals(out) as stopped:
        return execute(notebook, parameters, out, "compare", then=published)
    return stopped["code"]
