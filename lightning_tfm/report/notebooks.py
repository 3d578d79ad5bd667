"""``ltfm report SWEEP.yaml``: execute the sweep's report notebook headless and write what a person reads.

    ltfm report sweeps/table3-cpu.yaml                   # local results + the sweep's Optuna storage
    ltfm report sweeps/table3-cpu.yaml --results DIR --storage URL --out DIR
    ltfm report sweeps/table3-cpu.yaml --from-wandb ENTITY/PROJECT    # the runs of W&B group = sweep name
    ltfm report sweeps/table3-cpu.yaml --from-export reports/reference/table3-cpu/export   # from an export alone
    ltfm report A.yaml --results R1 --against B.yaml --against-results R2       # two tables side by side

A sweep with ``variants`` gets ``table3.ipynb``, a sweep with a ``space`` gets ``search.ipynb``. The command
runs the notebook with papermill (its ``parameters`` cell: ``sweep_file``, ``results_dir``, ``storage``,
``out_dir``, ``wandb_path``, ``export_dir``; the comparison's also ``against_file``, ``against_results``,
``against_storage``, ``against_export``), exports it to HTML with nbconvert (without the code: :func:`export_html`), and
writes into ``reports/build/<sweep
name>/`` (or ``--out``):

- table3: ``table3.ipynb`` (executed), ``table3.html``, ``table3.md``, ``table3.csv``,
  ``dev_ppl_by_family.png``, ``ppl_vs_flops.png``, ``bleu_vs_params.png``, ``norm_curves.png``, and
  ``export/<sweep name>.json`` (:mod:`.export`: what ``--from-export`` rebuilds the tables from);
- compare (``--against``): ``compare.ipynb``, ``compare.html``, ``compare.md``, ``compare.csv``,
  ``compare_deltas.png``, ``a_ppl_vs_flops.png``, ``b_ppl_vs_flops.png`` (:mod:`.compare`);
- search: ``search.ipynb``, ``search.html``, ``search.md``, ``search.csv``, ``optimization_history.png``,
  ``param_importances.png``, ``intermediate_values.png``.

A table3 report (not one rebuilt ``--from-export``) is then also logged to the sweep's W&B project (one run of
job type ``report``) and, read from an Optuna storage, written into the study's optuna-dashboard note and custom plots
(:mod:`.dashboards`; a failure there is a one-line warning, the report still succeeds).

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
from importlib import resources
from pathlib import Path

from ..training.errors import UserError
from .text import environment, first_line

NOTEBOOKS = {"variants": "table3", "space": "search"}
EXPECTED = {"table3": ("table3.md", "table3.csv", "dev_ppl_by_family.png", "ppl_vs_flops.png", "bleu_vs_params.png",
                       "norm_curves.png", "export"),
            "search": ("search.md", "search.csv", "optimization_history.png", "param_importances.png",
                       "intermediate_values.png"),
            "compare": ("compare.md", "compare.csv", "compare_deltas.png", "a_ppl_vs_flops.png",
                        "b_ppl_vs_flops.png")}


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


def _check_out(out: Path) -> None:
    """``--out`` must be a new or empty folder, or one an earlier ``ltfm report`` made (its marker file):
    the report replaces the whole folder, so a folder of the user's own files is refused (exit 2)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file: give a folder for the report")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(f"--out folder {str(out)!r} is not a report folder made by `ltfm report` (no {MARKER} "
                        "file) and is not empty: give a new or empty folder (the report replaces its contents)")


def _replace_dir(src: Path, dest: Path) -> None:
    """Move ``src`` to ``dest`` (marking it as made by us), replacing a previous ``dest`` report folder."""
    from ..training.atomic import write_text

    try:
        _check_out(dest)  # again: the folder may have changed while the notebook ran
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


