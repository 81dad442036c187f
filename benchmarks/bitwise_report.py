"""Bitwise batch invariance of the shipped models, on this machine's default backend
(issue 42, item 6; docs/checks.md, "Bitwise batch invariance").

For the shipped ``mlp`` and ``flax_cnn`` (digits), the Python API's check
(:func:`vmapcheck.testing.check_batching`, ``bitwise="report"``) on the model's stored
reference (``data/reference/<model>/``: its verified, trained params and its
``standard`` case, real rows of the model's data set; the model's init params and
random rows when ``--init`` is given or no reference is stored). It writes, per
model and batch path: bitwise yes or no, the rows that differ, the largest ULP
distance, whether it is bitwise equal to the loop, the first operation where the bits
part, and the argmax flip share (class outputs); and the check's seconds with the
measurement off (first, JAX warming up), on, and off again, in the same process.

One process, no sockets, nothing but JAX, Flax, NumPy and vmapcheck (a TPU is held by
one process: run it there as it is)::

    python benchmarks/bitwise_report.py --json benchmarks/bitwise_cpu_<YYYYMMDD>.json
    python benchmarks/bitwise_report.py --json benchmarks/bitwise_tpu_<YYYYMMDD>.json  # on a TPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp", "flax_cnn")
# The rows checked when no reference is stored (a reference's standard case has its own).
RANDOM_ROWS = 32


def _model(name: str) -> Any:
    """The shipped model ``name`` as the pipeline builds it (src/vmapcheck/conf/model/)."""
    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model

    conf = ROOT / "src" / "vmapcheck" / "conf" / "model" / f"{name}.yaml"
    raw = yaml.safe_load(conf.read_text(encoding="utf-8"))
    # The interpolations of the factory's keys (${model.in_features}), resolved here as
    # Hydra resolves them when it composes params.yaml.
    factory = raw.get("factory")
    if isinstance(factory, dict):
        raw["factory"] = {
            k: raw[v.removeprefix("${model.").removesuffix("}")]
            if isinstance(v, str) and v.startswith("${model.")
            else v
            for k, v in factory.items()
        }
    return build_model(ModelConfig.model_validate(raw))


def _inputs(model: Any, init: bool) -> tuple[Any, Any, str]:
    """(params, the batch, where they come from): the stored reference's params and its
    standard case, else the init params and random rows."""
    import jax
    import numpy as np

    from vmapcheck.check.reference import load_reference
    from vmapcheck.data.regression import STANDARD_CASE
    from vmapcheck.params_io import load_model_params

    folder = ROOT / "data" / "reference" / model.name
    stored = None if init else load_reference(folder)
    if stored is not None and STANDARD_CASE in stored["cases"]:
        params, _ = load_model_params(model, folder)
        x = stored["cases"][STANDARD_CASE]["x"]
        made = stored["meta"].get("created_at", "?")
        where = f"data/reference/{model.name} (trained params, made {made})"
        return params, x, f"{where}: case {STANDARD_CASE}"
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    shapes = {leaf.name: leaf.shape for leaf in model.contract.leaves}
    if model.contract.flat:
        x = rng.normal(size=(RANDOM_ROWS, model.in_features)).astype(np.float32)
    else:
        # Each leaf uniform in 0..16, the digits' ink counts (the shipped dict model).
        x = {
            k: rng.uniform(0, 16, size=(RANDOM_ROWS, *s)).astype(np.float32)
            for k, s in shapes.items()
        }
    return params, x, f"init params (key 0), {RANDOM_ROWS} random rows"


def report_model(name: str, init: bool) -> dict[str, Any]:
    """One model's bitwise report through the API."""
    from vmapcheck.core.bitwise_verdict import summary_line
    from vmapcheck.testing import check_batching

    model = _model(name)
    params, x, source = _inputs(model, init)
    took = {}
    # The check without the measurement (the first run warms JAX up), with it, and
    # without it again: "report" against "off_again" is the measurement's cost in a warm
    # process.
    for key, mode in (("off_first", "off"), ("report", "report"), ("off_again", "off")):
        wall, cpu = time.perf_counter(), time.process_time()
        done = check_batching(model, params, x, bitwise=mode)
        took[key] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        if mode == "report":
            report = done
    section = report.details["bitwise"]
    flips = section["argmax_flips"]
    return {
        "model": name,
        "inputs": source,
        "case_rows": section["rows"],
        "rows_alone": section["rows_alone"],
        "out_features": model.out_features,
        "check_passed": report.passed,
        "line": summary_line(section),
        "argmax_flip_share": None if flips is None else flips["flipped"] / flips["rows"],
        "argmax_flips": flips,
        "paths": {
            path: {
                "bitwise": p.bitwise,
                "rows_differing": p.rows_differing,
                "rows": p.rows,
                "max_ulp": p.max_ulp,
                "bitwise_equal_to_loop": p.vs_plain,
                "first_op": p.first_op or None,
                "first_op_found_at": (section["paths"][path]["first_op"] or {}).get("found_at"),
                "argmax_flips": p.argmax_flips,
            }
            for path, p in report.bitwise.items()
        },
        # The API check's seconds: bitwise "off" (first, JAX warming up), "report", "off".
        "check_seconds": took,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the report")
    parser.add_argument("--init", action="store_true", help="init params and random rows")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import jax

    device = jax.devices()[0]
    load_before = os.getloadavg()
    models = [report_model(name, args.init) for name in args.models]
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "devices": jax.device_count(),
        "jax_version": jax.__version__,
        "models": models,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for m in models:
        print(f"{m['model']}: {m['line']}")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
