"""Names shared by the stages that write and read the forward outputs (no JAX import)."""

# The six forward paths: loop / vmap / direct, each eager and under jax.jit.
PATH_NAMES = ("loop_eager", "loop_jit", "vmap_eager", "vmap_jit", "direct_eager", "direct_jit")


def output_key(case: str, path: str) -> str:
    """Key of one output in data/forward/outputs.npz, e.g. ``standard.vmap_jit``."""
    return f"{case}.{path}"
