"""Numerics on the accelerator, measured (issue 32, point 4): for each shipped model and
precision, every forward path's error against the float64 oracle, against a float32 CPU
reference computed in the same process, and against the stored reference; whether
vmapcheck's check passes there; and whether a planted batching mistake still fails.

Everything runs in one process through the library:

- each model is built from its shipped option (``conf/model/<name>.yaml``, composed with
  the data group it needs, :func:`vmapcheck.compose.compose_yaml`,
  :func:`vmapcheck.core.models.build_model`);
- params and examples: the stored reference's (``data/reference/<model>/``, loaded and
  sha256-verified by :func:`vmapcheck.check.reference.load_reference` and
  :func:`vmapcheck.params_io.load_model_params`): the first ``--rows`` rows of its
  ``standard`` case. A model without one (resnet): ``model.init(jax.random.key(SEED))``
  (jitted, on the CPU) and ``--rows`` images drawn from a standard normal
  (``numpy.random.default_rng(SEED)``, float32, 32x32x3);
- the check: :func:`vmapcheck.testing.check_batching` at each precision: every path the
  model provides runs on the default device (the accelerator), the float64 oracle and the
  terms' magnitude on the CPU device, and the pipeline's rules judge them. Its report
  holds each path's figures against float64 (``details["cases"][case]["oracle"]``) and
  each pair's (``pairs``), but not the paths' outputs, which the CPU and stored
  comparisons need: they are taken from the check's own forward (its step
  ``vmapcheck.testing.forward`` is wrapped for the call and passes them on unchanged),
  so the figures describe the very numbers the check judged. Should that step be renamed,
  the outputs are computed again with :func:`vmapcheck.core.forward.run_forward` (the
  JSON says which: ``outputs_from``);
- the CPU reference: ``jax.jit(model.forward_one)`` one row at a time (the plain loop) on
  ``jax.devices("cpu")[0]``, float32, matmul precision ``highest``, from the same params
  and examples (once per model). Every path's output is compared with it, and with the
  stored reference's plain-loop output (``standard.loop_eager``, made on CPU with the JAX
  its meta.json names), by :func:`vmapcheck.core.compare.compare`: ``max_rel`` is
  ``max |a - b| / max(|a|, |b|)`` elementwise, as in every check;
- the planted mistake: the transformer with its attention softmax over the batch axis
  (``tests/helpers/transformer_faults.py``, fault ``softmax_over_batch``) on the same
  params and examples, at each precision: its check must FAIL.

A precision option the installed library does not accept yet (``f32_default`` while
``vmapcheck.config.PrecisionConfig.name`` lists only f32, f64 and bf16) is validated
field by field with the name set aside, then given to the check under its own name
(``precision_config_from`` in the JSON says so).

Usage (from the repository root)::

    python benchmarks/tpu_numerics.py --out numerics.json        # the whole grid
    python benchmarks/tpu_numerics.py --out n.json --models mlp --precisions f32 f32_default
    python benchmarks/tpu_numerics.py --out n.json --budget-s 240  # no new cell past 240 s
    python benchmarks/tpu_numerics.py --out n.json --models        # the planted mistake only

Rows: 16 examples per model, 8 for the resnet (``--rows`` sets every model's).
``--planted-precisions`` / ``--planted-paths`` / ``--no-planted``: where the planted
mistake is checked (default: every precision asked, every path). Programs compiled a
second time in the run (each check builds its paths afresh; the planted model shares all
but its direct paths with the healthy one) come from a persistent JAX compilation cache in
a fresh temporary folder (``--no-compile-cache``: none): the same executables.

The JSON is rewritten (atomically) after every model/precision cell, so a run stopped
early keeps what it measured; the table is printed at the end (and each cell's verdict
as it finishes). Time is mostly compilation: every path's programs, eager op by op too.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import importlib.metadata
import importlib.resources
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# tests.helpers (the planted mistake) from the checkout; vmapcheck from src/ when it is
# not installed (a bare copy of the repository on the accelerator's machine).
sys.path.insert(0, str(ROOT))
try:
    import vmapcheck  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

MODELS = ("mlp", "flax_cnn", "flax_transformer", "resnet")
PRECISIONS = ("f32", "f32_default", "bf16")
# The data group each model's shipped option is composed with (its in_features).
COMPANIONS = {
    "flax_cnn": ("data=digits",),
    "flax_transformer": ("data=digit_tokens",),
    "resnet": ("data=images32", "guard=images"),
}
PLANTED_MODEL = "flax_transformer"
PLANTED_FAULT = "softmax_over_batch"
SEED = 0
# Examples per model unless --rows says: the resnet's loop_jit unrolls one 15-MFLOP
# forward per row (compile time), and its float64 oracle runs them on the CPU.
DEFAULT_ROWS = 16
DEFAULT_ROWS_BY_MODEL = {"resnet": 8}
# The regression case of a stored reference whose rows are the examples.
REFERENCE_CASE = "standard"
# The check's case names (vmapcheck.testing): the examples, their first row as a batch
# of one, and unbatched.
EXAMPLES_CASE = "examples"
SINGLE_CASE = "single"
SINGLE_VECTOR_CASE = "single_vector"
SHOWN_FAILURES = 10


# --- set-up -------------------------------------------------------------------------------


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict[str, Any]:
    """Where and with what this ran: host, devices, versions."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    try:
        cpu = jax.devices("cpu")
    except RuntimeError:
        cpu = []
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "device": {
            "backend": jax.default_backend(),
            "platform": device.platform,
            "kind": device.device_kind,
            "count": jax.device_count(),
            "cpu_devices": len(cpu),
        },
        "versions": {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "libtpu": _version("libtpu") or _version("libtpu-nightly"),
            "flax": _version("flax"),
            "numpy": np.__version__,
            "vmapcheck": _version("vmapcheck"),
        },
        "git_commit": _git_commit(),
        "env": {k: os.environ.get(k) for k in ("JAX_PLATFORMS", "XLA_FLAGS")},
    }


