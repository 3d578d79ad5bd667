"""What an older version wrote, read as today's: every compatibility rule for older run folders and checkpoints, in
one place (as fairseq's ``checkpoint_utils._upgrade_state_dict``). Each rule names the commit whose files it
upgrades from (files written before it lack what it added); a new format change adds its rule here.

A checkpoint (:func:`checkpoint`, applied to every checkpoint the package reads: :func:`~.checkpoints.load_checkpoint`,
a resume's check, :func:`~.resume.check`, and the one Lightning loads to resume, ``Seq2SeqModule.on_load_checkpoint``):

1. no vocabulary hash (``hyper_parameters.tokenizer_sha256``, :data:`~.checkpoint_io.TOKENIZER`; before a5038ba): that
   of the ``tokenizer.json`` of the run folder the file sits in (none elsewhere: its vocabulary goes unchecked);
2. its random state as rank zero's alone, a dict (:data:`~.checkpoint_io.RNG`; d8a8210 up to 0534a00): a list of that
   one state, which every rank restores (:func:`~.resume.rank_rng`), as then;
3. the end of fitting marked resume-only (:data:`~.checkpoint_io.RESUME_ONLY`; before 2131502 the weights a run ended
   with were marked so): a ``last.ckpt`` so marked at the step the run's ``summary.json`` says it completed at is
   its final weights (:func:`final_marked_resume_only`, read by :func:`~.checkpoints.final_weights`), which
   averaging counts;
4. no writer's run id or corpus (:data:`~.checkpoint_io.RUN_ID`, :data:`~.checkpoint_io.CORPUS`; before 8b8bfa0):
   nothing to fill in; whose checkpoint it is is told by its vocabulary and config alone
   (:func:`~.checkpoints.foreign_problem`).

A run folder:

5. ``summary.json``'s precision by Lightning's short name (``"32"``; before b76d26d): its full name (``"32-true"``,
   :data:`~.results.PRECISION_NAMES`), applied where every summary is read (:func:`~.results.load_summary`: the
   results module is below this one);
6. a folder named by the run id of its time, before the corpus was identified by its content (``data.path`` hashed
   in place of ``data.corpus``; before 2357486): :func:`legacy_id`; a run continues in it when the folder of its
   id holds no run and that one holds a run of the same config (:func:`~.run_folder.existing_run_id`), and a
   checkpoint recording it is the run's own (:func:`names`);
7. a sweep trial's folder named ``<run.name>-<hash>`` (before 54d561d named trials
   ``<study>-<variant>-s<seed>-<hash>``): found by its hash among the folders of the results folder
   (:func:`~.run_folder.existing_run_id`, ``others``);
8. a run that recorded no content identity of its corpus (``summary.json``'s ``corpus``; before 2357486): what it
   did record of its prepared corpus (its manifest's key, by content or by each file's size and modification time;
   else that key's hash, ``data_cache_hash``) tells whether the files changed since (:func:`corpus_changed`); a
   changed corpus gets an identity that matches none, so that the run is continued on none
   (:func:`~.run_folder.recorded_corpus`);
9. a run id of a run made before keys stopped being hashed at their defaults (2357486): every key of
   :data:`~..config.run_id.KEYS_V1` stays hashed at its value, and a key since removed at its frozen default where
   the config would have saved it (:func:`~..config.run_id.was_saved`). That rule is the run id's own definition,
   so it is kept where the hash is computed (:mod:`..config.run_id`) and only listed here.

No rule is needed for a config key newer than a run: a config saved before the key existed reads it at its default
wherever it is read (the run id, rule 9; ``ltfm runs``' architecture, :mod:`.runs`; the report's Table 3 knobs),
which is why a new key's default keeps today's behaviour.

Reads only. Below the modules that read what it upgrades (:mod:`.checkpoints`, :mod:`.resume`, :mod:`.run_folder`),
above :mod:`.checkpoint_io` (the keys) and :mod:`.results`; the run id's and the corpus's modules are imported where
a rule needs them.
"""
from __future__ import annotations

import json
from pathlib import Path

from .checkpoint_io import RESUME_ONLY, RNG, TOKENIZER, own_run, tokenizer_hash


