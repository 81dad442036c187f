"""The gate (the verdict as the exit status) and the code stage's line, on files written
here: no pipeline runs. The e2e test in tests/e2e/test_failed_experiments.py runs both
in DVC (a failed experiment kept, `dvc repro` red on it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vmapcheck.compose import compose_yaml
from vmapcheck.errors import ArtifactError, did_you_mean
from vmapcheck.layout import Layout
from vmapcheck.pipeline.gate import EXP_NAME_ENV, gate, main, run_gate

ROOT = Path(__file__).resolve().parents[1]

PASSED = {
    "passed": True,
    "n_failures": 0,
    "findings": {"batching": 0, "numerical": 0, "model": 0, "contract": 0},
    "worst_bound_ratio": 0.0133,
}
FAILED = PASSED | {
    "passed": False,
    "n_failures": 3,
    "findings": {"batching": 3, "numerical": 0, "model": 0, "contract": 0},
    "worst_bound_ratio": 412.0,
}


def _reports(root: Path, check: dict, replay_passed: float | None = None) -> Layout:
    layout = Layout(root)
    layout.reports.mkdir(parents=True, exist_ok=True)
    layout.check_report.write_text(json.dumps(check))
    if replay_passed is not None:
        figures = {"passed": replay_passed, "compiles": 9.0, "buckets": 4.0, "mismatched": 0.0}
        layout.bench_details.write_text(json.dumps({"replay": {"figures": figures}}))
    return layout


def test_a_passing_run_passes_the_gate_with_its_deciding_figure(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(EXP_NAME_ENV, raising=False)
    layout = _reports(tmp_path, PASSED, replay_passed=1.0)
    assert run_gate(layout, stage=True) == 0
    assert capsys.readouterr().out == (
        "gate: the check PASSED; worst_bound_ratio 0.0133 (the largest disagreement over "
        "its bound; above 1 fails)\n"
    )


def test_a_failed_check_fails_the_gate_under_dvc_repro_naming_kind_and_figure(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv(EXP_NAME_ENV, raising=False)
    layout = _reports(tmp_path, FAILED)
    assert run_gate(layout, stage=True) == 1
    out = capsys.readouterr().out
    assert out.startswith("gate: the check FAILED (3 batching finding(s)); worst_bound_ratio 412")
    assert out.rstrip().endswith("exiting non-zero")


def test_inside_dvc_exp_run_the_stage_keeps_the_failed_run_and_the_command_still_fails(
    tmp_path, capsys, monkeypatch
):
    # DVC sets DVC_EXP_NAME for every stage command of `dvc exp run` (queue/base.py).
    monkeypatch.setenv(EXP_NAME_ENV, "rapt-dace")
    layout = _reports(tmp_path, FAILED)
    assert run_gate(layout, stage=True) == 0
    out = capsys.readouterr().out
    assert "the check FAILED" in out and "kept as experiment rapt-dace" in out
    # `vmapcheck gate`, the step after `dvc exp run` in a scheduled job: red.
    assert run_gate(layout, stage=False) == 1
    assert capsys.readouterr().out.startswith("vmapcheck gate: the check FAILED")


def test_a_failed_guard_replay_fails_a_passing_check(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(EXP_NAME_ENV, raising=False)
    layout = _reports(tmp_path, PASSED, replay_passed=0.0)
    assert not gate(layout).passed
    assert run_gate(layout, stage=True) == 1
    assert "the guard's replay FAILED (9 compiles for 4 buckets" in capsys.readouterr().out


def test_missing_or_malformed_reports_are_named(tmp_path, capsys):
    with pytest.raises(ArtifactError, match=r"check\.json: not found"):
        gate(Layout(tmp_path))
    assert main(tmp_path) == 2
    assert "gate: error: " in capsys.readouterr().out
    layout = _reports(tmp_path, PASSED | {"passed": "yes"})
    with pytest.raises(ArtifactError, match="passed: expected true or false, found 'yes'"):
        gate(layout)


def test_the_gate_command_exits_1_on_a_failed_verdict(tmp_path):
    _reports(tmp_path, FAILED)
    done = subprocess.run(
        [sys.executable, "-m", "vmapcheck", "gate", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "vmapcheck gate: the check FAILED" in done.stdout


def test_the_code_stage_names_only_what_changed(tmp_path, capsys):
    """With its records kept (persist: true in dvc.yaml), a rerun says "no change"; an
    edited record is named alone."""
    from vmapcheck.project.code import run

    (tmp_path / "params.yaml").write_text(compose_yaml(ROOT / "conf"))
    assert run(tmp_path) == 0
    assert "new record for prepare, train, forward, check, bench, track" in capsys.readouterr().out
    assert run(tmp_path) == 0
    assert capsys.readouterr().out.rstrip().endswith("; no change")
    record = Layout(tmp_path).code_record("bench")
    record.write_text(record.read_text().replace('"sha256": "', '"sha256": "0', 1))
    assert run(tmp_path) == 0
    assert capsys.readouterr().out.rstrip().endswith("; changed code for bench")


@pytest.mark.parametrize(
    "name,known,prefix,expected",
    [
        ("tolerence", ["tolerance", "dtype"], "precision.", " (did you mean precision.tolerance?)"),
        ("comapre", ["compare", "init"], "", " (did you mean compare?)"),
        ("zzzz", ["name", "dtype"], "", ""),
    ],
)
def test_suggest_names_the_closest_known_name(name, known, prefix, expected):
    assert did_you_mean(name, known, prefix) == expected
