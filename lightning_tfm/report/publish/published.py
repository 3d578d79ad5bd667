"""Where ``ltfm report`` publishes a Table 3 or Table 2 report, once it has written the report folder: the W&B project
of the sweep's runs (:mod:`.wandb_run`) and the sweep's Optuna study (:mod:`.optuna_note`). :func:`publish` puts it
there (what each kind gives each place: :data:`.kinds.KINDS`); a failure there is one warning line on stderr, the
report stays a success. :func:`where_published` says where, as lines of the report itself (its last section,
:func:`~.render.published_markdown`): the W&B report run (offline: its run folder and the ``wandb sync`` command that
uploads it; online: its URL) and the command that opens the sweep's study in optuna-dashboard."""
from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
from pathlib import Path

from ...base.redact import mask_url, scrub
from ..core.text import first_line, md_code, md_text, waiting_lock
from ..inputs.records import default_results_dir, resolve_local
from .kinds import KINDS
from .optuna_note import dashboard_available, write_dashboard
from .wandb_run import WANDB_DIR, log_wandb_report, publish_lock, report_run_id, wandb_target


def _here(path: Path) -> str:
    """``path`` as a command typed in this folder takes it: relative when inside it, else absolute."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())


def where_published(data, results_dir=None, storage: str | None = None, wandb_path: str | None = None,
                    export_dir=None, pipeline_check: bool = False, kind: str = "table3") -> list[str]:
    """Where ``ltfm report`` puts the report's copies (:func:`publish`), as the report's lines: the W&B report
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
        base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        app = mask_url(base.rstrip("/").replace("://api.", "://", 1))
        entity = target["entity"] or "ENTITY"
        url = f"{app}/{entity}/{target['project']}/runs/{run_id}"
        lines.append(f"W&B: the report run {md_code(run_id)}: <{md_text(url)}>"
                     + ("" if target["entity"] else " (ENTITY: your W&B entity, the API key's default)") + ".")
    if data.study is not None and not wandb_path:
        command, masked = dashboard_command(sweep, results_dir, storage)
        lines.append(f"optuna-dashboard: {md_code(command)} opens the study "
                     f"{md_code(data.study.study_name)} (its note holds this report's headline)"
                     + ("; put the password in place of `***`" if masked else "")
                     + "; `pip install -e '.[dashboard]'` installs it.")
    return lines


def dashboard_command(sweep, results_dir=None, storage: str | None = None) -> tuple[str, bool]:
    """(``optuna-dashboard <storage URL>``, whether a password in it is masked): the command that opens the sweep's
    study, its URL the one the report read (``storage``, else the results folder's SQLite file, relative to here),
    its password masked (secrets are never printed)."""
    url = storage or resolve_local(sweep, results_dir, None)[1] or ""
    if url.startswith("sqlite:///"):
        url = "sqlite:///" + _here(Path(url[len("sqlite:///"):]))
    masked = mask_url(url)
    return "optuna-dashboard " + shlex.quote(masked), masked != url


def dashboard_next(sweep, parameters: dict) -> str | None:
    """The optuna-dashboard part of ``ltfm report``'s ``ltfm: next:`` line: the command that opens the study the
    report read (and wrote its note to), or None when it read none (W&B, an export, run folders without a
    storage)."""
    if parameters.get("wandb_path") or parameters.get("export_dir"):
        return None
    try:
        if not (parameters.get("storage") or resolve_local(sweep, parameters.get("results_dir"), None)[1]):
            return None
    except Exception:  # noqa: BLE001 - the folder went away since: nothing to open
        return None
    command, masked = dashboard_command(sweep, parameters.get("results_dir"), parameters.get("storage"))
    return (command + (" (the password in place of ***)" if masked else "")
            + ("" if dashboard_available() else " (after: pip install -e '.[dashboard]')"))


def _warn(message: str) -> None:
    print(f"ltfm: warning: {message}", file=sys.stderr, flush=True)


def publish(sweep, parameters: dict, out: Path, table: dict | None = None) -> list[str]:
    """After the report folder ``out`` is written: the W&B report run and the optuna-dashboard note (and plots) of
    ``table``, a Table 3 report's or, for a sweep of several architectures (:func:`.table2.table.is_table2`), a Table 2
    report's (default: rebuilt from the folder's export; Table 2's: from the runs). Returns the lines to print;
    every failure here is a one-line warning, never the report's failure."""
    from ..inputs.sources import load_report_data

    lines: list[str] = []
    urls = [parameters.get("storage") or ""]  # its password masked in a warning, however the message quotes it
    try:
        data = load_report_data(parameters["sweep_file"], results_dir=parameters.get("results_dir"),
                                storage=parameters.get("storage"), wandb_path=parameters.get("wandb_path"))
    except Exception as e:  # noqa: BLE001 - the report is written; only its copies here are lost
        _warn(f"report not sent to W&B or optuna-dashboard: cannot re-read the sweep "
              f"({e.__class__.__name__}: {first_line(scrub(str(e), urls))})")
        return lines
    results = Path(parameters.get("results_dir") or default_results_dir(sweep))
    try:
        publish_lock(results).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _warn(f"report not sent to W&B or optuna-dashboard: cannot write {results / WANDB_DIR} ({e.strerror})")
        return lines
    with waiting_lock(publish_lock(results), f"sweep {sweep.name}'s W&B report run ({results / WANDB_DIR})"):
        return _publish(sweep, parameters, out, data, results, lines, urls, table)


def _publish(sweep, parameters: dict, out: Path, data, results: Path, lines: list[str], urls: list[str],
             table: dict | None) -> list[str]:
    from .notebooks import notebook_name

    kind = notebook_name(sweep)  # table2 or table3: the report's notebook
    try:
        table = table if table is not None else KINDS[kind].build(data, sweep, out)
    except Exception as e:  # noqa: BLE001 - the report is written; only its copies here are lost
        _warn(f"report not sent to W&B or optuna-dashboard: cannot rebuild its table ({e.__class__.__name__}: "
              f"{first_line(scrub(str(e), urls))})")
        return lines
    try:
        target = wandb_target(sweep, parameters.get("wandb_path"))
        info = log_wandb_report(sweep, out, results, table, target, table.pipeline_check, kind)
        if info is not None:
            where = (f"offline in {info['folder']} (upload: wandb sync {info['folder']})"
                     if info["mode"] == "offline" else f"project {info['project']}")
            lines.append(f"  W&B: report run {info['run_id']}, {where}")
    except Exception as e:  # noqa: BLE001 - W&B must never fail the report
        _warn(f"report not logged to W&B ({e.__class__.__name__}: {first_line(scrub(str(e), urls))}); the report "
              "itself is complete (run `ltfm report` again to log it)")
        try:
            import wandb
            wandb.teardown()
        except Exception:  # noqa: BLE001
            pass
    if data.study is not None and not parameters.get("wandb_path") and dashboard_available():
        try:
            d = write_dashboard(data, table, out, kind)
            plots = f" and {len(d['plots'])} plots" if d["plots"] else ""
            lines.append(f"  optuna-dashboard: note{plots} on study {d['study']}; open it: "
                         f"{dashboard_command(sweep, parameters.get('results_dir'), parameters.get('storage'))[0]}")
        except Exception as e:  # noqa: BLE001 - nor the dashboard
            _warn(f"report not written to optuna-dashboard ({e.__class__.__name__}: {first_line(scrub(str(e), urls))})")
    return lines