# ------------------------------------------------------------------------------------------- checkpoints
def checkpoint(ck: dict, path: Path | None = None) -> dict:
    """``ck``, a checkpoint read from ``path`` (None: where the file is not known, as in Lightning's hook), as
    today's version writes it: rules 1 and 2 of the module's docstring applied, in place. Returns ``ck``."""
    if isinstance(ck.get(RNG), dict):  # rule 2
        ck[RNG] = [ck[RNG]]
    run = own_run(path) if path is not None else None
    hp = ck.get("hyper_parameters")
    if run is not None and isinstance(hp, dict) and not isinstance(hp.get(TOKENIZER), str) \
            and (run / "tokenizer.json").is_file():  # rule 1
        hp[TOKENIZER] = tokenizer_hash(run / "tokenizer.json")
    return ck


def final_marked_resume_only(ck: dict, summary: dict | None) -> bool:
    """Rule 3: whether ``ck``, a run's ``last.ckpt`` marked resume-only, is the weights it ended with all the same: an
    older version marked the end of fitting so, and the run's ``summary`` says it completed at this step."""
    summary = summary or {}
    return bool(ck.get(RESUME_ONLY)) and summary.get("status") == "completed" \
        and summary.get("steps") == ck.get("global_step")


# ------------------------------------------------------------------------------------------- run folders
def legacy_hash(cfg) -> str:
    """The hash of the run ids before the corpus was identified by its content (rule 6): ``data.path`` hashed in
    its place (:func:`~..config.run_id.path_keys`)."""
    from ..config import run_id as ids

    return ids.digest(ids.path_keys(cfg))


def legacy_id(cfg) -> str:
    """The run id ``cfg`` had before the corpus was identified by its content (rule 6, :func:`legacy_hash`); the
    same as :func:`~..config.run_id.run_id` where the corpus's files cannot be read."""
    from ..config import run_id as ids

    return ids.named(cfg, legacy_hash(cfg))


def names(cfg, corpus: str | None = None) -> tuple[str, ...]:
    """What names a run of ``cfg`` wherever its folder is and whatever it is called: its run id and legacy id (the
    corpus identified by ``corpus``, as a run folder records it, where given; else by its files), then the two hashes
    alone (a run named by ``run.id`` holds no hash in its name). A checkpoint records the id it was trained under
    (:data:`~.checkpoint_io.RUN_ID`): one of these when it is of ``cfg``."""
    from ..config import run_id as ids

    digest = ids.digest(ids.hashed(cfg, corpus))
    return ids.named(cfg, digest), legacy_id(cfg), digest, legacy_hash(cfg)


def corpus_by_stats_key(cfg) -> dict:
    """The prepared corpus's key as a version before 2357486 made it (rule 8): each local file's size and
    modification time in place of the corpus's content identity (:func:`~..data.corpus.cache_key`)."""
    from ..data.corpus import cache_key, file_stats

    key = {k: v for k, v in cache_key(cfg).items() if k not in ("corpus", "files")}
    key["files"] = file_stats(cfg)
    return key


def corpus_changed(cfg, data_cache: str | None, data_cache_hash: str | None) -> list[str] | None:
    """For a run that recorded no content identity of its corpus (rule 8), which of the files its config reads
    changed since it was prepared, by what the run did record: the prepared corpus it trained on (``data_cache``:
    its manifest's key, by content or by each file's size and mtime), else that key's hash (``data_cache_hash``, of
    the key by size and mtime, :func:`corpus_by_stats_key`). [] when none did; None when nothing recorded tells."""
    from ...base.errors import UserError
    from ..data.corpus import file_stats, key_hash
    from ..data.corpus_id import fingerprint

    if cfg.data.source != "local" or not cfg.data.path:
        return None
    try:
        key = json.loads((Path(data_cache) / "manifest.json").read_text())["key"] if data_cache else None
    except (OSError, ValueError, KeyError, TypeError):
        key = None
    try:
        if isinstance(key, dict) and isinstance(key.get("corpus"), str):
            return [] if key["corpus"] == fingerprint(cfg.data) else ["its files"]
        if isinstance(key, dict) and isinstance(key.get("files"), dict):
            now = file_stats(cfg)
            return sorted(n for n in {*now, *key["files"]} if now.get(n) != key["files"].get(n))
        if isinstance(data_cache_hash, str):
            return [] if key_hash(corpus_by_stats_key(cfg)) == data_cache_hash else ["its files"]
    except (UserError, OSError):
        return ["its files"]  # gone or unreadable: not the corpus it trained on, as far as anything can tell
    return None
