"""What a run is asked to do, and the name it is known by: the config's schema and its reading.

- :mod:`.config`: :class:`~.config.Config` (the sections gathered), nested YAML, ``dotted.key=value`` overrides,
  the checks across sections (:func:`~.config.validate`), :data:`~.config.SCHEMA`, :func:`~.config.flatten`;
- :mod:`.sections`: the sections besides the model's (``run``, ``data``, ``train``, ``decode``, ``wandb``,
  ``sweep``), each a typed dataclass that checks its own keys (the model's section is
  :class:`lightning_tfm.model.config.ModelConfig`);
- :mod:`.run_id`: the run id a config trains under and the keys its hash covers (the local corpus hashed by
  its content: :func:`lightning_tfm.training.data.corpus_id.fingerprint`).

Not here: what a run folder holds and whether a config may train in it (:mod:`lightning_tfm.training.runs`), the
YAML texts a user hands the program, read whole and bounded, and what a section is made of (:mod:`lightning_tfm.base`).
"""
