"""``ltfm sweep``: Table 3 as one Optuna study, open searches with pruning, many workers, resumable.

One job per module; imports point one way (model <- training <- sweep <- report; inside the package,
spec <- plan, storage <- queue <- worker, status <- cli, and spec, storage <- pruning):

- :mod:`.spec`: the sweep file (:func:`load_sweep`, :class:`Sweep`, :class:`Entry`), its sampler and pruner
  (:func:`build_sampler`, :func:`build_pruner`) and its search space (:func:`distributions`, :func:`suggest`);
- :mod:`.plan`: each trial's overrides and config (:func:`trial_overrides`, :func:`trial_config`,
  :class:`Plan`): one path for the worker, the dry run and the reports; parameter counts;
- :mod:`.storage`: storage URLs and drivers, SQLite ``BEGIN IMMEDIATE``, the study (:func:`open_study`),
  the trial heartbeat, retries;
- :mod:`.queue`: the rows a variants sweep queues, the atomic claim of one, the duplicate check;
- :mod:`.worker`: running claimed trials as ``ltfm train`` processes (:class:`Worker`); where a trial
  becomes a run folder and a W&B run, and what a worker does when one is killed, locked or out of disk;
- :mod:`.status`: the dry run and the status table;
- :mod:`.launch`: ``--workers K|auto``: K workers started here, one progress line (rows done/running/left,
  each running row's step and dev PPL, the time left);
- :mod:`.pruning`: the Lightning callback a trial process reports its dev metric through (imports
  Lightning, so it is not imported here);
- :mod:`.cli`: ``ltfm sweep``.

Sweep file (YAML, in ``sweeps/``)::

    name: table3-cpu                         # the Optuna study name ([A-Za-z0-9._-])
    experiment: ../experiments/multi30k-cpu.yaml   # base experiment, relative to this file
    metric: dev_loss                         # a summary.json key: dev_loss | dev_ppl | dev_bleu
    direction: minimize                      # default: minimize for loss/ppl, maximize for bleu
    sampler: {type: tpe, seed: 1}            # tpe | random | cmaes | gp | qmc (+ the class's arguments)
    pruner: {type: none}                     # none | median | percentile | hyperband | successive_halving
                                             # | threshold (+ the class's arguments)
    seeds: [1]                               # run.seed of the trials
    overrides: {decode.average_last: 0}      # optional: applied to the experiment of every trial
    heartbeat: {interval: 30, grace: 120, max_retry: 3}   # optional (seconds)
    report: {last_fraction: 0.333, horizon: 2, min_points: 2}   # optional: the report's budget verdict
                                             # (lightning_tfm.report.verdict; these are the defaults)
    n_trials: 40                             # space sweeps: trials in the whole study
    variants:                                # EITHER named rows: one trial per variant and seed
      base: {}
      A1: {model.heads: 1, model.d_k: 256, model.d_v: 256}
      big: {family: big, budget: 3, model.d_model: 512}   # budget: factor on train.max_steps
      # a row's own seeds (default: the sweep's): the base at three seeds measures the seed noise
      # base: {seeds: [1, 2, 3]}
    space:                                   # OR Optuna distributions over dotted keys
      model.heads: {type: categorical, choices: [2, 4, 8]}
      model.dropout: {type: float, low: 0.0, high: 0.3}
      model.d_model: {type: int, low: 128, high: 512, step: 64}

Precedence of a trial's config: experiment < ``overrides`` < command-line ``dotted.key=value`` < the
variant's (or sampled) values < the variant's ``budget`` factor on train.max_steps < seed/bookkeeping.
So ``ltfm sweep sweeps/table3-cpu.yaml train.max_steps=300`` sets the budget of every row (and ``big``,
with ``budget: 3``, gets 900).

Storage: ``--storage URL`` (``sqlite:///path.db``, ``postgresql://user@host/db``, ``mysql+pymysql://...``)
or by default the SQLite file ``<run.results_dir>/<name>.db``. Prefer passwords in ``PGPASSWORD``/
``~/.pgpass`` over the URL; a password in the URL is never printed or written to run folders (trial
processes get the URL through the environment; their config holds it masked).

How trials are shared (every ``ltfm sweep`` on the same storage and file joins one study):

- Variants: each worker enqueues the (variant, seed) rows missing from the study as WAITING trials with a
  ``grid_key`` user attribute (variant, seed, budget, hash of the variant's definition) and claims WAITING
  trials of its own keys one at a time with the storage's atomic WAITING -> RUNNING transition (what
  ``study.ask`` does; on SQLite every transaction is ``BEGIN IMMEDIATE`` so that the check-and-set is atomic
  there too). A different budget makes different keys: new trials, which continue the same run folders from
  their checkpoints. Two workers that start together may enqueue a row twice; a claimed trial whose key
  already belongs to a lower-numbered live trial is closed at once as FAIL with ``skip=duplicate``, never
  trained. A key whose trials all crashed is enqueued again by the next worker.
- Space: ``study.ask()`` with the file's sampler and pruner, until ``n_trials`` trials exist; a sampled
  configuration equal to an earlier trial's is closed as a duplicate instead of training the same run.
- Each trial runs ``python -m lightning_tfm train EXPERIMENT ... sweep.trial=N`` as its own process (a
  crash fails one trial); the trial process reports the dev metric at each validation (:mod:`.pruning`).
  The worker records the run folder, W&B run id and results in the trial's user attributes; the objective
  is ``summary.json[metric]``.
- Heartbeat: a trial whose worker was killed or stopped is failed by a live worker once the grace period
  has passed and re-queued by :class:`~.storage.RetryWhileProgressing` (Optuna's
  ``RetryHeartbeatStaleTrialCallback``, but ``max_retry`` counts only attempts that kept no work); run ids are
  deterministic, so the retry resumes the run from its last checkpoint. The trial process dies with its worker. A worker with
  nothing left to claim waits while trials of its rows still run elsewhere, so that such a retry is run
  without a second command.
- A bad night: a trial killed by a signal (the out-of-memory killer, kill -9) is queued again through the
  same callback (``max_retry`` counts the attempts of both kinds that kept no work); a trial stopped by a results folder that cannot be written is
  queued again and the worker claims nothing until the folder takes writes again; a retry that finds its run
  still trained by a stopped trial waits for that process to end, then resumes the run; storage calls wait
  for a database that restarts (:func:`~.storage.retry`). ``make soak`` runs all of these at once.
- A row the model cannot build (e.g. an odd d_model) is closed as FAIL with ``skip=unbuildable`` and the
  reason, never a crash.

Trial user attributes (what reports read): ``variant``, ``family``, ``seed``, ``grid_key``, ``max_steps``,
``budget``, ``overrides`` (the variant's or sampled values), ``run_id``, ``run_dir``, ``host``, ``log``,
``planned_params``; after the run ``status``, ``steps``, ``params``, ``dev_loss``, ``dev_ppl``, ``dev_bleu``,
``test_bleu``, ``wall_time_s``, ``wandb_run_id``, ``wandb_project``, ``wandb_mode``; ``skip`` + ``reason``
for rows not run, ``error`` + ``exit_code`` for failures. A variant trial's params are its Table 3 knobs
(``DASHBOARD_KNOBS``: fixed values, never sampled). Study: its metric name is the sweep's metric; user
attributes ``ltfm.pruner``, ``ltfm.metric``, ``ltfm.machine.<host>`` (CPU model and cores of each worker).
``optuna-dashboard <storage URL>`` shows all of it.
"""
from .cli import sweep_cli
from .plan import (Plan, build_model_params, check_buildable, format_overrides, parse_cli_overrides,
                   trial_config, trial_overrides, yaml_value)
from .spec import REPORT_DEFAULTS, Entry, Sweep, build_pruner, build_sampler, distributions, load_sweep, suggest
from .status import dry_run, format_status, status_rows
from .storage import (STORAGE_ENV, Heartbeat, default_storage, machine_description, open_storage, open_study,
                      quiet_optuna, retry)
from .queue import claim_waiting, duplicate_of, enqueue_missing
from .worker import RESULT_ATTRS, Worker

__all__ = ["Entry", "Heartbeat", "Plan", "REPORT_DEFAULTS", "RESULT_ATTRS", "STORAGE_ENV", "Sweep", "Worker", "build_model_params",
           "build_pruner", "build_sampler", "check_buildable", "claim_waiting", "default_storage",
           "distributions", "dry_run", "duplicate_of", "enqueue_missing", "format_overrides", "format_status",
           "load_sweep", "machine_description", "open_storage", "open_study", "parse_cli_overrides",
           "quiet_optuna", "retry", "status_rows", "suggest", "sweep_cli", "trial_config", "trial_overrides",
           "yaml_value"]
