"""The verified model served through MLflow, against a real sqlite store (no mocks).

A passing run's params are registered by the real registry code as a pyfunc
(vmapcheck.tracking.serving); ``mlflow.pyfunc.load_model("models:/<name>@verified")``
predicts through the guard, a changed artifact is refused on load, bad requests are
refused with HTTP 400 and the guard's message, and the packaged code loads with no
vmapcheck on ``sys.path``. The e2e test serves it with ``mlflow models serve`` on loopback,
then rolls the alias back and serves the previous version.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers.inprocess import JAX_SETTINGS
from tests.helpers.registry import Store
from tests.helpers.servers import free_port, start_in_group, wait_until_ok
from tests.helpers.wait import HANG_S
from vmapcheck import cli
from vmapcheck.core.compare import compare
from vmapcheck.errors import ArtifactError
from vmapcheck.tracking import registry_commands, serving

NAME = "vmapcheck-mlp"
# Two buckets: every load compiles each of them (conf/guard/default.yaml has five).
SMALL_GUARD = ("guard.buckets=[1,8]", "guard.max_batch=8")
# A project whose deployment target is two_tower (else the run would not move @verified).
TWO_TOWER = (
    "model=two_tower",
    "data=diabetes",
    "registry.target.model=two_tower",
    "registry.target.hidden=null",
    *SMALL_GUARD,
)


def rows(n: int, width: int = 8, seed: int = 0) -> np.ndarray:
    """``n`` float32 rows of ``width`` features, batch axis 0."""
    return np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)


def forward(store: Store, seed: int, x: Any) -> np.ndarray:
    """The model's own hand-batched forward of ``x`` with the params of ``seed``."""
    return np.asarray(store.model.forward_batch(store.params(seed), x))


def load(store: Store, uri: str) -> Any:
    """``mlflow.pyfunc.load_model(uri)`` against ``store``; ``sys.path`` and JAX's settings
    left as they were (loading prepends the model's code/ folder and pins JAX to the run's
    backend and precision, as a serving process wants)."""
    import jax
    import mlflow.pyfunc

    path = list(sys.path)
    settings = {name: jax.config.values[name] for name in JAX_SETTINGS}
    try:
        with pytest.MonkeyPatch.context() as patch:
            # What a user sets: a models:/ URI is resolved in this registry.
            patch.setenv("MLFLOW_TRACKING_URI", store.uri)
            patch.setenv("MLFLOW_REGISTRY_URI", store.uri)
            return mlflow.pyfunc.load_model(uri)
    finally:
        sys.path[:] = path
        for name, value in settings.items():
            jax.config.update(name, value)


def registered(tmp_path_factory, empty_mlflow_store, *overrides: str) -> tuple[Store, dict]:
    root = tmp_path_factory.mktemp("served")
    empty_mlflow_store(root / "mlflow.db")
    store = Store(root, *overrides)
    return store, store.run_and_register(seed=1)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory, empty_mlflow_store) -> tuple[Store, dict]:
    return registered(tmp_path_factory, empty_mlflow_store, *SMALL_GUARD)


@pytest.fixture(scope="module")
def mlp_model(mlp) -> Any:
    return load(mlp[0], f"models:/{NAME}@verified")


def test_the_verified_version_loads_by_alias_and_predicts_the_models_forward(mlp, mlp_model):
    store, _ = mlp
    x = rows(5)
    out = mlp_model.predict(x)
    assert out.shape == (5, 2) and out.dtype == np.float32
    agreement = compare(out, forward(store, 1, x), store.config.precision.tolerance)
    assert agreement["passed"], agreement["reason"]
    # A DataFrame of in_features columns, in the contract's feature order, is that batch.
    frame = pd.DataFrame(x, columns=store.features)
    np.testing.assert_array_equal(mlp_model.predict(frame), out)
    signature = mlp_model.metadata.signature
    assert [spec.shape for spec in signature.inputs.inputs] == [(-1, 8)]
    assert [spec.type for spec in signature.inputs.inputs] == [np.dtype(np.float32)]
    assert [spec.shape for spec in signature.outputs.inputs] == [(-1, 2)]