def cpu_device() -> Any:
    """The CPU device the references run on (the default device where JAX has no CPU
    backend in this process: then ``cpu_reference_on`` in the JSON says so)."""
    import jax

    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return jax.devices()[0]


# --- models, params, examples -------------------------------------------------------------


def compose_model(name: str, *extra: str) -> Any:
    """The validated ``model`` group of the shipped option ``name``, composed as the
    pipeline composes it (with the data group it needs)."""
    import yaml

    from vmapcheck.compose import compose_yaml
    from vmapcheck.config import validate_config

    overrides = [f"model={name}", *COMPANIONS.get(name, ()), *extra]
    return validate_config(yaml.safe_load(compose_yaml(ROOT / "conf", overrides))).model


def build(name: str, *extra: str) -> Any:
    from vmapcheck.core.models import build_model

    return build_model(compose_model(name, *extra))


def inputs_for(model: Any, name: str, rows: int) -> dict[str, Any]:
    """Params, examples and the stored reference's outputs (or None) for ``model``:
    ``{"params", "examples", "stored" (case -> array or None), "params_from",
    "examples_from", "stored_from"}``."""
    import jax

    from vmapcheck.check.reference import load_reference
    from vmapcheck.core.contract import rows as count_rows
    from vmapcheck.core.contract import take
    from vmapcheck.core.paths import output_key, plain_path
    from vmapcheck.params_io import load_model_params

    folder = ROOT / "data" / "reference" / name
    reference = load_reference(folder)
    if reference is not None:
        params, _ = load_model_params(model, folder)
        x = reference["cases"][REFERENCE_CASE]["x"]
        n = min(rows, count_rows(x))
        meta = reference["meta"]
        key = output_key(REFERENCE_CASE, plain_path())
        return {
            "params": params,
            "examples": take(x, slice(0, n)),
            "stored": np.asarray(reference["outputs"][key])[:n].astype(np.float64),
            "params_from": f"data/reference/{name}/params.safetensors",
            "examples_from": f"data/reference/{name}/inputs.npz: {REFERENCE_CASE}, first {n} rows",
            "stored_from": (
                f"data/reference/{name}/outputs.npz: {key}, first {n} rows (made on "
                f"{meta['runtime']['backend']} with jax {meta['runtime']['jax_version']}, "
                f"{meta['dtype']}, matmul precision {meta['runtime'].get('matmul_precision')})"
            ),
        }
    with jax.default_device(cpu_device()):
        params = jax.device_get(jax.jit(model.init)(jax.random.key(SEED)))
    rng = np.random.default_rng(SEED)
    leaves = model.contract.leaves
    if len(leaves) != 1 or leaves[0].dtype != "float":
        raise ValueError(f"model {name}: no stored reference, and no synthetic input for it")
    shape = tuple(leaves[0].shape)
    examples = rng.standard_normal((rows, *shape)).astype(np.float32)
    x = examples if model.contract.flat else {leaves[0].name: examples}
    return {
        "params": params,
        "examples": x,
        "stored": None,
        "params_from": f"model.init(jax.random.key({SEED})), jitted on the CPU",
        "examples_from": (
            f"{rows} images of shape {shape} drawn from a standard normal "
            f"(numpy.random.default_rng({SEED}), float32)"
        ),
        "stored_from": None,
    }


