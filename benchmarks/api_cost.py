"""What a ``check_batching`` call costs, first and repeated, beside a hand-written check
(issue 42, item 7; issue 44, item 1).

Models: the shipped mlp and Flax CNN (``--rows`` examples each, 32 by default), and every
entry of ``tests/real_bugs`` (the acceptance corpus, docs/real-bugs.md), its bug and its
fix. Each model is measured in two fresh Python processes, each of which first imports
JAX and vmapcheck and runs one tiny jitted op (timed apart: the import and JAX's own
start), then builds the model and times, in turn:

- ``api``: ``check_batching`` with the entry's arguments, then the same call again (the
  *repeat*: what a test file with several checks of one model pays after the first);
- ``hand``: the check a careful user writes instead, twice (a test function builds its
  closures anew each time, as it would): the plain per-example loop eager, ``jax.jit(
  jax.vmap(forward_one))`` and, where the model has one, ``jax.jit(forward_batch)``, each
  compared with ``np.testing.assert_allclose`` at the precision option's ``tolerance``
  (rtol, atol), inputs and params cast to its dtype.

Figures per call: CPU seconds (``time.process_time``, every thread, plus waited-for
children) and wall seconds. The table gives the API's first and repeat call against the
hand-written check's first call (the targets of issue 44: first <= 3x, repeat <= 1.5x).
The machine is shared: the 1-minute load average is read before and after each model
and for the whole run, and the CPU, cores, JAX version and git commit are recorded.
Corpus entries whose feature is not in the installed vmapcheck (``RealBug.missing()``)
are listed as skipped. ``--json`` writes it all.

``--narrow``: the API check with the unit-test choice of docs/python-api.md
(:data:`NARROW_PATHS` the model provides, ``bitwise="off"``). ``--compile-cache``: two
more ``api`` processes per model share a fresh folder as JAX's persistent compilation
cache (``JAX_COMPILATION_CACHE_DIR``, every compile kept:
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``, the documented opt-in): the first fills
it, the second's calls are the ``api_cache_warm`` figures (a test run after another).

Usage (from the repository root; CPU-heavy, several minutes)::

    python benchmarks/api_cost.py --json benchmarks/api_cost_<YYYYMMDD>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.real_bugs
sys.path.insert(0, str(ROOT / "benchmarks"))  # api_speed's helpers

from api_speed import machine  # noqa: E402

SIDES = ("bug", "fix")
# The shipped models measured besides the corpus (src/vmapcheck/conf/model/<name>.yaml).
SHIPPED = ("mlp", "flax_cnn")
KINDS = ("api", "hand")
# --narrow: the plain loop, vmap under jit and the hand-batched form under jit (where the
# model has one), bitwise invariance not measured (docs/python-api.md, "Speed").
NARROW_PATHS = ("loop_eager", "vmap_jit", "direct_jit")
# Issue 44's targets: the API's CPU against the hand-written check's first call.
TARGET_FIRST = 3.0
TARGET_REPEAT = 1.5
LAZY_IMPORTS = (
    "vmapcheck.testing",
    "vmapcheck.testing._run",
    "vmapcheck.check.checks",
    "vmapcheck.core.forward",
    "vmapcheck.core.oracle",
    "vmapcheck.core.composition",
    "vmapcheck.data.regression",
    "vmapcheck.report.summary",
    "jax.experimental.multihost_utils",
    "jax.extend",
)


def _cpu_now() -> float:
    """CPU seconds of this process (all threads) and of its waited-for children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _shipped(name: str, rows: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(model, params, examples, check kwargs) of a shipped model: built from its
    conf/model/<name>.yaml (a factory's keys as the file gives them), ``rows`` examples
    of its input contract, batch axis 0 (normal values; the CNN's images 0..16)."""
    import importlib

    import jax
    import yaml

    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model

    raw = yaml.safe_load((ROOT / f"src/vmapcheck/conf/model/{name}.yaml").read_text())
    if raw.get("factory"):
        # Hydra would resolve ${model.in_features}; the factory is called here directly.
        factory = dict(raw["factory"])
        module, _, attr = factory.pop("_target_").rpartition(".")
        factory.update(in_features=raw["in_features"], out_features=raw["out_features"])
        model = getattr(importlib.import_module(module), attr)(**factory)
    else:
        model = build_model(ModelConfig.model_validate(raw))
    rng = np.random.default_rng(0)
    if model.inputs:
        examples: Any = {
            leaf.name: rng.uniform(0.0, 16.0, size=(rows, *leaf.shape)).astype(np.float32)
            for leaf in model.contract.leaves
        }
    else:
        examples = rng.normal(size=(rows, model.in_features)).astype(np.float32)
    return model, model.init(jax.random.key(0)), examples, {}


def _case(name: str, side: str, rows: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    if name in SHIPPED:
        return _shipped(name, rows)
    from tests.real_bugs import REAL_BUGS

    entry = REAL_BUGS[name]
    model, params, examples = entry.bug() if side == "bug" else entry.fix()
    return model, params, examples, dict(entry.check_kwargs)


def hand_check(model: Any, params: Any, examples: Any, precision: str) -> bool:
    """The check a user writes by hand: the per-example loop eager against
    ``jit(vmap(forward_one))`` and ``jit(forward_batch)`` (when there is one), with
    ``np.testing.assert_allclose`` at the precision option's tolerance; a stochastic
    model's rows get one key each. True when it passes."""
    import jax

    from vmapcheck.core.contract import rows, take
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.testing import precision_config

    config = precision_config(precision)
    with (
        jax.enable_x64(config.enable_x64),
        jax.default_matmul_precision(config.matmul_precision),
    ):
        dtype = jax.numpy.dtype(config.dtype)
        p, x = cast_tree(params, dtype), cast_tree(examples, dtype)
        n = rows(x)
        keys = (jax.random.split(jax.random.key(0), n),) if model.stochastic else ()
        axes = (None, 0, 0) if model.stochastic else (None, 0)
        loop = np.stack(
            [
                np.asarray(model.forward_one(p, take(x, i), *(k[i] for k in keys)), np.float64)
                for i in range(n)
            ]
        )
        tol = {"rtol": config.tolerance.rtol, "atol": config.tolerance.atol}
        try:
            vmapped = jax.jit(jax.vmap(model.forward_one, in_axes=axes))(p, x, *keys)
            np.testing.assert_allclose(np.asarray(vmapped, np.float64), loop, **tol)
            if model.forward_batch is not None:
                direct = jax.jit(model.forward_batch)(p, x, *keys)
                np.testing.assert_allclose(np.asarray(direct, np.float64), loop, **tol)
        except AssertionError:
            return False
    return True


def _timed(call: Any) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), _cpu_now()
    passed = call()
    return {"cpu_s": _cpu_now() - cpu, "wall_s": time.perf_counter() - wall, "passed": passed}


def child(kind: str, name: str, side: str, rows: int, narrow: bool = False) -> dict[str, Any]:
    """One model, in this (fresh) process: the import and a first jitted op, then the
    API's check twice (``kind`` "api") or the hand-written one twice ("hand")."""
    wall, cpu = time.perf_counter(), _cpu_now()
    import importlib

    import jax
    import jax.numpy as jnp

    # vmapcheck.testing imports its machinery on the first call (a test suite's collection
    # stays cheap): import it here so the check's figure holds no import. The modules a
    # first check_batching call loaded on 2026-12-07 (sys.modules before and after).
    for module in LAZY_IMPORTS:
        importlib.import_module(module)
    jax.jit(lambda a: a + 1)(jnp.ones(3)).block_until_ready()  # JAX's own start
    imported = {"cpu_s": _cpu_now() - cpu, "wall_s": time.perf_counter() - wall}
    model, params, examples, kwargs = _case(name, side, rows)
    if kind == "api":
        from vmapcheck.core.paths import not_provided
        from vmapcheck.testing import check_batching

        if narrow:
            lacking = not_provided(model)
            kwargs = {
                **kwargs,
                "paths": [p for p in NARROW_PATHS if p not in lacking],
                "bitwise": "off",
            }

        def call() -> bool:
            return check_batching(model, params, examples, **kwargs).passed
    else:

        def call() -> bool:
            return hand_check(model, params, examples, kwargs.get("precision", "f32"))

    return {
        "jax": jax.__version__,
        "import": imported,
        "first": _timed(call),
        "repeat": _timed(call),
    }


def spread(values: list[float]) -> dict[str, float]:
    """Median, 90th percentile and worst of ``values`` (seconds)."""
    array = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(array)),
        "p90": float(np.percentile(array, 90)),
        "worst": float(array.max()),
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def _run_child(
    kind: str, name: str, side: str, rows: int, narrow: bool = False, cache: Path | None = None
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind, name, side, "--rows", str(rows)]
    env = dict(os.environ)
    if cache is not None:  # JAX reads its options from these variables at import
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    command += ["--narrow"] if narrow and kind == "api" else []
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} child for {name} ({side}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def ratios(row: dict[str, Any]) -> dict[str, float]:
    """The API's first and repeat call, and the hand-written check's repeat, each over
    the hand-written check's first call (CPU seconds)."""
    hand = row["hand"]["first"]["cpu_s"]
    out = {
        "first_over_hand": row["api"]["first"]["cpu_s"] / hand,
        "repeat_over_hand": row["api"]["repeat"]["cpu_s"] / hand,
        "hand_repeat_over_hand": row["hand"]["repeat"]["cpu_s"] / hand,
    }
    if "api_cache_warm" in row:
        out["warm_first_over_hand"] = row["api_cache_warm"]["first"]["cpu_s"] / hand
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="these models only (shipped or corpus entries)"
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--rows", type=int, default=32, help="examples of a shipped model")
    parser.add_argument(
        "--narrow", action="store_true", help="the API on NARROW_PATHS, bitwise off"
    )
    parser.add_argument(
        "--compile-cache", action="store_true", help="also the API with JAX's persistent cache warm"
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("KIND", "NAME", "SIDE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, rows=args.rows, narrow=args.narrow)))
        return 0

    from tests.real_bugs import REAL_BUGS

    known = [*SHIPPED, *REAL_BUGS]
    names = args.only or known
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"--only: no model named {unknown}; models: {known}")
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git_commit": _git_commit(),
        "what": f"per model, in two fresh processes: check_batching twice (first, repeat) "
        f"and a hand-written loop/vmap/jit + assert_allclose check twice; the shipped "
        f"models on {args.rows} rows, the corpus entries on their own examples (float32 "
        f"on the CPU unless the entry's check_kwargs say otherwise); CPU seconds",
        "narrow": {"paths": list(NARROW_PATHS), "bitwise": "off"} if args.narrow else None,
        "compile_cache": "JAX persistent cache warm (api_cache_warm)"
        if args.compile_cache
        else None,
        "targets": {"first_over_hand": TARGET_FIRST, "repeat_over_hand": TARGET_REPEAT},
        "load_1min": {"before": _load()},
        "rows": [],
        "skipped": {},
    }
    print(
        f"{'model':44} {'side':4} {'API 1st':>7} {'API rep':>7} {'hand 1st':>8} {'hand rep':>8}"
        f" {'1st/hand':>8} {'rep/hand':>8} {'warm/hand':>9} {'load':>5}  verdict"
    )
    for name in names:
        if name in REAL_BUGS:
            missing = REAL_BUGS[name].missing()
            if missing:
                doc["skipped"][name] = f"needs vmapcheck feature(s) {list(missing)}"
                continue
        for side in ("-",) if name in SHIPPED else args.sides:
            before = _load()
            row: dict[str, Any] = {"model": name, "side": side}
            for kind in KINDS:
                row[kind] = _run_child(kind, name, side, args.rows, args.narrow)
            if args.compile_cache:
                with tempfile.TemporaryDirectory(prefix="api_cost_jax_cache_") as folder:
                    _run_child("api", name, side, args.rows, args.narrow, Path(folder))  # fills
                    row["api_cache_warm"] = _run_child(
                        "api", name, side, args.rows, args.narrow, Path(folder)
                    )
            row["load_1min"] = [before, _load()]
            row["ratios"] = ratios(row)
            doc["rows"].append(row)
            api, hand, r = row["api"], row["hand"], row["ratios"]
            warm = f"{r['warm_first_over_hand']:.1f}x" if "warm_first_over_hand" in r else "-"
            print(
                f"{name:44} {side:4} {api['first']['cpu_s']:7.2f} {api['repeat']['cpu_s']:7.2f}"
                f" {hand['first']['cpu_s']:8.2f} {hand['repeat']['cpu_s']:8.2f}"
                f" {r['first_over_hand']:7.1f}x {r['repeat_over_hand']:7.1f}x"
                f" {warm:>9} {before:5.1f}  "
                f"{'PASSED' if api['first']['passed'] else 'FAILED'}",
                flush=True,
            )
    doc["load_1min"]["after"] = _load()
    rows = doc["rows"]
    if rows:
        doc["jax"] = rows[0]["api"]["jax"]
        doc["summary"] = {
            "checks": len(rows),
            "api_first_cpu_s": spread([row["api"]["first"]["cpu_s"] for row in rows]),
            "api_repeat_cpu_s": spread([row["api"]["repeat"]["cpu_s"] for row in rows]),
            "hand_first_cpu_s": spread([row["hand"]["first"]["cpu_s"] for row in rows]),
            "first_over_hand": spread([row["ratios"]["first_over_hand"] for row in rows]),
            "repeat_over_hand": spread([row["ratios"]["repeat_over_hand"] for row in rows]),
            "import_cpu_s": spread([row["api"]["import"]["cpu_s"] for row in rows]),
            **(
                {
                    "warm_first_over_hand": spread(
                        [row["ratios"]["warm_first_over_hand"] for row in rows]
                    )
                }
                if args.compile_cache
                else {}
            ),
            "within_target": {
                "first": sum(r["ratios"]["first_over_hand"] <= TARGET_FIRST for r in rows),
                "repeat": sum(r["ratios"]["repeat_over_hand"] <= TARGET_REPEAT for r in rows),
                "of": len(rows),
            },
        }
        print()
        for key, figures in doc["summary"].items():
            if isinstance(figures, dict) and "median" in figures:
                print(
                    f"{key:20} median {figures['median']:6.2f}  p90 {figures['p90']:6.2f}"
                    f"  worst {figures['worst']:6.2f}"
                )
        within = doc["summary"]["within_target"]
        print(
            f"within target: first <= {TARGET_FIRST}x in {within['first']} of {within['of']}, "
            f"repeat <= {TARGET_REPEAT}x in {within['repeat']} of {within['of']}"
        )
    for name, why in doc["skipped"].items():
        print(f"skipped {name}: {why}")
    print(f"load (1 min) {doc['load_1min']['before']} before, {doc['load_1min']['after']} after")
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