def test_a_request_the_guard_refuses_is_a_400_with_its_message_and_no_value(mlp_model):
    from mlflow.exceptions import MlflowException

    x = rows(3)
    x[1, 4] = np.nan
    with pytest.raises(serving.RequestRefused) as caught:
        mlp_model.predict(x)
    refused = caught.value
    assert refused.get_http_status_code() == 400
    expected = {
        "error_code": "INVALID_PARAMETER_VALUE",
        "message": "request refused: expected finite values, got NaN in 1 element(s) "
        "(first at index (1, 4))",
        "reason": "non_finite_input",
    }
    assert json.loads(refused.serialize_as_json()) == expected
    # The scoring server prefixes the message with the request's values before it answers;
    # what it sends back stays the refusal.
    refused.message = f"Failed to predict data '{x}'. \nError: {refused.message}"
    assert json.loads(refused.serialize_as_json()) == expected

    with pytest.raises(serving.RequestRefused) as caught:
        mlp_model.predict(rows(9))
    assert caught.value.reason == "batch_too_large"
    assert caught.value.refusal == "request refused: expected at most guard.max_batch=8 rows, got 9"

    # The signature holds the feature count: MLflow refuses another before predict runs.
    with pytest.raises(MlflowException) as caught:
        mlp_model.predict(rows(2, width=7))
    assert caught.value.get_http_status_code() == 400
    assert "Shape of input (2, 7) does not match expected shape (-1, 8)" in caught.value.message


def test_the_scoring_server_takes_named_columns_by_name_and_refuses_bad_bodies(mlp, mlp_model):
    """MLflow's own scoring function, in process, as `mlflow models serve` calls it: loading
    the model put vmapcheck's body rule in front of it (request_body.install)."""
    from mlflow.pyfunc import scoring_server

    store, _ = mlp
    schema = mlp_model.metadata.get_input_schema()
    x = rows(3)
    expected = mlp_model.predict(x)

    def invoke(value: Any, content_type: str = "application/json") -> tuple[int, Any]:
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        answer = scoring_server.invocations(data, content_type, mlp_model, schema)
        return answer.status, json.loads(answer.response)

    reversed_names = store.features[::-1]
    split = {"columns": reversed_names, "data": x[:, ::-1].tolist()}
    status, answer = invoke({"dataframe_split": split})
    assert status == 200
    np.testing.assert_array_equal(np.asarray(answer["predictions"], np.float32), expected)
    records = [dict(zip(reversed_names, row[::-1], strict=True)) for row in x.tolist()]
    status, answer = invoke({"dataframe_records": records})
    assert status == 200
    np.testing.assert_array_equal(np.asarray(answer["predictions"], np.float32), expected)

    status, answer = invoke(b"[" * (50 * 2**20))
    assert (status, answer["reason"]) == (413, "body_too_large")
    status, answer = invoke(b"x0,x1\n1,2\n", "text/csv")
    assert (status, answer["reason"]) == (415, "content_type") and "stack_trace" not in answer
    misnamed = dict(records[0], x9=records[0].pop("x0"))
    status, answer = invoke({"dataframe_records": [misnamed]})
    assert (status, answer["reason"]) == (400, "columns")
    assert "missing ['x0']; unknown ['x9']" in answer["message"]
    status, answer = invoke({"inputs": rows(2, width=7).tolist()})
    assert (status, answer["reason"]) == (400, "row_shape")
    assert answer["message"] == (
        "request refused: inputs: row 0 has 7 values, expected 8 (one per feature)"
    )


