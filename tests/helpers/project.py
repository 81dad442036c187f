"""End-to-end helpers: a real copy of the project, real subprocesses (DVC, MLflow, git)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.store import copy_empty_store, empty_store_template
from tests.helpers.wait import COMMAND_HANG_S

ROOT = Path(__file__).resolve().parents[2]


def project_env(project: Path) -> dict[str, str]:
    """The environment a command in ``project`` runs with: its own src/, this
    interpreter first on PATH, no analytics, a git identity."""
    env = dict(os.environ)
    env.update(
        # The copy's own library, not the editable install of the original checkout.
        PYTHONPATH=str(project / "src"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="e2e",
        GIT_AUTHOR_EMAIL="e2e@vmapcheck.invalid",
        GIT_COMMITTER_NAME="e2e",
        GIT_COMMITTER_EMAIL="e2e@vmapcheck.invalid",
    )
    env.pop("JAX_PLATFORMS", None)  # the pipeline selects the backend itself
    # Bytecode written, as a user's shell has it: each stage process then imports the
    # copy's vmapcheck from the bytecode the first one wrote, not from source every time
    # (this project's machines set PYTHONDONTWRITEBYTECODE; .dvcignore hides __pycache__).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(
    project: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a command in ``project`` with the project's interpreter first on PATH."""
    result = subprocess.run(
        list(args),
        cwd=project,
        env=project_env(project) | (env or {}),
        capture_output=True,
        text=True,
        timeout=COMMAND_HANG_S,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


# dvc.yaml's first and last stages run on every `dvc repro` by design (always_changed):
# code validates params.yaml and records which vmapcheck code each stage runs
# (vmapcheck.project.code); gate turns the verdict into the exit status
# (vmapcheck.pipeline.gate).
ALWAYS_RUN = ("code", "gate")


def stages_run(output: str) -> set[str]:
    """The stages a `dvc repro` ran (its output), less code and gate, which always run."""
    import re

    return set(re.findall(r"Running stage '(\w+)'", output)) - set(ALWAYS_RUN)


def dvc_up_to_date(project: Path) -> dict:
    """What `dvc status --json` reports beyond code's and gate's "always changed": {} when
    every stage is up to date."""
    import json

    status = json.loads(run(project, "dvc", "status", "--json").stdout or "{}")
    for stage in ALWAYS_RUN:
        if status.get(stage) == ["always changed"]:
            del status[stage]
    return status


# Requests of the guard's replay in a fast run (a test reads the count back).
FAST_REPLAY_REQUESTS = 200

# Train and benchmark just enough to exercise every stage in seconds, not minutes.
# One batch size: the bench compiles and warms up every path at each (a fast run's MLP
# bench stage: 5.4 CPU s with two sizes and 8 un-bucketed requests, 4.1 with one and 4;
# 2026-12-06, the two-core VM). Tests of what two sizes show (plots, per-size rows) add
# TWO_BATCH_SIZES.
FAST_RUN = [
    "train.steps=30",
    "train.eval_every=10",
    "bench.batch_sizes=[8]",
    "bench.warmup=1",
    "bench.repeats=5",
    "bench.loop_max_batch=8",
    # The guard: three buckets up to 64 rows, not five up to 1,024 (each is compiled when
    # the guard is built: a CNN's 1,024-row bucket alone takes seconds), and a short
    # replay: 200 requests, the first 4 of them without buckets (each a new batch size,
    # so a compile: 4 show the point as well as 40 did, at a tenth of the cost).
    "guard.buckets=[1,8,64]",
    "guard.max_batch=64",
    f"guard.replay.n_requests={FAST_REPLAY_REQUESTS}",
    "guard.replay.unbucketed_requests=4",
    # No wall-clock budgets: a test reads the outputs back (the 8-row cells' figures, the
    # replay's request count), and under load the quick profile's budgets (14 s of bench,
    # 10 s of replay) were spent on compiling, leaving cells out and requests unsent: the
    # outputs then depended on the machine's load (issue 44). This run is small anyway.
    "bench.early_stop.time_budget_s=null",
    "bench.replay_time_budget_s=null",
]
# Two batch sizes, for the tests that read a figure per size or a curve over sizes.
TWO_BATCH_SIZES = "bench.batch_sizes=[1,8]"


def compose_params(project: Path, *overrides: str) -> None:
    """Rewrite ``project``'s params.yaml from conf/ with Hydra overrides."""
    run(project, sys.executable, "-m", "vmapcheck", "params", *overrides)


def copy_project(dest: Path, source: Path = ROOT) -> Path:
    """Copy the tracked and untracked-but-not-ignored files of ``source`` (a git checkout
    of the project; no outputs, no store) to a new git repository at ``dest``, as a fresh
    clone of its working tree would be."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=source,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        src = source / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    run(dest, "git", "init", "-q")
    return dest


def commit_all(project: Path, message: str = "e2e copy") -> None:
    run(project, "git", "add", "-A")
    run(project, "git", "commit", "-qm", message)


# A planted fault: the hand-batched forward forgets the output bias, so only `direct`
# is wrong. (old, new) for :func:`planted` in src/vmapcheck/core/models.py.
MISSING_OUTPUT_BIAS = (
    'return hidden @ last["W"] + last["b"][None, :]',
    'return hidden @ last["W"]',
)
# A planted fault the diagnosis localizes: the hand-batched forward computes its second
# hidden layer in bfloat16 (forward, layers[1], direct_eager first).
BF16_HIDDEN_LAYER = (
    '        hidden = tap(f"layers[{i}]", jax.nn.relu(hidden @ layer["W"] + layer["b"][None, :]))',
    """        w = layer["W"].astype(jnp.bfloat16) if i == 1 else layer["W"]
        pre = (hidden.astype(w.dtype) @ w).astype(hidden.dtype)
        hidden = tap(f"layers[{i}]", jax.nn.relu(pre + layer["b"][None, :]))""",
)


@contextmanager
def planted(path: Path, old: str, new: str) -> Iterator[None]:
    """Inside the block, ``path`` has its one ``old`` replaced by ``new`` (a planted
    fault); the original text is back after it, whatever happened."""
    original = path.read_text()
    assert original.count(old) == 1, f"{path}: expected {old!r} exactly once"
    path.write_text(original.replace(old, new))
    try:
        yield
    finally:
        path.write_text(original)


def committed_project(dest: Path, *overrides: str) -> Path:
    """:func:`copy_project` to ``dest``, params composed with ``overrides``, committed,
    with an empty local MLflow store (conf/tracking/local.yaml's ``mlflow.db``) copied in:
    MLflow's migrations take seconds, and a store made on first use is what
    tests/e2e/test_pipeline.py and test_own_repository.py see."""
    copy_project(dest)
    copy_empty_store(empty_store_template(), dest / "mlflow.db")
    compose_params(dest, *overrides)
    commit_all(dest)
    return dest
