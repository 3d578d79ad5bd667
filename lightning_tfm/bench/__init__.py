"""``ltfm bench``: what the code costs on the machine at hand (the layer above training, below the sweeps).

- :mod:`.speed`: training and decoding speed of an architecture, optionally beside Hugging Face's MarianMTModel;
  its default shapes (:data:`~.speed.DEFAULTS`) are also the sentence lengths training FLOPs are counted at where
  a sweep or a report has no measured ones (the sweeps and reports import them from here);
- :mod:`.layers`: the paper's Table 1, one layer of each type timed over sentence lengths;
- :mod:`.pipeline`: the data pipeline at scale (``ltfm prepare`` and the first training steps of real ``ltfm``
  processes on a generated corpus);
- :mod:`.profile`: where a real trial of an experiment spends its time (its phases, and its training step by kind of
  work under torch.profiler).

The ``bench`` command is :mod:`lightning_tfm.cli.bench`.

What is measured is the training layer's own code (the model, the loss, the optimizer, beam search, the corpus
reader); nothing here is imported by a training run.
"""
