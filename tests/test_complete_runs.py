"""Only complete runs count: a run that a killed ``track`` left behind is never a baseline,
compare shows it as failed once the next ``track`` has marked it, and nothing a run
points to is deleted (real MLflow sqlite stores, real processes; no mocks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers.config import ROOT
from vmapcheck.errors import ArtifactError
from vmapcheck.tracking.attempts import (
    ABANDONED_AFTER_S,
    abandon_unfinished_runs,
    settle_earlier_attempts,
)
from vmapcheck.tracking.baselines import last_verified_run, resolve_baseline
from vmapcheck.tracking.runs import compare_rows, select_runs
from vmapcheck.tracking.store import (
    ABANDONED_TAG,
    HOST_TAG,
    PID_START_TAG,
    PID_TAG,
    PIPELINE_KEY_TAG,
    complete_filter,
    is_complete,
    mark_complete,
    owner_tags,
)

TAGS = {"verdict": "passed", "model": "mlp", "backend": "cpu", "precision": "f32"}
WANTED = {"model": "mlp", "backend": "cpu", "precision": "f32"}

# What a track leaves in the store when it is SIGKILLed after creating its run: the run
# with its tags (log_run sets them all at creation), some artifacts, status RUNNING.
KILLED_TRACK = """
import json, sys, time
from mlflow.tracking import MlflowClient
from vmapcheck.tracking.store import owner_tags
uri, experiment, bench, tags = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
client = MlflowClient(tracking_uri=uri)
run = client.create_run(experiment, run_name="killed", tags={**tags, **owner_tags()})
client.log_artifact(run.info.run_id, bench)
print(run.info.run_id, flush=True)
time.sleep(600)
"""


def bench_file(folder, median_ms: float):
    """A bench_details.json whose one cell has latencies around ``median_ms``."""
    samples = np.random.default_rng(int(median_ms * 100)).lognormal(np.log(median_ms), 0.1, 50)
    path = folder / f"bench-{median_ms}" / "bench_details.json"
    path.parent.mkdir(exist_ok=True)
    details = {
        "model": "mlp",
        "dtype": "float32",
        "runtime": {"backend": "cpu", "device_kind": "cpu", "jax_version": "0.11.2"},
        "samples_ms": {"direct_jit": {"b16": samples.tolist()}},
        "machine": {"noisy": False, "before": {"cpu_model": "test cpu"}},
    }
    path.write_text(json.dumps(details))
    return path


@pytest.fixture
def store(tmp_path, empty_mlflow_store):
    from mlflow.tracking import MlflowClient

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("vmapcheck", artifact_location=tmp_path.as_uri())
    return uri, client, experiment, tmp_path


def complete_run(store, key: str, median_ms: float, name: str = "good", **extra) -> str:
    """A run as a track that finished logs it: RUNNING, then pipeline_complete, FINISHED."""
    uri, client, experiment, folder = store
    tags = {**TAGS, PIPELINE_KEY_TAG: key, **owner_tags(), **extra}
    run_id = client.create_run(experiment, run_name=name, tags=tags).info.run_id
    client.log_artifact(run_id, str(bench_file(folder, median_ms)))
    mark_complete(uri, run_id, tags.get("verdict", "passed"))
    return run_id


def killed_track(store, key: str, median_ms: float) -> tuple[str, int]:
    """Run a process that creates a half-logged run, SIGKILL it; the run id and its PID."""
    uri, _, experiment, folder = store
    tags = json.dumps({**TAGS, PIPELINE_KEY_TAG: key})
    bench = str(bench_file(folder, median_ms))
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_TRACK, uri, experiment, bench, tags],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    try:
        run_id = child.stdout.readline().strip()
        assert len(run_id) == 32, f"the child did not create its run ({child.poll()})"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    return run_id, child.pid


def planted(store, key: str, *, start_s: float | None = None, **tags: str) -> str:
    """A RUNNING run of a track with the given owner tags (and start time)."""
    _, client, experiment, _ = store
    start = int((start_s if start_s is not None else time.time()) * 1000)
    all_tags = {**TAGS, PIPELINE_KEY_TAG: key, **tags}
    return client.create_run(experiment, start_time=start, tags=all_tags).info.run_id


def reaped_pid() -> int:
    """The PID of a process that has exited and been waited for."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def verdicts(uri: str) -> dict[str, str]:
    rows, _ = compare_rows(select_runs(uri, n=20, prefix="vmapcheck").runs)
    return {row["run"]: row["verdict"] for row in rows}


