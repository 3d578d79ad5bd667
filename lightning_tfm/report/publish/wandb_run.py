"""A report as ONE W&B run of job type ``report`` in the sweep's group, id ``report-<sweep>-<kind>``
(:func:`report_run_id`; stable, with ``resume="allow"``: a re-run writes the same run again rather than a second
one). What a report of each kind gives it is its :class:`~.core.columns.Kind` (:data:`.kinds.KINDS`): the run holds

- its W&B tables (Table 3's ``table3/dev_ppl`` and ``table3/dev_bleu``, Table 2's ``table2/rows``);
- the summary: its headline numbers (Table 3's: :func:`.kinds.headline_numbers`);
- ``figures/<name>``: every ``*.png`` of the report as a ``wandb.Image``;
- the artifact ``<kind>-<sweep>`` (type ``report``): the report's files (Table 3's ``table3.md``, ``table3.csv``,
  ``table3.html``, ...).

Mode, project and entity are resolved as for the training runs (``WANDB_MODE`` else the experiment's
``wandb.mode`` through :func:`lightning_tfm.training.tracking.tracking.resolve_mode`; ``WANDB_PROJECT``/
``WANDB_ENTITY`` else ``wandb.project``/``wandb.entity``: :func:`wandb_target`); ``disabled`` logs nothing. The
run's files go to ``<results>/wandb-report/wandb/`` (never into the report folder, which each report replaces);
offline, the older ``offline-run-*-<id>`` folders of the same id are removed once the new run is written, so
``wandb sync`` finds one. Two reports of one sweep at once publish one after the other (:func:`publish_lock`,
``<results>/wandb-report/.publish.lock``, held by :func:`.published.publish`): the last one's run is the one left,
in the folder it printed.

A pipeline check's report (its runs tagged ``pipeline-check``: ``make ablation QUICK=1``) is its own run:
id ``report-<sweep>-pipeline-check-table3``, group ``<sweep>-pipeline-check`` (where its training runs are,
:func:`lightning_tfm.training.tracking.tracking.wandb_group`), tag ``pipeline-check``: the real report's run and
group are never touched.
"""
from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
from pathlib import Path

from ..core.text import environment
from ..inputs.records import REPORT_JOB_TYPE as JOB_TYPE
from .kinds import KIND, KINDS

WANDB_DIR = "wandb-report"   # below the sweep's results folder
LOCK = ".publish.lock"       # in WANDB_DIR: one report at a time publishes a sweep's results folder


def publish_lock(results_dir: str | Path) -> Path:
    """The lock a report holds while it publishes a sweep (its W&B report run, the study's note and plots):
    two reports of one sweep at once publish one after the other, the last one's run is the one left."""
    return Path(results_dir) / WANDB_DIR / LOCK


def report_run_id(sweep_name: str, kind: str = KIND, pipeline_check: bool = False) -> str:
    """``report-<sweep>-<kind>``: one W&B run per (sweep, report kind), whatever the machine or the day; a
    pipeline check's (``make ablation QUICK=1``) is ``report-<sweep>-pipeline-check-<kind>``, never the real one."""
    if pipeline_check:
        from ...training.tracking.tracking import PIPELINE_CHECK
        sweep_name = f"{sweep_name}-{PIPELINE_CHECK}"
    rid = f"report-{sweep_name}-{kind}"
    if len(rid) > 64:  # a long sweep name: keep the id short, and unique with a hash of the full name
        rid = f"report-{sweep_name[:40]}-{hashlib.sha1(sweep_name.encode()).hexdigest()[:8]}-{kind}"
    return rid


def wandb_target(sweep, wandb_path: str | None = None) -> dict:
    """mode / project / entity of the sweep's W&B runs, resolved as the training runs resolve them; a report
    read ``--from-wandb ENTITY/PROJECT`` goes to that project."""
    import os

    from ...sweep import trial_config
    from ...training.tracking.tracking import resolve_mode

    cfg = trial_config(sweep, checked=False)
    target = {"mode": resolve_mode(cfg), "project": os.environ.get("WANDB_PROJECT") or cfg.wandb.project,
              "entity": os.environ.get("WANDB_ENTITY") or cfg.wandb.entity}
    if wandb_path:
        target["entity"], target["project"] = wandb_path.split("/", 1)
    return target


def run_folders(wandb_dir: Path, run_id: str, offline_only: bool = False) -> list[Path]:
    """wandb's folders of run ``run_id`` in ``wandb_dir``: ``offline-run-<time>-<id>`` (and, unless
    ``offline_only``, ``run-<time>-<id>``; wandb adds ``-<n>`` to a second run started in the same second),
    oldest first."""
    prefix = "offline-" if offline_only else "(?:offline-)?"
    pattern = re.compile(rf"{prefix}run-(?P<time>\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(?P<n>\d+))?")
    found = [(m, p) for p in Path(wandb_dir).glob(f"*{run_id}*") if p.is_dir() and (m := pattern.fullmatch(p.name))]
    return [p for m, p in sorted(found, key=lambda mp: (mp[0]["time"], int(mp[0]["n"] or 0)))]


