"""Pure-PyTorch Transformer of Vaswani et al. (2017); no Lightning in here.

attention.py (Sec. 3.2), layers.py (Sec. 3.1, 3.3), positional.py (Sec. 3.5), transformer.py (Sec. 3, 3.4);
config.py: ModelConfig, the model section of a config; cache.py: incremental decoding; fast.py: the CPU speed paths, each switched by an argument.
"""
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .cache import KVCache, MemoryCache
from .config import ModelConfig
from .layers import DecoderLayer, EncoderLayer, FeedForward
from .positional import LearnedPositions, SinusoidalPositions, sinusoid_table
from .transformer import BOS, EOS, PAD, UNK, Transformer, count_parameters

__all__ = ["MultiHeadAttention", "scaled_dot_product_attention", "KVCache", "MemoryCache", "FeedForward",
           "EncoderLayer", "DecoderLayer", "SinusoidalPositions", "LearnedPositions", "sinusoid_table",
           "ModelConfig", "Transformer", "count_parameters", "PAD", "BOS", "EOS", "UNK"]
