"""The forward stage as a group of processes (``backend.processes``; docs/multiprocess.md).

The small run (2 processes of 1 emulated CPU device) is CI's: it agrees bitwise with the
stage run as one process of 2 devices (the same mesh, the same SPMD program; the
single-device paths run on each process's own device). The big one (4 processes of 2
devices, against one process of 8, then check, bench and track: one MLflow run) is
marked ``multiprocess`` and left to ``make test-multiprocess``: 4 JAX processes on two
cores, then the stages after them, took 112 s (2026-12-07, load 4-5). The refusals (a
count that is not a positive whole number, devices that do not split, a port taken, a
variable of the group's environment wrong) run no process; a process killed mid-run is
named by the launcher, which stops the others.

Each run's subprocesses are few: the launcher runs in this test process (the stage's
body, in-process), and only the group's processes are started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.inprocess import inputs_repository, run_stage, run_stages, write_params
from tests.helpers.project import commit_all
from tests.helpers.wait import HANG_S
from vmapcheck.config import BackendConfig
from vmapcheck.core.distributed import (
    CLUSTER_ENV,
    COORDINATOR_ENV,
    LOCAL_DEVICES_ENV,
    PROCESS_ID_ENV,
    PROCESSES_ENV,
    Launch,
    launched,
)
from vmapcheck.errors import ConfigError, ProcessGroupError
from vmapcheck.layout import Layout
from vmapcheck.pipeline.multiprocess import (
    LAUNCHER_PID_ENV,
    check_launchable,
    exit_said,
    follow_launcher,
    process_env,
    run_group,
)

SMALL = ("data.n_rows=240", "data.standard_batch=8", "train.steps=0")
ARRAYS = ("outputs", "composition", "reference_outputs", "gradients")


def _backend(**keys) -> BackendConfig:
    return BackendConfig(**{"name": "cpu", "platform": "cpu", "num_devices": 2, **keys})


# --- refusals: no process started ------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2.5, "4", None, True])
def test_a_process_count_not_a_positive_whole_number_is_refused_by_name(value):
    with pytest.raises(ValueError, match="processes"):
        _backend(processes=value)


@pytest.mark.parametrize("value", [0, -2, "2", 1.5])
def test_a_device_count_not_a_positive_whole_number_is_refused_by_name(value):
    with pytest.raises(ValueError, match="num_devices"):
        _backend(num_devices=value, processes=2)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("+backend.processes=0", "backend.processes: Input should be greater than 0, found 0"),
        ("+backend.processes=two", "backend.processes: Input should be a valid integer"),
        ("+backend.processes=3", "backend.num_devices=2 with backend.processes=3: expected"),
        ("+backend.coordinator_port=80", "backend.coordinator_port: Input should be greater"),
    ],
)
def test_params_yaml_refusals_name_the_key_and_what_was_found(override, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        compose_config("backend=cpu", override)


def test_devices_that_do_not_split_over_the_processes_are_refused_with_both_values():
    with pytest.raises(ValueError, match=r"num_devices=6 with backend.processes=4.*multiple"):
        _backend(num_devices=6, processes=4)
    assert _backend(num_devices=8, processes=4).processes == 4
    assert _backend().processes == 1  # absent: one process, params.yaml unchanged


def test_each_process_is_told_its_place_and_its_share_of_the_devices():
    env = process_env(_backend(num_devices=8, processes=4), 1234, 3, base={CLUSTER_ENV: "x"})
    assert env[COORDINATOR_ENV] == "127.0.0.1:1234"
    assert (env[PROCESSES_ENV], env[PROCESS_ID_ENV], env[LOCAL_DEVICES_ENV]) == ("4", "3", "2")
    assert CLUSTER_ENV not in env  # the launcher's group, not a cluster's
    assert env[LAUNCHER_PID_ENV] == str(os.getpid())
    assert launched(env) == Launch("127.0.0.1:1234", 4, 3, 2)


def test_a_taken_coordinator_port_is_refused_before_any_process_starts(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        backend = _backend(processes=2, coordinator_port=port)
        with pytest.raises(ConfigError, match=rf"backend.coordinator_port={port}: .*taken"):
            run_group("forward", backend, tmp_path)


def test_a_local_group_on_an_accelerator_is_refused_pointing_at_the_cluster_way():
    tpu = BackendConfig(name="tpu", platform="tpu", num_devices=None, processes=4)
    with pytest.raises(ConfigError, match=f"cpu only.*{CLUSTER_ENV}=cluster"):
        check_launchable(tpu)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({COORDINATOR_ENV: "127.0.0.1:1", PROCESSES_ENV: "2"}, PROCESS_ID_ENV),
        ({COORDINATOR_ENV: "127.0.0.1", PROCESSES_ENV: "2", PROCESS_ID_ENV: "0"}, "host:port"),
        ({COORDINATOR_ENV: "h:1", PROCESSES_ENV: "0", PROCESS_ID_ENV: "0"}, PROCESSES_ENV),
        ({COORDINATOR_ENV: "h:1", PROCESSES_ENV: "two", PROCESS_ID_ENV: "0"}, PROCESSES_ENV),
        ({COORDINATOR_ENV: "h:1", PROCESSES_ENV: "2", PROCESS_ID_ENV: "2"}, "index below"),
        ({COORDINATOR_ENV: "h:1", PROCESSES_ENV: "2", PROCESS_ID_ENV: "-1"}, PROCESS_ID_ENV),
        ({CLUSTER_ENV: "yes"}, CLUSTER_ENV),
        ({CLUSTER_ENV: "cluster", PROCESS_ID_ENV: "0"}, "both set"),
    ],
)
def test_a_group_environment_that_is_wrong_is_refused_naming_the_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        launched(env)


def test_alone_or_in_a_cluster_the_environment_says_so():
    assert launched({}) is None
    cluster = launched({CLUSTER_ENV: "cluster"})
    assert cluster == Launch(None, None, None, None)
    assert cluster.label() == "a process of the cluster"


def test_a_process_whose_launcher_is_gone_or_unnamed_says_so():
    follow_launcher({})  # alone or a cluster's: nothing to follow
    with pytest.raises(ConfigError, match=f"{LAUNCHER_PID_ENV}: expected a process id"):
        follow_launcher({LAUNCHER_PID_ENV: "me"})
    # Not this process's parent (checked before the parent-death signal is set: this
    # test process is left as it was).
    gone = str(os.getppid() + 1)
    with pytest.raises(ProcessGroupError, match=rf"launcher of this group \(pid {gone}\)"):
        follow_launcher({LAUNCHER_PID_ENV: gone})


def test_an_exit_status_is_said_as_a_person_reads_it():
    assert exit_said(2) == "exit code 2"
    assert exit_said(-signal.SIGKILL) == "killed by SIGKILL"


# --- runs ---------------------------------------------------------------------------------


def _project(root: Path, *overrides: str) -> Layout:
    """A project at ``root`` after prepare and train (in this process), untrained."""
    inputs_repository(root)
    write_params(root, *SMALL, *overrides)
    commit_all(root, "multi-process inputs")
    run_stages(root, "prepare", "train")
    return Layout(root)


def _arrays(layout: Layout) -> dict[str, dict[str, np.ndarray]]:
    return {
        name: dict(np.load(layout.forward / f"{name}.npz", allow_pickle=False)) for name in ARRAYS
    }


def _assert_bitwise(ours: dict, theirs: dict) -> None:
    for name in ARRAYS:
        assert sorted(ours[name]) == sorted(theirs[name]), name
        differ = [k for k in ours[name] if not np.array_equal(ours[name][k], theirs[name][k])]
        assert not differ, f"{name}: {differ[:5]} differ from the single-process run"


def _reduces_across_devices(key: str) -> bool:
    """Whether the array ``key`` (``<case>.<path>``, ``<case>.<path>.<regrouping>``)
    comes from a path that splits the params over the mesh axis "model": its partial
    sums are added by a collective, whose order is gloo's across processes and XLA's
    within one, so its bits may differ."""
    from vmapcheck.core.paths import PATHS

    return any(part in PATHS and "model" in PATHS[part].mesh_axes for part in key.split("."))


def _assert_agree(ours: dict, theirs: dict, tolerance) -> None:
    """Bitwise alike where no collective reduces across devices; within the check's one
    tolerance rule (vmapcheck.core.compare) on the tensor-parallel paths."""
    from vmapcheck.core.compare import compare

    reduced = 0
    for name in ARRAYS:
        assert sorted(ours[name]) == sorted(theirs[name]), name
        for key in ours[name]:
            a, b = ours[name][key], theirs[name][key]
            if _reduces_across_devices(key):
                reduced += 1
                result = compare(a, b, tolerance)
                assert result["passed"], f"{name}: {key}: {result}"
            else:
                assert np.array_equal(a, b), f"{name}: {key} differs from the single-process run"
    assert reduced, "no tensor-parallel output was compared"


def _record(layout: Layout) -> dict:
    return json.loads((layout.forward / "record.json").read_text())


def _assert_same_record_but_processes(
    group: dict, alone: dict, processes: int, bits_may_differ: bool = False
) -> None:
    """Every key of the two forward records alike but ``sharded`` and ``meshes`` (every
    mesh path's), whose devices differ by their ids (a process's devices are numbered
    from 2048 x its index). ``bits_may_differ``: the tensor-parallel paths' collectives
    add in another order (:func:`_reduces_across_devices`), so the bitwise report, which
    measures every path's bits, is only checked to cover the same case and rows."""
    by_ids = ("sharded", "meshes", *(("bitwise",) if bits_may_differ else ()))
    assert {k: v for k, v in group.items() if k not in by_ids} == {
        k: v for k, v in alone.items() if k not in by_ids
    }
    if bits_may_differ:
        same = ("case", "rows", "rows_alone")
        assert {k: group["bitwise"][k] for k in same} == {k: alone["bitwise"][k] for k in same}
    keep = ("path", "devices", "mesh_shape", "padding", "form")
    assert {k: group["sharded"][k] for k in keep} == {k: alone["sharded"][k] for k in keep}
    assert sorted(group["meshes"]) == sorted(alone["meshes"])
    for name, about in group["meshes"].items():
        same = [k for k in keep if k in about]
        assert {k: about[k] for k in same} == {k: alone["meshes"][name][k] for k in same}, name
    assert group["sharded"]["processes"] == processes and alone["sharded"]["processes"] == 1
    held = group["sharded"]["process_devices"]
    assert sorted(held) == [str(p) for p in range(processes)]
    assert sorted(d for ids in held.values() for d in ids) == group["sharded"]["device_ids"]


