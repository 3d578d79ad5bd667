"""Checkpoints read: load with ``weights_only=True`` (what an older version wrote read as today's:
:func:`.upgrade.checkpoint`), tell whose a checkpoint is, scan a run's checkpoint folder, average, resolve a name to
a file, load a run's model. Loading never writes: an averaged checkpoint that is not on disk is averaged in memory;
``write_average`` is the one place that writes one. Lightning's writer made atomic is :mod:`.checkpoint_io`; the
steps of a resume (the file it loads, its check, the unreadable ones set aside) are :mod:`.resume`.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ...base import atomic
from ...base.errors import UserError
from ...model import build_model
from ..config import config
from . import results, run_folder, upgrade
from .checkpoint_io import CORPUS, RESUME_ONLY, RUN_ID, TOKENIZER, own_run, tokenizer_hash

STEP_CKPT = re.compile(r"^step=(\d+)(?:-v\d+)?\.ckpt$")


def load_checkpoint(path: Path) -> dict:
    """A checkpoint's dict, loaded with ``weights_only=True`` on the CPU and read as today's version writes it
    (:func:`.upgrade.checkpoint`); one line naming the way out if it cannot be read or is not a Lightning
    checkpoint."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint {path} not found") from None
    except Exception as e:  # truncated file, not a torch file, unsafe pickle
        raise UserError(f"cannot read checkpoint {path} ({e.__class__.__name__}; truncated or damaged?): give "
                        f"another checkpoint written by `ltfm train` or `ltfm average` (--checkpoint PATH, e.g. a "
                        f"checkpoints/step=*.ckpt), or run the same `ltfm train` again: "
                        "it sets damaged ones aside") from None
    if not isinstance(ck, dict) or not isinstance(ck.get("state_dict"), dict):
        raise UserError(f"{path} is not a Lightning checkpoint (no state_dict): give a checkpoint written by "
                        f"`ltfm train` or `ltfm average`")
    return upgrade.checkpoint(ck, path)


def vocabulary(ck: dict) -> str | None:
    """The vocabulary ``ck`` was trained with (:data:`TOKENIZER`; an older checkpoint's, that of the run folder it
    sits in: :mod:`.upgrade` rule 1); None when it does not tell."""
    recorded = (ck.get("hyper_parameters") or {}).get(TOKENIZER)
    return recorded if isinstance(recorded, str) else None


