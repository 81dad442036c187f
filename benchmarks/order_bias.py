"""Measure the timing-order bias of the benchmark: vmap_jit / direct_jit at one batch size.

Two measurements of the same ratio for the default MLP (conf/model/mlp.yaml), one per
process, each printed with the 1-minute load average before and after it:

- ``bench``: :func:`vmapcheck.bench.timing.run.run_bench` at ``--rows`` only, with the other
  settings of ``conf/bench/<--bench>.yaml`` (the method of the code on ``PYTHONPATH``): its
  ``vmap_over_direct`` and that ratio's confidence interval;
- ``reference``: the two jit paths alone, called alternately ``--calls`` times each, each
  call timed to ``block_until_ready``: the ratio of the two medians. No other path runs,
  so no other path's leftovers land on either.

Usage (from the project root; a fresh process per measurement)::

    PYTHONPATH=src python benchmarks/order_bias.py bench --rows 256
    PYTHONPATH=src python benchmarks/order_bias.py reference --rows 256 --calls 400

The table in docs/benchmark.md ("Why order and isolation matter") comes from this script
(the "before" rows: the same script with the previous commit's src/ on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _setup(bench_option: str) -> tuple[Any, ...]:
    """Config, model, params (seed 0), 64 template rows and dtype of the default MLP."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import yaml

    from vmapcheck.compose import compose_yaml
    from vmapcheck.config import validate_config
    from vmapcheck.core.models import build_model
    from vmapcheck.core.runtime import configure_jax

    config = validate_config(
        yaml.safe_load(compose_yaml(ROOT / "conf", ["model=mlp", f"bench={bench_option}"]))
    )
    configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(64, model.in_features)).astype(np.float32)
    return config, model, params, rows, jnp.dtype(config.precision.dtype)


def bench(rows_n: int, bench_option: str) -> str:
    from vmapcheck.bench.timing.run import run_bench

    config, model, params, rows, dtype = _setup(bench_option)
    settings = config.bench.model_copy(update={"batch_sizes": [rows_n]})
    result = run_bench(model, params, rows, settings, dtype)
    label = f"b{rows_n}"
    ratio = result["speedup"][label]["vmap_over_direct"]
    ci = result.get("speedup_ci", {}).get(label, {}).get("vmap_over_direct", [None, None])
    p50 = {p: result["latency_ms"][p][label]["p50"] for p in ("vmap_jit", "direct_jit")}
    return (
        f"bench={bench_option} {label}: vmap_jit/direct_jit = {ratio:.3f} CI {ci} "
        f"(p50 ms: vmap_jit {p50['vmap_jit']:.4g}, direct_jit {p50['direct_jit']:.4g})"
    )


def reference(rows_n: int, calls: int, bench_option: str) -> str:
    import jax
    import numpy as np

    from vmapcheck.bench.timing.sampling import bench_input
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.core.paths import PATHS

    _, model, params, rows, dtype = _setup(bench_option)
    x = bench_input(rows, rows_n, dtype)
    run_params = jax.device_put(cast_tree(params, dtype))
    fns = {name: PATHS[name].compile(model).fn for name in ("vmap_jit", "direct_jit")}
    for fn in fns.values():  # compile and warm up
        for _ in range(10):
            jax.block_until_ready(fn(run_params, x))
    secs: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(calls):
        # Alternating, the first of each pair swapped every time.
        for name in list(fns)[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            jax.block_until_ready(fns[name](run_params, x))
            secs[name].append(time.perf_counter() - start)
    med = {name: float(np.median(v)) * 1e3 for name, v in secs.items()}
    return (
        f"reference b{rows_n}, {calls} calls each, alternating: vmap_jit/direct_jit = "
        f"{med['vmap_jit'] / med['direct_jit']:.3f} (p50 ms: vmap_jit {med['vmap_jit']:.4g}, "
        f"direct_jit {med['direct_jit']:.4g})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("bench", "reference"))
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--bench", default="full", help="bench config option (conf/bench)")
    parser.add_argument("--calls", type=int, default=400, help="reference: calls per path")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    start = time.perf_counter()
    if args.what == "bench":
        line = bench(args.rows, args.bench)
    else:
        line = reference(args.rows, args.calls, args.bench)
    after = os.getloadavg()[0]
    print(
        f"{line}; {time.perf_counter() - start:.0f} s; load avg 1m {before:.2f} -> {after:.2f} "
        f"on {os.cpu_count()} cores"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
