"""The committed dvc.lock stays current.

What it records of the sources, the params and the metrics kept in git is what DVC
computes from a fresh copy of the tree now (`dvc status` in the copy reports nothing
else than the outputs a fresh clone does not have yet). And the deterministic stages,
prepare and train, reproduce their locked outputs from the committed defaults
(end to end). When a test here fails: `dvc repro` on a clean tree, then commit dvc.lock
and reports/*.json (docs/pipeline.md, "What git holds").
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.config import ROOT
from tests.helpers.project import commit_all, copy_project, run

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs git and a git checkout of the project",
)

STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
# Each stage's wall-time record: an output that differs on every run by nature.
WALL_TIMES = "reports/stages/"
REGENERATE = "regenerate it on a clean tree: `dvc repro`, then commit dvc.lock and reports/*.json"


def _reproducible(lock: dict) -> dict:
    """dvc.lock's stages without the wall-time records (reports/stages/*.json)."""
    return {
        name: {
            **stage,
            "outs": [o for o in stage.get("outs", []) if not o["path"].startswith(WALL_TIMES)],
        }
        for name, stage in lock["stages"].items()
    }


def _differing(locked: dict, now: dict) -> list[str]:
    """The deps/outs paths whose records differ between two lock entries of a stage."""
    paths = []
    for kind in ("deps", "outs"):
        before = {e["path"]: e for e in locked.get(kind, [])}
        after = {e["path"]: e for e in now.get(kind, [])}
        paths += [p for p in sorted(set(before) | set(after)) if before.get(p) != after.get(p)]
    return paths


def _paths(entries: list) -> list[str]:
    """The paths of a dvc.yaml deps/outs/metrics list (a path, or {path: options})."""
    return [e if isinstance(e, str) else next(iter(e)) for e in entries]


def _params(entries: list) -> set[str]:
    """The params.yaml keys of a dvc.yaml params list."""
    keys: set[str] = set()
    for entry in entries:
        if isinstance(entry, str):
            keys.add(entry)
        else:  # {params file: [key, ...]}
            keys.update(next(iter(entry.values())))
    return keys


# Outputs of some stage that are not in git: a fresh clone has none of them until the
# stage runs, so `dvc status` reports them missing, not stale.
OUTPUTS = {p for s in STAGES.values() for p in _paths(s.get("outs", []) + s.get("metrics", []))}


def _tracked() -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(listed.split())


def test_the_lock_records_each_stage_as_dvc_yaml_declares_it():
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    assert list(lock) == list(STAGES), f"dvc.lock: stages differ from dvc.yaml; {REGENERATE}"
    for name, stage in STAGES.items():
        locked = lock[name]
        assert locked["cmd"] == stage["cmd"], f"dvc.lock: {name}'s cmd; {REGENERATE}"
        assert {d["path"] for d in locked.get("deps", [])} == set(stage.get("deps", [])), (
            f"dvc.lock: {name}'s deps differ from dvc.yaml's; {REGENERATE}"
        )
        assert set(locked.get("params", {}).get("params.yaml", {})) == _params(
            stage.get("params", [])
        ), f"dvc.lock: {name}'s params differ from dvc.yaml's; {REGENERATE}"
        declared = _paths(stage.get("outs", []) + stage.get("metrics", []))
        assert {o["path"] for o in locked.get("outs", [])} == set(declared), (
            f"dvc.lock: {name}'s outs differ from dvc.yaml's; {REGENERATE}"
        )


def _stale(status: dict, committed: set[str]) -> dict[str, dict]:
    """What `dvc status --json` reports beyond the outputs a fresh clone lacks: a source,
    raw or reference file, a params key, a command, or a metrics file kept in git whose
    hash is not the locked one."""
    stale: dict[str, dict] = {}
    for stage, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):  # "changed command", "always changed"
                # The code stage runs every time by design (dvc.yaml: always_changed).
                if change != "always changed" or not STAGES[stage].get("always_changed"):
                    stale.setdefault(stage, {})[change] = True
                continue
            for kind, paths in change.items():
                for path, what in paths.items():
                    missing_output = path in OUTPUTS and path not in committed
                    if not missing_output:
                        stale.setdefault(stage, {})[f"{kind}: {path}"] = what
    return stale


def test_the_locked_sources_params_and_metrics_are_the_trees(tmp_path):
    """`dvc status` on a fresh copy of the tree (tracked and not-ignored files, as a clone
    has them): every dep that no stage produces, every params key, the command and the
    metrics files kept in git hash as dvc.lock records."""
    project = copy_project(tmp_path / "repo")
    status = json.loads(run(project, "dvc", "status", "--json").stdout or "{}")
    stale = _stale(status, _tracked())
    assert not stale, f"dvc.lock is out of date with the tree: {stale}; {REGENERATE}"


@pytest.mark.e2e
def test_prepare_and_train_reproduce_their_locked_outputs(tmp_path):
    """On a fresh copy, `dvc repro train` (prepare, then train, on the committed defaults)
    reproduces what dvc.lock records of them (data/prepared, data/cases, data/params and
    the losses) and leaves the committed metrics as they are. Each stage's wall-time record
    (reports/stages/<stage>.json) is an output too, different on every run by nature:
    it is left out of the comparison."""
    project = copy_project(tmp_path / "repo")
    commit_all(project)
    locked = _reproducible(yaml.safe_load((project / "dvc.lock").read_text()))
    run(project, "dvc", "repro", "train")
    now = _reproducible(yaml.safe_load((project / "dvc.lock").read_text()))
    for stage in ("prepare", "train"):
        assert now[stage] == locked[stage], (
            f"{stage} did not reproduce its locked outputs: "
            f"{_differing(locked[stage], now[stage])}; {REGENERATE}"
        )
    changed = run(project, "git", "status", "--porcelain", "reports").stdout
    changed = [line for line in changed.splitlines() if WALL_TIMES not in line]
    assert not changed, f"the committed metrics changed: {changed}"
    assert (Path(project) / "data" / "params" / "params.safetensors").is_file()
