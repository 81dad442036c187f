"""Atomic outputs, verified params (sha256 + contract), no pickle."""

import json

import jax
import numpy as np
import pytest

from vmapcheck.config import ModelConfig
from vmapcheck.core.models import build_model
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_dir, atomic_write_json, load_npz
from vmapcheck.params_io import load_model_params, read_params_file, save_params


def test_atomic_dir_keeps_the_old_output_when_the_writer_fails(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as folder:
        (folder / "a.txt").write_text("first")
    with pytest.raises(RuntimeError), atomic_dir(target) as folder:
        (folder / "a.txt").write_text("half")
        raise RuntimeError("interrupted")
    assert (target / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_write_leaves_no_temp_file(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_pickled_npz_is_refused(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ArtifactError, match="refused"):
        load_npz(path)


@pytest.fixture
def saved(tmp_path):
    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[6], out_features=2))
    params = jax.device_get(model.init(jax.random.key(0)))
    save_params(tmp_path, params, {"model": "mlp"})
    return model, params, tmp_path


def test_params_round_trip(saved):
    model, params, folder = saved
    loaded, manifest = load_model_params(model, folder)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    assert manifest["contract"]["layers[0].W"] == {"shape": [4, 6], "dtype": "float32"}


def test_tampered_params_fail_the_sha256_check(saved):
    model, _, folder = saved
    raw = bytearray((folder / "params.safetensors").read_bytes())
    raw[-1] ^= 0xFF
    (folder / "params.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match="sha256 check failed"):
        load_model_params(model, folder)


def test_params_of_another_model_name_the_leaf(saved):
    _, _, folder = saved
    other = build_model(ModelConfig(name="mlp", in_features=4, hidden=[7], out_features=2))
    with pytest.raises(ArtifactError, match=r"leaf layers\[0\]\.W: expected shape \[4, 7\]"):
        load_model_params(other, folder)


def test_missing_and_extra_leaves_are_named(saved):
    _, _, folder = saved
    deeper = build_model(ModelConfig(name="mlp", in_features=4, hidden=[6, 6], out_features=2))
    with pytest.raises(ArtifactError, match=r"missing leaf layers\[2\]\.W"):
        load_model_params(deeper, folder)
    toy = build_model(ModelConfig(name="toy", in_features=3, hidden=[], out_features=2))
    with pytest.raises(ArtifactError, match=r"unexpected leaf layers\[0\]\.W"):
        load_model_params(toy, folder)


@pytest.mark.parametrize("bad,name", [(np.nan, "NaN"), (np.inf, "Inf"), (-np.inf, "Inf")])
def test_params_that_are_not_finite_are_refused_when_loaded_naming_the_leaf(tmp_path, bad, name):
    # A NaN used to pass train (params_file) and be caught only by check.
    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[6], out_features=2))
    params = jax.device_get(model.init(jax.random.key(0)))
    params["layers"][1]["b"] = np.array([0.0, bad], np.float32)
    manifest = save_params(tmp_path, params, {"model": "mlp"})
    expected = (
        f"{tmp_path / 'params.safetensors'}: leaf layers[1].b: expected finite values, found "
        f"{name} in 1 element(s) (first at index (1,)); params must be finite"
    )
    with pytest.raises(ArtifactError) as info:
        load_model_params(model, tmp_path)
    assert str(info.value) == expected
    # The reader train uses for train.params_file (and the registry for its versions).
    template = jax.eval_shape(model.init, jax.random.key(0))
    with pytest.raises(ArtifactError, match=r"leaf layers\[1\]\.b: expected finite values"):
        read_params_file(tmp_path / "params.safetensors", template, manifest["sha256"])


def test_the_layout_names_the_params_folder_s_files_as_params_io_does(tmp_path):
    """Layout names the params folder's files once; params_io writes and reads them
    under those names."""
    from vmapcheck.layout import CONTRACT_FILE, MANIFEST_FILE, Layout

    layout = Layout(tmp_path)
    assert layout.contract == layout.params / CONTRACT_FILE
    assert layout.params_manifest == layout.params / MANIFEST_FILE


# --- issue 45: params.yaml and JSON read bounded, their file type checked before opening --


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda p: p.write_bytes(b"seed: 0\nname: caf\xe9\n"),
            "expected UTF-8 text, found the byte 0xe9",
        ),
        (lambda p: p.mkdir(), "expected a params file (a regular file), found a directory"),
        (lambda p: p.symlink_to("/dev/zero"), "found a character device"),
        (lambda p: __import__("os").mkfifo(p), "found a FIFO (named pipe)"),
        (lambda p: p.symlink_to(p.name), "expected a file, found a symbolic link loop"),
        (lambda p: p.write_bytes(b"a: " + b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
        (
            lambda p: p.write_bytes(b"#" * (5 * 2**20)),
            "of at most 4,194,304 bytes, found 5,242,880",
        ),
    ],
)
def test_a_params_file_that_is_no_small_yaml_file_is_refused_naming_it(tmp_path, make, said):
    from vmapcheck.config.load import read_params
    from vmapcheck.errors import ConfigError

    path = tmp_path / "params.yaml"
    make(path)
    with pytest.raises(ConfigError, match=r"params\.yaml") as refused:
        read_params(path)
    assert said in str(refused.value)


def test_json_nested_too_deeply_is_refused_naming_the_file(tmp_path):
    from vmapcheck.io import read_json

    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match=r"deep\.json: expected JSON nested a few hundred"):
        read_json(path)


