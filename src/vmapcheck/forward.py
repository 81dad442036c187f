"""Run every forward path on every regression case, recording outputs and refusals."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from vmapcheck.errors import InvalidInputError
from vmapcheck.models import Model, Params
from vmapcheck.names import output_key
from vmapcheck.paths import build_paths, cast_tree


def run_forward(
    model: Model, params: Params, cases: dict[str, dict[str, Any]], dtype: Any
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the six paths on each case at ``dtype``.

    Returns ``(outputs, record)``: ``outputs["<case>.<path>"]`` is the output of a valid
    case, upcast to float32 when the run is bfloat16 (exact: bf16 values are f32 values)
    so it can be stored without pickle; ``record`` says, per case and path, the output's
    shape and dtype, or for an invalid case whether and how the path refused it.
    """
    paths = build_paths(model, dtype)
    run_params = cast_tree(params, dtype)
    outputs: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {}
    for case_name, case in cases.items():
        x = jax.numpy.asarray(case["x"], dtype=dtype)
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
            except Exception as exc:  # recorded, judged by check: a crash is not a refusal
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
            stored = host.astype(np.float32) if host.dtype == jax.numpy.bfloat16 else host
            outputs[output_key(case_name, path_name)] = stored
        record[case_name] = per_path
    return outputs, record
