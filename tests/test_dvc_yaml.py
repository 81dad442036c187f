"""dvc.yaml declares what each stage really uses, so DVC reruns the stages an edit affects.

vmapcheck's own code is not a dep of dvc.yaml (a user's repository does not hold it):
each stage depends on its record ``reports/code/<stage>.json``, written by the ``code``
stage from :data:`vmapcheck.project.code.STAGE_CODE`. That registry lists library files
or folders (whole). Every library file a stage imports must be covered by one of them,
and every one listed must be imported: so a new vmapcheck reruns each stage that runs
the changed code, and no stage it does not touch beyond what a folder holds.
"""

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.helpers.config import ROOT
from vmapcheck.core.paths import SPEEDUPS, path_names, series_colours
from vmapcheck.layout import Layout
from vmapcheck.project import code
from vmapcheck.project.code import EXAMPLES, STAGE_CODE
from vmapcheck.project.data_choice import DataChoice
from vmapcheck.project.init import plan
from vmapcheck.project.model_choice import ModelChoice

DVC_YAML = yaml.safe_load((ROOT / "dvc.yaml").read_text())
STAGES = DVC_YAML["stages"]
PACKAGE = ROOT / "src" / "vmapcheck"


@cache
def _imported_library_files(stage: str) -> frozenset[str]:
    """Files of vmapcheck (relative to the package) that importing the stage module loads,
    in a fresh interpreter."""
    source = (
        f"import json, sys, vmapcheck.stages.{stage}; "
        "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('vmapcheck') and getattr(m, '__file__', None)})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return frozenset(str(Path(f).resolve().relative_to(PACKAGE)) for f in json.loads(out))


def _covers(dep: str, file: str) -> bool:
    """Whether ``dep`` (a file, or a folder above it) holds ``file``."""
    return file == dep or file.startswith(f"{dep.rstrip('/')}/")


def test_stage_order_is_the_documented_one():
    assert list(STAGES) == [
        "code",
        "prepare",
        "train",
        "forward",
        "check",
        "bench",
        "track",
        "gate",
    ]
    assert list(STAGE_CODE) == list(STAGES)[1:-1]


def test_the_code_stage_always_runs_and_keeps_one_record_per_stage():
    """persist: DVC leaves the last records in place when it reruns the stage, so the
    stage compares with them (without it, every run said every stage's code was new)."""
    assert STAGES["code"]["cmd"] == "python stages/code.py"
    assert STAGES["code"]["deps"] == ["stages/code.py"]
    assert STAGES["code"]["always_changed"] is True
    layout = Layout(ROOT)
    assert STAGES["code"]["outs"] == [
        {str(layout.code_record(s).relative_to(ROOT)): {"persist": True}} for s in STAGE_CODE
    ]


def test_the_gate_is_last_always_runs_writes_nothing_and_reads_the_verdict():
    gate = STAGES["gate"]
    assert gate["cmd"] == "python stages/gate.py" and gate["always_changed"] is True
    assert "outs" not in gate and "metrics" not in gate
    # After track (its report), on the check's headline and the guard's replay.
    assert set(gate["deps"]) == {
        "stages/gate.py",
        "reports/check.json",
        "reports/bench_details.json",
        "reports/track.json",
    }


def test_track_depends_on_every_key_of_vmapcheck_and_on_none_of_the_users():
    """A key of the user's own (`-S lr=0.3`) reruns no stage of vmapcheck's (track logged
    another run for it); each of vmapcheck's own keys reruns track, which logs them."""
    from vmapcheck.config import CONFIG_KEYS, Config

    track = STAGES["track"]
    assert track["params"] == list(CONFIG_KEYS)
    assert set(CONFIG_KEYS) == set(Config.model_fields) - {"project_keys"}
    for name, stage in STAGES.items():
        assert "params.yaml" not in stage.get("deps", []), name


def test_the_last_good_report_survives_a_failed_track():
    outs = STAGES["track"]["outs"]
    assert {"reports/report.html": {"persist": True}} in outs


@pytest.mark.parametrize("stage", list(STAGE_CODE))
def test_each_stage_runs_the_installed_module_and_depends_on_its_code_record(stage):
    assert STAGES[stage]["cmd"] == f"python stages/{stage}.py"
    deps = STAGES[stage]["deps"]
    assert deps[:2] == [f"stages/{stage}.py", f"reports/code/{stage}.json"], deps
    assert not [d for d in deps if d.startswith("src/")], f"{stage}: lists library sources"


@pytest.mark.parametrize("stage", list(STAGE_CODE))
def test_every_imported_library_file_is_covered_by_a_listed_file_or_folder(stage):
    listed = STAGE_CODE[stage]
    assert f"stages/{stage}.py" in listed, f"{stage}: expected its own module stages/{stage}.py"
    missing = sorted(
        f for f in _imported_library_files(stage) if not any(_covers(d, f) for d in listed)
    )
    assert not missing, f"STAGE_CODE[{stage!r}]: the stage imports {missing}, not listed"


@pytest.mark.parametrize("stage", list(STAGE_CODE))
def test_every_listed_library_file_or_folder_is_imported(stage):
    used = _imported_library_files(stage)
    for dep in STAGE_CODE[stage]:
        assert (PACKAGE / dep).exists(), f"STAGE_CODE[{stage!r}] lists {dep}, which does not exist"
        if dep == EXAMPLES:
            continue
        assert any(_covers(dep, f) for f in used), (
            f"STAGE_CODE[{stage!r}] lists {dep} but the stage imports nothing from it (a change "
            "there would rerun it for nothing)"
        )
        inside = [d for d in STAGE_CODE[stage] if d != dep and _covers(d, dep)]
        assert not inside, f"STAGE_CODE[{stage!r}] lists {dep} and a folder holding it"


def test_editing_one_stage_body_reruns_only_that_stage():
    """pipeline/ holds one module per stage: no stage lists the folder or another's."""
    for stage in STAGE_CODE:
        others = {f"pipeline/{s}.py" for s in STAGE_CODE if s != stage}
        for dep in STAGE_CODE[stage]:
            covered = sorted(o for o in others if _covers(dep, o))
            assert not covered, f"STAGE_CODE[{stage!r}]: {dep} covers {covered}"


def test_editing_the_html_report_reruns_only_track():
    """check and bench use the headline figures of report/ only, not the HTML report."""
    for stage in STAGE_CODE:
        listed = any(_covers(d, "report/html.py") for d in STAGE_CODE[stage])
        assert listed == (stage == "track"), stage


def test_a_changed_library_file_changes_the_records_of_the_stages_that_run_it(
    tmp_path, monkeypatch
):
    """The code stage on a copy of the package: unchanged, nothing is rewritten; an edit
    of the HTML report changes track's record alone, one of core/ every stage's."""
    package = tmp_path / "vmapcheck"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code, "PACKAGE", package)
    layout = Layout(tmp_path / "project")
    assert set(code.write_records(layout).values()) == {"new"}
    before = {s: layout.code_record(s).read_bytes() for s in STAGE_CODE}
    assert set(code.write_records(layout).values()) == {"same"}
    assert before == {s: layout.code_record(s).read_bytes() for s in STAGE_CODE}

    with (package / "report" / "html.py").open("a") as f:
        f.write("\n# an edit\n")
    changes = code.write_records(layout)
    assert [s for s, c in changes.items() if c == "changed"] == ["track"]
    record = json.loads(layout.code_record("track").read_text())
    assert record["vmapcheck"] and "report/html.py" in record["files"]

    with (package / "core" / "compare.py").open("a") as f:
        f.write("\n# an edit\n")
    assert set(code.write_records(layout).values()) == {"changed"}