def test_a_run_left_by_a_killed_track_is_never_trusted_and_shows_as_failed(store, capsys):
    uri, client, _, _ = store
    good = complete_run(store, "k-good", median_ms=1.0)
    killed, pid = killed_track(store, "k-killed", median_ms=2.0)
    run = client.get_run(killed)
    assert run.info.status == "RUNNING" and run.data.tags["verdict"] == "passed"
    assert not is_complete(run) and is_complete(client.get_run(good))

    # (a) Newer and passed, but not complete: neither last-verified nor a baseline by id.
    assert last_verified_run(uri, "vmapcheck", WANTED) == good
    assert resolve_baseline("last-verified", uri, "vmapcheck", WANTED).source == f"run {good}"
    with pytest.raises(ArtifactError, match=f"run '{killed}' .* not a complete run: its status"):
        resolve_baseline(killed, uri, "vmapcheck", WANTED)
    # compare shows its status, not its verdict tag, even before the cleanup.
    assert verdicts(uri) == {"killed": "running", "good": "PASSED"}

    # (b) The next track, on another pipeline state, marks it before looking for baselines.
    assert settle_earlier_attempts(uri, "k-next") is None
    out = capsys.readouterr().out
    assert f"track: marked run {killed} (killed) FAILED: left RUNNING by a track" in out
    assert f"its process {pid} on " in out
    run = client.get_run(killed)
    assert run.info.status == "FAILED" and run.info.lifecycle_stage == "active"
    reason = run.data.tags[ABANDONED_TAG]
    assert reason.startswith("left RUNNING by a track that did not finish (its process")
    assert f"marked FAILED by the track of process {os.getpid()}" in reason
    assert verdicts(uri) == {"killed": "abandoned", "good": "PASSED"}
    with pytest.raises(ArtifactError, match="its status is FAILED \\(left RUNNING by a track"):
        resolve_baseline(killed, uri, "vmapcheck", WANTED)
    assert last_verified_run(uri, "vmapcheck", WANTED) == good


def test_the_cleanup_leaves_the_runs_of_live_tracks_alone(store, capsys):
    uri, client, experiment, _ = store
    host = owner_tags()[HOST_TAG]
    dead = {PID_TAG: str(reaped_pid()), HOST_TAG: host}
    hours_ago = time.time() - ABANDONED_AFTER_S - 3600
    sleeper = subprocess.Popen(["sleep", "60"])  # a parallel track, still logging
    try:
        alive = {
            "this process": planted(store, "k1", **owner_tags()),
            "a live process": planted(store, "k2", **{PID_TAG: str(sleeper.pid), HOST_TAG: host}),
            "another host, recent": planted(store, "k3", **{PID_TAG: "1", HOST_TAG: "elsewhere"}),
            "no owner, recent": planted(store, "k4"),
        }
        gone = {
            "a reaped process": planted(store, "k5", **dead),
            "a reused PID": planted(
                store, "k6", **{**owner_tags(), PID_START_TAG: "1"}
            ),  # this PID, another process's start time
            "another host, old": planted(
                store, "k7", start_s=hours_ago, **{PID_TAG: "1", HOST_TAG: "elsewhere"}
            ),
            "no owner, old": planted(store, "k8", start_s=hours_ago),
        }
        # Not a track's run (no pipeline_key): not vmapcheck's to judge.
        foreign = client.create_run(experiment, start_time=int(hours_ago * 1000)).info.run_id
        finished = complete_run(store, "k9", median_ms=1.0)

        marked = abandon_unfinished_runs(uri)
        assert sorted(marked) == sorted(gone.values())
        for what, run_id in alive.items():
            run = client.get_run(run_id)
            assert run.info.status == "RUNNING" and ABANDONED_TAG not in run.data.tags, what
        for what, run_id in gone.items():
            run = client.get_run(run_id)
            assert run.info.status == "FAILED", what
            assert run.data.tags[ABANDONED_TAG].startswith("left RUNNING by a track"), what
        assert "is gone" in client.get_run(gone["a reused PID"]).data.tags[ABANDONED_TAG]
        old = client.get_run(gone["another host, old"]).data.tags[ABANDONED_TAG]
        assert "h ago on another host (elsewhere)" in old
        assert client.get_run(foreign).info.status == "RUNNING"
        assert is_complete(client.get_run(finished))
        assert abandon_unfinished_runs(uri) == []  # nothing is marked twice

        sleeper.kill()  # the parallel track is killed in turn
        sleeper.wait()
        assert abandon_unfinished_runs(uri) == [alive["a live process"]]
    finally:
        sleeper.kill()
        sleeper.wait()
    capsys.readouterr()


