"""vmapcheck: prove batched JAX inference agrees with the per-example loop, and time it."""

__version__ = "0.1.0"
