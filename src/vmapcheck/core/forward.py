"""Run every forward path on every regression case, recording outputs and refusals."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vmapcheck.core.cases import kind_of
from vmapcheck.core.forms import cast_tree
from vmapcheck.core.models import Model, Params
from vmapcheck.core.paths import build, output_key
from vmapcheck.errors import InvalidInputError


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
    """Run each case through the paths its kind calls for (:data:`CASE_KINDS`), at ``dtype``.

    A batch case goes through every path taking a batch (distributed ones over ``mesh``;
    None: every device present), a vector case through those taking one example, and
    each invalid case through the paths named by its ``runs_on``.

    Returns ``(outputs, record)``: ``outputs["<case>.<path>"]`` is the output of a valid
    case (bfloat16 stored as float32, exactly); ``record[case][path]`` says the output's
    shape and dtype, or whether and how the path refused the input.
    """
    built = {
        "batch": build(model, dtype, "batch", mesh=mesh),
        "vector": build(model, dtype, "vector"),
    }
    run_params = cast_tree(params, dtype)
    outputs: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {}
    for case_name, case in cases.items():
        kind = kind_of(case, case_name)
        paths = {name: fn for takes in built.values() for name, fn in takes.items()}
        paths = {name: paths[name] for name in kind.paths(case) if name in paths}
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
            if kind.valid:
                outputs[output_key(case_name, path_name)] = _storable(host)
        record[case_name] = per_path
    return outputs, record