def recorded_config(ck: dict, path: Path) -> "config.Config | None":
    """The config a checkpoint records (``hyper_parameters.config``, a plain dict), None when it records none."""
    hp = ck.get("hyper_parameters") or {}
    if not hp.get("config"):
        return None
    try:
        return config.Config.from_dict(hp["config"], checked=False)
    except (UserError, AttributeError, TypeError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise UserError(f"checkpoint {path} stores a config this version cannot read ({why}): give a checkpoint "
                        f"written by this version's `ltfm train` or `ltfm average`") from None


def own_names(run_dir: Path, cfg: "config.Config | None") -> Iterator[str]:
    """What a checkpoint of the run in ``run_dir`` may record as the run that wrote it (:data:`RUN_ID`): the folder's
    name, then, computed only when asked for (a generator), the identities of ``cfg``, the config it trains
    (:func:`.upgrade.names`, its corpus as the folder records it): a folder renamed (``mv RUN
    mymodel``) keeps what was trained in it."""
    yield run_dir.name
    if cfg is not None:
        yield from upgrade.names(cfg, run_folder.recorded_corpus(run_dir))


def foreign_problem(ck: dict, path: Path, cfg: "config.Config | None", vocab: str | None, whose: str,
                    sections: set[str] | None = None, corpus: str | None = None,
                    run: str | Iterable[str] | None = None) -> str | None:
    """Why checkpoint ``ck`` (at ``path``) is not one of the run ``whose`` (a run folder) with config ``cfg``,
    vocabulary hash ``vocab`` and run id ``run`` (or any of the names ``run`` gives: :func:`own_names`): written by
    another run (the id it records, :data:`RUN_ID`), another vocabulary, or another config in ``sections``' keys (all
    the run id's keys when None: :func:`~.run_folder.differences`, the checkpoint's corpus as it records it,
    :data:`CORPUS`, else as ``corpus`` identifies it); None when it is, or cannot tell (a checkpoint of an older
    version records no run id, :mod:`.upgrade` rule 4). ``ck`` is read as today's (:func:`.upgrade.checkpoint`)."""
    writer = ck.get(RUN_ID)
    # a run id is a name and the hash of what is trained (training/config/run_id.py): a folder taken over under the
    # name an earlier version gave it keeps its hash, a folder renamed its config's; another run's checkpoint has
    # another
    if run is not None and isinstance(writer, str):
        names = (run,) if isinstance(run, str) else run
        if not any(writer.rsplit("-", 1)[-1] == name.rsplit("-", 1)[-1] for name in names):
            return f"checkpoint {path} was written by run {writer}, not by {whose}"
    corpus = ck[CORPUS] if isinstance(ck.get(CORPUS), str) else corpus
    theirs = vocabulary(ck)
    if vocab is not None and theirs is not None and theirs != vocab:
        return (f"checkpoint {path} was trained with another vocabulary (tokenizer {theirs}) than {whose} (tokenizer "
                f"{vocab}), whatever their sizes: its ids would decode to other words")
    ck_cfg = recorded_config(ck, path)
    diff = run_folder.differences(ck_cfg, cfg, sections, ("checkpoint", "run"), corpus) if ck_cfg and cfg else []
    if diff:
        return (f"checkpoint {path} is of another {'model' if sections else 'config'} than {whose}, differing in "
                f"{', '.join(diff)}")
    return None


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a readable checkpoint (truncated, corrupt, not a Lightning checkpoint), or None.

    Checks the zip container and every member's CRC (a truncated or overwritten file fails here without
    unpickling anything), then loads it with ``weights_only=True`` (memory-mapped, so it costs little)."""
    import zipfile

    path = Path(path)
    try:
        if not zipfile.is_zipfile(path):
            return "not a complete zip archive: truncated?"
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            return f"member {bad} fails its CRC check"
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any failure to read is the answer
        return f"{e.__class__.__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}".rstrip(": ")
    if not isinstance(ck, dict) or not isinstance(ck.get("state_dict"), dict):
        return "no state_dict: not a Lightning checkpoint"
    return None


def step_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's ``checkpoints/step=NNNNNN.ckpt`` files, by step."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_CKPT.match(p.name))]
    return sorted(found, key=lambda sp: (sp[0], sp[1].name))


def average_checkpoints(paths: list[str | Path]) -> dict:
    """Mean of every floating-point tensor of the checkpoints' state_dicts (Sec. 6.1: "averaging the last
    5 checkpoints"); other entries are taken from the last checkpoint. Loads one checkpoint at a time.
    Accumulates in float64 and casts back to each tensor's dtype (tensor2tensor's avg_checkpoints sums in
    the checkpoint's dtype; float64 only makes the mean exact to the last bit)."""
    if not paths:
        raise UserError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    last: dict = {}
    for i, path in enumerate(paths):
        ck = load_checkpoint(Path(path))
        sd = ck["state_dict"]
        if i == 0:
            first = (ck, Path(path))
        else:  # another vocabulary or model of the same shapes would average into nonsense
            why = foreign_problem(ck, Path(path), recorded_config(*first), vocabulary(first[0]),
                                  f"{paths[0]}", run_folder.model_sections(), run=first[0].get(RUN_ID))
            if why is not None:
                raise UserError(f"{why}: average checkpoints of one run")
        if i == 0:
            sums = {k: v.to(torch.float64) for k, v in sd.items() if v.is_floating_point()}
            keys = set(sd)
        else:
            if set(sd) != keys:
                raise UserError(f"{path} has other parameters than {paths[0]}: average checkpoints of one run")
            for k in sums:
                if sd[k].shape != sums[k].shape:
                    raise UserError(f"{path}: {k} has shape {tuple(sd[k].shape)}, {paths[0]} has "
                                    f"{tuple(sums[k].shape)}: average checkpoints of one run")
                sums[k] += sd[k].to(torch.float64)
        last = sd
    n = len(paths)
    return {k: (sums[k] / n).to(v.dtype) if k in sums else v for k, v in last.items()}


