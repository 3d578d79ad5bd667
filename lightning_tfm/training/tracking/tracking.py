"""Experiment tracking: one Weights & Biases run per training run, through Lightning's ``WandbLogger``.

How a run appears in W&B (so Table 3 can be read off the dashboard):

- group    = the study / sweep name (``run.study``, else ``sweep.study``), ``"adhoc"`` for a lone run;
  ``<study>-pipeline-check`` for a run tagged ``pipeline-check`` (``make ablation QUICK=1``): a pipeline check
  is never in the real sweep's group (``ltfm report --from-wandb`` reads group = sweep name);
- job_type = the row family (``run.family``: base, A, B, C, D, E, big, norm, search); default
  ``"adhoc"`` for a lone run and ``"base"`` for a study run that names no family;
- name     = ``<variant or run.name>-s<seed>``; tags = ``wandb.tags`` + variant + family;
- config   = the resolved config as FLAT keys (``model.heads``, ``model.d_k``, ...) so the runs table
  shows the paper's knobs as columns, plus ``run.id`` = the local run folder name; secrets scrubbed;
- summary  = dev_ppl, dev_bleu, test_bleu, params, train_tokens, wall_time_s, tokens_per_s (``finish``);
- history  = whatever the LightningModule logs (keys below) against ``trainer/global_step``.

Mode: ``WANDB_MODE`` else ``wandb.mode``. ``online`` needs an API key (``WANDB_API_KEY`` or a netrc
entry for the W&B host); without one, or when the server cannot be reached at start (after
``WANDB_INIT_TIMEOUT``, default 90 s), the run falls back to ``offline`` with a one-line warning.
Offline runs live in ``<wandb.dir or run folder>/wandb/offline-run-*/`` and upload later with
``wandb sync``. ``disabled`` creates no logger.

Exactly one W&B run per training run: the run is created lazily on global rank 0 only (Lightning's
``rank_zero_experiment``), a run left open by an earlier training in the same process (a sweep worker)
is finished first instead of being reused (Lightning's default is to reuse ``wandb.run``), and
``finish`` ends it. The W&B run id is kept in ``<run folder>/wandb_id.txt`` so that re-running the same
command (resume) continues the same W&B run (``resume="allow"``). ``finish`` also shuts wandb-core down
(``wandb.teardown``): in wandb 0.31 ``run.finish()`` returns before the run's files are flushed.
"""
from __future__ import annotations

import contextlib
import netrc
import os
import re
import secrets
import shutil
import string
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import urlparse

from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_only

from ...base.errors import UserError
from ...base.redact import scrub  # redact.py is the one place secrets are masked
from ..config.config import Config, flatten
from ..runs.results import DEV_SAMPLES, RESULT_FIELDS
from .wandb_files import ID_FILE  # the file naming a run folder's W&B run: one home, beside its reader

SAMPLE_COLUMNS = ["source", "reference", "hypothesis"]

# summary.json fields copied to the W&B run summary by ``finish`` (whichever are present): a stopped run's status
# ("stopped", not "failed") with its last validation (step, dev loss and perplexity).
SUMMARY_KEYS = RESULT_FIELDS + ("bleu_signature", "last_validation")

MODES = ("online", "offline", "disabled")
# The tag of a pipeline check's runs (`make ablation QUICK=1`: wandb.tags=[pipeline-check]): numbers that say
# nothing, kept out of the real sweep's W&B group and report run.
PIPELINE_CHECK = "pipeline-check"


@contextlib.contextmanager
def scrubbed_argv() -> Iterator[None]:
    """wandb records ``sys.argv[1:]`` in the run (offline: in the .wandb file), so a command line like
    ``ltfm train ... sweep.storage=postgresql://u:pw@h/db`` would leak the password. Mask it while the
    run starts; the original list object is restored (Lightning's DDP launcher re-executes sys.argv)."""
    saved = list(sys.argv)
    sys.argv[:] = [scrub(a) for a in saved]
    try:
        yield
    finally:
        sys.argv[:] = saved


# ---------------------------------------------------------------------------------------------------
# Mode, naming
# ---------------------------------------------------------------------------------------------------


def _warn(message: str) -> None:
    if rank_zero_only.rank == 0:
        print(f"ltfm: warning: {message}", file=sys.stderr, flush=True)


def has_api_key() -> bool:
    """An API key is available: WANDB_API_KEY, or a netrc entry for the W&B host (what ``wandb login`` writes)."""
    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def resolve_mode(cfg: Config) -> str:
    """online | offline | disabled, from WANDB_MODE (or WANDB_DISABLED) else ``wandb.mode``; online
    without an API key falls back to offline with a one-line warning."""
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        return "disabled"
    env = os.environ.get("WANDB_MODE", "").strip()
    raw = env or cfg.wandb.mode
    mode = {"dryrun": "offline", "run": "online"}.get(raw.lower(), raw.lower())
    if mode not in MODES:
        where = "WANDB_MODE" if env else "wandb.mode"
        raise UserError(f"{where}={raw!r} is not one of: {', '.join(MODES)}")
    if mode == "online" and not has_api_key():
        _warn("W&B mode is online but no API key was found (WANDB_API_KEY or `wandb login`); "
              "logging offline instead (upload later with `wandb sync`)")
        mode = "offline"
    return mode