def rows_for(name: str, args: argparse.Namespace) -> int:
    """The examples model ``name`` is measured on: ``--rows``, else its default."""
    return args.rows if args.rows is not None else DEFAULT_ROWS_BY_MODEL.get(name, DEFAULT_ROWS)


def cpu_reference(model: Any, params: Any, examples: Any) -> np.ndarray:
    """The plain loop on the CPU device, float32, matmul precision highest: ``jax.jit(
    model.forward_one)`` row by row, (rows, out_features) as float64."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.contract import cast_floats, rows, take
    from vmapcheck.core.forms import cast_tree

    with (
        jax.default_device(cpu_device()),
        jax.default_matmul_precision("highest"),
    ):
        params32 = cast_tree(params, jnp.float32)
        x = cast_floats(examples, jnp.float32)
        forward = jax.jit(model.forward_one)
        out = [np.asarray(forward(params32, take(x, i))) for i in range(rows(x))]
    return np.stack(out).astype(np.float64)


# --- the library, as it is called ----------------------------------------------------------


def precision_for_check(name: str) -> tuple[Any, str]:
    """(the validated precision option ``name``, where it came from): the library's
    :func:`vmapcheck.testing.precision_config`, or, when that refuses only the option's
    name (an option newer than the config model's list), every other field validated by
    :class:`vmapcheck.config.PrecisionConfig` and the name set afterwards."""
    import yaml

    from vmapcheck import testing
    from vmapcheck.config import PrecisionConfig
    from vmapcheck.errors import ConfigError

    try:
        return testing.precision_config(name), "vmapcheck.testing.precision_config"
    except ConfigError as exc:
        if name not in testing.precision_names() or "precision.name:" not in str(exc):
            raise
    resource = (
        importlib.resources.files(testing.PRECISION_PACKAGE)
        / testing.PRECISION_GROUP
        / f"{name}.yaml"
    )
    raw = yaml.safe_load(resource.read_text(encoding="utf-8"))
    # Any name the config model accepts stands in for it during validation.
    stand_in = typing.get_args(PrecisionConfig.model_fields["name"].annotation)[0]
    config = PrecisionConfig.model_validate({**raw, "name": stand_in}).model_copy(
        update={"name": name}
    )
    return config, (
        "the shipped file, every field validated by PrecisionConfig but the name, which "
        "the installed vmapcheck.config does not list yet"
    )


@contextlib.contextmanager
def hooked_check(config: Any, captured: dict[str, Any]) -> Iterator[None]:
    """For one :func:`vmapcheck.testing.check_batching` call: its precision option is
    ``config``, and its forward step's outputs are kept in ``captured["outputs"]``
    (``"<case>.<path>" -> array``), unchanged."""
    from vmapcheck import testing

    saved = {name: getattr(testing, name, None) for name in ("precision_config", "forward")}

    def precision_config(name: str, *, rtol: Any = None, atol: Any = None) -> Any:
        if rtol is not None or atol is not None:
            raise ValueError("tolerance overrides are not used here")
        return config

    testing.precision_config = precision_config
    forward = saved["forward"]
    if forward is not None:

        def spy(*args: Any, **kwargs: Any) -> Any:
            result = forward(*args, **kwargs)
            captured["outputs"] = dict(result[0])
            return result

        testing.forward = spy
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(testing, name, value)


def recompute_outputs(model: Any, params: Any, examples: Any, config: Any) -> dict[str, Any]:
    """The paths' outputs on the check's valid cases, computed again by
    :func:`vmapcheck.core.forward.run_forward` at ``config``'s numerics (when the check's
    own cannot be kept)."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.contract import take
    from vmapcheck.core.forms import data_mesh
    from vmapcheck.core.forward import run_forward

    dtype = jnp.dtype(config.dtype)
    cases = {
        EXAMPLES_CASE: {"x": examples, "kind": "batch"},
        SINGLE_CASE: {"x": take(examples, slice(0, 1)), "kind": "batch"},
        SINGLE_VECTOR_CASE: {"x": take(examples, 0), "kind": "vector"},
    }
    with (
        jax.enable_x64(config.enable_x64),
        jax.default_matmul_precision(config.matmul_precision),
    ):
        outputs, _ = run_forward(model, params, cases, dtype, data_mesh())
    return outputs


