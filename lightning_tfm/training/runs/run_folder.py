"""A run folder's life: the lock that lets one process train it, its earlier summary and attempts,
whether it is already done, whether a config may train in it (:func:`reuse_problem`: the one comparison of a
folder's saved config with the one asked for, which ``ltfm train``, the sweep and the checkpoint loader use), and
the one-line errors of a results folder that cannot be written.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from ...base.atomic import free_space
from ...base.errors import UserError
from ..config import config
from ..config import run_id as ids
from ..config.config import Config
from ..data import corpus_id
from . import results, upgrade


def rank_zero() -> bool:
    """Whether this process is a run's global rank 0, before its Trainer exists: torchrun's and Lightning's launcher's
    ``RANK``/``LOCAL_RANK``/``NODE_RANK``, else Slurm's ``SLURM_PROCID`` (a run whose ranks are a step's tasks)."""
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", os.environ.get("SLURM_PROCID", "0")))
    return int(rank) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def check_writable(results_dir: Path) -> None:
    """Try to create (and remove) a folder in the nearest existing ancestor: os.access says yes to root."""
    import tempfile

    p = results_dir.absolute()
    while not p.exists():
        p = p.parent
    try:
        if not p.is_dir():
            raise NotADirectoryError(p)
        tempfile.TemporaryDirectory(dir=p).cleanup()
    except OSError as e:
        raise UserError(f"results folder {str(results_dir)!r} is not writable ({e.strerror or e.__class__.__name__}; "
                        f"{free_space(p)} free): set run.results_dir to a folder you can write") from None


# Errors that mean "the results folder cannot take this write": the user's to fix (exit 2), not a crash.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


# ... as some libraries (tokenizers, torch's C++ writer) report them: as text, not an OSError
CANNOT_WRITE = "cannot write in"  # how a storage error's line starts: the sweep worker looks for it

_STORAGE_TEXTS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "file write failed")


def storage_error(exc: BaseException, run_dir: Path) -> UserError | None:
    """A one-line UserError naming the folder and its free space when ``exc`` (or its cause) is a failed
    write into the results folder (disk full, quota, read-only, permission), else None."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            what = e.strerror or os.strerror(e.errno)
            break
        if any(t in str(e) for t in _STORAGE_TEXTS):
            what = next(t for t in _STORAGE_TEXTS if t in str(e))
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    return UserError(f"{CANNOT_WRITE} {run_dir} ({what}; {free_space(run_dir)} free there): free space, or set "
                     f"run.results_dir to a writable folder, then run the same command again to resume")


def write_problem(results_dir: Path, size: int = 1 << 16) -> str | None:
    """Why the results folder cannot take a write now (``No space left on device; 0 bytes free``), or None:
    a small file is written, flushed to the filesystem and removed (a folder alone can be made on a full disk)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=results_dir, prefix=".ltfm-probe-") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return f"{e.strerror or e.__class__.__name__}; {free_space(results_dir)} free"
    return None


LOCK_FILE = "train.lock"

#: When set, every acquisition and release of a run's lock is appended to this file as one JSON line (run id,
#: event, pid, host, time, and at acquisition the previous holder the lock file named and whether it was still
#: alive): the audit trail in which ``tests/soak/soak.py`` checks that no two processes ever trained one run.
LOCK_LOG_ENV = "LTFM_LOCK_LOG"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists and has not exited (a zombie has released its locks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
    except (OSError, IndexError):
        pass
    try:  # no /proc (macOS): a signal 0 tells whether the process exists
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def audit(rid: str, event: str, **fields) -> None:
    """Append one line to the lock audit log (``$LTFM_LOCK_LOG``), if one is asked for; never fails."""
    path = os.environ.get(LOCK_LOG_ENV)
    if not path:
        return
    line = json.dumps({"run": rid, "event": event, "pid": os.getpid(), "host": socket.gethostname(),
                       "t": time.time(), **fields}) + "\n"
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write of one line with O_APPEND: lines never interleave
        finally:
            os.close(fd)


class RunLock:
    """One training per run folder: an exclusive ``flock`` on ``<run>/train.lock``, held while the
    process trains. The kernel releases it when the process ends in any way (exit, crash, SIGKILL), so
    there is no stale lock to clean up. The file records the holder's host and pid for the message
    the second process prints. (flock works across NFS clients on Linux >= 2.6.12, as POSIX locks.)"""

    def __init__(self, run_dir: Path, rid: str):
        self.path, self.rid, self.fd = run_dir / LOCK_FILE, rid, None

    def __enter__(self) -> "RunLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            finally:
                os.close(fd)
            who = (f"pid {holder.get('pid')} on host {holder.get('host')}" if isinstance(holder, dict) and
                   holder.get("pid") else "another process")
            raise UserError(f"run {self.rid} {results.RUN_LOCKED} {who} (lock {self.path}): "
                            "wait for it to finish or stop "
                            f"it; running the same command afterwards resumes the run") from None
        self.fd = fd
        if os.environ.get(LOCK_LOG_ENV):
            try:
                before = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                before = {}
            mine = isinstance(before, dict) and before.get("host") == socket.gethostname()
            prev = before.get("pid") if mine else None
            audit(self.rid, "acquire", prev_pid=prev, prev_alive=_alive(prev) if isinstance(prev, int) else None)
        with contextlib.suppress(OSError):  # a full disk must not stop the holder itself
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode() + b"\n", 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            audit(self.rid, "release")  # before the close: no other process can hold the lock yet
            os.close(self.fd)  # releases the flock
            self.fd = None


def lock_free(run_dir: Path) -> bool:
    """Whether no process holds ``run_dir``'s training lock now (taken and released at once to find out)."""
    import fcntl

    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases it, if taken
    return True


