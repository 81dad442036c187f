"""Run every forward path on every regression case, recording outputs and refusals."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vmapcheck.errors import InvalidInputError
from vmapcheck.models import Model, Params
from vmapcheck.names import output_key
from vmapcheck.paths import build_paths, build_vector_paths, cast_tree


def _storable(host: np.ndarray) -> np.ndarray:
    # bfloat16 has no pickle-free .npz encoding; its values are exactly float32 values.
    return host.astype(np.float32) if host.dtype == jnp.bfloat16 else host


def run_forward(
    model: Model,
    params: Params,
    cases: dict[str, dict[str, Any]],
    dtype: Any,
    mesh: Mesh | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run each case through the paths its kind calls for, at ``dtype``.

    Batch cases go through the batched paths (loop, vmap, direct, eager and jit, and
    ``sharded_jit`` over ``mesh``; None: every device present), the vector case through
    ``forward_one`` (eager and jit), and each invalid case through the paths named by
    its ``runs_on``.

    Returns ``(outputs, record)``: ``outputs["<case>.<path>"]`` is the output of a valid
    case (bfloat16 stored as float32, exactly); ``record[case][path]`` says the output's
    shape and dtype, or whether and how the path refused the input.
    """
    batch_paths = build_paths(model, dtype, mesh=mesh)
    vector_paths = build_vector_paths(model, dtype)
    run_params = cast_tree(params, dtype)
    outputs: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {}
    for case_name, case in cases.items():
        kind = case["kind"]
        on_vector = kind == "vector" or case.get("runs_on") == "vector"
        paths = vector_paths if on_vector else batch_paths
        x = jnp.asarray(case["x"], dtype=dtype) if case.get("cast", True) else case["x"]
        per_path: dict[str, Any] = {}
        for path_name, path in paths.items():
            try:
                out = jax.block_until_ready(path(run_params, x))
            except InvalidInputError as exc:
                per_path[path_name] = {
                    "refused": True,
                    "error": type(exc).__name__,
                    "message": str(exc),
                }
                continue
            except Exception as exc:  # recorded and judged by check: a crash is no refusal
                per_path[path_name] = {
                    "refused": False,
                    "crashed": True,
                    "error": type(exc).__name__,
                    "message": str(exc),
                }
                continue
            host = np.asarray(out)
            per_path[path_name] = {
                "refused": False,
                "shape": list(host.shape),
                "dtype": str(host.dtype),
            }
            if kind != "invalid":
                outputs[output_key(case_name, path_name)] = _storable(host)
        record[case_name] = per_path
    return outputs, record
