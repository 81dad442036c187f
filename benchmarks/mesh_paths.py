"""The mesh paths' figures (issue 46, point 4): time per batch of every distributed path
(``sharded_jit``, ``tensor_parallel_jit``, ``data_model_jit``) against the one-device
``vmap_jit``, and their communication as the compiled program holds it, on emulated CPU
devices.

For each model (the shipped ``mlp``, ``flax_transformer`` and ``resnet``, from
src/vmapcheck/conf/model/) and each path, in one process started with ``--devices``
emulated CPU devices (``jax_num_cpu_devices``, set before JAX starts): the path is built
from the registry (``vmapcheck.core.paths.PATHS``) on the run's mesh
(``vmapcheck.core.mesh.run_mesh``: ``--model-axis`` or the default grid), compiled ahead
of time, then called ``--repeats`` times on a batch of ``--rows`` rows already on its
devices; the figures are the median and the quartiles of the wall time per call.

Communication: the collectives in the compiled HLO text (``all-reduce``, ``all-gather``,
``reduce-scatter``, ``all-to-all``, ``collective-permute``, their async ``-start`` forms
counted once), how many and the bytes of their results (from each op's result shape),
and that volume's share of XLA's ``bytes accessed`` for the per-device program
(``cost_analysis``) plus it. A *volume* share, not a time share: the emulated devices
share one host's memory and cores, so a collective there is a memory copy, and timing
with and without the collectives would time copies, not links.

What emulated devices can tell about real chips: which collectives the partitioner
inserts, how many and how large (the program is the one a real mesh runs, up to the
backend's own passes), and that the partitioned program gives the same answers. What
they cannot: the time of a collective over ICI or NVLink, the overlap of communication
with compute, and any speed-up (the "devices" share the host's cores: a mesh of 8 on
2 cores is no faster than one device). The JSON says so too.

Usage (from the repository root)::

    python benchmarks/mesh_paths.py --out benchmarks/mesh_paths_<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("mlp", "flax_transformer", "resnet")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# An HLO instruction: "%name = <result shape> <op>(" or "<op>-start(" (async pair: the
# -done half carries no new data).
_OP = re.compile(
    r"=\s+(?P<shape>\(?[a-z0-9\[\]{},:\s/]*?\)?)\s+"
    r"(?P<op>" + "|".join(COLLECTIVES) + r")(-start)?\("
)
_ARRAY = re.compile(r"(?P<dtype>pred|[subf]\d+|bf16)\[(?P<dims>[\d,]*)\]")
_BYTES = {"pred": 1, "bf16": 2}
CAN_TELL = (
    "which collectives the SPMD partitioner inserts for each path, how many and how large "
    "(the per-device program is the one a real mesh of this shape runs, up to the backend's "
    "own passes); that the partitioned program's answers agree (tests/test_mesh_paths.py)"
)
CANNOT_TELL = (
    "the time of a collective over real links (ICI on a TPU slice, NVLink or the network "
    "between GPU hosts), its overlap with compute, or any speed-up: the emulated devices "
    "share one host's cores and memory, so a collective is a memory copy and a mesh of N "
    "is no faster than one device"
)


def _array_bytes(shape: str) -> int:
    total = 0
    for match in _ARRAY.finditer(shape):
        dtype = match["dtype"]
        size = _BYTES.get(dtype, max(int(dtype[1:]) // 8, 1))
        dims = [int(d) for d in match["dims"].split(",") if d]
        count = 1
        for d in dims:
            count *= d
        total += size * count
    return total


def collectives(hlo: str) -> dict[str, Any]:
    """The collectives of one compiled HLO module: per op, how many and their result
    bytes; ``total_bytes`` over all of them."""
    found: dict[str, dict[str, int]] = {}
    for match in _OP.finditer(hlo):
        entry = found.setdefault(match["op"], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += _array_bytes(match["shape"])
    return {"ops": found, "total_bytes": sum(e["bytes"] for e in found.values())}


def _batch(model: Any, rows: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(0)
    x = {}
    for leaf in model.contract.leaves:
        if leaf.vocab is not None:
            x[leaf.name] = rng.integers(0, leaf.vocab, (rows, *leaf.shape)).astype(np.int32)
        elif leaf.dtype == "bool":
            x[leaf.name] = np.ones((rows, *leaf.shape), bool)
        else:
            x[leaf.name] = rng.normal(size=(rows, *leaf.shape)).astype(np.float32)
    return x if model.inputs is not None else x[model.contract.leaves[0].name]


def measure(name: str, rows: int, repeats: int, model_axis: int | None) -> dict[str, Any]:
    """Every distributed path and vmap_jit for the shipped model ``name``."""
    import jax
    import yaml
    from omegaconf import OmegaConf

    from vmapcheck.config import ModelConfig
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.core.mesh import run_mesh
    from vmapcheck.core.models import build_model
    from vmapcheck.core.paths import PATHS, mesh_label

    raw = yaml.safe_load((ROOT / f"src/vmapcheck/conf/model/{name}.yaml").read_text())
    # ${model.out_features} in the factory's arguments: resolved as Hydra would.
    resolved: Any = OmegaConf.to_container(OmegaConf.create({"model": raw}), resolve=True)
    model = build_model(ModelConfig.model_validate(resolved["model"]))
    params = cast_tree(model.init(jax.random.key(0)), "float32")
    x = _batch(model, rows)
    mesh = run_mesh(None, model_axis)
    figures: dict[str, Any] = {}
    for path in [PATHS["vmap_jit"], *(p for p in PATHS.values() if p.distributed)]:
        compiled = path.compile(model, mesh)
        assert compiled is not None
        args = compiled.place(params, x)
        began = time.perf_counter()
        executable = compiled.fn.lower(*args).compile()
        compile_s = time.perf_counter() - began
        jax.block_until_ready(compiled.fn(*args))  # the first call, not timed
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            jax.block_until_ready(compiled.fn(*args))
            times.append((time.perf_counter() - began) * 1e3)
        cost = executable.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        accessed = float((cost or {}).get("bytes accessed", float("nan")))
        comm = collectives(executable.as_text())
        quartiles = statistics.quantiles(times, n=4)
        figures[path.name] = {
            "label": mesh_label(compiled.about) if compiled.about else f"{path.name} (one device)",
            "mesh_shape": (compiled.about or {}).get("mesh_shape", {}),
            "devices": compiled.devices,
            "compile_s": round(compile_s, 3),
            "ms_per_batch": {
                "p50": round(statistics.median(times), 4),
                "p25": round(quartiles[0], 4),
                "p75": round(quartiles[2], 4),
            },
            "collectives": comm["ops"],
            "collective_bytes_per_device": comm["total_bytes"],
            "bytes_accessed_per_device": accessed,
            "collective_volume_share": round(
                comm["total_bytes"] / (comm["total_bytes"] + accessed), 4
            )
            if accessed == accessed and comm["total_bytes"] + accessed > 0
            else None,
        }
    return {"rows": rows, "repeats": repeats, "paths": figures}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--model-axis", type=int, default=None)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    sys.path.insert(0, str(ROOT / "src"))
    load_before = os.getloadavg()
    began = time.perf_counter()
    results = {
        name: measure(name, args.rows, args.repeats, args.model_axis) for name in args.models
    }
    out = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "devices": f"{len(jax.devices())} emulated {jax.devices()[0].platform} devices",
        },
        "load": {"before": load_before, "after": os.getloadavg()},
        "wall_s": round(time.perf_counter() - began, 1),
        "emulated_devices_can_tell": CAN_TELL,
        "emulated_devices_cannot_tell": CANNOT_TELL,
        "models": results,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, result in results.items():
        for fig in result["paths"].values():
            ops = ", ".join(f"{op} x{e['count']}" for op, e in fig["collectives"].items())
            print(
                f"{name:17} {fig['label']}: {fig['ms_per_batch']['p50']:.3f} ms per batch of "
                f"{result['rows']} (p25-p75 {fig['ms_per_batch']['p25']:.3f}-"
                f"{fig['ms_per_batch']['p75']:.3f}); collectives: {ops or 'none'}, "
                f"{fig['collective_bytes_per_device']} B per device, volume share "
                f"{fig['collective_volume_share']}"
            )
    print(f"emulated devices can tell: {CAN_TELL}")
    print(f"emulated devices cannot tell: {CANNOT_TELL}")
    print(f"load {load_before} -> {out['load']['after']}; written {args.out}")


if __name__ == "__main__":
    main()