def previous_summary(summary_path: Path) -> dict | None:
    """The run's earlier summary, or None. An unusable one (truncated, hand-edited) is set aside with a
    warning; a fresh summary is written and the checkpoints are kept."""
    prev, problem = results.load_summary(summary_path.parent)
    if problem is not None:
        dest = summary_path.with_name(f"summary.json.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(summary_path, dest)
            kept = f"moved to {dest.name}"
        except OSError:
            kept = "left as it is"
        print(f"ltfm: warning: {summary_path} {problem}; {kept}; writing a fresh summary (checkpoints are kept)",
              file=sys.stderr)
    return prev


def attempts(prev: dict | None) -> list[dict]:
    """Every earlier attempt of the run, newest last: a continuation that fails never erases results."""
    if not prev:
        return []
    earlier = [a for a in prev.get("attempts") or [] if isinstance(a, dict)]
    return earlier + [{k: v for k, v in prev.items() if k not in ("attempts", "config")}]


def holds_run(run_dir: Path) -> bool:
    """Whether a folder holds a run: a summary, a checkpoint, or a process training it now."""
    try:
        return (run_dir / "summary.json").is_file() or any((run_dir / "checkpoints").glob("*.ckpt")) or \
            not lock_free(run_dir)
    except OSError:
        return False


#: The files of a run folder its training writes and reads back, with what each is for: no other command writes
#: over them (:func:`owned_file`). ``checkpoints/average.ckpt`` is ``ltfm average``'s (and training's, with
#: decode.average_last), ``hyps/`` holds ``ltfm evaluate``'s files beside training's dev and test hypotheses.
OWNED = ((re.compile(r"config\.yaml"), "config (config.yaml), which a resume and every reader check"),
         (re.compile(r"summary\.json"), "summary (summary.json), which ltfm runs, sweeps and reports read"),
         (re.compile(r"tokenizer\.json"), "vocabulary (tokenizer.json), which every checkpoint is decoded with"),
         (re.compile(r"checkpoints/last\.ckpt"), "resume point (checkpoints/last.ckpt)"),
         (re.compile(r"checkpoints/best\.ckpt"), "best checkpoint (checkpoints/best.ckpt)"),
         (re.compile(r"checkpoints/step=\d+(-v\d+)?\.ckpt"), "step checkpoint ({}), which resumes and averages read"),
         (re.compile(r"checkpoints/average\.ckpt"), "averaged checkpoint (checkpoints/average.ckpt, which `ltfm "
                                                    "average RUN` writes)"),
         (re.compile(r"hyps/(dev|test)\.[^./]+\.txt"), "dev or test hypotheses ({}), which its BLEU and the report's "
                                                      "bootstrap read"),
         (re.compile(r"(logs|wandb)/.+"), "record ({}), which its curves are read from"))


def is_run_folder(folder: Path) -> bool:
    """A folder ``ltfm train`` made: its ``config.yaml`` or ``summary.json`` is there."""
    return (folder / "config.yaml").is_file() or (folder / "summary.json").is_file()


def owned_file(path: Path) -> str | None:
    """Whose file ``path`` (resolved) is when a run's training owns it (:data:`OWNED`: ``run R's resume point
    (checkpoints/last.ckpt)``), else None: the owner :func:`lightning_tfm.base.outputs.check_outputs` asks."""
    for folder in list(path.parents)[:4]:
        rel = path.relative_to(folder).as_posix()
        for pattern, what in OWNED:
            if pattern.fullmatch(rel) and is_run_folder(folder):
                return f"run {folder.name}'s {what.format(rel)}"
    return None


# ---------------------------------------------------------------------------------- the folder's config
def _line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else e.__class__.__name__


def saved_config(run_dir: Path) -> tuple[Config | None, str | None]:
    """(the config the run in ``run_dir`` trains, None): its ``config.yaml``, else its ``summary.json``'s. (None,
    None): the folder records none (its checkpoints' own configs are compared when a resume would load one:
    :func:`~.resume.check`); (None, why): it records one that this version cannot read. Reads only."""
    problems = []
    path = run_dir / "config.yaml"
    if path.is_file():
        try:
            return config.load_config(path, checked=False), None
        except (UserError, OSError, ValueError, TypeError) as e:
            problems.append(f"{path.name}: {_line(e)}")
    tree = (results.read_summary(run_dir) or {}).get("config")
    if isinstance(tree, dict):
        try:
            return Config.from_dict(tree, checked=False), None
        except (UserError, ValueError, TypeError, AttributeError) as e:
            problems.append(f"summary.json: {_line(e)}")
    return None, "; ".join(problems) or None


def model_sections() -> set[str]:
    """The sections that make the network: the model's, and each registered architecture's own (``rnn.*``)."""
    from ...model import registry

    return {"model", *registry.ARCHITECTURES}


_UNSET = object()


def recorded_corpus(run_dir: Path) -> str | None:
    """The content identity of the corpus the run in ``run_dir`` trained on, as its summary records it (``corpus``:
    :func:`~.data.corpus_id.fingerprint`). A run of an older version recorded none: where what it did record of its
    prepared corpus shows that its files changed since (:func:`~.upgrade.corpus_changed`), an identity that
    matches no corpus (``val.de changed since the run``), so that it is continued on none; else None (its files'
    content now stands for it; or no run yet)."""
    summary = results.read_summary(run_dir) or {}
    found = summary.get("corpus")
    if isinstance(found, str) or not (summary.get("data_cache") or summary.get("data_cache_hash")):
        return found if isinstance(found, str) else None
    saved = saved_config(run_dir)[0]
    cache, cache_hash = summary.get("data_cache"), summary.get("data_cache_hash")
    changed = upgrade.corpus_changed(saved, cache if isinstance(cache, str) else None,
                            cache_hash if isinstance(cache_hash, str) else None) if saved is not None else None
    return f"{', '.join(changed)} changed since the run" if changed else None


def differences(there: Config, asked: Config, sections: set[str] | None = None,
                names: tuple[str, str] = ("there", "asked"), there_corpus: str | None = None) -> list[str]:
    """The keys, ``"model.dropout (0.1 there, 0.3 asked)"`` for the first few, in which two configs differ: every
    key of the run id's hash (:func:`~.run_id.hashed`; not :data:`~.config.NOT_HASHED`'s: the budget, the
    bookkeeping, the sweep's keys, which a run may change when it trains on; a newer key at its default is no
    difference), the corpus by its content (``data.corpus``; ``there_corpus``: as the folder recorded it; its
    folder, ``data.path``, where a side's files cannot be read: :func:`~.run_id.compared`), secrets masked as
    saved; only ``sections``' keys when given. A key one config leaves out (another architecture's section)
    differs too."""
    from ...base.redact import scrub

    a, b = (scrub(flat) for flat in ids.compared(there, asked, there_corpus))
    keys = sorted((k for k in dict.fromkeys([*b, *a]) if (sections is None or k.split(".")[0] in sections)
                   and a.get(k, _UNSET) != b.get(k, _UNSET)), key=lambda k: k != "model.arch")  # the arch first
    held = [scrub(config.flatten(c)) for c in (there, asked)]  # every key each config holds, hashed or not

    def shown(flat, whole, k):
        """The value a side holds: as hashed (a corpus's identity: its first 12 hex digits); else as the config
        holds it (a newer key left out of the hash at its default: the value saved, or its default where the saved
        config predates the key); else model.arch's default (transformer); else unset (another section's key)."""
        if k in flat:
            v = flat[k]
            return v[:len(corpus_id.PREFIX) + 12] if k == ids.CORPUS_KEY and v.startswith(corpus_id.PREFIX) else v
        if k in whole:
            return whole[k]
        return config.SCHEMA["model"]["arch"][1] if k == "model.arch" else "unset"

    out = [f"{k} ({shown(a, held[0], k)} {names[0]}, {shown(b, held[1], k)} {names[1]})" if i < 3 else k
           for i, k in enumerate(keys)]
    return out if len(out) <= 10 else out[:8] + [f"and {len(out) - 8} more"]


def reuse_problem(cfg: Config, run_dir: Path) -> str | None:
    """Why ``cfg`` must not train in ``run_dir`` (one line naming the differing keys and the way out), or None: the
    folder records no config, or one that differs from ``cfg`` only in keys a run may change when it trains on
    (:func:`differences`). Whatever the folder's name: a hash-named folder of another config (a collision, a folder
    of an older version) is never resumed either. Reads only."""
    saved, unreadable = saved_config(run_dir)
    way_out = "give another run.id (or run.results_dir), or delete the folder to train there anew"
    if saved is None:
        return None if unreadable is None else \
            f"run folder {run_dir} records a config this version cannot read ({unreadable}): {way_out}"
    diff = differences(saved, cfg, there_corpus=recorded_corpus(run_dir))
    if not diff:
        return None
    return (f"run folder {run_dir} holds a run of another config, differing in {', '.join(diff)}: "
            f"{way_out}")


def check_reuse(cfg: Config, run_dir: Path) -> None:
    """:func:`reuse_problem` as the one-line error (exit 2); before anything is written in the folder."""
    problem = reuse_problem(cfg, run_dir)
    if problem is not None:
        raise UserError(problem)


def existing_run_id(cfg: Config, others: bool = True) -> str:
    """The run id ``cfg`` trains under: its own (:func:`~.run_id.run_id`) when that folder holds a run
    (:func:`holds_run`); else that of a folder in run.results_dir holding a run of the same config under another
    name, the one trained furthest of several; else its own. Another name: its legacy id (the corpus hashed by its
    folder: :func:`~.upgrade.legacy_id`); with ``others`` (a sweep trial), also ``<run.name>-<hash>`` (a run outside
    a sweep, and the trial folders of versions that named trials so: :mod:`.upgrade`, rule 7) or another sweep's
    row defined the same way (``sweeps/table3-cpu-continued.yaml`` continues ``sweeps/table3-cpu.yaml``'s runs),
    under either hash. The hash ends every name (the run's bookkeeping and budget are not hashed); each candidate's
    saved config is compared with ``cfg`` (:func:`differences`). Its own folder is returned whatever it holds: a run
    refuses it when it holds another config (:func:`check_reuse`)."""
    rid = ids.run_id(cfg)
    results_dir = Path(cfg.run.results_dir)
    if cfg.run.id or holds_run(results_dir / rid):
        return rid
    try:
        if others:
            digests = dict.fromkeys([ids.config_hash(cfg), upgrade.legacy_hash(cfg)])
            candidates = sorted({d for h in digests for d in results_dir.glob(f"*-{h}")
                                 if d.name != rid and d.is_dir()})
        else:
            candidates = [d for d in [results_dir / upgrade.legacy_id(cfg)] if d.name != rid and d.is_dir()]
    except OSError:
        return rid
    found = []
    for d in candidates:
        saved = saved_config(d)[0] if holds_run(d) else None
        if saved is not None and not differences(saved, cfg, there_corpus=recorded_corpus(d)):
            steps = (results.read_summary(d) or {}).get("steps")
            found.append((steps if isinstance(steps, int) else -1, d.name))
    return max(found)[1] if found else rid


def already_done(prev: dict | None, cfg: Config) -> bool:
    return bool(prev) and prev.get("status") == "completed" and (prev.get("steps") or 0) >= cfg.train.max_steps