def test_no_perf_baseline_points_to_a_deleted_run(store, capsys):
    uri, client, _, _ = store
    host = owner_tags()[HOST_TAG]
    # A half-logged run of state k1 that an older track took as its baseline.
    half = planted(store, "k1", **{PID_TAG: str(reaped_pid()), HOST_TAG: host})
    complete_run(store, "k2", median_ms=1.0, name="later", perf_baseline=f"run {half}")
    # State k1 is rerun: its earlier attempt is replaced by a fresh run, and marked, not
    # deleted.
    assert settle_earlier_attempts(uri, "k1") is None
    assert f"marked run {half} " in capsys.readouterr().out
    for run in client.search_runs([client.get_run(half).info.experiment_id]):
        baseline = run.data.tags.get("perf_baseline", "")
        if baseline.startswith("run "):
            pointed = client.get_run(baseline[len("run ") :])
            assert pointed.info.lifecycle_stage == "active"
    assert client.get_run(half).info.status == "FAILED"
    # A run deleted by hand (mlflow runs delete) is named as such when asked for.
    deleted = complete_run(store, "k3", median_ms=1.0, name="deleted")
    client.delete_run(deleted)
    with pytest.raises(ArtifactError, match=f"baseline run '{deleted}' .* it was deleted"):
        resolve_baseline(deleted, uri, "vmapcheck", WANTED)
    assert last_verified_run(uri, "vmapcheck", WANTED) != deleted


def test_the_complete_filter_is_what_mlflow_searches_with(store):
    uri, client, experiment, _ = store
    done = complete_run(store, "k1", median_ms=1.0)
    no_verdict = client.create_run(experiment, tags={"pipeline_complete": "true"}).info.run_id
    client.set_terminated(no_verdict)
    untagged = client.create_run(experiment, tags={"verdict": "passed"}).info.run_id
    client.set_terminated(untagged)  # FINISHED by an older track, pipeline_complete missing
    found = client.search_runs([experiment], filter_string=complete_filter())
    assert [r.info.run_id for r in found] == [done]
    runs = client.search_runs([experiment])
    assert [r.info.run_id for r in runs if is_complete(r)] == [done]
    assert verdicts(uri)["good"] == "PASSED"
    assert sorted(verdicts(uri).values()) == ["PASSED", "incomplete", "incomplete"]


def test_last_verified_never_crosses_a_model_contract(store):
    """Two passed runs of model "mlp" of other widths (another contract digest): the
    baseline of a run of one is never a run of the other, however much newer."""
    uri = store[0]
    narrow = complete_run(store, "k-narrow", 1.0, name="narrow", model_contract_sha256="a" * 64)
    complete_run(store, "k-wide", 1.0, name="wide", model_contract_sha256="b" * 64)
    wanted = {**WANTED, "model_contract_sha256": "a" * 64}
    assert last_verified_run(uri, "vmapcheck", wanted) == narrow
    unknown = {**WANTED, "model_contract_sha256": "c" * 64}
    assert last_verified_run(uri, "vmapcheck", unknown) is None


def test_a_failed_check_ends_its_run_failed_and_it_is_still_a_complete_run(store, capsys):
    """MLflow's runs list shows a failed check as a red cross (status FAILED); the run is
    still complete: a baseline by id, logged once per pipeline state, shown as FAILED by
    `vmapcheck compare`, never last-verified (that wants verdict=passed)."""
    uri, client, experiment, _ = store
    good = complete_run(store, "k-good", median_ms=1.0)
    bad = complete_run(store, "k-bad", median_ms=2.0, name="bad", verdict="failed")
    run = client.get_run(bad)
    assert run.info.status == "FAILED" and is_complete(run)
    assert client.get_run(good).info.status == "FINISHED"
    found = client.search_runs([experiment], filter_string=complete_filter())
    assert sorted(r.info.run_id for r in found) == sorted([good, bad])
    assert last_verified_run(uri, "vmapcheck", WANTED) == good
    assert resolve_baseline(bad, uri, "vmapcheck", WANTED).source == f"run {bad}"
    assert verdicts(uri) == {"bad": "FAILED", "good": "PASSED"}
    # The same pipeline state again: the FAILED run is the one logged before, not marked.
    assert settle_earlier_attempts(uri, "k-bad")["run_id"] == bad
    assert "marked run" not in capsys.readouterr().out
    assert client.get_run(bad).info.status == "FAILED" and ABANDONED_TAG not in (
        client.get_run(bad).data.tags
    )
    with pytest.raises(ValueError, match="verdict must be one of"):
        mark_complete(uri, good, "unknown")
