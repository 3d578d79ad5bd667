"""Pure-PyTorch Transformer of Vaswani et al. (2017); no Lightning in here."""
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .layers import DecoderLayer, EncoderLayer, FeedForward
from .positional import LearnedPositions, SinusoidalPositions, sinusoid_table
from .transformer import BOS, EOS, PAD, UNK, Transformer, count_parameters

__all__ = ["MultiHeadAttention", "scaled_dot_product_attention", "FeedForward", "EncoderLayer", "DecoderLayer",
           "SinusoidalPositions", "LearnedPositions", "sinusoid_table", "Transformer", "count_parameters",
           "PAD", "BOS", "EOS", "UNK"]
