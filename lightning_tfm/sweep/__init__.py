"""``ltfm sweep``: Table 3 as one Optuna study, open searches with pruning, many workers, resumable.

How to run a sweep is in the README ("Sweep"); the sweep file's keys: ``ltfm sweep --keys``. One job per module:

- :mod:`.schema`: the sweep file's sections as typed dataclasses, help beside each key (``ltfm sweep --keys``);
- :mod:`.spec`: loading and checking a sweep file; its sampler, pruner and search space;
- :mod:`.plan`: each trial's overrides and config, one path for the worker, the dry run and the reports;
- :mod:`.seeding`: the sweep's sampler, seeded per trial so that many workers share one search;
- :mod:`.storage`: storage URLs and drivers, the study, the trial heartbeat and its retries;
- :mod:`.queue`: the rows a variants sweep queues, the atomic claim of one, the duplicate check;
- :mod:`.worker`: claimed trials run as ``ltfm train`` processes, and what a worker does when one fails;
- :mod:`.budget`: a run folder read at a sweep's budget when another sweep trained it on (worker, status, reports);
- :mod:`.curve_pruner`: the pruner that stops a search trial from its fitted curve;
- :mod:`.pruning`: the Lightning callback a trial reports its dev metric through (imports Lightning);
- :mod:`.launch`: ``--workers K|auto`` and the progress line;
- :mod:`.slurm`: ``--launcher slurm``, the workers as a Slurm job array (submitit), stopped and requeued;
- :mod:`.proxy`: Optuna's gRPC storage proxy (``--serve-storage``, ``--storage grpc://``), its heartbeat;
- :mod:`.status`: the dry run and the status table;
- :mod:`.settle`: ``--settle``, the loop that queues and runs the trials the planner asks for until every row is
  answered or at its cap.

What a row's runs say (its curves, its verdict, its answer and the settle planner) is computed in
:mod:`lightning_tfm.findings`, below this layer.

The commands (``ltfm sweep``, ``ltfm prepare``, and ``ltfm train``, a sweep's trial) are in :mod:`lightning_tfm.cli`.
"""
from ..base.lazy import lazy_names

# The package's names, imported on first use (PEP 562): importing the package imports neither Optuna nor torch
# until a name that needs them is asked for. A name and the module that defines it:
_HOMES = {
    "plan": ("Plan", "build_model_params", "check_buildable", "format_overrides", "parse_cli_overrides",
             "trial_config", "trial_overrides", "yaml_value"),
    "spec": ("REPORT_DEFAULTS", "Entry", "Sweep", "build_pruner", "build_sampler", "distributions", "load_sweep",
             "suggest"),
    "status": ("dry_run", "format_status", "status_rows"),
    "storage": ("STORAGE_ENV", "Heartbeat", "default_storage", "machine_description", "open_storage", "open_study",
                "quiet_optuna", "retry"),
    "queue": ("claim_waiting", "duplicate_of", "enqueue_missing"),
    "worker": ("RESULT_ATTRS", "Worker"),
}
__all__, __getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
