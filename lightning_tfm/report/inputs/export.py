"""What a Table 3 report is built from, as one JSON file: every record's curve and summary, no checkpoints.

``ltfm report`` writes ``<out>/export/<sweep name>.json`` (:func:`write_export`) beside the report; committed
with it, it rebuilds the same tables without the results folder, the Optuna storage or W&B:
``ltfm report SWEEP.yaml --from-export DIR`` (:func:`read_export`, through
:func:`lightning_tfm.report.inputs.sources.load_report_data`).

The file holds:

- ``records``: each :class:`~lightning_tfm.report.inputs.records.RunRecord` (one per row and seed): its variant, family,
  seed, status, flat config, parameters, dev loss / PPL / BLEU, steps, the counts its training compute is
  counted from, and its ``history`` (dev loss, dev PPL, dev BLEU and training loss at every logged step); its run
  folder by name only and no dev-hypotheses path;
- ``planned``: the sweep file's config of every row (rows without a run keep their knobs);
- ``bootstrap``: the paired bootstrap as the report computed it (it needs the dev hypotheses, which are not
  exported), and ``run_info`` (wall time, machines: from the Optuna study, which is not exported);
- ``source`` and ``notes``: where the records came from.

An export is a file a user gives: :func:`read_export` checks every field the report reads before anything is
built from it (:func:`check_tree`), and refuses a file that breaks one in one line naming the file, the record and
the field. A record whose run was last trained by another sweep (its ``run.study``) is read at this sweep's budget
(:mod:`.budget`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from ...base.atomic import write_text
from ...base.errors import UserError
from ...training.config.run_id import NAME_BYTES
from ...training.config.sections import LABEL_CHARS
from ...training.runs.results import DEV_BLEU, DEV_LOSS, DEV_PPL, TRAIN_LOSS
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
    tests, notes, signature = table.bootstrap
    return {"format": FORMAT, "version": VERSION, "sweep": data.sweep.name, "sweep_file": data.sweep.path.name,
            "source": data.source, "notes": list(data.notes), "run_info": table.run_info,
            "bootstrap": {"tests": tests, "notes": list(notes), "signature": signature},
            "planned": data.planned, "records": [_record(r) for r in data.records]}


def write_export(data: ReportData, table: dict, out_dir: str | Path) -> Path:
    """``<out_dir>/<sweep name>.json``: the export of the report built from ``data`` (``table``:
    :func:`~lightning_tfm.report.table3.table.build_table` of it)."""
    text = json.dumps(export_data(data, table), indent=1, sort_keys=True, default=str) + "\n"
    try:  # what read_export refuses is not written (a run trained by hand may carry any run.variant): one line
        check_tree(json.loads(text))
    except Refused as e:
        raise UserError(f"the export of sweep {data.sweep.name}: {e}: fix that run's config.yaml in its run folder "
                        "(run.variant, run.family) or move the run out of the results folder") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_text(out / f"{data.sweep.name}.json", text)


def export_file(sweep, path: str | Path, option: str = "--from-export") -> Path:
    """The export file of ``sweep`` at ``path``: the file itself, or ``<path>/<sweep name>.json``; a one-line
    UserError naming ``option`` (the command-line option that gave the path) when it is not there."""
    p = Path(path)
    f = p / f"{sweep.name}.json" if p.is_dir() else p
    if not f.is_file():
        from .records import committed_exports
        found = committed_exports(sweep)
        raise UserError(f"{option} {str(path)!r}: no export of sweep {sweep.name!r} there (looked for {f}); "
                        "give the export/ folder an `ltfm report` wrote, or its JSON file"
                        + (f"; committed with this checkout: {', '.join(map(str, found))}" if found else ""))
    return f


def owned_export(path: Path) -> str | None:
    """``the export of sweep S (...)`` when ``path`` (resolved) is a report's export (a JSON file of
    :data:`FORMAT`): no command writes over one but ``ltfm report`` replacing its own report folder whole (one is
    read by ``--from-export``, ``--against-export``, ``--backtest-to``); else None. The owner
    :func:`lightning_tfm.base.outputs.check_outputs` asks."""
    try:
        if path.suffix != ".json" or not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        tree = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if isinstance(tree, dict) and tree.get("format") == FORMAT:
        return f"the export of sweep {str(tree.get('sweep'))[:80]!r} (every run's curve, summary and config)"
    return None


def owners() -> tuple:
    """Every owner a command's outputs are checked against (:func:`lightning_tfm.base.outputs.check_outputs`): a
    run's files (:func:`~lightning_tfm.training.runs.run_folder.owned_file`) and exports (:func:`owned_export`)."""
    from ...training.runs.run_folder import owned_file

    return owned_file, owned_export


