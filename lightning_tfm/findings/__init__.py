"""What a sweep's runs say, below the sweep layer so that a sweep can act on it and a report renders it: pure numerics
(numpy, scipy), no Optuna, no Lightning.

- :mod:`.settings`: the verdict's settings (the sweep file's ``report:`` section) and their ranges;
- :mod:`.curves`: learning curves fitted and extrapolated, the predicted gap's direction and size (the verdict's);
- :mod:`.verdict`: a row's verdict against the base, one rule for ``ltfm sweep --status``, the launcher and the
  report.
"""
