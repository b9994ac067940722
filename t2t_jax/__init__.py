"""t2t_jax: the Transformer of "Attention Is All You Need" in JAX/Flax."""

__version__ = "0.2.0"