def superseded_folders(wandb_dir: Path, run_id: str, keep: Path | None) -> list[Path]:
    """Offline run folders of ``run_id`` in ``wandb_dir`` other than ``keep``."""
    return [p for p in run_folders(wandb_dir, run_id, offline_only=True)
            if keep is None or p.resolve() != keep.resolve()]


def log_wandb_report(sweep, out: Path, results_dir: Path, table: dict, target: dict,
                     pipeline_check: bool = False, kind: str = KIND) -> dict | None:
    """The report folder ``out`` and its ``table`` (:func:`~.table3.table.rebuilt_table`) as the sweep's W&B report
    run (see the module docstring); None when W&B is disabled. Raises whatever wandb raises
    (:func:`.published.publish` turns it into a warning). Call it holding :func:`publish_lock`
    (:func:`.published.publish` does): it removes the run's older offline folders."""
    if target["mode"] == "disabled":
        return None
    root = Path(results_dir) / WANDB_DIR
    root.mkdir(parents=True, exist_ok=True)
    run_id = report_run_id(sweep.name, kind, pipeline_check)
    before = set(run_folders(root / "wandb", run_id))
    try:
        return _log_run(sweep, out, table, target, root, run_id, pipeline_check, kind)
    except BaseException:
        # a failed start leaves an empty online run folder (as in tracking.py), a failed write an incomplete
        # offline one: `wandb sync` would upload them as attempts of this run; the earlier, complete run stays
        for stub in set(run_folders(root / "wandb", run_id)) - before:
            shutil.rmtree(stub, ignore_errors=True)
        raise


def _log_run(sweep, out: Path, table: dict, target: dict, root: Path, run_id: str,
             pipeline_check: bool = False, kind: str = KIND) -> dict:
    import wandb

    from ...base.redact import scrub
    from ...training.tracking.tracking import PIPELINE_CHECK, scrubbed_argv, wandb_group  # wandb records sys.argv

    tags = [JOB_TYPE, kind] + ([PIPELINE_CHECK] if pipeline_check else [])
    with scrubbed_argv():
        run = wandb.init(id=run_id, resume="allow", mode=target["mode"], dir=str(root), project=target["project"],
                         entity=target["entity"], group=wandb_group(sweep.name, tags), job_type=JOB_TYPE,
                         name=f"{sweep.name} {kind}" + (f" ({PIPELINE_CHECK})" if pipeline_check else ""), tags=tags,
                         config=scrub({"report.kind": kind, "report.sweep": sweep.name,
                                       "report.pipeline_check": pipeline_check,
                                       "report.sweep_file": str(Path(sweep.path).absolute()),
                                       "report.folder": str(out)}),
                         settings=wandb.Settings(silent=True, console="off", save_code=False, disable_git=True))
    folder = Path(run.dir).parent
    try:
        with _staging_in(folder):
            _log_report(run, out, table, sweep.name + (f"-{PIPELINE_CHECK}" if pipeline_check else ""), kind)
    except BaseException:
        run.finish(exit_code=1)
        wandb.teardown()
        raise
    run.finish()
    wandb.teardown()  # as tracking.finish: the run's files are complete only once wandb-core has exited
    removed = []
    if target["mode"] == "offline":
        for old in superseded_folders(folder.parent, run_id, keep=folder):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return {"run_id": run_id, "mode": target["mode"], "project": target["project"], "folder": folder,
            "removed": removed}


@contextlib.contextmanager
def _staging_in(folder: Path):
    """wandb stages artifact files (the tables', the report's) in ``$WANDB_DATA_DIR/artifacts/staging``
    (default ``~/.local/share/wandb``) until they are uploaded: put them in the run's own folder, so an offline
    run carries them to ``wandb sync`` and a superseded run takes them away with it."""
    with environment("WANDB_DATA_DIR", str(folder / "staging")):
        yield


def report_contents(table: dict, kind: str = KIND) -> tuple[dict, dict]:
    """(the summary numbers, the W&B tables {name: (columns, rows)}) of a report of ``kind`` (:data:`.kinds.KINDS`)."""
    return KINDS[kind].summary(table), KINDS[kind].wandb_tables(table)


def _log_report(run, out: Path, table: dict, sweep_name: str, kind: str = KIND) -> None:
    import wandb

    summary, tables = report_contents(table, kind)
    logged = {name: wandb.Table(columns=cols, data=data) for name, (cols, data) in tables.items()}
    for png in sorted(out.glob("*.png")):
        logged[f"figures/{png.stem}"] = wandb.Image(str(png), caption=png.name)
    run.log(logged)
    run.summary.update(summary)
    artifact = wandb.Artifact(f"{kind}-{sweep_name}", type=JOB_TYPE, metadata=dict(summary))
    for name in KINDS[kind].files:
        artifact.add_file(str(out / name), name=name)
    run.log_artifact(artifact, aliases=["latest"])
