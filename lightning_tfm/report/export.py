"""What a Table 3 report is built from, as one JSON file: every record's curve and summary, no checkpoints.

``ltfm report`` writes ``<out>/export/<sweep name>.json`` (:func:`write_export`) beside the report; committed
with it, it rebuilds the same tables without the results folder, the Optuna storage or W&B:
``ltfm report SWEEP.yaml --from-export DIR`` (:func:`read_export`, through
:func:`lightning_tfm.report.records.load_report_data`).

The file holds:

- ``records``: each :class:`~lightning_tfm.report.records.RunRecord` (one per row and seed): its variant, family,
  seed, status, flat config, parameters, dev loss / PPL / BLEU, steps, the counts its training compute is
  counted from, and its ``history`` (dev loss, dev PPL, dev BLEU and training loss at every logged step); its run
  folder by name only and no dev-hypotheses path;
- ``planned``: the sweep file's config of every row (rows without a run keep their knobs);
- ``bootstrap``: the paired bootstrap as the report computed it (it needs the dev hypotheses, which are not
  exported), and ``run_info`` (wall time, machines: from the Optuna study, which is not exported);
- ``source`` and ``notes``: where the records came from.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..training.atomic import write_text
from ..training.errors import UserError
from .records import ReportData, RunRecord

FORMAT = "ltfm-report-export"
VERSION = 1
_FIELDS = {f.name for f in dataclasses.fields(RunRecord)}


def _record(rec: RunRecord) -> dict:
    out = dataclasses.asdict(rec)
    out["hyps"] = None  # a path of this machine; the test's results travel in "bootstrap"
    out["run"] = Path(rec.run).name if rec.run else None
    return out


def export_data(data: ReportData, table: dict) -> dict:
    """The export of a report (see the module docstring) as a JSON-ready dict."""
    tests, notes, signature = table["bootstrap"]
    return {"format": FORMAT, "version": VERSION, "sweep": data.sweep.name, "sweep_file": data.sweep.path.name,
            "source": data.source, "notes": list(data.notes), "run_info": table["run_info"],
            "bootstrap": {"tests": tests, "notes": list(notes), "signature": signature},
            "planned": data.planned, "records": [_record(r) for r in data.records]}


def write_export(data: ReportData, table: dict, out_dir: str | Path) -> Path:
    """``<out_dir>/<sweep name>.json``: the export of the report built from ``data`` (``table``:
    :func:`~lightning_tfm.report.table.build_table` of it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(export_data(data, table), indent=1, sort_keys=True, default=str) + "\n"
    return write_text(out / f"{data.sweep.name}.json", text)


def export_file(sweep, path: str | Path) -> Path:
    """The export file of ``sweep`` at ``path``: the file itself, or ``<path>/<sweep name>.json``; a one-line
    UserError when it is not there."""
    p = Path(path)
    f = p / f"{sweep.name}.json" if p.is_dir() else p
    if not f.is_file():
        raise UserError(f"--from-export {str(path)!r}: no export of sweep {sweep.name!r} there (looked for {f}); "
                        "give the export/ folder an `ltfm report` wrote, or its JSON file")
    return f


def read_export(sweep, path: str | Path) -> ReportData:
    """The :class:`ReportData` an export holds, for ``sweep`` (the sweep file the export was written for)."""
    f = export_file(sweep, path)
    try:
        tree = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"--from-export {str(f)!r} is not a readable JSON file ({e.__class__.__name__})") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT or tree.get("version") != VERSION:
        raise UserError(f"--from-export {str(f)!r} is not a report export (format {FORMAT} version {VERSION})")
    if tree.get("sweep") != sweep.name:
        raise UserError(f"--from-export {str(f)!r} exports sweep {tree.get('sweep')!r}, not {sweep.name!r}: give "
                        "the sweep file it was written for")
    try:
        records = [RunRecord(**{k: v for k, v in r.items() if k in _FIELDS}) for r in tree["records"]]
        boot = tree["bootstrap"]
        bootstrap = ({k: dict(v) for k, v in (boot.get("tests") or {}).items()}, list(boot.get("notes") or []),
                     boot.get("signature"))
        planned = dict(tree.get("planned") or {})
    except (KeyError, TypeError, AttributeError) as e:
        raise UserError(f"--from-export {str(f)!r}: malformed export ({e.__class__.__name__}: {e})") from None
    return ReportData(sweep, records, f"export {f.name} (of {tree.get('source')})", planned, None,
                      list(tree.get("notes") or []), bootstrap=bootstrap, run_info=tree.get("run_info"))
