"""Pure-PyTorch models; no Lightning in here.

registry.py: the architectures ``model.arch`` chooses from and ``build_model``, the one place a model is built;
incremental.py: what an architecture implements (training's forward, the incremental-decoder protocol of beam
search, its parameter and FLOPs counts); config.py: ModelConfig, the model section of a config.
The Transformer of Vaswani et al. (2017): attention.py (Sec. 3.2), layers.py (Sec. 3.1, 3.3), positional.py
(Sec. 3.5), transformer.py (Sec. 3, 3.4); cache.py: its incremental decoding; fast.py: its CPU speed paths, each
switched by a config key.
"""
import importlib
import pkgutil

from ..base.knobs import Section
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .cache import KVCache, MemoryCache
from .config import ModelConfig
from .incremental import EncoderDecoder
from .layers import DecoderLayer, EncoderLayer, FeedForward
from .positional import LearnedPositions, SinusoidalPositions, sinusoid_table
from .registry import ARCHITECTURES, DEFAULT_ARCH, build_model, register, train_flops_per_step
from .transformer import BOS, EOS, PAD, UNK, Transformer

# Every module of this package is imported, so that an architecture in a file of its own registers itself
# (fairseq's import_models): adding one is adding that file.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
del _module

__all__ = ["MultiHeadAttention", "scaled_dot_product_attention", "KVCache", "MemoryCache", "FeedForward",
           "EncoderLayer", "DecoderLayer", "SinusoidalPositions", "LearnedPositions", "sinusoid_table",
           "ModelConfig", "Section", "EncoderDecoder", "ARCHITECTURES", "DEFAULT_ARCH", "build_model", "register",
           "Transformer", "train_flops_per_step", "PAD", "BOS", "EOS", "UNK"]
