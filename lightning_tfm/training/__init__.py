"""One training run: config, data, the Lightning module, checkpoints, evaluation, tracking (the layer
between the model and the sweeps)."""
