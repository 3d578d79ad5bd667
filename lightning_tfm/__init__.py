"""lightning_tfm: experiment tracking and ablations for the Transformer of Vaswani et al. (2017)."""
__version__ = "0.1.0"
