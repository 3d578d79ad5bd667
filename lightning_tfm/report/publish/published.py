"""Where ``ltfm report`` publishes a report (:mod:`.dashboards`), as lines of the report itself (its last section,
:func:`~.render.published_markdown`): the W&B report run (offline: its run folder and the ``wandb sync`` command that
uploads it; online: its URL) and the command that opens the sweep's study in optuna-dashboard."""
from __future__ import annotations

import contextlib
import io
import os
import shlex
from pathlib import Path

from ...training.redact import mask_url
from .dashboards import WANDB_DIR, report_run_id, wandb_target
from ..inputs.records import default_results_dir, resolve_local
from ..core.text import md_code, md_text


def _here(path: Path) -> str:
    """``path`` as a command typed in this folder takes it: relative when inside it, else absolute."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())


def where_published(data, results_dir=None, storage: str | None = None, wandb_path: str | None = None,
                    export_dir=None, pipeline_check: bool = False, kind: str = "table3") -> list[str]:
    """Where ``ltfm report`` puts the report's copies (:mod:`.dashboards`), as the report's lines: the W&B report
    run (offline: its run folder and the ``wandb sync`` command that uploads it; online: its URL) and the command
    that opens the sweep's study in optuna-dashboard (the storage URL's password masked: secrets are never
    written). A report rebuilt from an export is published nowhere: one line says so."""
    if export_dir:
        return ["Not published to W&B or optuna-dashboard: a report rebuilt from an export."]
    sweep, lines = data.sweep, []
    with contextlib.redirect_stderr(io.StringIO()):  # online without a key: `ltfm report` warns as it publishes
        target = wandb_target(sweep, wandb_path)
    run_id = report_run_id(sweep.name, kind, pipeline_check)
    if target["mode"] == "disabled":
        lines.append("W&B: not logged (W&B is disabled: WANDB_MODE or the experiment's wandb.mode).")
    elif target["mode"] == "offline":
        results = Path(results_dir) if results_dir else default_results_dir(sweep)
        run = f"{shlex.quote(_here(results / WANDB_DIR / 'wandb'))}/offline-run-*-{shlex.quote(run_id)}"
        lines.append(f"W&B: the report run {md_code(run_id)} (offline), in {md_code(run)}; to publish it: "
                     f"{md_code('wandb sync ' + run)}.")
    else:
        app = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/").replace("://api.", "://", 1)
        entity = target["entity"] or "ENTITY"
        url = f"{app}/{entity}/{target['project']}/runs/{run_id}"
        lines.append(f"W&B: the report run {md_code(run_id)}: <{md_text(url)}>"
                     + ("" if target["entity"] else " (ENTITY: your W&B entity, the API key's default)") + ".")
    if data.study is not None and not wandb_path:
        url = storage or resolve_local(sweep, results_dir, None)[1] or ""  # the URL the study was read from
        if url.startswith("sqlite:///"):
            url = "sqlite:///" + _here(Path(url[len("sqlite:///"):]))
        masked = mask_url(url)
        lines.append(f"optuna-dashboard: {md_code('optuna-dashboard ' + shlex.quote(masked))} opens the study "
                     f"{md_code(data.study.study_name)} (its note holds this report's headline)"
                     + ("; put the password in place of `***`" if masked != url else "")
                     + "; `pip install -e '.[dashboard]'` installs it.")
    return lines