def export_label(f: Path) -> str:
    """An export file as a report names what it read (``table3-cpu/export/table3-cpu.json``: the report folder, its
    export/ and the file), the same on every machine and from every folder."""
    f = Path(f).absolute()
    kept = f.parts[-3:] if f.parent.name == "export" else f.parts[-2:]
    return "/".join(part for part in kept if part != f.anchor)  # (the root "/" is no name)


def read_export(sweep, path: str | Path, option: str = "--from-export") -> ReportData:
    """The :class:`ReportData` an export holds, for ``sweep`` (the sweep file the export was written for);
    ``option``: the command-line option that gave ``path``, named in every error."""
    from .budget import budget_note, of_other_studies

    f = export_file(sweep, path, option)
    where = f"{option} {str(f)!r}"
    try:
        if f.stat().st_size > MAX_BYTES:
            raise UserError(f"{where} is larger than {MAX_BYTES >> 20} MiB: not an export `ltfm report` writes; "
                            "give the export/ folder an `ltfm report` wrote")
        tree = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserError(f"{where} is not a readable JSON file ({e.__class__.__name__}): give the export/ folder an "
                        "`ltfm report` wrote, or its JSON file") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT or tree.get("version") != VERSION:
        raise UserError(f"{where} is not a report export (format {FORMAT} version {VERSION})")
    if tree.get("sweep") != sweep.name:
        shown = tree.get("sweep") if isinstance(tree.get("sweep"), str) else None
        raise UserError(f"{where} exports sweep {shown!r}, not {sweep.name!r}: give the sweep file it was written "
                        "for")
    try:
        check_tree(tree)
    except Refused as e:
        raise UserError(f"{where}: {e}: fix or remove it in the file, or write the export again with `ltfm report "
                        f"{sweep.path.name}` from the runs") from None
    records = [RunRecord(**{k: v for k, v in r.items() if k in _FIELDS}) for r in tree["records"]]
    boot = tree["bootstrap"]
    bootstrap = ({k: dict(v) for k, v in (boot.get("tests") or {}).items()}, list(boot.get("notes") or []),
                 boot.get("signature"))
    notes = list(tree.get("notes") or [])
    if of_other_studies(sweep, records):  # an export of runs a later sweep trained on, written before
        notes += [n for n in [budget_note(records)] if n]
    source = f"export {export_label(f)}, which a report wrote from {tree.get('source')}"  # "export": as views read it
    return ReportData(sweep, records, source, dict(tree.get("planned") or {}),
                      None, notes, bootstrap=bootstrap, run_info=tree.get("run_info"))


# ------------------------------------------------------------------------------------------------ the checks
# Far above any export a report writes (a table of a few dozen rows is a few hundred kB)
MAX_BYTES = 256 << 20
BIG = 10 ** 15          # counts (parameters, steps, tokens) beyond this are no counts
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")   # a variant name, as a sweep file allows it
STATUS = re.compile(r"^[a-z][a-z0-9 _-]{0,39}$")
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_.]*$")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")   # every control character but tab and newline


