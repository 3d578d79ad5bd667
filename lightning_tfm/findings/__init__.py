"""What a sweep's runs say, below the sweep layer so that a sweep can act on it and a report renders it: pure numerics
(numpy, scipy), no Optuna, no Lightning.

- :mod:`.settings`: the verdict's settings (the sweep file's ``report:`` section), the settle loop's (``settle:``)
  and their ranges;
- :mod:`.curves`: learning curves fitted and extrapolated, the predicted gap's direction and size (the verdict's);
- :mod:`.verdict`: a row's verdict against the base, one rule for ``ltfm sweep --status``, the launcher and the
  report;
- :mod:`.answers`: a row's answer from its own seeds (better, worse, the same within ±delta, unsettled) with a
  false-answer rate that holds over the settle loop's looks;
- :mod:`.settle`: the settle loop's planner: each row's answer and the trials that answer the rest at the least
  compute, within the caps.
"""
