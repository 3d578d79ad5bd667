"""What every layer uses, below the model: no torch, no Lightning, no Optuna.

- :mod:`.errors`: the one exception of bad input (:class:`~.errors.UserError`: one line, exit 2);
- :mod:`.atomic`: the one way a file is written (whole or absent);
- :mod:`.outputs`: the one check of where a command writes: never over one of its inputs, nor a file a run or a
  report owns (:func:`~.outputs.check_outputs`);
- :mod:`.redact`: the one place secrets are masked;
- :mod:`.inputs`: the YAML a user hands over, read safely, and :func:`~.inputs.shown` (a value in an error);
- :mod:`.knobs`: what a config section is made of (:class:`~.knobs.Section`, :func:`~.knobs.knob`,
  :class:`~.knobs.Range`), for run configs and sweep files alike;
- :mod:`.command`: what an ``ltfm`` command is (:class:`~.command.Command`) and what every command prints alike;
- :mod:`.lifeline`: a sweep's trial process dies with its worker.
"""