def read_export_beside(sweep, path: str, option: str) -> ReportData:
    """The ReportData of the export ``path`` (a folder holding one export, or its JSON file) of another sweep, read
    with its own sweep file from beside ``sweep``'s (``--backtest-to``, ``--settle-replay``: ``option``, the option
    that named it, for the errors)."""
    from ...sweep import load_sweep

    p = Path(path)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p] if p.is_file() else []
    if len(files) != 1:
        what = "several JSON files" if files else "no export"
        raise UserError(f"{option} {path!r}: {what} there; give the export/ folder of a sweep's report "
                        "(one JSON file), or its JSON file")
    try:
        tree = json.loads(files[0].read_text(encoding="utf-8"))
        name, sweep_file = tree["sweep"], tree["sweep_file"]
        if not isinstance(name, str) or not isinstance(sweep_file, str):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        raise UserError(f"{option} {str(files[0])!r} is not a report export: give the export/ folder an "
                        "`ltfm report` wrote") from None
    beside = sweep.path.parent / Path(sweep_file).name
    if not beside.is_file():
        raise UserError(f"{option} {path!r}: the export is of sweep {name!r}, whose file {beside.name} is not "
                        f"beside {sweep.path.name}: put it there")
    other = load_sweep(beside)
    if other.name != name:
        raise UserError(f"{option} {path!r}: the export is of sweep {name!r}, but {beside} names sweep "
                        f"{other.name!r}: give the sweep file the export was written for")
    return read_export(other, files[0], option)


class Refused(Exception):
    """A field of an export that the report cannot take; its message names the record and the field."""


def _show(v: Any) -> str:
    if isinstance(v, str):
        return repr(v[:40] + ("..." if len(v) > 40 else ""))
    if isinstance(v, (bool, int, float)) or v is None:
        text = repr(v)
        return text if len(text) <= 40 else f"a {len(text)}-digit number"
    return f"a JSON {'list' if isinstance(v, list) else 'object' if isinstance(v, dict) else type(v).__name__}"


def _refuse(field: str, v: Any, expected: str) -> None:
    raise Refused(f"{field} is {_show(v)}, {expected}")


def _number(field: str, v: Any, lo: float, hi: float, integer: bool = False, optional: bool = True) -> None:
    kind = "an integer" if integer else "a finite number"
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
        _refuse(field, v, f"not {kind}")
    if (isinstance(v, float) and not math.isfinite(v)) or not lo <= v <= hi:  # an int is compared exactly
        _refuse(field, v, f"not {kind} " + (f">= {lo:g}" if hi == math.inf else f"from {lo:g} to {hi:g}"))