def test_an_output_path_is_checked_before_the_work(tmp_path):
    from vmapcheck.io import output_file_problem

    assert output_file_problem(tmp_path / "new" / "out.json") is None
    assert output_file_problem(tmp_path) == "expected a file path, found a directory"
    (tmp_path / "file").write_text("x")
    under_a_file = output_file_problem(tmp_path / "file" / "out.json")
    assert under_a_file == "expected a folder in its path, found a file (Not a directory)"
    assert "refuses" in str(output_file_problem("/proc/out.json"))


def test_an_npz_that_is_a_fifo_is_refused_without_opening_it(tmp_path):
    import os

    path = tmp_path / "train.npz"
    os.mkfifo(path)
    with pytest.raises(ArtifactError, match=r"train\.npz: expected an \.npz file .* found a FIFO"):
        load_npz(path)


# A full disk the tests can make as any user: a child process whose file size limit
# (RLIMIT_FSIZE, `ulimit -f`) is small, with SIGXFSZ ignored, so that a write past it fails
# with EFBIG, as one on a full disk fails with ENOSPC (both mapped alike: vmapcheck.io.NO_ROOM).
# Chosen over a small tmpfs: mounting one needs root or user namespaces, which CI
# containers often lack; /dev/shm is shared with the machine and cannot be made small.
FULL_DISK_CHILD = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
"""


def run_with_file_limit(code: str, limit: int, *args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD + code, str(limit), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_write_with_no_room_names_the_folder_and_its_free_space_and_loses_nothing(tmp_path):
    target = tmp_path / "reports" / "check.json"
    target.parent.mkdir()
    target.write_text('{"before": true}\n')
    done = run_with_file_limit(
        "from pathlib import Path\n"
        "from vmapcheck.io import atomic_write_json\n"
        "from vmapcheck.errors import ArtifactError\n"
        "try:\n"
        "    atomic_write_json(Path(sys.argv[2]), {'x': 'y' * 100_000})\n"
        "except ArtifactError as exc:\n"
        "    print(exc)\n",
        4096,
        str(target),
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"{target}: cannot write it in {target.parent} (File too large; ")
    assert f"free in {target.parent}, and this process may write files of at most 4096" in line
    assert line.endswith("; the file is as it was before")
    # Nothing lost, nothing half-written: the old file stays, no temp file is left, and the
    # next write (room again) succeeds.
    assert target.read_text() == '{"before": true}\n'
    assert [p.name for p in target.parent.iterdir()] == ["check.json"]
    atomic_write_json(target, {"x": "y" * 100_000})
    assert json.loads(target.read_text())["x"] == "y" * 100_000


def test_an_artifact_store_with_no_room_is_named_not_the_database(tmp_path, empty_mlflow_store):
    """MLflow copies a run's artifacts into the artifact root: a write there that fails
    for lack of room names that folder and its free space, not mlflow.db."""
    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    artifacts = tmp_path / "mlartifacts"
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * 2_000_000)
    done = run_with_file_limit(
        "from pathlib import Path\n"
        "from mlflow.tracking import MlflowClient\n"
        "from vmapcheck.errors import TrackingStoreError\n"
        "from vmapcheck.tracking.sqlite_store import store_faults\n"
        "uri, artifacts, big = sys.argv[2], Path(sys.argv[3]), sys.argv[4]\n"
        "client = MlflowClient(tracking_uri=uri)\n"
        "run = client.create_run(client.create_experiment('e', str(artifacts)))\n"
        "try:\n"
        "    with store_faults(uri, artifacts):\n"
        "        client.log_artifact(run.info.run_id, big)\n"
        "except TrackingStoreError as exc:\n"
        "    print(exc)\n",
        1_000_000,
        uri,
        str(artifacts),
        str(big),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("the run's artifacts could not be written in "), line
    assert str(artifacts) in line and "free in " in line and "mlflow.db" not in line
    assert "the next `track` marks it FAILED" in line


def test_params_and_folder_outputs_with_no_room_name_the_output_folder(tmp_path):
    """safetensors' own I/O error and a file of a folder output (atomic_dir) are named as
    the output folder, with its free space, not as a traceback or the temp folder."""
    params = tmp_path / "data" / "params"
    folder = tmp_path / "data" / "prepared"
    done = run_with_file_limit(
        "from pathlib import Path\n"
        "import numpy as np\n"
        "from vmapcheck.errors import ArtifactError\n"
        "from vmapcheck.io import atomic_dir, atomic_save_npz\n"
        "from vmapcheck.params_io import save_params\n"
        "params, folder = Path(sys.argv[2]), Path(sys.argv[3])\n"
        "try:\n"
        "    save_params(params, {'w': np.zeros((64, 64), np.float32)}, {})\n"
        "except ArtifactError as exc:\n"
        "    print(exc)\n"
        "try:\n"
        "    with atomic_dir(folder) as tmp:\n"
        "        atomic_save_npz(tmp / 'train.npz', {'x': np.zeros((64, 64))})\n"
        "except ArtifactError as exc:\n"
        "    print(exc)\n",
        4096,
        str(params),
        str(folder),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    saved, built = done.stdout.splitlines()
    assert saved.startswith(f"{params}/params.safetensors: cannot write it in {params} (File")
    assert "free in" in saved and "ulimit -f" in saved
    assert built.startswith(f"{folder}/train.npz: cannot write it in {folder} (File too large")
    assert built.endswith("the folder is as it was before") and "free in" in built
    assert not folder.exists() and list(params.iterdir()) == []