def final_weights(ck: dict, run_dir: Path) -> bool:
    """Whether ``ck``, the ``last.ckpt`` of the run in ``run_dir``, holds the weights the run ended with (or,
    unfinished, has now), not a resume point written between step checkpoints (:data:`RESUME_ONLY`: by time, or at a
    stop by a signal; an older version's end of fitting so marked: :func:`.upgrade.final_marked_resume_only`)."""
    return not ck.get(RESUME_ONLY) or upgrade.final_marked_resume_only(ck, results.read_summary(run_dir))


def averaged_checkpoint(run_dir: str | Path, last: int = 5) -> tuple[dict, list[Path]]:
    """The average of the run's checkpoints of its last ``last`` steps, in memory: (checkpoint, averaged paths).

    The candidates are the step checkpoints and ``checkpoints/last.ckpt`` when it is newer than every one of them and
    holds the run's final weights (:func:`final_weights`: the budget's end off the step cadence, a run ended by time),
    so the last steps end with the one the run ended at; a ``last.ckpt`` at a step checkpoint's step (one file, a
    link) counts once. The result is a Lightning checkpoint like the others (the newest averaged checkpoint
    with its state_dict replaced, without optimizer state), so it loads the same way; unreadable
    candidates are left out with a warning.
    """
    run_dir = Path(run_dir)
    if last < 1:
        raise UserError(f"asked to average the last {last} checkpoints: give at least 1 "
                        f"(ltfm average --last N, decode.average_last=N)")
    if not run_dir.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist: give a folder written by `ltfm train`")
    cands = []
    for step, path in step_checkpoints(run_dir):  # an unreadable one (full disk, kill) is left out, said once
        why = checkpoint_problem(path)
        if why is None:
            cands.append((step, path))
        else:
            print(f"ltfm: warning: skipping unreadable {path} ({why})", file=sys.stderr)
    last_ckpt = run_dir / "checkpoints" / "last.ckpt"
    if last_ckpt.is_file():
        why = checkpoint_problem(last_ckpt)
        if why is not None:
            print(f"ltfm: warning: skipping unreadable {last_ckpt} ({why})", file=sys.stderr)
        else:
            ck_last = load_checkpoint(last_ckpt)
            step = int(ck_last.get("global_step", -1))
            if final_weights(ck_last, run_dir) and (not cands or step > cands[-1][0]):
                cands.append((step, last_ckpt))
    if not cands:
        raise UserError(f"run folder {run_dir} has no checkpoints to average (checkpoints/step=*.ckpt): "
                        f"train it first with `ltfm train CONFIG`")
    chosen = [p for _, p in cands[-last:]]
    state = average_checkpoints(chosen)
    ck = load_checkpoint(chosen[-1])
    for key in ("optimizer_states", "lr_schedulers"):
        ck.pop(key, None)
    ck["state_dict"] = state
    ck["averaged_from"] = [p.name for p in chosen]
    return ck, chosen


