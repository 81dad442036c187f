"""The git state logged with every run: commit, and dirty only for changes people made."""

import subprocess

from vmapcheck.provenance import git_state


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_dirty_means_a_changed_source_not_the_lock_the_pipeline_rewrites(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "c")
    clean = git_state(tmp_path)
    assert len(clean["git_commit"]) == 40 and clean["git_dirty"] == "false"
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")  # the pipeline ran
    assert git_state(tmp_path)["git_dirty"] == "false"
    (tmp_path / "model.py").write_text("x = 2\n")  # a person changed the code
    assert git_state(tmp_path)["git_dirty"] == "true"
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("new\n")  # an untracked file counts too
    assert git_state(tmp_path)["git_dirty"] == "true"


DVC_YAML = """
stages:
  bench:
    cmd: python -m vmapcheck.stages.bench
    outs: [reports/bench_details.json, reports/plots]
    metrics:
      - reports/bench.json:
          cache: false
"""


def test_the_pipelines_own_outputs_are_rewritten_not_dirty(tmp_path):
    """The metrics kept in git and the .gitignore DVC writes beside an out are the
    pipeline's: listed as rewritten, not dirty. A person's edit beside them is dirty."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "bench.json").write_text("{}")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "c")
    assert git_state(tmp_path)["git_outputs_rewritten"] == ""
    (tmp_path / "reports" / "bench.json").write_text('{"p50": 1}')  # measured anew
    (tmp_path / "reports" / ".gitignore").write_text("/bench_details.json\n")  # DVC's
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    state = git_state(tmp_path)
    assert state["git_dirty"] == "false"
    assert state["git_outputs_rewritten"] == "dvc.lock,reports/.gitignore,reports/bench.json"
    (tmp_path / "model.py").write_text("x = 2\n")
    assert git_state(tmp_path)["git_dirty"] == "true"


def test_outside_a_checkout_the_state_is_unknown(tmp_path):
    assert git_state(tmp_path) == {
        "git_commit": "unknown",
        "git_dirty": "unknown",
        "git_outputs_rewritten": "",
    }
