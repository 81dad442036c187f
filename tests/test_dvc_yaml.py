"""dvc.yaml declares what each stage really uses, so DVC reruns exactly what changed."""

import json
import subprocess
import sys

import yaml

from tests.helpers.config import ROOT
from vmapcheck.core.paths import path_names

DVC_YAML = yaml.safe_load((ROOT / "dvc.yaml").read_text())
STAGES = DVC_YAML["stages"]


def _imported_library_files(stage: str) -> set[str]:
    """Files of vmapcheck that importing the stage module loads (in a fresh interpreter)."""
    code = (
        f"import json, sys, stages.{stage}; "
        "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('vmapcheck') and getattr(m, '__file__', None)})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {str(__import__("pathlib").Path(f).resolve().relative_to(ROOT)) for f in json.loads(out)}


def test_stage_order_is_the_documented_one():
    assert list(STAGES) == ["prepare", "train", "forward", "check", "bench", "track"]


def test_every_stage_depends_on_its_own_module_and_every_library_file_it_imports():
    for name, stage in STAGES.items():
        deps = set(stage["deps"])
        assert f"stages/{name}.py" in deps, name
        used = _imported_library_files(name) - {"src/vmapcheck/__init__.py"}
        missing = used - deps
        assert not missing, f"stage {name} imports {sorted(missing)} but does not list them"


def test_tolerance_is_read_only_by_check():
    for name, stage in STAGES.items():
        params = stage.get("params", [])
        reads_tolerance = any(p in ("precision", "precision.tolerance") for p in params)
        assert reads_tolerance == (name == "check"), name


def test_metrics_and_plots_are_declared():
    metrics = {
        m if isinstance(m, str) else next(iter(m))
        for s in STAGES.values()
        for m in s.get("metrics", [])
    }
    assert {"reports/check.json", "reports/bench.json"} <= metrics
    plot = DVC_YAML["plots"][0]["latency_p50_ms_vs_batch_size"]
    assert plot["x"] == "batch_size"
    assert set(plot["y"]) == {f"reports/plots/{p}.csv" for p in path_names("batch")}