def _text(field: str, v: Any, limit: int = 1000, optional: bool = True, free: bool = False) -> None:
    """A text of at most ``limit`` characters, valid Unicode; one line without control characters unless ``free``
    (a run's error note or a config value, as the run wrote them)."""
    if v is None and optional:
        return
    if not isinstance(v, str):
        _refuse(field, v, "not a text")
    if len(v) > limit:
        _refuse(field, v, f"longer than {limit} characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        _refuse(field, v, "not valid Unicode (a lone surrogate)")
    if not free and (CONTROL.search(v) or "\n" in v):
        _refuse(field, v, "not one line of text (it holds a newline or a control character)")


def _name(field: str, v: Any) -> None:
    """A row's name: one line of at most LABEL_CHARS (100) characters. A sweep file's variants are plain names
    (:data:`NAME`), but a run trained by hand may carry any ``run.variant``: the report shows it as text, so its
    export holds it."""
    if not isinstance(v, str) or not v.strip():
        _refuse(field, v, "not a row name (a non-empty text)")
    _text(field, v, LABEL_CHARS, optional=False)


def _list(field: str, v: Any, limit: int = 100_000) -> list:
    if not isinstance(v, list):
        _refuse(field, v, "not a list")
    if len(v) > limit:
        _refuse(field, v, f"a list of more than {limit} items")
    return v


def _config(field: str, cfg: Any) -> None:
    """A flat config: ``section.name`` keys; scalars or lists of scalars; a known key's value of its type."""
    from ...training.config.config import SCHEMA, Config, set_dotted

    if not isinstance(cfg, dict):
        _refuse(field, cfg, "not an object of section.name keys")
    for key, v in cfg.items():
        if not KEY.match(key) or len(key) > 200:
            _refuse(f"{field} key", key, "not a section.name key")
        for item in (v if isinstance(v, list) else [v]):
            if isinstance(item, (dict, list)):
                _refuse(f"{field}[{key}]", v, "not a value or a list of values")
            elif isinstance(item, str):
                _text(f"{field}[{key}]", item, 10_000, free=True)
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                _number(f"{field}[{key}]", item, -BIG, BIG)
        if isinstance(v, list):
            _list(f"{field}[{key}]", v, 1000)
        sec, _, name = key.partition(".")
        if name in SCHEMA.get(sec, {}):
            try:
                set_dotted(Config(), key, v)
            except UserError:
                _refuse(f"{field}[{key}]", v, "not of the type the config takes")


def _run_name(field: str, v: Any) -> None:
    """A run folder's name, as run_id.check_run_id allows it (run.name may hold spaces or any letters): one line
    of at most NAME_BYTES bytes, no path."""
    _text(field, v, NAME_BYTES)
    if v is not None and (len(v.encode("utf-8")) > NAME_BYTES or v in ("", ".", "..") or any(c in v for c in "/\\")):
        _refuse(field, v, "not a run folder's name (no path)")


# RunRecord field -> its check (a record's other keys are ignored, as an older reader ignores newer fields)
def _record_checks() -> dict:
    count, big_int = (lambda f, v: _number(f, v, 0, BIG, True)), (lambda f, v: _number(f, v, -BIG, BIG, True))
    return {
        "variant": lambda f, v: _name(f, v), "family": lambda f, v: _text(f, v, LABEL_CHARS), "seed": big_int,
        "status": lambda f, v: None if isinstance(v, str) and STATUS.match(v) else _refuse(
            f, v, "not a status (completed, failed, pruned, ...)"),
        "config": _config, "params": count, "steps": count, "trial": count,
        "dev_loss": lambda f, v: _number(f, v, 0, math.inf), "dev_ppl": lambda f, v: _number(f, v, 1, math.inf),
        "dev_bleu": lambda f, v: _number(f, v, 0, 100), "wall_time_s": lambda f, v: _number(f, v, 0, math.inf),
        "train_tokens": lambda f, v: _number(f, v, 0, BIG), "vocab_size": lambda f, v: _number(f, v, 1, BIG, True),
        "effective_batch_tokens": lambda f, v: _number(f, v, 1, BIG, True),
        "src_len": lambda f, v: _number(f, v, 1e-9, 1e9), "tgt_len": lambda f, v: _number(f, v, 1e-9, 1e9),
        "hyps": lambda f, v: None if v is None else _refuse(f, v, "not null (an export holds no path)"),
        "run": _run_name,
        "note": lambda f, v: _text(f, v, 10_000, free=True), "bleu_signature": lambda f, v: _text(f, v, 300),
        "started_at": lambda f, v: _text(f, v, 64), "finished_at": lambda f, v: _text(f, v, 64),
        "host": lambda f, v: _text(f, v, 255), "precision": lambda f, v: _text(f, v, 40),
        "later_attempt": lambda f, v: _text(f, v, 200), "history": _history,
    }


# history key -> (lowest, highest) value
_HISTORY = {DEV_LOSS: (0, math.inf), DEV_PPL: (1, math.inf), DEV_BLEU: (0, 100), TRAIN_LOSS: (0, math.inf)}


def _history(field: str, rows: Any) -> None:
    seen = set()
    for i, row in enumerate(_list(field, rows)):
        if not isinstance(row, dict):
            _refuse(f"{field}[{i}]", row, "not an object {step, dev/ppl, ...}")
        step = row.get("step")
        _number(f"{field}[{i}].step", step, 0, BIG, integer=True, optional=False)
        if step in seen:
            _refuse(f"{field}[{i}].step", step, "a step given twice")
        seen.add(step)
        for key, v in row.items():
            if key != "step" and key not in _HISTORY:
                _refuse(f"{field}[{i}] key", key, f"not one of step, {', '.join(_HISTORY)}")
            if key != "step":
                _number(f"{field}[{i}].{key}", v, *_HISTORY[key], optional=False)


def _test(field: str, t: Any) -> None:
    if not isinstance(t, dict):
        _refuse(field, t, "not an object")
    for key in ("p_value", "tested", "differing", "sentences", "seeds"):
        if key not in t:
            raise Refused(f"{field} has no {key}")
    _number(f"{field}.p_value", t["p_value"], 0, 1, optional=False)
    if not isinstance(t["tested"], bool):
        _refuse(f"{field}.tested", t["tested"], "not true or false")
    _number(f"{field}.differing", t["differing"], 0, BIG, True, optional=False)
    _number(f"{field}.sentences", t["sentences"], 0, BIG, True, optional=False)
    for s in _list(f"{field}.seeds", t["seeds"], 10_000):
        _number(f"{field}.seeds", s, -BIG, BIG, True)
    for key in ("score", "base_score"):
        _number(f"{field}.{key}", t.get(key), 0, 100)
    _text(f"{field}.signature", t.get("signature"), 300)


def _run_info(info: Any) -> None:
    if info is None:
        return
    if not isinstance(info, dict):
        _refuse("run_info", info, "not an object")
    for key in ("wall_s", "train_s"):
        _number(f"run_info.{key}", info.get(key), 0, math.inf)
    for key in ("runs", "records"):
        _number(f"run_info.{key}", info.get(key), 0, BIG, True)
    for key in ("machines", "precisions"):
        for v in _list(f"run_info.{key}", _given(info, key, []), 10_000):
            _text(f"run_info.{key}", v, 300)


def _given(tree: dict, key: str, default):
    """``tree[key]``, ``default`` when it is absent or null (an empty list is no empty object)."""
    v = tree.get(key)
    return default if v is None else v


def _rows(field: str, rows: Any, check) -> None:
    """An object of rows (``bootstrap.tests``, ``planned``): each key a variant's name, each value checked by
    ``check(f"{field}.{variant}", value)``."""
    if not isinstance(rows, dict):
        _refuse(field, rows, "not an object of rows")
    for variant, value in rows.items():
        _name(f"{field} key", variant)
        check(f"{field}.{variant}", value)


def check_tree(tree: dict) -> None:
    """Every field of an export the report reads, checked (the module docstring): :class:`Refused` on the first
    that breaks its rule."""
    checks = _record_checks()
    records = tree.get("records")
    if not isinstance(records, list):
        _refuse("records", records, "not a list of records")
    seen: dict[tuple, int] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise Refused(f"record {i} is {_show(rec)}, not an object")
        if "variant" not in rec:
            raise Refused(f"record {i} has no variant")
        variant, seed = rec.get("variant"), rec.get("seed")
        label = f"record {i}" + (f" ({variant} seed {seed})" if isinstance(variant, str) and NAME.match(variant)
                                 and len(variant) <= LABEL_CHARS and (seed is None or isinstance(seed, int)) else "")
        try:
            for key, check in checks.items():
                if key in rec:
                    check(key, rec[key])
        except Refused as e:
            raise Refused(f"{label}: {e}") from None
        if (variant, seed) in seen:
            raise Refused(f"{label} repeats record {seen[(variant, seed)]} (the same variant and seed): one run a "
                          "seed")
        seen[(variant, seed)] = i
    boot = tree.get("bootstrap")
    if not isinstance(boot, dict):
        _refuse("bootstrap", boot, "not an object {tests, notes, signature}")
    _rows("bootstrap.tests", _given(boot, "tests", {}), _test)
    for note in _list("bootstrap.notes", _given(boot, "notes", [])):
        _text("bootstrap.notes", note, 2000)
    _text("bootstrap.signature", boot.get("signature"), 300)
    _rows("planned", _given(tree, "planned", {}), _config)
    for note in _list("notes", _given(tree, "notes", [])):
        _text("notes", note, 2000)
    _text("source", tree.get("source"), 1000)
    _text("sweep_file", tree.get("sweep_file"), 1000)
    _run_info(tree.get("run_info"))
