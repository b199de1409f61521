"""attnlab: Transformer scaling-law and length-extrapolation experiments in JAX/Flax NNX."""

__version__ = "0.1.0"
