"""dvc.yaml declares what each stage really uses, so DVC reruns the stages an edit affects.

Code deps are folders (a library package, whole) or single modules. Every library file a
stage imports must be covered by one of them, and every one listed must be imported: so
an edit reruns each stage that runs the edited code, and no stage it does not touch
beyond what a folder holds (dvc.yaml's header says where single modules are kept).
"""

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.helpers.config import ROOT
from vmapcheck.core.paths import SPEEDUPS, path_names

DVC_YAML = yaml.safe_load((ROOT / "dvc.yaml").read_text())
STAGES = DVC_YAML["stages"]
LIBRARY = "src/vmapcheck"
# The shipped plug-in models: imported only when configured (model=flax_mlp, ...), so
# no default import shows them; every stage that builds a model lists them.
PLUGINS = f"{LIBRARY}/examples"
# Loaded by every import of the package; it re-exports, it computes nothing.
PACKAGE_INIT = f"{LIBRARY}/__init__.py"


@cache
def _imported_library_files(stage: str) -> frozenset[str]:
    """Files of vmapcheck that importing the stage module loads (in a fresh interpreter)."""
    code = (
        f"import json, sys, stages.{stage}; "
        "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('vmapcheck') and getattr(m, '__file__', None)})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    files = {str(Path(f).resolve().relative_to(ROOT)) for f in json.loads(out)}
    return frozenset(files - {PACKAGE_INIT})


def _code_deps(stage: str) -> list[str]:
    """The stage's deps inside the library: files and folders."""
    return [d for d in STAGES[stage]["deps"] if d == LIBRARY or d.startswith(f"{LIBRARY}/")]


def _covers(dep: str, file: str) -> bool:
    """Whether DVC hashes ``file`` as part of dep ``dep`` (the file, or a folder above it)."""
    return file == dep or file.startswith(f"{dep.rstrip('/')}/")


def test_stage_order_is_the_documented_one():
    assert list(STAGES) == ["prepare", "train", "forward", "check", "bench", "track"]


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_imported_library_file_is_covered_by_a_listed_file_or_folder(stage):
    deps = STAGES[stage]["deps"]
    assert f"stages/{stage}.py" in deps, f"{stage}: expected its own module stages/{stage}.py"
    missing = sorted(
        f for f in _imported_library_files(stage) if not any(_covers(d, f) for d in deps)
    )
    assert not missing, (
        f"dvc.yaml: stage {stage} imports {missing} but lists no file or folder holding them"
    )


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_listed_library_file_or_folder_is_imported(stage):
    used = _imported_library_files(stage)
    for dep in _code_deps(stage):
        assert (ROOT / dep).exists(), f"dvc.yaml: stage {stage} lists {dep}, which does not exist"
        if dep == PLUGINS:
            continue
        assert any(_covers(dep, f) for f in used), (
            f"dvc.yaml: stage {stage} lists {dep} but imports nothing from it (an edit there "
            "would rerun it for nothing)"
        )
        if (ROOT / dep).is_file():
            inside = [d for d in _code_deps(stage) if d != dep and _covers(d, dep)]
            assert not inside, f"dvc.yaml: stage {stage} lists {dep} and a folder holding it"


def test_editing_one_stage_body_reruns_only_that_stage():
    """pipeline/ holds one module per stage: no stage lists the folder or another's."""
    for stage in STAGES:
        others = {f"{LIBRARY}/pipeline/{s}.py" for s in STAGES if s != stage}
        for dep in _code_deps(stage):
            covered = sorted(o for o in others if _covers(dep, o))
            assert not covered, f"dvc.yaml: stage {stage}'s dep {dep} covers {covered}"


def test_editing_the_html_report_reruns_only_track():
    """check and bench use the headline figures of report/ only, not the HTML report."""
    html = f"{LIBRARY}/report/html.py"
    for stage in STAGES:
        listed = any(_covers(d, html) for d in _code_deps(stage))
        assert listed == (stage == "track"), stage


def test_tolerance_is_read_only_by_check():
    for name, stage in STAGES.items():
        params = stage.get("params", [])
        reads_tolerance = any(p in ("precision", "precision.tolerance") for p in params)
        assert reads_tolerance == (name == "check"), name


def test_metrics_are_small_files_kept_in_git():
    """The metrics are in git (cache: false): `dvc metrics diff main` and `dvc exp show`
    read main's figures on a fresh clone, without a DVC remote."""
    metrics = {}
    for stage in STAGES.values():
        for entry in stage.get("metrics", []):
            (path, options), *_ = entry.items()
            metrics[path] = options
    assert set(metrics) == {"reports/check.json", "reports/bench.json", "reports/train.json"}
    for path, options in metrics.items():
        assert options == {"cache": False}, path
    ignored = (ROOT / "reports" / ".gitignore").read_text().split()
    assert not {f"/{Path(p).name}" for p in metrics} & set(ignored)


def test_plots_draw_every_path_and_speedup_through_the_log_log_template():
    plots = {next(iter(p)): p[next(iter(p))] for p in DVC_YAML["plots"] if isinstance(p, dict)}
    latency = plots["latency_p50_ms_vs_batch_size"]
    assert latency["x"] == "batch_size"
    assert latency["y"] == {f"reports/plots/{p}.csv": "p50_ms" for p in path_names("batch")}
    speedup = plots["vmap_speedup_vs_batch_size"]
    assert speedup["y"] == {f"reports/plots/speedup/{s.name}.csv": "ratio" for s in SPEEDUPS}
    template = json.loads((ROOT / ".dvc" / "plots" / "loglog.json").read_text())
    assert {latency["template"], speedup["template"]} == {"loglog"}
    encoding = template["encoding"]
    assert encoding["x"]["scale"]["type"] == encoding["y"]["scale"]["type"] == "log"
    # One colour per path: a scheme with a colour for each of them, never reused.
    assert encoding["color"]["scale"]["scheme"] == "tableau10"
    assert len(path_names("batch")) <= 10, "tableau10 has 10 colours: choose a larger scheme"