def wandb_group(study: str | None, tags) -> str:
    """The W&B group of a study's runs: the study's name (``adhoc`` without one), with ``-pipeline-check`` when
    the runs are tagged :data:`PIPELINE_CHECK`."""
    group = study or "adhoc"
    return f"{group}-{PIPELINE_CHECK}" if PIPELINE_CHECK in [str(t) for t in tags or []] else group


def run_naming(cfg: Config) -> dict:
    """group / job_type / name / tags of a training run's W&B run (see the module docstring)."""
    run = cfg.run
    study = run.study or cfg.sweep.study
    family = run.family
    variant = run.variant
    tags: list[str] = []
    for t in [*(cfg.wandb.tags or []), variant, family]:
        if t is not None and str(t) and str(t) not in tags:
            tags.append(str(t)[:64])  # W&B limits tags to 64 characters
    return {
        "group": wandb_group(study, tags),
        "job_type": family or ("base" if study else "adhoc"),
        "name": f"{variant or run.name}-s{run.seed}",
        "tags": tags,
    }


def wandb_config(cfg: Config, run_id: str) -> dict:
    """The config as W&B sees it: flat paper-knob keys, ``run.id`` = local run id, secrets masked."""
    flat = flatten(cfg)
    flat["run.id"] = run_id
    return scrub(flat)


def _new_run_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _read_run_id(run_dir: Path) -> str | None:
    path = Path(run_dir) / ID_FILE
    if not path.is_file():
        return None
    text = path.read_text().strip()
    return text if re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", text) else None


# ---------------------------------------------------------------------------------------------------
# Logger
# ---------------------------------------------------------------------------------------------------


class TrackingLogger(WandbLogger):
    """Lightning's WandbLogger with this project's guarantees (see the module docstring):

    - a fresh W&B run per logger: a leftover ``wandb.run`` is finished (as failed) rather than reused;
    - the W&B run id is written to ``<run folder>/wandb_id.txt`` when the run starts (rank 0), so a
      resumed training continues the same W&B run;
    - hyperparameters Lightning logs (``save_hyperparameters``) are flattened and scrubbed, so the nested
      config never lands in W&B next to the flat one, and no secret does;
    - ``sys.argv`` is scrubbed while wandb starts (wandb records the command line).
    """

    def __init__(self, *, run_dir: Path, run_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # everything else goes to wandb.init (mode, group, job_type, config, ...)
        # Lightning always passes anonymous=None, which wandb 0.31 warns about on every run.
        self._wandb_init.pop("anonymous", None)
        self.run_dir = Path(run_dir)
        self.local_run_id = run_id
        self.mode = kwargs.get("mode", "online")
        self._tracking_finished: dict | None = None  # finish()'s answer, once finished

    @property
    def experiment(self):  # noqa: D401 - same contract as WandbLogger.experiment
        if self._experiment is None and rank_zero_only.rank == 0:
            import wandb

            if wandb.run is not None:
                _warn(f"W&B run {wandb.run.id} was still open from an earlier training in this process; "
                      "finishing it as failed so this training gets its own run")
                wandb.run.finish(exit_code=1)
            try:
                with scrubbed_argv():
                    exp = super().experiment
            except Exception as e:  # noqa: BLE001 - any failure to reach the server
                if self.mode != "online":
                    raise
                # No network / server down / bad key: training must not die for its dashboard.
                first = scrub(str(e)).strip().splitlines()[0] if str(e).strip() else ""
                _warn(f"W&B online start failed ({e.__class__.__name__}: {first}); logging offline instead "
                      "(upload later with `wandb sync`)")
                # wandb-core keeps the failed stream under this run id ("run ID ... is in use"): restart it.
                wandb.teardown()
                # ... and leaves an empty online run folder (header, run, exit records) that `wandb sync`
                # would upload as a second, empty attempt: remove it, the offline run replaces it.
                for stub in Path(self._save_dir, "wandb").glob(f"run-*-{self._wandb_init['id']}"):
                    shutil.rmtree(stub, ignore_errors=True)
                self.mode = self._wandb_init["mode"] = "offline"
                self._experiment = None
                with scrubbed_argv():
                    exp = super().experiment
            if getattr(exp, "id", None):
                self.run_dir.mkdir(parents=True, exist_ok=True)
                tmp = self.run_dir / (ID_FILE + ".tmp")
                tmp.write_text(exp.id + "\n")
                tmp.replace(self.run_dir / ID_FILE)
            return exp
        return super().experiment

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        # Lightning passes a dict or a Namespace (its own _convert_params, a private name, did this)
        params = (vars(params) if isinstance(params, Namespace) else params) or {}
        flat: dict[str, Any] = {}
        for key, value in params.items():
            # save_hyperparameters(config=<nested config, or a Config>) -> the same flat keys as at wandb.init
            if key == "config" and isinstance(value, Config):
                flat.update(flatten(value))
            elif key == "config" and isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values()):
                flat.update(flatten(dict(value)))
            else:
                flat[key] = value
        flat["run.id"] = self.local_run_id
        super().log_hyperparams(scrub(flat))


