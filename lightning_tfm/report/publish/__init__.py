"""A report taken out of Python: :mod:`.notebooks` (``ltfm report``'s work: the packaged notebooks executed with
papermill, HTML, the report folder), :mod:`.dashboards` (the same report as one W&B run of job type ``report``
and as the study's optuna-dashboard note and custom plots, for Table 3 and Table 2 alike) and :mod:`.published`
(where a report was published, as its page says). Imports every other sub-package; only :mod:`.commands` imports
it."""
