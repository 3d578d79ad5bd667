"""What a run tells the outside while it trains and after: W&B and the progress lines.

- :mod:`.tracking`: one Weights & Biases run per training run through Lightning's ``WandbLogger`` (its group, job
  type, name, flat config and summary, the offline fallback, one run across resumes);
- :mod:`.wandb_files`: an offline W&B run read back from its ``run-<id>.wandb`` files without a server (``ltfm runs
  RUN --wandb``, and the tests that check what a run logged);
- :mod:`.progress`: one line of progress on stderr where Lightning's bar would not show (a log file, a pipe, CI),
  and Lightning's tips and its own deprecation warning kept out of every run's log.

Not here: the metric names and ``summary.json`` fields a run writes, the source of truth the tracking copies
(:mod:`lightning_tfm.training.runs.results`), and the masking of secrets before anything leaves the process
(:mod:`lightning_tfm.base.redact`).
"""
