"""What a sweep's runs say, below the sweep layer so that a sweep can act on it and a report renders it: pure numerics
(numpy, scipy), no Optuna, no Lightning.

- :mod:`.settings`: the verdict's settings (the sweep file's ``report:`` section), the settle loop's (``settle:``)
  and their ranges;
- :mod:`.noise`: seed noise, its rule and the intervals a finding carries (Welch's, a record's);
- :mod:`.curves`: learning curves fitted and extrapolated, the predicted gap's direction and size (the verdict's),
  with the constants it reads from ``calibration.json``;
- :mod:`.verdict`: a row's verdict against the base, one rule for ``ltfm sweep --status``, the launcher and the
  report;
- :mod:`.backtest`: the verdict's back-test, an earlier budget's verdicts against a later budget's curves, and the
  scores of each row;
- :mod:`.calibrate`: the constants and records computed from back-tests, each export left out in turn (what
  ``calibration.json`` holds);
- :mod:`.answers`: a row's answer from its own seeds (better, worse, the same within ±delta, unsettled) with a
  false-answer rate that holds over the settle loop's looks;
- :mod:`.settle`: the settle loop's planner: each row's answer and the trials that answer the rest at the least
  compute, within the caps.
"""
