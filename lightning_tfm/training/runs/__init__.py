"""A run on disk: its folder, what it trained to (checkpoints) and what it scored (results).

- :mod:`.run_folder`: a run folder's life: the lock that lets one process train it, its earlier summary and
  attempts, whether a config may train in it (:func:`~.run_folder.reuse_problem`), the run id it trains under
  where an older id's folder holds it, and the one-line errors of a results folder that cannot be written;
- :mod:`.checkpoints`: loading (``weights_only=True``), telling whose a checkpoint is, scanning and averaging
  checkpoints, a run's model loaded;
- :mod:`.resume`: a resume, one name per step: the checkpoint it loads, its check, the unreadable ones set aside,
  each rank's random state;
- :mod:`.upgrade`: every rule by which what an older version wrote (a checkpoint, a summary, a run folder's name,
  its corpus's record) is read as today's, each with the commit it upgrades from;
- :mod:`.checkpoint_io`: writing them (Lightning's writer made atomic, one step's checkpoints one file);
- :mod:`.results`: the metric names a run logs and the fields of its ``summary.json``, and the readers of the
  local results store, which the sweeps, the tracking and the reports read through;
- :mod:`.runs`: that store as ``ltfm runs``' terminal table.

Not here: the run id's hash (:mod:`lightning_tfm.training.config.run_id`), the atomic writer every file goes
through (:mod:`lightning_tfm.base.atomic`), the W&B copy of a run (:mod:`lightning_tfm.training.tracking`).
"""