def test_tolerance_is_read_only_by_check_and_logged_by_track():
    for name, stage in STAGES.items():
        params = stage.get("params", [])
        reads_tolerance = any(p in ("precision", "precision.tolerance") for p in params)
        assert reads_tolerance == (name in ("check", "track")), name


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
    assert not {f"/{p}" for p in metrics} & set((ROOT / ".gitignore").read_text().split())


def test_every_cached_output_is_git_ignored_before_any_stage_runs():
    """DVC writes its ignore entries only when a stage succeeds: init's block ignores
    every cached output up front, so `git add -A` after a failed run takes none."""
    root_rules = set((ROOT / ".gitignore").read_text().splitlines())
    for name, stage in STAGES.items():
        for kind in ("outs", "metrics"):
            for entry in stage.get(kind, []):
                path, options = (
                    next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
                )
                if options.get("cache", True):
                    assert f"/{path}" in root_rules, (name, path)


def _colour_scale(template: dict) -> dict:
    return template["spec"]["encoding"]["color"]["scale"]


def test_plots_draw_every_path_and_speedup_through_the_log_log_templates():
    plots = {next(iter(p)): p[next(iter(p))] for p in DVC_YAML["plots"] if isinstance(p, dict)}
    latency = plots["latency_p50_ms_vs_batch_size"]
    assert latency["x"] == "batch_size"
    assert latency["y"] == {f"reports/plots/{p}.csv": "p50_ms" for p in path_names("batch")}
    speedup = plots["vmap_speedup_vs_batch_size"]
    assert speedup["y"] == {f"reports/plots/speedup/{s.name}.csv": "ratio" for s in SPEEDUPS}
    assert (latency["template"], speedup["template"]) == ("loglog", "speedup")
    colours = series_colours()
    for name, series in (
        ("loglog", path_names("batch")),
        ("speedup", tuple(s.name for s in SPEEDUPS)),
    ):
        template = json.loads((ROOT / ".dvc" / "plots" / f"{name}.json").read_text())
        spec = template["spec"]
        assert spec["encoding"]["x"]["scale"]["type"] == "log"
        drawn = [layer for layer in _y_layers(spec) if "field" in _y(layer)]
        assert {_y(layer)["scale"]["type"] for layer in drawn} == {"log"}
        # One colour per series, fixed by the registry: the same in every run, revision
        # and plot, in the PNGs and the HTML report (vmapcheck.core.paths.series_colours).
        assert _colour_scale(template) == {
            "domain": list(series),
            "range": [colours[s] for s in series],
        }
        # `dvc plots diff`: one panel per revision, in the order given.
        assert template["facet"]["field"] == "rev" and template["facet"]["sort"] is None
        # A ratio's "as fast" marked across the panel, where an interval across it is no
        # measurable difference; a latency has no such line.
        rules = [layer for layer in spec["layer"] if _y(layer) == {"datum": 1}]
        assert len(rules) == (name == "speedup"), name