def run_check(
    model: Any,
    params: Any,
    examples: Any,
    precision: str,
    recompute: bool = False,
    paths: list[str] | None = None,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(BatchingReport, outputs "<case>.<path>" -> array, notes) of the check of ``model``
    at ``precision`` (``paths``: those named, None: every path the model provides)."""
    from vmapcheck.testing import check_batching

    config, config_from = precision_for_check(precision)
    captured: dict[str, Any] = {}
    with hooked_check(config, captured):
        report = check_batching(model, params, examples, precision=precision, paths=paths)
    outputs, outputs_from = captured.get("outputs"), "the check's own forward"
    if outputs is None or recompute:
        outputs = recompute_outputs(model, params, examples, config)
        outputs_from = "computed again by vmapcheck.core.forward.run_forward"
    notes = {
        "precision_config_from": config_from,
        "outputs_from": outputs_from,
        "matmul_precision": config.matmul_precision,
        "dtype": config.dtype,
    }
    return report, outputs, notes


# --- figures ------------------------------------------------------------------------------


def _max(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return max(found) if found else None


def reference_rows(case: str, reference: np.ndarray) -> np.ndarray:
    """The rows of a per-example reference that case ``case`` of the check covers."""
    if case == SINGLE_CASE:
        return reference[0:1]
    if case == SINGLE_VECTOR_CASE:
        return reference[0]
    return reference


def against(outputs: dict[str, Any], path: str, reference: np.ndarray, tolerance: Any) -> dict:
    """``{"max_rel", "max_abs"}`` of ``path``'s outputs on the check's cases against the
    per-example ``reference`` (:func:`vmapcheck.core.compare.compare`, worst over cases)."""
    from vmapcheck.core.compare import compare

    results = []
    for case in (EXAMPLES_CASE, SINGLE_CASE, SINGLE_VECTOR_CASE):
        out = outputs.get(f"{case}.{path}")
        if out is None:
            continue
        want = reference_rows(case, reference)
        results.append(compare(np.asarray(out, dtype=np.float64), want, tolerance))
    if any(r["max_rel"] is None for r in results):
        return {"max_rel": None, "max_abs": None, "reason": "non-finite or misshapen output"}
    return {
        "max_rel": _max([r["max_rel"] for r in results]),
        "max_abs": _max([r["max_abs"] for r in results]),
    }


def path_rows(
    name: str,
    precision: str,
    report: Any,
    outputs: dict[str, Any],
    cpu: np.ndarray,
    stored: np.ndarray | None,
) -> list[dict[str, Any]]:
    """One row per path the check ran: its figures against float64, the CPU reference and
    the stored reference, its worst pair and its regroupings."""
    from vmapcheck.config import ToleranceConfig

    details = report.details
    cross = ToleranceConfig(**details["cross_run_tolerance"])
    out = []
    for path in report.paths:
        oracle = [
            case["oracle"][path]
            for case in details["cases"].values()
            if path in case.get("oracle", {})
        ]
        pairs = [
            figures
            for key, figures in report.pairs.items()
            if path in key.replace("single.", "").split("-vs-")
        ]
        worst_pair = max(
            (p for p in pairs if p.bound_ratio is not None),
            key=lambda p: p.bound_ratio,
            default=None,
        )
        vs_cpu = against(outputs, path, cpu, cross)
        vs_stored = against(outputs, path, stored, cross) if stored is not None else None
        out.append(
            {
                "model": name,
                "precision": precision,
                "matmul_precision": report.details["runtime"]["matmul_precision"],
                "dtype": report.dtype,
                "path": path,
                "max_rel_vs_f64": _max([r.get("max_rel") for r in oracle]),
                "max_abs_vs_f64": _max([r.get("max_abs") for r in oracle]),
                # max |a - b| / (atol + rtol * S) under cross_run_tolerance: <= 1 passes.
                "bound_ratio_vs_f64": _max([r.get("bound_ratio") for r in oracle]),
                "passed_vs_f64": all(r.get("passed") for r in oracle) if oracle else None,
                "max_rel_vs_cpu": vs_cpu["max_rel"],
                "max_abs_vs_cpu": vs_cpu["max_abs"],
                "max_rel_vs_stored_reference": vs_stored["max_rel"] if vs_stored else None,
                "max_abs_vs_stored_reference": vs_stored["max_abs"] if vs_stored else None,
                # Against the other paths, under tolerance (within-run): the worst pair.
                "worst_pair": worst_pair.pair if worst_pair else None,
                "worst_pair_max_rel": worst_pair.max_rel if worst_pair else None,
                "worst_pair_bound_ratio": worst_pair.bound_ratio if worst_pair else None,
                "pairs_passed": all(p.passed for p in pairs) if pairs else None,
                # Its own outputs on the batch regrouped (reversed, halved): max_abs.
                "regrouped_max_abs": dict(report.composition.get(path, {})) or None,
                # The check at this precision (every path, pair, regrouping, refusal).
                "passed": report.passed,
            }
        )
    return out


def cell_summary(report: Any) -> dict[str, Any]:
    """The check's verdict and its worst figures, for one model and precision."""
    details = report.details
    oracle = [
        r["bound_ratio"]
        for case in details["cases"].values()
        for r in case.get("oracle", {}).values()
        if r.get("bound_ratio") is not None
    ]
    worst = report.worst
    return {
        "passed": report.passed,
        "tolerance": dict(report.tolerance),
        "cross_run_tolerance": dict(report.cross_run_tolerance),
        "paths": list(report.paths),
        "not_run": dict(report.not_run),
        "worst_pair": worst.pair if worst else None,
        "worst_pair_bound_ratio": worst.bound_ratio if worst else None,
        "worst_pair_case": worst.case if worst else None,
        "worst_bound_ratio_vs_f64": max(oracle) if oracle else None,
        "refused": f"{report.refused}/{report.invalid_total}",
        "n_failures": len(report.failures),
        "failures": list(report.failures[:SHOWN_FAILURES]),
        "runtime": details["runtime"],
    }


# --- the run --------------------------------------------------------------------------------


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": traceback.format_exc()[-4000:],
    }