def make_wandb_logger(cfg: Config, run_id: str, run_dir: Path) -> TrackingLogger | None:
    """The W&B logger of one training run, or None when W&B is disabled.

    Call once per training run, before building the Trainer; pass it to ``Trainer(logger=[csv, it])``
    (CSVLogger first, so Lightning's default paths stay in the run folder). The W&B run itself starts
    lazily on global rank 0 the first time Lightning logs (or at ``finish``).
    """
    mode = resolve_mode(cfg)
    if mode == "disabled":
        return None
    run_dir = Path(run_dir)
    save_dir = Path(cfg.wandb.dir or run_dir)
    if rank_zero_only.rank == 0:
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"wandb.dir {str(save_dir)!r} cannot be created ({e.strerror}): "
                            "pass a writable wandb.dir=FOLDER") from None
    naming = run_naming(cfg)
    return TrackingLogger(
        run_dir=run_dir,
        run_id=run_id,
        mode=mode,
        resume="allow",
        save_dir=str(save_dir),
        id=_read_run_id(run_dir) or _new_run_id(),
        project=os.environ.get("WANDB_PROJECT") or cfg.wandb.project,
        entity=os.environ.get("WANDB_ENTITY") or cfg.wandb.entity,
        **naming,
        config=wandb_config(cfg, run_id),
        log_model=False,  # checkpoints are uploaded once, at the end, by finish() (online only)
    )


def log_samples(logger: WandbLogger | None, step: int, rows: list[tuple[str, str, str]]) -> None:
    """Log sample translations as a W&B table (source, reference, hypothesis) at ``step`` under
    ``dev/samples``. No-op without a logger or rows; rank zero only."""
    if logger is None or not rows or rank_zero_only.rank != 0:
        return
    logger.log_table(key=DEV_SAMPLES, columns=list(SAMPLE_COLUMNS),
                     data=[[str(c) for c in row] for row in rows], step=step)


def finish(logger: WandbLogger | None, summary: dict, checkpoint_path: Path | None = None) -> dict:
    """End the training run's W&B run and return the fields ``summary.json`` records.

    Writes the summary metrics present in ``summary`` to the W&B run summary; online, uploads
    ``checkpoint_path`` as a ``model`` artifact (offline: the run folder's checkpoint is the local copy);
    calls ``finish`` with exit code 1 when ``summary["status"]`` is neither ``completed`` nor ``pruned``.
    Returns ``{"wandb_run_id", "wandb_project", "wandb_mode", "wandb_dir"}`` (mode ``disabled`` and
    Nones for ``logger=None``; only rank 0 touches W&B).
    """
    if logger is None:
        return {"wandb_run_id": None, "wandb_project": None, "wandb_mode": "disabled", "wandb_dir": None}
    if getattr(logger, "_tracking_finished", None) is not None:  # already finished: same answer
        return dict(logger._tracking_finished)
    mode = getattr(logger, "mode", None) or ("offline" if logger._offline else "online")
    info = {"wandb_run_id": None, "wandb_project": logger.name, "wandb_mode": mode, "wandb_dir": None}
    if rank_zero_only.rank != 0:  # the W&B run lives on global rank 0 only
        return info
    import wandb

    run = logger.experiment
    info["wandb_run_id"] = run.id
    info["wandb_project"] = run.project or logger.name
    metrics = {k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None}
    if metrics:
        run.summary.update(scrub(metrics))
    mode = info["wandb_mode"] = getattr(logger, "mode", mode)  # online may have fallen back to offline
    if mode == "online" and checkpoint_path is not None and Path(checkpoint_path).is_file():
        try:
            artifact = wandb.Artifact(name=f"model-{run.id}", type="model",
                                      metadata=scrub({"run.id": getattr(logger, "local_run_id", None),
                                                      "file": Path(checkpoint_path).name, **metrics}))
            artifact.add_file(str(checkpoint_path), name="model.ckpt")
            run.log_artifact(artifact, aliases=["latest", "final"])
        except Exception as e:  # noqa: BLE001 - the local checkpoint is the source of truth
            _warn(f"could not upload the checkpoint to W&B ({e.__class__.__name__}); it stays in the run folder")
    if mode == "offline":
        info["wandb_dir"] = str(Path(run.dir).parent)
    status = summary.get("status", "completed")
    run.finish(exit_code=0 if status in ("completed", "pruned") else 1)  # a pruned trial ended normally
    # wandb 0.31: run.finish() only *informs* wandb-core that the run is over; the core writes and closes
    # the run's .wandb file afterwards (seen here: the file still held only its 7-byte header right after
    # finish() in about 1 run in 5). teardown() waits for the core process to exit, so when finish()
    # returns the run's files are complete (a sweep worker may read them, a user may `wandb sync` them).
    # The next training in this process starts a fresh core (well under a second).
    wandb.teardown()
    logger._tracking_finished = dict(info)
    return info