@pytest.mark.parametrize(
    "relative",
    [
        "artifacts/params/params.safetensors",
        "artifacts/params/contract.json",
        "artifacts/serving.json",
    ],
)
def test_a_changed_artifact_is_refused_on_load_naming_the_file(mlp, relative):
    store, result = mlp
    path = store.version_file(result, relative)
    original = path.read_bytes()
    changed = bytearray(original)
    changed[len(changed) // 2] ^= 0x01
    try:
        path.write_bytes(bytes(changed))
        with pytest.raises(
            ArtifactError,
            match=rf"served model: {relative}: sha256 check failed: .* was recorded when the "
            r"model was logged, the file is .* \(changed since\); refused",
        ):
            load(store, f"models:/{NAME}/1")
    finally:
        path.write_bytes(original)


def test_a_model_whose_example_is_a_dict_of_leaves_takes_a_dict_of_tensors(
    tmp_path_factory, empty_mlflow_store
):
    from mlflow.exceptions import MlflowException

    store, result = registered(tmp_path_factory, empty_mlflow_store, *TWO_TOWER)
    # Its factory is a shipped example: packaged with vmapcheck.
    assert store.version_file(result, "code/vmapcheck/examples/two_tower.py").is_file()
    assert store.version_file(result, "code/vmapcheck/tracking/serving.py").is_file()
    model = load(store, "models:/vmapcheck-two_tower@verified")
    inputs = model.metadata.signature.inputs.inputs
    assert [(spec.name, spec.shape) for spec in inputs] == [("body", (-1, 2)), ("serum", (-1, 6))]
    x = {"body": rows(4, 2), "serum": rows(4, 6, seed=1)}
    out = model.predict(x)
    agreement = compare(out, forward(store, 1, x), store.config.precision.tolerance)
    assert out.shape == (4, 1) and agreement["passed"], agreement["reason"]
    x["serum"][2, 5] = np.inf
    with pytest.raises(serving.RequestRefused, match=r"leaf 'serum': expected finite values"):
        model.predict(x)
    with pytest.raises(MlflowException) as caught:
        model.predict({"body": x["body"]})
    assert caught.value.get_http_status_code() == 400


def test_a_bfloat16_run_takes_and_returns_float32_on_the_wire(tmp_path_factory, empty_mlflow_store):
    import jax.numpy as jnp

    from vmapcheck.core.forms import cast_tree

    store, _ = registered(
        tmp_path_factory,
        empty_mlflow_store,
        "precision=bf16",
        "registry.target.precision=bf16",  # its deployment target: @verified moves to it
        *SMALL_GUARD,
    )
    model = load(store, f"models:/{NAME}@verified")
    signature = model.metadata.signature
    float32 = np.dtype(np.float32)
    assert [spec.type for spec in signature.inputs.inputs + signature.outputs.inputs] == [
        float32,
        float32,
    ]
    x = rows(4)
    out = model.predict(x)
    assert out.dtype == float32
    # Cast to bfloat16 on arrival: the model's forward in bfloat16, within its tolerance.
    params = cast_tree(store.params(1), jnp.bfloat16)
    expected = np.asarray(store.model.forward_batch(params, x.astype(jnp.bfloat16)), np.float32)
    agreement = compare(out, expected, store.config.precision.tolerance)
    assert agreement["passed"], agreement["reason"]


def test_the_packaged_code_loads_where_no_vmapcheck_is_installed(mlp, tmp_path):
    import mlflow.artifacts

    store, result = mlp
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=result["source"], dst_path=str(tmp_path / "model")
    )
    script = tmp_path / "load.py"
    script.write_text(
        "import importlib.util, json, sys\n"
        "from pathlib import Path\n"
        "# Drop every sys.path entry holding vmapcheck (the editable install's src/).\n"
        "sys.path[:] = [p for p in sys.path if not (Path(p or '.') / 'vmapcheck').is_dir()]\n"
        "assert importlib.util.find_spec('vmapcheck') is None\n"
        "import numpy as np, mlflow.pyfunc\n"
        "model = mlflow.pyfunc.load_model(sys.argv[1])\n"
        "import vmapcheck\n"
        "print(json.dumps({'vmapcheck': vmapcheck.__file__,\n"
        "    'out': model.predict(np.load(sys.argv[2])).tolist()}))\n"
    )
    x = rows(3)
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    done = subprocess.run(
        [sys.executable, str(script), local, str(tmp_path / "x.npy")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(answer["vmapcheck"]).resolve().is_relative_to(Path(local).resolve() / "code")
    out = np.asarray(answer["out"], dtype=np.float32)
    assert compare(out, forward(store, 1, x), store.config.precision.tolerance)["passed"]


# --- end to end: `mlflow models serve` on loopback --------------------------------------


class ModelServer:
    """``mlflow models serve -m <uri> --env-manager local`` on 127.0.0.1, in its own
    process group, started from ``workdir`` (no project there) with only
    MLFLOW_TRACKING_URI naming the store."""

    def __init__(self, workdir: Path, tracking_uri: str, model_uri: str) -> None:
        self.workdir, self.tracking_uri, self.model_uri = workdir, tracking_uri, model_uri
        self.port, self.url = 0, ""
        self.log = workdir / "serve.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = HANG_S) -> None:
        # A new port each start: a uvicorn worker of the stopped server that outlived its
        # group leader for a moment once answered the restarted server's request with the
        # version served before the rollback.
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            str(Path(sys.executable).parent / "mlflow"),
            "models",
            "serve",
            "-m",
            self.model_uri,
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.pop("PYTHONPATH", None)
        env["MLFLOW_TRACKING_URI"] = self.tracking_uri
        # As in an activated .venv: the server starts `uvicorn` from PATH.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        # Its own group: stop() ends the uvicorn worker too.
        self.proc = start_in_group(command, self.workdir, env, self.log)
        wait_until_ok(self.proc, f"{self.url}/ping", wait_s, self.log)

    def invoke(self, body: str) -> tuple[int, dict]:
        """POST ``body`` (JSON) to /invocations: (HTTP status, the JSON answer)."""
        request = urllib.request.Request(
            f"{self.url}/invocations",
            data=body.encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=HANG_S) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # a worker left in the group
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None


@pytest.mark.e2e
def test_mlflow_models_serve_answers_refuses_and_follows_a_rollback(
    tmp_path, empty_mlflow_store, root, monkeypatch, capsys
):
    empty_mlflow_store(tmp_path / "mlflow.db")
    store = Store(tmp_path)  # the default config: conf/guard/default.yaml's buckets and limits
    store.run_and_register(seed=1)
    store.run_and_register(seed=2)
    assert store.verified() == "2"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server = ModelServer(elsewhere, store.uri, f"models:/{NAME}@verified")
    tolerance = store.config.precision.tolerance
    x = rows(5)
    valid = json.dumps({"inputs": x.tolist()})
    try:
        server.start()
        status, answer = server.invoke(valid)
        assert status == 200
        served = np.asarray(answer["predictions"], dtype=np.float32)
        assert compare(served, forward(store, 2, x), tolerance)["passed"]

        status, answer = server.invoke(json.dumps({"inputs": rows(2, width=7).tolist()}))
        assert status == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "row 0 has 7 values, expected 8" in answer["message"]
        # Named columns in another order: by name, the same prediction.
        names = store.features[::-1]
        split = {"columns": names, "data": x[:, ::-1].tolist()}
        status, answer = server.invoke(json.dumps({"dataframe_split": split}))
        assert status == 200
        np.testing.assert_array_equal(np.asarray(answer["predictions"], np.float32), served)

        with_nan = x.tolist()
        with_nan[3][2] = float("nan")  # json.dumps writes NaN, which MLflow's reader takes
        status, answer = server.invoke(json.dumps({"inputs": with_nan}))
        assert (status, answer) == (
            400,
            {
                "error_code": "INVALID_PARAMETER_VALUE",
                "message": "request refused: expected finite values, got NaN in 1 element(s) "
                "(first at index (3, 2))",
                "reason": "non_finite_input",
            },
        )
        oversized = json.dumps({"inputs": rows(store.config.guard.max_batch + 1).tolist()})
        status, answer = server.invoke(oversized)
        assert status == 400 and answer["reason"] == "batch_too_large"
        server.stop()

        # `make rollback`, then a restart: the server serves version 1.
        (tmp_path / "params.yaml").write_text((root / "params.yaml").read_text())
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
        assert cli.main(["rollback", "--model", NAME]) == 0
        assert "moved from version 2" in capsys.readouterr().out
        assert store.verified() == "1"
        server.start()
        status, answer = server.invoke(valid)
        assert status == 200
        served = np.asarray(answer["predictions"], dtype=np.float32)
        assert compare(served, forward(store, 1, x), tolerance)["passed"]
        assert not compare(served, forward(store, 2, x), tolerance)["passed"]
    finally:
        server.stop()
    assert registry_commands.list_versions(store.uri, NAME)[1].tags["rolled_back_to"] == "1"
