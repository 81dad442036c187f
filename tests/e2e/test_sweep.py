"""End to end: a queued sweep (`dvc exp run --queue` x4, `dvc queue start -j 2`).

Queued experiments run in temporary copies under .dvc/tmp/exps/, deleted afterwards; the
default store (sqlite:///mlflow.db, artifacts in mlartifacts/) must not live there. The
store is created once (`vmapcheck store init`) before the two parallel
workers start, and every experiment's run must land in the repository's one store.
Nothing is mocked: real DVC queue workers (celery), JAX, MLflow.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.project import (
    FAST_RUN,
    commit_all,
    compose_params,
    copy_project,
    project_env,
    run,
)
from tests.helpers.wait import COMMAND_HANG_S, HANG_S

pytestmark = pytest.mark.e2e

TINY = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]
# Ordered so that the second pair can restore prepare/train/forward/bench of the first
# pair from DVC's run cache: only check and track differ (the tolerance).
SWEEP = [("toy", "1e-05"), ("mlp", "1e-05"), ("toy", "2e-05"), ("mlp", "2e-05")]
WAIT_S = COMMAND_HANG_S  # four small pipelines on a loaded two-core machine; only a hang


def queue_status(project: Path) -> dict[str, str]:
    """Experiment name -> Queued/Running/Success/Failed, from `dvc queue status`."""
    shown = run(project, "dvc", "queue", "status").stdout
    return dict(re.findall(r"^\S+\s+(sweep-\S+)\s+.*?\b(\w+)\s*$", shown, re.M))


def start_workers(project: Path, log: Path) -> None:
    """`dvc queue start -j 2`, its output to ``log``. Not through a pipe: its workers
    (forked, not detached) inherit the command's stdout, so reading it to the end waits
    for the last worker to exit; and a worker told to shut down while its last task ran
    can hang in celery's shutdown after that task succeeded (seen under load: the sweep
    done, `queue start` still open ten minutes later). The queue's status is what the
    test waits on."""
    with log.open("w") as out:
        subprocess.run(
            ["dvc", "queue", "start", "-j", "2"],
            cwd=project,
            env=project_env(project),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=HANG_S,
        )


def kill_workers(project: Path) -> None:
    """Kill what is left of the queue's workers (a worker hung in its shutdown, above):
    every process whose working directory is in ``project``."""
    import psutil

    root = project.resolve()
    for process in psutil.process_iter():
        try:
            if Path(process.cwd()).is_relative_to(root):
                process.kill()
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read


def test_a_queued_sweep_of_four_configs_with_two_jobs_reaches_one_store(tmp_path):
    project = copy_project(tmp_path / "repo")
    compose_params(project, *TINY)
    commit_all(project)
    # Before the parallel writers: create the sqlite store and the experiment once.
    init = run(project, sys.executable, "-m", "vmapcheck", "store", "init")
    assert "store ready" in init.stdout
    tiny = [arg for override in TINY for arg in ("-S", override)]
    names = []
    for i, (model, rtol) in enumerate(SWEEP):
        name = f"sweep-{i}-{model}"
        names.append(name)
        run(
            project,
            "dvc",
            "exp",
            "run",
            "--queue",
            "-n",
            name,
            "-S",
            f"model={model}",
            "-S",
            f"precision.tolerance.rtol={rtol}",
            *tiny,
        )
    assert set(queue_status(project)) == set(names)
    started = time.monotonic()
    try:
        start_workers(project, tmp_path / "queue-start.log")
        while True:
            status = queue_status(project)
            if len(status) == 4 and all(s in ("Success", "Failed") for s in status.values()):
                break
            assert time.monotonic() - started < WAIT_S, f"sweep not done in {WAIT_S} s: {status}"
            # `dvc queue status` is ~1.5 CPU s, taken from the two cores the sweep runs
            # on: every 3 s it was a third of a core for the whole sweep.
            time.sleep(10)
    finally:
        run(project, "dvc", "queue", "stop", "--kill", check=False)
        kill_workers(project)
    print(f"sweep done in {time.monotonic() - started:.0f} s: {status}")
    if set(status.values()) != {"Success"}:
        logs = {n: run(project, "dvc", "queue", "logs", n, check=False).stdout for n in names}
        shown = "\n".join(f"{name}:\n{log[-3000:]}" for name, log in logs.items())
        raise AssertionError(f"{status}\n{shown}")

    from mlflow.tracking import MlflowClient

    # Every run reached the repository's own store, none a temp copy's.
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    runs = client.search_runs(list(experiments))
    assert len(runs) == 4, [r.info.run_name for r in runs]
    logged = {(r.data.tags["model"], r.data.params["precision.tolerance.rtol"]) for r in runs}
    assert logged == set(SWEEP)
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags["pipeline_complete"] == "true"
        # One experiment for every model (tracking.experiment_per_model false).
        assert experiments[r.info.experiment_id] == "vmapcheck"
        assert r.data.tags["verdict"] == "passed"
        artifacts = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert {"report.html", "check.json"} <= artifacts
        assert r.info.artifact_uri.startswith((project / "mlartifacts").resolve().as_uri())
    assert len({r.data.tags["pipeline_key"] for r in runs}) == 4
    assert not list((project / ".dvc" / "tmp").rglob("mlflow.db"))
    # The experiments are DVC's too: each with its metrics.
    shown = run(project, "dvc", "exp", "show", "--csv").stdout
    assert all(name in shown for name in names)
