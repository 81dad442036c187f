"""Names shared by the stages that write and read the forward outputs (no JAX import)."""

# The six batched forward paths: loop / vmap / direct, each eager and under jax.jit.
PATH_NAMES = ("loop_eager", "loop_jit", "vmap_eager", "vmap_jit", "direct_eager", "direct_jit")
# forward_one itself on one unbatched feature vector, eager and under jax.jit.
VECTOR_PATH_NAMES = ("one_eager", "one_jit")

# Kinds of regression case: a batch (batch axis 0) run through PATH_NAMES, one vector run
# through VECTOR_PATH_NAMES, or an invalid input every path must refuse.
CASE_KINDS = ("batch", "vector", "invalid")


def output_key(case: str, path: str) -> str:
    """Key of one output in data/forward/outputs.npz, e.g. ``standard.vmap_jit``."""
    return f"{case}.{path}"


def paths_for(kind: str) -> tuple[str, ...]:
    """The paths a case of ``kind`` runs through (invalid inputs: every batched path)."""
    return VECTOR_PATH_NAMES if kind == "vector" else PATH_NAMES
