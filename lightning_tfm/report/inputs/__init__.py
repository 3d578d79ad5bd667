"""A sweep's runs as the report reads them: :mod:`.records` (a run as a :class:`~.records.RunRecord`, the readers
of local run folders, the Optuna study and W&B), :mod:`.sources` (:func:`~.sources.load_report_data`: a sweep's
records from its results, W&B or an export), :mod:`.budget` (a run read at its own sweep's budget when a later sweep
trained its folder on) and :mod:`.export` (the records a report is built from as one JSON file, checked when read
back). Imports only :mod:`.core` of the report."""
