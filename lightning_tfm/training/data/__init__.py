"""The parallel text a run learns from, from the files to the batches (Section 5.1).

- :mod:`.corpus_id`: a local corpus's files (``{split}.{lang}[.gz]``) and its identity by content, which the run
  id hashes (it imports nothing of the config, nor torch);
- :mod:`.data`: reading corpora (a local folder or the Hub), the shared BPE vocabulary, encoding and decoding,
  and the token-budget batches;
- :mod:`.corpus`: prepared corpora: the vocabulary and every split's token ids built once into one folder per
  data key (``ltfm prepare``), memory-mapped by every run and rank.

Not here: the ``data.*`` keys themselves (:mod:`lightning_tfm.training.config.sections`), beam search over the
ids (:mod:`lightning_tfm.training.decode`), the tokenizer a checkpoint carries
(:mod:`lightning_tfm.training.runs.checkpoints`).
"""
