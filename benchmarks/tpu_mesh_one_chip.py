"""The mesh paths on one TPU chip (issue 46, "Must show"): they run on a mesh of one device
and say so, with no figure that pretends to a split.

On whatever JAX finds (one TPU v5e chip on this workplace's device machine), in one
process: the shipped ``mlp`` (src/vmapcheck/conf/model/mlp.yaml) and the hand-written
tensor-parallel MLP of tests/helpers/mesh_faults.py, healthy and with each planted
mistake, through ``vmapcheck.testing.check_batching`` (paths loop_eager, vmap_jit and
every mesh path; no gradients, no bitwise report). Recorded per run: passed, the mesh
paths' labels and mesh shapes, and the verdict's text. On a mesh of one the planted
mistakes cannot show (a psum over one device is the identity): that they pass there is
the expected result, and the reason the docs say a mesh of one tests no partitioning.

Usage (repository root; on the device machine, OUT set). The machine has JAX 0.10.2 and
libtpu but not what vmapcheck imports; its own package index has it (the install below
ran there on 2026-12-07), and the machine's JAX stays first on PYTHONPATH::

    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
        --index-url file:///opt/pypi/simple --target /tmp/site pydantic pyyaml \
        cloudpickle etils filelock pygments packaging safetensors optax
    export PYTHONPATH=$PYTHONPATH:/tmp/site:$(pwd)/src:$(pwd)
    python3 benchmarks/tpu_mesh_one_chip.py --out $OUT/tpu_mesh_one_chip.json

Rehearsed on this project's CPU machine with JAX 0.10.2 from the same index (one CPU
device: every run passed, each mesh path labelled "a mesh of 1: nothing split"; two:
both planted mistakes failed), not yet on the chip.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    began = time.perf_counter()
    load_before = os.getloadavg()
    import jax
    import numpy as np
    import yaml

    from tests.helpers.mesh_faults import FAULTS, make_model
    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model
    from vmapcheck.core.paths import PATHS, mesh_label
    from vmapcheck.testing import check_batching

    kept = ("loop_eager", "vmap_jit", *(p.name for p in PATHS.values() if p.distributed))
    raw = yaml.safe_load((ROOT / "src/vmapcheck/conf/model/mlp.yaml").read_text())
    models = {"mlp": build_model(ModelConfig.model_validate(raw))}
    models.update({f"mesh_mlp_{fault}": make_model(fault) for fault in FAULTS})
    runs = {}
    for name, model in models.items():
        params = model.init(jax.random.key(0))
        rows = np.random.default_rng(0).normal(size=(8, model.in_features)).astype(np.float32)
        report = check_batching(model, params, rows, paths=kept, gradients=False, bitwise="off")
        meshes = report.details.get("meshes", {})
        runs[name] = {
            "passed": report.passed,
            "labels": [mesh_label(about) for about in meshes.values()],
            "mesh_shapes": {path: about["mesh_shape"] for path, about in meshes.items()},
            "notes": {path: about["note"] for path, about in meshes.items() if "note" in about},
            "summary": report.summary,
        }
        print(f"{name}: passed={report.passed}; " + "; ".join(runs[name]["labels"]))
    device = jax.devices()[0]
    out = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
            "devices": [f"{d.platform} {d.device_kind}" for d in jax.devices()],
        },
        "device_kind": device.device_kind,
        "load": {"before": load_before, "after": os.getloadavg()},
        "wall_s": round(time.perf_counter() - began, 1),
        "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