@pytest.mark.stages
def test_two_processes_of_one_device_agree_bitwise_with_one_process_of_two(tmp_path, capfd):
    layout = _project(tmp_path, "backend.num_devices=2")
    assert run_stage(tmp_path, "forward") == 0  # one process, this one's 2 devices
    alone, alone_record = _arrays(layout), _record(layout)
    write_params(tmp_path, *SMALL, "backend.num_devices=2", "+backend.processes=2")
    capfd.readouterr()
    started = time.time()
    assert run_stage(tmp_path, "forward") == 0  # this process launches the 2
    out = capfd.readouterr().out
    _assert_bitwise(_arrays(layout), alone)
    _assert_same_record_but_processes(_record(layout), alone_record, 2)
    # Written once: process 0's summary alone, and the stage's time record is the
    # launcher's (this process), written after the group ended.
    assert out.count("forward: ") == 1 and "across 2 processes (process 0 wrote)" in out
    timed = json.loads(layout.stage_time("forward").read_text())
    assert (timed["pid"], timed["exit_code"]) == (os.getpid(), 0)
    assert (
        timed["start"] >= started - 1
        and (layout.forward / "record.json").stat().st_mtime < (timed["end"])
    )


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _process_id(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in env:
        if entry.startswith(PROCESS_ID_ENV.encode() + b"="):
            return entry.split(b"=", 1)[1].decode()
    return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start_group(root: Path) -> tuple[subprocess.Popen, dict[str, int]]:
    """The forward stage of a 2-process project at ``root`` started as DVC starts it;
    (the launcher, {process index: pid}) once both processes run (a process is known by
    its environment once it has exec'd: until then it shows its launcher's)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "vmapcheck.stages.forward"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + HANG_S
    group: dict[str, int] = {}
    while not {"0", "1"} <= set(group) and time.monotonic() < deadline:
        if launcher.poll() is not None:
            break
        found = {_process_id(pid): pid for pid in _children(launcher.pid)}
        group = {k: pid for k, pid in found.items() if k is not None}
        time.sleep(0.2)
    if not {"0", "1"} <= set(group):
        launcher.kill()
        _, err = launcher.communicate()
        pytest.fail(f"the launcher never started its 2 processes: {err[-2000:]}")
    time.sleep(3)  # into their run (importing, joining or computing: any point must do)
    return launcher, group


def _gone(pids, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(_alive(pid) for pid in pids)


@pytest.mark.stages
def test_a_process_killed_mid_run_is_named_and_the_others_are_stopped(tmp_path):
    layout = _project(tmp_path, "backend.num_devices=2", "+backend.processes=2")
    launcher, group = _start_group(tmp_path)
    os.kill(group["1"], signal.SIGKILL)
    _, err = launcher.communicate(timeout=HANG_S)
    assert launcher.returncode == 2, err
    assert f"process 1 of 2 (pid {group['1']}) ended with killed by SIGKILL" in err
    assert "the 1 still running were stopped" in err
    assert _gone(group.values(), within_s=0)  # none left behind
    assert not (layout.forward / "record.json").exists()
    timed = json.loads(layout.stage_time("forward").read_text())
    assert timed["exit_code"] == 2 and "ProcessGroupError" in timed["error"]


@pytest.mark.stages
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_launcher_ended_by_a_signal_ends_its_processes(tmp_path, sig):
    """SIGTERM (a person, a scheduler): the launcher stops its processes itself. SIGKILL
    (the out-of-memory killer): it cannot, and the kernel ends them (their parent-death
    signal), so none writes the outputs of a stage that has failed."""
    layout = _project(tmp_path, "backend.num_devices=2", "+backend.processes=2")
    launcher, group = _start_group(tmp_path)
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=HANG_S)
    assert launcher.returncode == (128 + sig if sig == signal.SIGTERM else -sig), err
    assert _gone(group.values()), "a process of the group outlived its launcher"
    assert not (layout.forward / "record.json").exists()


@pytest.mark.stages
def test_a_cluster_process_where_there_is_no_cluster_says_so_and_keeps_its_record(tmp_path):
    layout = _project(tmp_path, "backend.num_devices=2")
    done = subprocess.run(
        [sys.executable, "-m", "vmapcheck.stages.forward"],
        cwd=tmp_path,
        env={**os.environ, CLUSTER_ENV: "cluster"},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 2, done.stderr
    said = "forward (a process of the cluster): error: could not join the group of processes"
    assert said in done.stderr and f"{CLUSTER_ENV}=cluster asks JAX to find" in done.stderr
    # No launcher here: the process keeps its own record, on its host.
    timed = json.loads(layout.stage_time("forward").read_text())
    assert timed["exit_code"] == 2 and "BackendUnavailableError" in timed["error"]
    assert not (layout.forward / "record.json").exists()


NEVER_JOINED = """
import vmapcheck.core.distributed as distributed
from vmapcheck.config import BackendConfig
distributed.INIT_TIMEOUT_S = 10  # the test's patience, not 2 minutes
distributed.join(BackendConfig(name="cpu", platform="cpu", num_devices=2, processes=2))
print("joined")
"""


def test_a_process_whose_peers_never_come_says_so_before_jax_ends_it(tmp_path):
    env = {
        **os.environ,
        COORDINATOR_ENV: f"127.0.0.1:{_free_port()}",
        PROCESSES_ENV: "2",
        PROCESS_ID_ENV: "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", NEVER_JOINED],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    # JAX aborts the process (SIGABRT): no Python exception reaches vmapcheck.
    assert done.returncode == -signal.SIGABRT and "joined" not in done.stdout
    assert "process 0 of 2: the group of processes at 127.0.0.1:" in done.stderr
    assert "another process died or never started" in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_group_whose_process_fails_raises_naming_it(tmp_path):
    """A group on a folder with no project: each process refuses (no params.yaml) and
    the launcher names the first that ended, with its exit code."""
    ended = r"process \d of 2 \(pid \d+\) ended with exit code 2"
    with pytest.raises(ProcessGroupError, match=ended):
        run_group("forward", _backend(processes=2), tmp_path)


@pytest.mark.multiprocess
@pytest.mark.parametrize("model", ["mc_dropout", "two_tower"])
def test_a_sampling_model_and_a_dict_input_agree_bitwise_too(tmp_path, model):
    """The rows' keys of a sampling model and a model's dict of inputs are placed leaf
    by leaf (vmapcheck.core.distributed.put: a key array through its data)."""
    keys = (f"model={model}", "reference.required=false", "backend.num_devices=2")
    layout = _project(tmp_path, *keys)
    assert run_stage(tmp_path, "forward") == 0
    alone = _arrays(layout)
    write_params(tmp_path, *SMALL, *keys, "+backend.processes=2")
    assert run_stage(tmp_path, "forward") == 0
    _assert_bitwise(_arrays(layout), alone)


# --- the big run: 4 processes of 2 devices, and the pipeline after it ---------------------


@pytest.mark.multiprocess
def test_four_processes_of_two_devices_agree_with_one_of_eight_and_log_one_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from vmapcheck.config import load_config
    from vmapcheck.tracking.store import is_complete, tracking_uri

    def stage(name: str) -> None:
        # Its own process: this one has 2 devices, the runs here ask for 8.
        done = subprocess.run(
            [sys.executable, "-m", f"vmapcheck.stages.{name}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    layout = _project(tmp_path, "backend.num_devices=2")
    write_params(tmp_path, *SMALL, "backend.num_devices=8")
    stage("forward")
    alone, alone_record = _arrays(layout), _record(layout)
    write_params(tmp_path, *SMALL, "backend.num_devices=8", "+backend.processes=4")
    commit_all(tmp_path, "four processes")
    stage("forward")
    _assert_agree(_arrays(layout), alone, load_config(layout.params_yaml).precision.tolerance)
    _assert_same_record_but_processes(_record(layout), alone_record, 4, bits_may_differ=True)
    for name in ("check", "bench", "track"):
        stage(name)
    uri = tracking_uri(load_config(layout.params_yaml).tracking, layout.root)
    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1, [r.info.run_id for r in runs]
    (run,) = runs
    assert is_complete(run) and run.info.status == "FINISHED"
    assert run.data.params["backend.processes"] == "4"
    assert run.data.tags["verdict"] == "passed"
