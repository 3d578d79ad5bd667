"""A report taken out of Python: :mod:`.notebooks` (``ltfm report``'s work: the packaged notebooks executed with
papermill, HTML, the report folder), :mod:`.published` (the same report, Table 3's or Table 2's, put where the
sweep's runs are: :func:`~.published.publish`; and where it was published, as its page says), which sends it to
:mod:`.wandb_run` (one W&B run of job type ``report``) and :mod:`.optuna_note` (the study's optuna-dashboard note
and custom plots), both reading :mod:`.kinds` (what each kind of report gives them). Imports every other
sub-package; only the ``report`` command (:mod:`lightning_tfm.cli.report`) imports it."""
