"""An offline (or not yet deleted online) W&B run read back from its ``run-<id>.wandb`` files, without a server:
``ltfm runs RUN --wandb`` (:func:`read_run_folder`, :func:`format_run`) and the tests that check what a run
logged.

wandb 0.31 writes no config.yaml / wandb-summary.json / wandb-history.jsonl offline, and ships no Python
reader for its transaction log (the Go core writes it). The format, checked against the files wandb
0.31.0 writes (and the LevelDB log format it is modelled on):

    file   := header block*
    header := ident ":W&B" (4 bytes) | magic 0xBEE1 (uint16 LE) | version 0 (uint8)      -- 7 bytes
    block  := record* trailer?      -- 32 KiB blocks; the file header counts in the first block
    record := crc32 (uint32 LE) | length (uint16 LE) | type (uint8) | data[length]       -- 7-byte header
    type   := 1 FULL | 2 FIRST | 3 MIDDLE | 4 LAST;  a block tail shorter than 7 bytes is zero padding

The checksum is zlib's CRC-32 (IEEE, unmasked) of the type byte followed by the data -- not LevelDB's
masked CRC-32C. Each reassembled payload is one ``wandb.proto.wandb_internal_pb2.Record``.

Offline, a logged ``wandb.Table`` is a history entry of ``_type: "table-file"`` whose ``path`` is a JSON
file (``{"columns": [...], "data": [[...], ...]}``) under the run folder's ``files/`` directory.

Where a training run's files are (:mod:`.tracking`): ``<wandb.dir or run folder>/wandb/offline-run-<time>-<id>/
run-<id>.wandb`` (``run-<time>-<id>/`` online), the id in ``<run folder>/wandb_id.txt``. A resumed training
continues the same W&B run: offline, each attempt is one more folder of the same id (a *segment*), which
``wandb sync`` uploads into one run; :func:`merge` reads them as that one run.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...base.errors import UserError

HEADER = struct.Struct("<4sHB")
RECORD_HEADER = struct.Struct("<IHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

#: The file in a run folder that holds its W&B run id (:mod:`.tracking` writes it, under this name).
ID_FILE = "wandb_id.txt"
_RUN_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")


class WandbFileError(Exception):
    pass


def read_records(path: str | Path) -> list[Any]:  # wandb_internal_pb2.Record
    """Every Record of a ``.wandb`` file, in order. Raises on a bad header, checksum, length or fragment order;
    a record cut off at the end of the file (a run still writing or killed) is ignored."""
    # imported here, not at the top: `ltfm train` imports this module for ID_FILE, and importing wandb costs a
    # run that logs nothing to W&B (wandb.mode: disabled) 1.2 s of its start
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if len(data) < HEADER.size:
        raise WandbFileError(f"{path}: too short for a W&B header")
    ident, magic, version = HEADER.unpack_from(data, 0)
    if (ident, magic, version) != (IDENT, MAGIC, VERSION):
        raise WandbFileError(f"{path}: bad header {ident!r} {magic:#x} {version}")
    records, pending, pos = [], None, HEADER.size
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER.size:  # block trailer: zero padding
            pos += left
            continue
        if pos + RECORD_HEADER.size > len(data):
            break
        crc, length, rtype = RECORD_HEADER.unpack_from(data, pos)
        if rtype == 0 and length == 0:  # zeroed rest of a block
            pos += left
            continue
        start = pos + RECORD_HEADER.size
        if length > left - RECORD_HEADER.size:  # a fragment never crosses its block: a damaged header
            raise WandbFileError(f"{path}: record at byte {pos} runs past its block (damaged length)")
        if start + length > len(data):
            break  # truncated last record
        chunk = data[start:start + length]
        if zlib.crc32(bytes([rtype]) + chunk) & 0xFFFFFFFF != crc:
            raise WandbFileError(f"{path}: checksum mismatch at byte {pos}")
        pos = start + length
        if rtype == FULL:
            if pending is not None:
                raise WandbFileError(f"{path}: FULL record inside a fragmented one at byte {pos}")
            payloads = [chunk]
        elif rtype == FIRST:
            pending, payloads = [chunk], []
        elif rtype in (MIDDLE, LAST):
            if pending is None:
                raise WandbFileError(f"{path}: {('MIDDLE', 'LAST')[rtype - 3]} fragment without FIRST")
            pending.append(chunk)
            payloads = []
            if rtype == LAST:
                payloads, pending = [b"".join(pending)], None
        else:
            raise WandbFileError(f"{path}: unknown record type {rtype} at byte {pos}")
        for payload in payloads:
            record = pb.Record()
            try:
                record.ParseFromString(payload)
            except DecodeError:
                raise WandbFileError(f"{path}: a record ending at byte {pos} is not a W&B record") from None
            records.append(record)
    return records


def _item_key(item) -> list[str]:
    return list(item.nested_key) if item.nested_key else [item.key]


def _set_nested(target: dict, keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        target = target.setdefault(k, {})
        if not isinstance(target, dict):
            return
    target[keys[-1]] = value


def _remove_nested(target: dict, keys: list[str]) -> None:
    for k in keys[:-1]:
        target = target.get(k)
        if not isinstance(target, dict):
            return
    target.pop(keys[-1], None)


def _value(item) -> Any:
    return json.loads(item.value_json) if item.value_json else None


@dataclass
class OfflineRun:
    """What one offline run holds. ``history`` rows map keys to values and always carry ``_step``
    (wandb's own row counter); tables map a key to the list of logged tables, each
    ``{"_step", "trainer/global_step", "columns", "data", "path"}``. ``paths`` are the files read (one, or
    the segments of a resumed run, oldest first: :func:`merge`)."""

    path: Path
    run_id: str = ""
    project: str = ""
    entity: str = ""
    group: str = ""
    job_type: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    resumed: bool = False
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    output: str = ""
    exit_code: int | None = None
    paths: list[Path] = field(default_factory=list)

    def metric(self, key: str, step_key: str = "trainer/global_step") -> list[tuple[Any, Any]]:
        """[(step, value)] of one history key, the step taken from ``step_key``."""
        return [(row.get(step_key), row[key]) for row in self.history if key in row]

    @property
    def offline(self) -> bool:
        """True when the run was logged offline (its folder is ``offline-run-*``; ``wandb sync`` uploads it)."""
        return self.path.parent.name.startswith("offline-run-")


def find_run_files(root: str | Path) -> list[Path]:
    """All ``run-<id>.wandb`` files below ``root`` (a run folder, a wandb dir or one offline-run dir)."""
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(root.rglob("run-*.wandb"))


def read_run(path: str | Path) -> OfflineRun:
    """Parse one ``run-<id>.wandb`` file (or the single one below a folder) into an OfflineRun."""
    path = Path(path)
    if path.is_dir():
        files = find_run_files(path)
        if len(files) != 1:
            raise WandbFileError(f"{path}: expected one run-*.wandb file, found {len(files)}")
        path = files[0]
    run = OfflineRun(path=path, paths=[path])
    files_dir = path.parent / "files"
    output: list[str] = []
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id, run.project, run.entity = r.run_id, r.project, r.entity
            run.group, run.job_type, run.name = r.run_group, r.job_type, r.display_name
            run.tags, run.resumed = list(r.tags), r.resumed
            for item in r.config.update:
                _set_nested(run.config, _item_key(item), _value(item))
            for item in r.summary.update:
                _set_nested(run.summary, _item_key(item), _value(item))
        elif kind == "config":
            for item in record.config.update:
                _set_nested(run.config, _item_key(item), _value(item))
            for item in record.config.remove:
                _remove_nested(run.config, _item_key(item))
        elif kind == "summary":
            for item in record.summary.update:
                _set_nested(run.summary, _item_key(item), _value(item))
            for item in record.summary.remove:
                _remove_nested(run.summary, _item_key(item))
        elif kind == "history":
            row: dict = {}
            for item in record.history.item:
                _set_nested(row, _item_key(item), _value(item))
            row.setdefault("_step", record.history.step.num)
            run.history.append(row)
            for key, value in row.items():
                if isinstance(value, dict) and value.get("_type") == "table-file":
                    table = json.loads(_own_file(files_dir, str(value.get("path")), path).read_text())
                    run.tables.setdefault(key, []).append({
                        "_step": row["_step"], "trainer/global_step": row.get("trainer/global_step"),
                        "columns": table["columns"], "data": table["data"], "path": value["path"]})
        elif kind == "environment":
            if record.environment.args:
                run.args = list(record.environment.args)
        elif kind == "output_raw":
            output.append(record.output_raw.line)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    run.config.pop("_wandb", None)
    for key in ("_wandb", "_runtime", "_timestamp"):
        run.summary.pop(key, None)
    run.output = "".join(output)
    return run


def _own_file(folder: Path, name: str, wandb_file: Path) -> Path:
    """``folder / name`` when it is a regular file inside ``folder`` (a table a run logged), else a
    :class:`WandbFileError`: a record names no file outside its run's ``files/`` folder, nor a link or a folder."""
    target = folder / name
    inside = os.path.realpath(target).startswith(os.path.realpath(folder) + os.sep)
    if not inside or not stat.S_ISREG(_lstat_mode(target)):
        raise WandbFileError(f"{wandb_file}: its table file {name!r} is not a file in {folder}")
    return target


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def read_runs(root: str | Path) -> list[OfflineRun]:
    """Every offline run below ``root``, in file-name (= start time) order."""
    return [read_run(p) for p in find_run_files(root)]


def _update(target: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _update(target[key], value)
        else:
            target[key] = value


def merge(segments: list[OfflineRun]) -> OfflineRun:
    """The segments of one W&B run (oldest first: a training and its resumptions) as the one run ``wandb sync``
    uploads: the newest segment's name, tags and exit code; config and summary updated segment by segment;
    history, tables and console output one after the other."""
    if not segments:
        raise ValueError("merge needs at least one segment")
    last = segments[-1]
    run = OfflineRun(path=last.path, paths=[p for s in segments for p in s.paths], resumed=len(segments) > 1)
    for s in segments:
        for name in ("run_id", "project", "entity", "group", "job_type", "name", "tags", "args"):
            if getattr(s, name):
                setattr(run, name, getattr(s, name))
        _update(run.config, s.config)
        _update(run.summary, s.summary)
        run.history += s.history
        for key, tables in s.tables.items():
            run.tables.setdefault(key, []).extend(tables)
        run.output += s.output
    run.exit_code = last.exit_code
    return run


# ------------------------------------------------------------------------------------ a run folder's W&B run
_FOLDER = re.compile(r"(?:offline-)?run-(?P<time>\d{8}_\d{6})-(?P<id>[A-Za-z0-9_\-]+?)(?:-(?P<n>\d+))?")


def run_folders(wandb_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """wandb's run folders in ``wandb_dir`` (``offline-run-<time>-<id>``, ``run-<time>-<id>``; wandb adds
    ``-<n>`` to a second one started in the same second) holding a ``run-<id>.wandb`` file, only those of
    ``run_id`` when given, oldest first."""
    found = []
    root = Path(wandb_dir)
    if not root.is_dir():
        return []
    for p in root.iterdir():
        m = _FOLDER.fullmatch(p.name)
        # any entry of that name (a folder, a link): it claims the segment, and reading it says what it is
        if m and (run_id is None or m["id"] == run_id) and os.path.lexists(p / f"run-{m['id']}.wandb"):
            found.append((m["time"], int(m["n"] or 0), p))
    return [p for *_, p in sorted(found)]


def _run_id_of(folder: Path) -> str:
    return _FOLDER.fullmatch(folder.name)["id"]


def run_files(run_dir: str | Path, summary: dict | None = None) -> list[Path]:
    """The ``.wandb`` files of the W&B run of a run folder (the segments of one run, oldest first), or [].

    The W&B run is the one named in ``<run_dir>/wandb_id.txt`` (else in ``summary["wandb_run_id"]``; else
    the newest run in the folder's own ``wandb/``). Its files are looked for in ``<run_dir>/wandb/``, in the
    folder ``summary["wandb_dir"]`` names and in ``<wandb.dir>/wandb/`` of the summary's config; a segment found
    in several of them (a copied results folder) is read from the first."""
    run_dir = Path(run_dir)
    summary = summary or {}
    run_id = None
    id_file = run_dir / ID_FILE
    if id_file.is_file():
        text = id_file.read_text(errors="replace").strip()
        run_id = text if _RUN_ID.fullmatch(text) else None
    run_id = run_id or summary.get("wandb_run_id") or None
    dirs = [run_dir / "wandb"]
    configured = ((summary.get("config") or {}).get("wandb") or {}).get("dir")
    if run_id and summary.get("wandb_dir"):  # elsewhere (wandb.dir may be shared by many runs): by id only
        dirs.append(Path(summary["wandb_dir"]).parent)
    if run_id and isinstance(configured, str) and configured:
        dirs.append(Path(configured) / "wandb")
    seen, folders = set(), []
    for d in dirs:  # a segment is named by its folder: the run folder's own copy first (a copied results folder)
        for folder in run_folders(d, run_id):
            if folder.name not in seen:
                seen.add(folder.name)
                folders.append(folder)
    if run_id is None and folders:  # no id recorded: the newest run of the folder's own wandb/
        run_id = _run_id_of(folders[-1])
        folders = [f for f in folders if _run_id_of(f) == run_id]
    folders.sort(key=lambda f: (_FOLDER.fullmatch(f.name)["time"], int(_FOLDER.fullmatch(f.name)["n"] or 0)))
    return [f / f"run-{_run_id_of(f)}.wandb" for f in folders]


def read_run_folder(run_dir: str | Path, summary: dict | None = None) -> OfflineRun:
    """The W&B run of a run folder (:func:`run_files`), its segments merged. A folder without one, or an
    unreadable file, is a :class:`UserError` saying which."""
    files = run_files(run_dir, summary)
    if not files:
        mode = (summary or {}).get("wandb_mode")
        why = f" (its summary.json says W&B was {mode})" if mode == "disabled" else ""
        raise UserError(f"{run_dir} has no W&B run files (wandb/offline-run-*/run-*.wandb){why}: give a run "
                        "trained with wandb.mode offline or online")
    for f in files:
        if (why := _not_own(f)) is not None:
            raise UserError(f"cannot read the W&B run of {run_dir}: {f} {why}, not a W&B file of this run: remove it "
                            "(or put the run's own file there)")
    try:
        segments = [read_run(f) for f in files]
    except (WandbFileError, OSError, ValueError, KeyError, TypeError) as e:  # a file damaged or cut short
        raise UserError(f"cannot read the W&B run of {run_dir}: {e}") from None
    for f, segment in zip(files, segments):
        if segment.run_id and segment.run_id != _run_id_of(f.parent):
            raise UserError(f"cannot read the W&B run of {run_dir}: {f} holds W&B run {segment.run_id}, not "
                            f"{_run_id_of(f.parent)} as its name says: remove it (or put the run's own file there)")
    return merge(segments)


def _not_own(path: Path) -> str | None:
    """None when ``path`` is a regular file (not a link: a link may lead to another run's file, or loop), else what
    it is."""
    mode = _lstat_mode(path)
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            os.stat(path)
        except OSError as e:
            return "is a symbolic link that loops" if e.errno == errno.ELOOP else "is a symbolic link to nothing"
        return f"is a symbolic link to {os.path.realpath(path)}"
    return "is a folder" if stat.S_ISDIR(mode) else "is not a regular file"


# ------------------------------------------------------------------------------------------------ showing it
def flat(tree: dict, prefix: str = "") -> dict:
    """Nested dicts as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); a logged media or table value
    (a dict with ``_type``) stays one value."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and "_type" not in value:
            out.update(flat(value, name + "."))
        else:
            out[name] = value
    return out


def history_keys(run: OfflineRun) -> dict[str, dict]:
    """Each logged history key (wandb's own ``_``-keys aside), in first-logged order: ``{"steps": rows that
    hold it, "last_step": trainer/global_step (else _step) of the last, "last": its last value}``."""
    keys: dict[str, dict] = {}
    for row in run.history:
        step = row.get("trainer/global_step", row.get("_step"))
        for key, value in flat(row).items():
            if key.startswith("_"):
                continue
            entry = keys.setdefault(key, {"steps": 0, "last_step": None, "last": None})
            entry["steps"] += 1
            entry["last_step"], entry["last"] = step, value
    return keys


def describe(run: OfflineRun) -> dict:
    """The run as plain data (``ltfm runs RUN --wandb --json``); wandb's own ``_``-keys of the summary aside."""
    return {"run_id": run.run_id, "mode": "offline" if run.offline else "online", "project": run.project,
            "entity": run.entity or None, "group": run.group, "job_type": run.job_type, "name": run.name,
            "tags": run.tags, "exit_code": run.exit_code, "files": [str(p) for p in run.paths],
            "config": flat(run.config), "history_rows": len(run.history),
            "summary": {k: v for k, v in flat(run.summary).items() if not k.startswith("_")},
            "history": history_keys(run)}


def _shown(value: Any, width: int = 60) -> str:
    if isinstance(value, dict) and value.get("_type") == "table-file":
        return f"table {value.get('nrows', '?')}x{value.get('ncols', '?')} ({value.get('path', '')})"
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:.6g}" if math.isfinite(value) else str(value)
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def _aligned(rows: list[tuple[str, ...]], right: set[int] = frozenset()) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def format_run(run: OfflineRun) -> str:
    """The run for a terminal: who it is, its files, its config and summary (a line a key) and its history
    keys with the number of rows that hold each, the step of the last one and the last value."""
    d = describe(run)
    ident = ", ".join(f"{label} {d[key]}" for label, key in (("project", "project"), ("entity", "entity"),
                      ("group", "group"), ("job type", "job_type"), ("name", "name")) if d[key])
    exit_text = {None: "no exit recorded (still running, or killed)", 0: "exit 0"}.get(run.exit_code,
                                                                                      f"exit {run.exit_code}")
    lines = [f"W&B run {run.run_id} ({d['mode']}): {ident}" + (f"; tags {', '.join(run.tags)}" if run.tags else "")
             + f"; {exit_text}"]
    segments = f" ({len(run.paths)} segments: a resumed training)" if len(run.paths) > 1 else ""
    lines.append(f"files{segments}: {', '.join(map(str, run.paths))}")
    if run.offline:
        lines.append(f"upload: wandb sync {' '.join(str(p.parent) for p in run.paths)}")
    for title, values in (("config", d["config"]), ("summary", d["summary"])):
        lines += ["", f"{title} ({len(values)} keys)"]
        lines += _aligned([(k, _shown(v)) for k, v in values.items()])
    lines += ["", f"history ({len(d['history'])} keys, {len(run.history)} rows)"]
    rows = [("key", "steps", "last step", "last value")]
    rows += [(k, str(e["steps"]), "-" if e["last_step"] is None else str(e["last_step"]), _shown(e["last"]))
             for k, e in d["history"].items()]
    lines += _aligned(rows, right={1, 2}) if len(rows) > 1 else []
    return "\n".join(lines)
