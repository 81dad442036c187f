"""Names shared by the stages that write and read the forward outputs (no JAX import)."""

# The batched forward paths: loop / vmap / direct, each eager and under jax.jit, and
# sharded_jit: data parallelism, a different thing from vmap. vmap vectorizes the
# per-example forward on one device; sharded_jit splits the batch across the devices of
# a mesh (backend.num_devices) and runs that same vectorized forward on each shard.
PATH_NAMES = (
    "loop_eager",
    "loop_jit",
    "vmap_eager",
    "vmap_jit",
    "direct_eager",
    "direct_jit",
    "sharded_jit",
)
# forward_one itself on one unbatched feature vector, eager and under jax.jit.
VECTOR_PATH_NAMES = ("one_eager", "one_jit")

# A stored reference made before a path existed holds no output for it. The path is then
# compared with the stored output of the path computing the same function on one device:
# sharded_jit shards jit(vmap(forward_one)), so it stands against the stored vmap_jit.
REFERENCE_STAND_IN = {"sharded_jit": "vmap_jit"}

# Kinds of regression case: a batch (batch axis 0) run through PATH_NAMES, one vector run
# through VECTOR_PATH_NAMES, or an invalid input every path must refuse.
CASE_KINDS = ("batch", "vector", "invalid")


def output_key(case: str, path: str) -> str:
    """Key of one output in data/forward/outputs.npz, e.g. ``standard.vmap_jit``."""
    return f"{case}.{path}"


def paths_for(kind: str) -> tuple[str, ...]:
    """The paths a case of ``kind`` runs through (invalid inputs: every batched path)."""
    return VECTOR_PATH_NAMES if kind == "vector" else PATH_NAMES
