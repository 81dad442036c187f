"""benchmarks/tpu_numerics.py (issue 32, point 4) on the CPU: the accelerator's numerics
script runs end to end in a subprocess and writes what it promises.

One run, kept small: the mlp at f32 and f32_default (the backend's own matmul precision,
the same as highest on a CPU), and the planted transformer mistake (softmax over the
batch axis) at f32 on three of its paths, which the check must fail.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tests.helpers.config import compose_config
from tests.helpers.numerics import run_numerics
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import PATHS, not_provided

PRECISIONS = ("f32", "f32_default")
PLANTED_PATHS = ("loop_jit", "vmap_jit", "direct_jit")
FIGURES = (
    "max_rel_vs_f64",
    "max_abs_vs_f64",
    "bound_ratio_vs_f64",
    "max_rel_vs_cpu",
    "max_abs_vs_cpu",
    "max_rel_vs_stored_reference",
    "max_abs_vs_stored_reference",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("numerics") / "numerics.json"
    args = ["--models", "mlp", "--precisions", *PRECISIONS, "--planted-precisions", "f32"]
    args += ["--planted-paths", *PLANTED_PATHS, "--rows", "8"]
    return run_numerics(out, args, {**os.environ, "JAX_PLATFORMS": "cpu"})


def test_every_path_has_finite_figures_at_each_precision(run):
    doc, _ = run
    mlp = build_model(compose_config("model=mlp").model)
    paths = [name for name in PATHS if name not in not_provided(mlp)]
    for precision in PRECISIONS:
        rows = [r for r in doc["rows"] if r["model"] == "mlp" and r["precision"] == precision]
        assert [r["path"] for r in rows] == paths, precision
        for row in rows:
            for key in FIGURES:
                value = row[key]
                assert isinstance(value, float) and math.isfinite(value), (precision, row)
    assert doc["models"]["mlp"]["rows"] == 8
    assert doc["models"]["mlp"]["stored_reference_from"].startswith("data/reference/mlp/")


def test_the_check_passes_on_the_cpu_and_the_precision_is_the_one_asked(run):
    doc, _ = run
    cells = {c["precision"]: c for c in doc["cells"]}
    assert set(cells) == set(PRECISIONS)
    for cell in cells.values():
        assert "error" not in cell, cell.get("error")
        assert cell["passed"], cell["failures"]
        assert cell["wall_s"] > 0
    # Each cell ran under its option's matmul precision (the check's runtime record).
    expected = {"f32": "highest", "f32_default": "default"}
    for row in doc["rows"]:
        assert row["matmul_precision"] == expected[row["precision"]]
        assert row["passed"] is True
    # On a CPU the default matmul precision is float32's: the same outputs as highest.
    by_path = {
        p: {r["path"]: r["max_rel_vs_cpu"] for r in doc["rows"] if r["precision"] == p}
        for p in PRECISIONS
    }
    assert by_path["f32"] == by_path["f32_default"]
    # Against the stored reference (CPU, float32): within f32's cross-run tolerance.
    f32 = [r for r in doc["rows"] if r["precision"] == "f32"]
    assert max(r["max_rel_vs_stored_reference"] for r in f32) < 1e-4


def test_the_planted_mistake_fails(run):
    doc, stdout = run
    [planted] = doc["planted"]
    assert planted["fault"] == "softmax_over_batch" and planted["precision"] == "f32"
    assert planted["passed"] is False and planted["as_expected"] is True
    assert planted["paths"] == list(PLANTED_PATHS)
    assert "direct_jit" in planted["first_diverging_pair"]
    assert planted["failures"] and planted["n_failures"] >= len(planted["failures"])
    assert "softmax_over_batch (flax_transformer, f32): FAILED as expected" in stdout


def test_the_run_is_described(run):
    doc, stdout = run
    assert doc["device"]["platform"] == "cpu"
    assert doc["versions"]["jax"] and doc["versions"]["jaxlib"]
    assert doc["date"] and doc["total_wall_s"] > 0
    # The table: a line per model, precision and path.
    assert any(
        line.split()[:3] == ["mlp", "f32_default", "direct_jit"] for line in stdout.splitlines()
    )
    assert Path(doc["models"]["mlp"]["params_from"]).parts[:2] == ("data", "reference")