def execute(notebook: Path, parameters: dict, out: Path, name: str) -> int:
    """Run ``notebook`` with ``parameters`` (``out_dir`` is set here), export HTML, publish into ``out``."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"cannot write the report folder {str(out.parent)!r} ({e.strerror}): pass --out DIR") from None
    executed = staging / f"{name}.ipynb"
    try:
        with venv_kernel():
            pm.execute_notebook(str(notebook), str(executed), parameters={**parameters, "out_dir": str(staging)},
                                kernel_name="python3", language="python", progress_bar=False, log_output=False,
                                cwd=os.getcwd(), start_timeout=120)
    except PapermillExecutionError as e:
        if e.ename == "UserError":  # the user's input, found by the notebook: one line, exit 2
            shutil.rmtree(staging, ignore_errors=True)
            raise UserError(first_line(e.evalue)) from None
        failed = out.with_name(f"{out.name}.failed")
        shutil.rmtree(failed, ignore_errors=True)
        os.replace(staging, failed)
        print(f"ltfm: error: notebook {notebook.name} failed in cell {e.exec_count} "
              f"({_cell_title(e.source)!r}): {e.ename}: {first_line(e.evalue)} "
              f"(executed notebook with the traceback: {failed / executed.name})", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - no kernel, kernel died, timeout: one line
        shutil.rmtree(staging, ignore_errors=True)
        print(f"ltfm: error: could not execute notebook {notebook}: {e.__class__.__name__}: {first_line(e)}",
              file=sys.stderr)
        return 1
    missing = [f for f in EXPECTED[name] if not (staging / f).exists()]
    if missing:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"ltfm: error: notebook {notebook.name} ran but wrote no {missing[0]}: the notebook was edited "
              "into something else; restore it from the repository", file=sys.stderr)
        return 1
    export_html(executed, staging / f"{name}.html")
    _replace_dir(staging, out)
    return 0


HIDE_TAG = "report-hide"


def export_html(notebook: Path, html: Path) -> Path:
    """The executed notebook as a page for readers: no code (nbconvert's no-input export), no prompts, cells
    tagged ``report-hide`` (parameters, setup, loading) left out entirely; figures stay embedded as base64 PNG
    (the page can be mailed on its own). The executed notebook beside it keeps the code."""
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
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": notebook.stem}})
    html.write_text(body, encoding="utf-8")
    return html


def report_parameters(sweep, results: str | None, storage: str | None, wandb_path: str | None,
                      export: str | None = None) -> dict:
    """The notebook's parameters, checked here first (cheap, before any kernel starts)."""
    from .records import check_wandb_access, resolve_local

    params = {"sweep_file": str(Path(sweep.path).absolute()), "results_dir": None, "storage": None,
              "wandb_path": None, "export_dir": None}
    if export:
        from .export import export_file, read_export
        read_export(sweep, export)  # a wrong or malformed export stops here, before a kernel starts
        params["export_dir"] = str(export_file(sweep, export).absolute())
        return params
    if wandb_path:
        check_wandb_access(wandb_path)
        params["wandb_path"] = wandb_path
        return params
    results_dir, url = resolve_local(sweep, results, storage)
    params["results_dir"] = str(results_dir)
    params["storage"] = storage  # None: the notebook uses <results_dir>/<name>.db when it exists
    return params


def _check_sources(args) -> None:
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


def report_cli(args) -> int:
    """``ltfm report SWEEP.yaml [--storage URL] [--results DIR] [--out DIR] [--from-wandb ENTITY/PROJECT]
    [--from-export DIR] [--against SWEEP_B.yaml [--against-results DIR] [--against-storage URL]
    [--against-export DIR]]``"""
    from ..sweep import load_sweep

    sweep = load_sweep(args.sweep_file)
    _check_sources(args)
    if args.against:
        return compare_cli(args, sweep)
    name = NOTEBOOKS[sweep.mode]
    if args.from_export and name != "table3":
        raise UserError("--from-export rebuilds a Table 3 report (a sweep with variants), not a search report")
    out = Path(args.out or Path("reports") / "build" / sweep.name).absolute()
    _check_out(out)
    parameters = report_parameters(sweep, args.results, args.storage, args.from_wandb, args.from_export)
    notebook = notebook_path(name)
    print(f"report of sweep {sweep.name}: executing {notebook.name}", flush=True)
    rc = execute(notebook, parameters, out, name)
    if rc:
        return rc
    md = out / f"{name}.md"
    if name == "table3":
        print(_agreement_from_md(md.read_text()), end="")
    pngs = sorted(p.name for p in out.glob("*.png"))
    print(f"report: {md}\n  html: {out / (name + '.html')}\n  notebook: {out / (name + '.ipynb')}\n"
          f"  csv: {out / (name + '.csv')}\n  figures: {', '.join(pngs)}", flush=True)
    if name == "table3":
        print(f"  export: {out / 'export' / (sweep.name + '.json')}")
    if name == "table3" and args.from_export:
        print("  W&B, optuna-dashboard: not published (a report rebuilt from an export)")
    elif name == "table3":  # the same report in W&B and optuna-dashboard; a failure there is a warning
        from .dashboards import publish
        for line in publish(sweep, parameters, out):
            print(line)
    return 0


def compare_cli(args, sweep) -> int:
    """``ltfm report A.yaml --against B.yaml``: the comparison notebook (``compare.ipynb``), side A read as
    ``ltfm report A.yaml`` reads it, side B from ``--against-results``/``--against-storage`` or
    ``--against-export``; into ``reports/build/<A>-vs-<B>/`` (or ``--out``)."""
    from ..sweep import load_sweep

    other = load_sweep(args.against)
    if sweep.mode != "variants" or other.mode != "variants":
        raise UserError("--against compares two Table 3 reports: both sweep files need variants (not a space)")
    out = Path(args.out or Path("reports") / "build" / f"{sweep.name}-vs-{other.name}").absolute()
    _check_out(out)
    a = report_parameters(sweep, args.results, args.storage, args.from_wandb, args.from_export)
    b = report_parameters(other, args.against_results, args.against_storage, None, args.against_export)
    parameters = {**a, "against_file": b["sweep_file"], "against_results": b["results_dir"],
                  "against_storage": b["storage"], "against_export": b["export_dir"]}
    notebook = notebook_path("compare")
    print(f"comparison of sweep {sweep.name} with {other.name}: executing {notebook.name}", flush=True)
    rc = execute(notebook, parameters, out, "compare")
    if rc:
        return rc
    print(_agreement_from_md((out / "compare.md").read_text()), end="")
    pngs = sorted(p.name for p in out.glob("*.png"))
    print(f"report: {out / 'compare.md'}\n  html: {out / 'compare.html'}\n  notebook: {out / 'compare.ipynb'}\n"
          f"  csv: {out / 'compare.csv'}\n  figures: {', '.join(pngs)}", flush=True)
    return 0


def _agreement_from_md(text: str) -> str:
    """The headline of table3.md (its list before the first table section), for the terminal."""
    head = text.split("\n## ", 1)[0]
    return "".join(ln[2:] + "\n" for ln in head.splitlines() if ln.startswith("- "))
