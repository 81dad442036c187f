"""The Python API's speed as a user's test meets it (issue 33, point 5): one passing and
one failing ``assert_batching_consistent`` on a small model, each in a fresh process, as
a pytest run starts one.

Each repetition is a child process that imports vmapcheck and JAX, builds a 4-16-3 tanh
MLP (a user's model: ``forward_one`` and a hand-batched ``forward_batch``), then runs

1. the check on 8 examples (PASSED), and
2. the same model with its batched softmax over the batch axis (a planted mistake, as
   ``tests/e2e/test_own_repository.py`` plants it): the check must raise
   ``BatchingCheckError``,

timing each with ``time.perf_counter`` (wall) and ``time.process_time`` (CPU of the
process, every thread), and the import apart. ``--paths`` repeats it with the check's
``paths=`` narrowed to the four the docs suggest. The load average is read before and
after each child (a shared machine's other tenants show there), the machine from
``os.cpu_count`` and ``platform``. Figures: p50 and max over the repetitions.

``--model mlp`` checks the shipped mlp (src/vmapcheck/conf/model/mlp.yaml, built by
``build_model``) instead, its planted mistake the batch's mean subtracted from the
hand-batched outputs (a batch statistic); ``--rows`` sets the examples' rows. Each
configuration runs with the gradient check (``gradients=True``, the default since issue
42) and without it, the two alternating, so that their difference is the gradient
check's cost under the same load.

Usage (from the repository root)::

    python benchmarks/api_speed.py --out benchmarks/api_speed_<date>.json --repeats 5
    python benchmarks/api_speed.py --out benchmarks/api_speed_<date>_mlp32.json \
        --model mlp --rows 32
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FEW_PATHS = ["loop_eager", "vmap_jit", "direct_eager", "direct_jit"]


def child(paths: list[str] | None, model_name: str, rows: int, gradients: bool) -> dict[str, Any]:
    """One repetition, in this process: its figures."""
    began_wall, began_cpu = time.perf_counter(), time.process_time()
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.models import Model
    from vmapcheck.testing import BatchingCheckError, assert_batching_consistent

    imported = {
        "wall_s": time.perf_counter() - began_wall,
        "cpu_s": time.process_time() - began_cpu,
    }

    def make_shipped(planted: bool) -> Model:
        """The shipped mlp; ``planted``: its hand-batched outputs minus their batch mean."""
        from dataclasses import replace

        import yaml

        from vmapcheck.config import ModelConfig
        from vmapcheck.core.models import build_model

        conf = Path(__file__).resolve().parents[1] / "src/vmapcheck/conf/model/mlp.yaml"
        mlp = build_model(ModelConfig.model_validate(yaml.safe_load(conf.read_text())))
        if not planted:
            return mlp
        batch = mlp.forward_batch
        assert batch is not None

        def centred(params: Any, x: Any) -> Any:
            out = batch(params, x)
            return out - jnp.mean(out, axis=0, keepdims=True)

        return replace(mlp, forward_batch=centred, activations_batch=None)

    def make(batch_axis: int) -> Model:
        def init(key: Any) -> dict[str, Any]:
            k1, k2 = jax.random.split(key)
            return {
                "W1": jax.random.normal(k1, (4, 16), jnp.float32) * 0.5,
                "W2": jax.random.normal(k2, (16, 3), jnp.float32) * 0.5,
            }

        def forward_one(params: Any, x: Any) -> Any:  # (4,) -> (3,)
            return jax.nn.softmax(jnp.tanh(x @ params["W1"]) @ params["W2"], axis=-1)

        def forward_batch(params: Any, batch: Any) -> Any:  # (n, 4) -> (n, 3)
            logits = jnp.tanh(batch @ params["W1"]) @ params["W2"]
            return jax.nn.softmax(logits, axis=batch_axis)

        return Model(
            name="tanh_mlp",
            in_features=4,
            out_features=3,
            forward_one=forward_one,
            forward_batch=forward_batch,
            init=init,
        )

    out: dict[str, Any] = {"import": imported}
    for name, axis, should_pass in (("passing", -1, True), ("failing", 0, False)):
        model = make(axis) if model_name == "tanh_mlp" else make_shipped(not should_pass)
        examples = np.random.default_rng(0).normal(size=(rows, model.in_features))
        examples = examples.astype(np.float32)
        params = model.init(jax.random.key(0))
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            assert_batching_consistent(model, params, examples, paths=paths, gradients=gradients)
            passed = True
        except BatchingCheckError:
            passed = False
        out[name] = {
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            "passed": passed,
            "as_expected": passed == should_pass,
        }
    return out


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: cores, platform, Python, and the CPU model
    (``/proc/cpuinfo``'s model name where there is one, else ``platform``'s)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:  # not Linux: platform's name below
        pass
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": cpu or platform.processor() or platform.machine(),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in ("import", "passing", "failing"):
        for figure in ("wall_s", "cpu_s"):
            values = np.array([row[part][figure] for row in rows])
            out[f"{part}_{figure}"] = {
                "p50": float(np.median(values)),
                "max": float(values.max()),
            }
    out["all_as_expected"] = all(
        row[p]["as_expected"] for row in rows for p in ("passing", "failing")
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", choices=["tanh_mlp", "mlp"], default="tanh_mlp")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--child", choices=["all", "few"], help=argparse.SUPPRESS)
    parser.add_argument("--gradients", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        paths = None if args.child == "all" else FEW_PATHS
        print(json.dumps(child(paths, args.model, args.rows, args.gradients == "on")))
        return 0
    model = (
        "4-16-3 tanh MLP with softmax"
        if args.model == "tanh_mlp"
        else "the shipped mlp (8-32-32-2 relu, conf/model/mlp.yaml)"
    )
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": f"{model}, {args.rows} examples, float32 on the CPU",
        "runs": {},
    }
    for paths_label, which in (("every path", "all"), ("paths=" + ",".join(FEW_PATHS), "few")):
        by_label: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeats):
            # With and without the gradient check in turn: the same load for both.
            for gradients in ("on", "off"):
                label = f"{paths_label}, gradients={'True' if gradients == 'on' else 'False'}"
                load_before = os.getloadavg()[0]
                done = subprocess.run(
                    [
                        *(sys.executable, __file__, "--out", os.devnull, "--child", which),
                        *("--model", args.model, "--rows", str(args.rows)),
                        *("--gradients", gradients),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row["load_1min"] = [load_before, os.getloadavg()[0]]
                by_label.setdefault(label, []).append(row)
                print(
                    f"{label}: passing {row['passing']['wall_s']:.2f} s wall / "
                    f"{row['passing']['cpu_s']:.2f} s CPU, failing "
                    f"{row['failing']['wall_s']:.2f} / {row['failing']['cpu_s']:.2f}, import "
                    f"{row['import']['wall_s']:.2f} s, load {row['load_1min'][0]:.1f}",
                    flush=True,
                )
        for label, rows in by_label.items():
            doc["runs"][label] = {"repetitions": rows, "summary": summary(rows)}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