def _y(layer: dict) -> dict:
    return layer.get("encoding", {}).get("y", {})


def _y_layers(spec: dict) -> list[dict]:
    """Every leaf layer of a (nested) layer spec."""
    out = []
    for layer in spec["layer"]:
        out += _y_layers(layer) if "layer" in layer else [layer]
    return out


def test_each_path_has_its_own_colour_and_a_speedup_that_of_the_path_it_is_against():
    colours = series_colours()
    batch = path_names("batch")
    assert len({colours[p] for p in batch}) == len(batch)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", colours[p]) for p in batch)
    for s in SPEEDUPS:
        assert colours[s.name] == colours[s.against] and s.against in (s.slower, s.faster)


def test_an_added_path_reaches_the_plots_without_editing_the_template(monkeypatch):
    """init renders the plots' series from PATHS and SPEEDUPS: a new batch path (here a
    copy of vmap_jit under another name, registered for the test only) gets its CSV in
    dvc.yaml and a colour of its own, with no edit to the template."""
    import dataclasses

    from vmapcheck.core import paths

    before = len(path_names("batch"))
    extra = dataclasses.replace(paths.PATHS["vmap_jit"], name="extra_jit")
    monkeypatch.setattr(paths, "PATHS", {**paths.PATHS, "extra_jit": extra})
    assert len(path_names("batch")) == before + 1
    planned = plan(ROOT, ModelChoice(name="mlp"), DataChoice(name="synthetic"))
    rendered = yaml.safe_load(planned.files["dvc.yaml"])
    latency = next(p for p in rendered["plots"] if "latency_p50_ms_vs_batch_size" in p)
    assert "reports/plots/extra_jit.csv" in latency["latency_p50_ms_vs_batch_size"]["y"]
    scale = _colour_scale(json.loads(planned.files[".dvc/plots/loglog.json"]))
    assert scale["domain"][-1] == "extra_jit"
    assert scale["range"][-1] == paths.PALETTE[before] not in scale["range"][:-1]


def test_more_paths_than_colours_is_an_error_naming_the_palette(monkeypatch):
    import dataclasses

    from vmapcheck.core import paths

    many = {
        f"extra{i}_jit": dataclasses.replace(paths.PATHS["vmap_jit"], name=f"extra{i}_jit")
        for i in range(len(paths.PALETTE))
    }
    monkeypatch.setattr(paths, "PATHS", {**paths.PATHS, **many})
    with pytest.raises(ValueError, match=r"PALETTE in vmapcheck\.core\.paths has 20 colours"):
        series_colours()


@pytest.mark.parametrize("stage", ["code", *STAGE_CODE])
def test_each_stage_entry_is_the_one_init_writes(stage):
    entry = Layout(ROOT).stage_entry(stage)
    planned = plan(ROOT, ModelChoice(name="mlp"), DataChoice(name="synthetic"))
    assert planned.files[str(entry.relative_to(ROOT))] == entry.read_text()


def test_a_stage_entry_run_without_vmapcheck_says_which_python_and_what_to_activate():
    # -S: no site-packages, so this interpreter has no vmapcheck, as a python outside
    # the environment would.
    done = subprocess.run(
        [sys.executable, "-S", str(Layout(ROOT).stage_entry("prepare"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    message = done.stderr.strip()
    assert message.startswith(f"stages/prepare.py: vmapcheck is not installed for {sys.executable}")
    assert "source .venv/bin/activate" in message and len(message.splitlines()) == 1
