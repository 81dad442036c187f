"""Where the bench's compile time goes on an accelerator, path by path and size by size
(issue 32: the CNN's `bench=accelerator` spent over two minutes compiling at 4,096 rows on
a TPU v5e, 2026-12-06, and the bench could not say which path).

Each jit path the bench times (:func:`vmapcheck.core.paths.batch_paths`) is compiled as
the bench compiles it (``path.compile(model)``, ``fn.lower(*place(params, x)).compile()``)
at each batch size in turn, in a child process of its own with a wall-clock limit, so a
path whose compile does not finish costs its limit, not the whole call. Each compile's
seconds are printed as they come and the JSON is rewritten after each child.

Usage (from the repository root, on the machine that holds the device)::

    python benchmarks/tpu_compile_probe.py --model flax_cnn --sizes 256,1024,4096 \
        --out probe.json --limit-s 90

``--hlo``: also records, per compile, the optimized HLO's instruction count and whether
it holds a while loop (a ``lax.map``'s scan that XLA unrolled has none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def child(
    model_name: str, path_name: str, sizes: list[int], hlo: bool, precision: str | None
) -> None:
    """Compile one path at each size; one JSON line per compile on stdout."""
    import jax

    if precision:
        # As the pipeline's precision option sets it (f32: highest).
        jax.config.update("jax_default_matmul_precision", precision)
    import numpy as np
    from tpu_numerics import build, inputs_for  # the same model and params as the numerics

    from vmapcheck.bench.timing.sampling import bench_input
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.core.paths import batch_paths

    model = build(model_name)
    data = inputs_for(model, model_name, 8)
    path = next(p for p in batch_paths() if p.name == path_name)
    compiled = path.compile(model, None)
    params = jax.device_put(cast_tree(data["params"], np.float32))
    print(json.dumps({"device": str(jax.devices()[0].device_kind)}), flush=True)
    for rows in sizes:
        x = bench_input(data["examples"], rows, np.float32)
        args = compiled.place(params, x)
        began = time.perf_counter()
        lowered = compiled.fn.lower(*args)
        lowered_s = time.perf_counter() - began
        executable = lowered.compile()
        compile_s = time.perf_counter() - began - lowered_s
        row: dict[str, Any] = {"rows": rows, "lower_s": lowered_s, "compile_s": compile_s}
        began = time.perf_counter()
        jax.block_until_ready(compiled.fn(*args))
        row["first_call_s"] = time.perf_counter() - began
        if hlo:
            text = executable.as_text() or ""
            row["hlo_lines"] = text.count("\n")
            row["while_loops"] = text.count(" while(")
        print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="flax_cnn")
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--paths", default=None, help="comma-separated (default: every jit path)")
    parser.add_argument("--limit-s", type=float, default=90.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hlo", action="store_true")
    parser.add_argument(
        "--matmul-precision", default=None, help="e.g. highest (default: the backend's)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        child(args.model, args.child, sizes, args.hlo, args.matmul_precision)
        return 0
    from vmapcheck.core.paths import batch_paths

    names = args.paths.split(",") if args.paths else [p.name for p in batch_paths() if p.jit]
    doc: dict[str, Any] = {
        "model": args.model,
        "sizes": sizes,
        "limit_s": args.limit_s,
        "matmul_precision": args.matmul_precision,
        "paths": {},
    }
    for name in names:
        began = time.perf_counter()
        with tempfile.TemporaryFile("w+") as log:
            cmd = [
                sys.executable,
                __file__,
                "--model",
                args.model,
                "--sizes",
                args.sizes,
                "--child",
                name,
                "--out",
                os.devnull,
            ] + (["--hlo"] if args.hlo else [])
            if args.matmul_precision:
                cmd += ["--matmul-precision", args.matmul_precision]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            rows: list[dict[str, Any]] = []
            try:
                out, _ = proc.communicate(timeout=args.limit_s)
                status = f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                status = f"killed after {args.limit_s:g} s"
            for line in out.splitlines():
                rows.append(json.loads(line))
                print(name, line, flush=True)
            log.seek(0)
            tail = log.read()[-1500:] if proc.returncode else ""
        doc["paths"][name] = {
            "status": status,
            "wall_s": time.perf_counter() - began,
            "compiles": rows,
            "stderr_tail": tail,
        }
        print(f"{name}: {status} in {time.perf_counter() - began:.1f} s", flush=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
