"""One training run (the layer between the model and the benchmarks and sweeps).

The loop itself lives here: :mod:`.train` (one run, top to bottom), :mod:`.lit` (the LightningModule and
DataModule), :mod:`.loss`, :mod:`.optim`, :mod:`.precision`, :mod:`.decode` (beam search), :mod:`.evaluate` (BLEU
and a run's final evaluation); the commands that drive them are in :mod:`lightning_tfm.cli`. What every layer
uses (errors, atomic writes, redaction, config sections) is below the model, in :mod:`lightning_tfm.base`.

Each concern of three or more modules has its own sub-package:

- :mod:`.config`: what a run is asked to do (the schema, its sections, the run id);
- :mod:`.data`: the parallel text from the files to the batches (corpora, the vocabulary, prepared corpora);
- :mod:`.runs`: a run on disk (its folder, checkpoints, results and the ``ltfm runs`` table);
- :mod:`.tracking`: what a run tells the outside (W&B, the offline W&B reader, progress lines).
"""