def write_average(run_dir: str | Path, last: int = 5, out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Write :func:`averaged_checkpoint` to ``out`` (default ``checkpoints/average.ckpt``), atomically.
    Returns (written path, averaged paths)."""
    out = Path(out) if out else Path(run_dir) / "checkpoints" / "average.ckpt"
    owner = own_run(out)
    if owner is not None and owner.resolve() != Path(run_dir).resolve() and (owner / "config.yaml").is_file():
        raise UserError(f"--out {out} is in another run's checkpoints folder ({owner}): it would pass for that run's "
                        f"checkpoint; write it in {Path(run_dir) / 'checkpoints'} or outside any run folder")
    ck, chosen = averaged_checkpoint(run_dir, last)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out) as tmp:
        torch.save(ck, tmp)
    return out, chosen


def resolve_checkpoint(run_dir: str | Path, checkpoint: str = "last", average_last: int | None = None) -> Path | None:
    """Path of ``last`` | ``best`` | ``average`` | a file path; None for ``average`` when no
    ``checkpoints/average.ckpt`` is written (:func:`load_model` then averages in memory)."""
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    if checkpoint not in ("last", "best", "average"):
        p = Path(checkpoint)
        if not p.is_file():
            raise UserError(f"checkpoint {checkpoint!r} not found: give last, best, average or a .ckpt file")
        return p
    if not ckpt_dir.is_dir() or not any(ckpt_dir.glob("*.ckpt")):
        raise UserError(f"run folder {run_dir} has no checkpoints (checkpoints/*.ckpt): train it first with "
                        f"`ltfm train CONFIG`, or pass --checkpoint PATH")
    if checkpoint == "last":
        p = ckpt_dir / "last.ckpt"
        if not p.is_file():
            raise UserError(f"run folder {run_dir} has no checkpoints/last.ckpt: "
                            "pass --checkpoint best, average or PATH")
        return p
    if checkpoint == "best":
        p = ckpt_dir / "best.ckpt"
        if not p.is_file():
            raise UserError(f"run folder {run_dir} records no best checkpoint (checkpoints/best.ckpt, lowest dev "
                            f"loss): use --checkpoint last or average")
        return p
    p = ckpt_dir / "average.ckpt"
    return p if p.is_file() else None


def load_model(run_dir: str | Path, checkpoint: str = "last", average_last: int | None = None):
    """(model in eval mode on CPU, nested config, tokenizer) of a run folder's checkpoint.

    ``checkpoint``: ``last``, ``best`` (lowest dev loss), ``average`` (``checkpoints/average.ckpt``, or when
    none is written the last ``average_last`` (default: the run's decode.average_last, else 5) checkpoints
    averaged in memory), or a path. The model is built from the checkpoint's own config (``hyper_parameters.config``,
    else the run's config.yaml); the config returned (data, decoding) is the run's, else the checkpoint's. A
    checkpoint of another vocabulary than the run's ``tokenizer.json`` (even of the same size), or of another run
    whose model differs from this run's, is refused in one line (:func:`foreign_problem`).
    """
    from ..data.data import load_tokenizer

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist: give a folder written by `ltfm train`")
    cfg_path = run_dir / "config.yaml"
    run_cfg = config.load_config(cfg_path) if cfg_path.is_file() else None
    if average_last is None and run_cfg is not None:
        average_last = run_cfg.decode.average_last or None
    path = resolve_checkpoint(run_dir, checkpoint, average_last)
    if path is None:
        n = average_last or 5
        print(f"ltfm: averaging the last {n} checkpoints of {run_dir} (not written: `ltfm average` writes it)",
              file=sys.stderr)
        ck, chosen = averaged_checkpoint(run_dir, n)
        path = chosen[-1]
    else:
        ck = load_checkpoint(path)
    hp = ck.get("hyper_parameters") or {}
    # the checkpoint's own config (a plain dict, so that torch.load(weights_only=True) reads it), else config.yaml
    ck_cfg = recorded_config(ck, path) or run_cfg
    if ck_cfg is None:
        raise UserError(f"{path} holds no config and {cfg_path} is missing: give a run folder written by `ltfm train`")
    state = {k[len("model."):]: v for k, v in ck["state_dict"].items() if k.startswith("model.")}
    if not state:
        raise UserError(f"{path} is not a lightning_tfm checkpoint (no model.* weights)")
    tokenizer = load_tokenizer(run_dir)
    vocab = int(hp.get("vocab_size") or tokenizer.get_vocab_size())
    owner = own_run(path)
    # Another run's checkpoint must share this run's vocabulary and model (its own may predate a change the
    # version before run_folder.check_reuse let through: its vocabulary is still checked).
    foreign = owner is None or owner.resolve() != run_dir.resolve()
    # A file in this run's folder passes for its checkpoint (evaluate labels its hypotheses so): it must be its own.
    why = foreign_problem(ck, path, run_cfg if foreign else None, tokenizer_hash(run_dir / "tokenizer.json"),
                          f"run {run_dir}", run_folder.model_sections(),
                          run=None if foreign else own_names(run_dir.resolve(), run_cfg))
    if why is None and vocab != tokenizer.get_vocab_size():
        why = (f"checkpoint {path} has a vocabulary of {vocab} entries but {run_dir / 'tokenizer.json'} has "
               f"{tokenizer.get_vocab_size()}")
    if why is not None:
        mine = f", or run this command on its own run folder {owner}" if owner is not None and foreign else \
            f" (move {path.name} out of {path.parent} if it was copied in)" if not foreign else ""
        raise UserError(f"{why}: it belongs to another run; give a checkpoint of this run{mine}")
    try:
        model = build_model(ck_cfg.model, vocab)  # ValueError: an architecture this version does not register
        model.load_state_dict(state)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"checkpoint {path} does not fit its model config ({str(e).splitlines()[0]})") from None
    return model.eval(), run_cfg or ck_cfg, tokenizer