class Results:
    """The JSON document, rewritten atomically after each cell."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out = out
        self.started = time.perf_counter()
        self.doc: dict[str, Any] = {
            "schema": "vmapcheck-tpu-numerics/1",
            **environment(),
            "args": {
                "models": args.models,
                "precisions": args.precisions,
                "rows": args.rows,
                "planted": not args.no_planted,
                "planted_precisions": args.planted_precisions,
                "planted_paths": args.planted_paths,
                "budget_s": args.budget_s,
            },
            "definitions": {
                "max_rel": "max over elements of |a - b| / max(|a|, |b|) "
                "(vmapcheck.core.compare.compare), worst over the check's cases",
                "vs_f64": "the check's float64 oracle (CPU, params and inputs rounded to the "
                "run's dtype first), judged by cross_run_tolerance with scale: terms",
                "vs_cpu": "jax.jit(forward_one) row by row on the CPU device, float32, matmul "
                "precision highest, from the same params and examples (not rounded to bf16)",
                "vs_stored_reference": "the stored reference's plain loop "
                "(outputs.npz standard.loop_eager) on the same rows",
                "bound_ratio": "max |a - b| / (atol + rtol * S): at most 1 where it passes",
                "passed": "vmapcheck.testing.check_batching's verdict at that precision",
            },
            "models": {},
            "cells": [],
            "rows": [],
            "planted": [],
        }
        self.write()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def write(self) -> None:
        from vmapcheck.io import atomic_write_json

        self.doc["total_wall_s"] = round(self.elapsed(), 2)
        atomic_write_json(self.out, self.doc)


def measure_model(name: str, args: argparse.Namespace, results: Results) -> None:
    """Every requested precision of model ``name``, then (for the transformer) the planted
    mistake."""
    started = time.perf_counter()
    try:
        model = build(name)
        data = inputs_for(model, name, rows_for(name, args))
        cpu = cpu_reference(model, data["params"], data["examples"])
    except Exception as exc:
        results.doc["models"][name] = {"error": _error(exc)}
        results.write()
        print(f"{name}: set-up failed: {type(exc).__name__}: {exc}", flush=True)
        return
    results.doc["models"][name] = {
        "params_from": data["params_from"],
        "examples_from": data["examples_from"],
        "stored_reference_from": data["stored_from"],
        "rows": int(cpu.shape[0]),
        "cpu_reference_on": str(cpu_device()),
        "setup_wall_s": round(time.perf_counter() - started, 2),
    }
    results.write()
    for precision in args.precisions:
        cell: dict[str, Any] = {"model": name, "precision": precision}
        if args.budget_s is not None and results.elapsed() > args.budget_s:
            cell["skipped"] = f"past --budget-s {args.budget_s}"
            results.doc["cells"].append(cell)
            results.write()
            continue
        t0 = time.perf_counter()
        try:
            report, outputs, notes = run_check(
                model, data["params"], data["examples"], precision, args.recompute_outputs
            )
            cell.update(notes)
            cell.update(cell_summary(report))
            rows = path_rows(name, precision, report, outputs, cpu, data["stored"])
            results.doc["rows"].extend(rows)
        except Exception as exc:
            cell["error"] = _error(exc)
        cell["wall_s"] = round(time.perf_counter() - t0, 2)
        results.doc["cells"].append(cell)
        results.write()
        print(_cell_line(cell), flush=True)
    if name == PLANTED_MODEL and not args.no_planted:
        measure_planted(data, args, results)


def measure_planted(
    data: dict[str, Any] | None, args: argparse.Namespace, results: Results
) -> None:
    """The transformer with the softmax over the batch axis, on the healthy model's params
    and examples (``data``; None: loaded here), at each requested precision: its check
    must fail."""
    try:
        from tests.helpers.transformer_faults import factory_overrides

        model = build(PLANTED_MODEL, *factory_overrides(PLANTED_FAULT))
        if data is None:
            data = inputs_for(model, PLANTED_MODEL, rows_for(PLANTED_MODEL, args))
    except Exception as exc:
        results.doc["planted"].append({"fault": PLANTED_FAULT, "error": _error(exc)})
        results.write()
        return
    from vmapcheck.testing import diverging_from_plain, first_diverging_pair

    for precision in args.planted_precisions:
        entry: dict[str, Any] = {
            "model": PLANTED_MODEL,
            "fault": PLANTED_FAULT,
            "precision": precision,
            "expected_passed": False,
        }
        if args.budget_s is not None and results.elapsed() > args.budget_s:
            entry["skipped"] = f"past --budget-s {args.budget_s}"
            results.doc["planted"].append(entry)
            results.write()
            continue
        t0 = time.perf_counter()
        try:
            report, _, notes = run_check(
                model, data["params"], data["examples"], precision, paths=args.planted_paths
            )
            entry.update(
                passed=report.passed,
                as_expected=not report.passed,
                matmul_precision=notes["matmul_precision"],
                paths=list(report.paths),
                first_diverging_pair=first_diverging_pair(report.details),
                diverging_from_plain=diverging_from_plain(report.details),
                n_failures=len(report.failures),
                failures=list(report.failures[:SHOWN_FAILURES]),
            )
        except Exception as exc:
            entry["error"] = _error(exc)
        entry["wall_s"] = round(time.perf_counter() - t0, 2)
        results.doc["planted"].append(entry)
        results.write()
        verdict = "error" if "error" in entry else ("FAILED" if not entry["passed"] else "PASSED")
        print(
            f"planted {PLANTED_FAULT} at {precision}: {verdict} (expected FAILED), "
            f"first diverging pair {entry.get('first_diverging_pair')} "
            f"[{entry['wall_s']:.1f} s]",
            flush=True,
        )


# --- the table ------------------------------------------------------------------------------


def _g(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.2e}" if isinstance(value, float) else str(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _g(value)


def _cell_line(cell: dict[str, Any]) -> str:
    head = f"{cell['model']} {cell['precision']}"
    if "error" in cell:
        return f"{head}: error {cell['error']['type']}: {cell['error']['message'][:200]}"
    verdict = "PASSED" if cell["passed"] else f"FAILED ({cell['n_failures']} failures)"
    return (
        f"{head} (matmul {cell['matmul_precision']}): {verdict}; worst pair "
        f"{cell['worst_pair']} at {_g(cell['worst_pair_bound_ratio'])} of its bound, "
        f"vs float64 at {_g(cell['worst_bound_ratio_vs_f64'])} of its bound "
        f"[{cell['wall_s']:.1f} s]"
    )


COLUMNS = (
    ("model", "model", 16),
    ("precision", "precision", 11),
    ("path", "path", 17),
    ("max_rel_vs_f64", "rel_f64", 9),
    ("max_abs_vs_f64", "abs_f64", 9),
    ("bound_ratio_vs_f64", "bound_f64", 9),
    ("max_rel_vs_cpu", "rel_cpu", 9),
    ("max_rel_vs_stored_reference", "rel_stored", 10),
    ("worst_pair_bound_ratio", "pair_bound", 10),
    ("passed", "check", 5),
)


def table(doc: dict[str, Any]) -> str:
    """The rows as text: model x precision x path, then each cell's verdict and time."""
    lines = ["  ".join(f"{title:<{width}}" for _, title, width in COLUMNS)]
    for row in doc["rows"]:
        lines.append("  ".join(f"{_text(row[key]):<{width}}" for key, _, width in COLUMNS))
    lines.append("")
    for cell in doc["cells"]:
        if "skipped" in cell:
            lines.append(f"{cell['model']} {cell['precision']}: skipped, {cell['skipped']}")
        else:
            lines.append(_cell_line(cell))
    for entry in doc["planted"]:
        if "skipped" in entry or "error" in entry:
            lines.append(f"planted {entry.get('fault')}: {entry.get('skipped') or entry['error']}")
            continue
        lines.append(
            f"planted {entry['fault']} ({entry['model']}, {entry['precision']}): "
            f"{'FAILED as expected' if entry['as_expected'] else 'PASSED: NOT CAUGHT'}; "
            f"first diverging pair {entry['first_diverging_pair']}, "
            f"{entry['n_failures']} failures [{entry['wall_s']:.1f} s]"
        )
        lines += [f"    failure: {f}" for f in entry["failures"][:3]]
    lines.append(f"total wall: {doc['total_wall_s']:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument(
        "--models",
        nargs="*",
        default=list(MODELS),
        choices=MODELS,
        help="the models measured (none: only the planted mistake)",
    )
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help=f"examples per model (default {DEFAULT_ROWS}, the resnet "
        f"{DEFAULT_ROWS_BY_MODEL['resnet']})",
    )
    parser.add_argument(
        "--no-planted", action="store_true", help="skip the planted batching mistake"
    )
    parser.add_argument(
        "--planted-precisions",
        nargs="+",
        default=None,
        help="the precisions the planted mistake is checked at (default: --precisions)",
    )
    parser.add_argument(
        "--budget-s", type=float, default=None, help="start no new cell past this many seconds"
    )
    parser.add_argument(
        "--planted-paths",
        nargs="+",
        default=None,
        help="the paths the planted mistake's check runs (default: every path it provides)",
    )
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="no persistent JAX compilation cache (default: a fresh one in a temp folder)",
    )
    parser.add_argument(
        "--recompute-outputs",
        action="store_true",
        help="compute the paths' outputs again rather than keep the check's own",
    )
    args = parser.parse_args(argv)
    if args.rows is not None and args.rows < 2:
        parser.error("--rows: at least 2 (the regrouping check needs batch-mates)")
    if args.planted_precisions is None:
        args.planted_precisions = list(args.precisions)
    from vmapcheck.testing import precision_names

    unknown = [
        p for p in (*args.precisions, *args.planted_precisions) if p not in precision_names()
    ]
    if unknown:
        parser.error(f"--precisions: {unknown[0]!r} is no shipped option ({precision_names()})")
    cache = None
    if not args.no_compile_cache:
        # Programs compiled again (each check builds its paths afresh; the planted model
        # shares all but its direct paths with the healthy one) are loaded instead: the
        # same executables, so the same numbers.
        import jax

        from vmapcheck.core.runtime import enable_compile_cache

        folder = tempfile.mkdtemp(prefix="vmapcheck-numerics-jax-cache-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        try:
            enable_compile_cache(Path(folder))
            cache = jax.config.jax_compilation_cache_dir
        except Exception as exc:  # a run without the cache measures the same numbers
            cache = f"none: {type(exc).__name__}: {exc}"
    results = Results(args.out, args)
    results.doc["compile_cache"] = cache
    for name in args.models:
        measure_model(name, args, results)
    if not args.no_planted and PLANTED_MODEL not in args.models:
        measure_planted(None, args, results)  # on the healthy model's params and examples
    results.write()
    print(table(results.doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
