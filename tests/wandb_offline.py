"""Read an offline W&B run back from its ``run-<id>.wandb`` file (tests only; no mocking of wandb).

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
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

HEADER = struct.Struct("<4sHB")
RECORD_HEADER = struct.Struct("<IHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbFileError(Exception):
    pass


def read_records(path: str | Path) -> list[pb.Record]:
    """Every Record of a ``.wandb`` file, in order. Raises on a bad header, checksum or fragment order;
    a record cut off at the end of the file (a run still writing or killed) is ignored."""
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
            record.ParseFromString(payload)
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
    ``{"_step", "trainer/global_step", "columns", "data", "path"}``."""

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

    def metric(self, key: str, step_key: str = "trainer/global_step") -> list[tuple[Any, Any]]:
        """[(step, value)] of one history key, the step taken from ``step_key``."""
        return [(row.get(step_key), row[key]) for row in self.history if key in row]


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
    run = OfflineRun(path=path)
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
                    table = json.loads((files_dir / value["path"]).read_text())
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


def read_runs(root: str | Path) -> list[OfflineRun]:
    """Every offline run below ``root``, in file-name (= start time) order."""
    return [read_run(p) for p in find_run_files(root)]
