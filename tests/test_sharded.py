"""The data-parallel path sharded_jit: batch axis 0 split over a mesh of devices.

JAX creates its CPU devices once per process, so the multi-device tests run in a
subprocess started with emulated CPU devices (backend.num_devices through
configure_jax, as the forward and bench stages do). This process has the two emulated
CPU devices tests/conftest.py sets.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.subprocess_json import json_of_python
from vmapcheck.config import ModelConfig
from vmapcheck.core.forms import ShardedForward, data_mesh
from vmapcheck.core.models import build_model
from vmapcheck.errors import BackendUnavailableError, ConfigError


def _run(code: str) -> dict:
    return json_of_python(code, jax_platforms="")


# Four emulated CPU devices; batch sizes divisible by 4 and not (1, 5, 7).
SHARDED_ON_FOUR_DEVICES = """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from tests.helpers.config import compose_config
    from vmapcheck.core.runtime import configure_jax
    config = compose_config("backend=cpu", "backend.num_devices=4")
    info = configure_jax(config.backend, config.precision)
    from vmapcheck.errors import BackendUnavailableError, InvalidInputError
    from vmapcheck.core.models import build_model
    from vmapcheck.core.forms import ShardedForward, data_mesh
    from vmapcheck.core.paths import build_paths
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    mesh = data_mesh(config.backend.num_devices)
    paths = build_paths(model, jnp.float32, mesh=mesh)
    sharded = ShardedForward(model, mesh, "sharded_jit")
    out = {"device_count": info.device_count, "mesh": dict(mesh.shape)}
    out["describe"] = sharded.describe()
    out["diff"], out["shards"], out["path_devices"] = {}, {}, {}
    for rows in (8, 7, 5, 1):
        x = jax.random.normal(jax.random.key(rows), (rows, model.in_features), jnp.float32)
        got = {n: np.asarray(p(params, x)) for n, p in paths.items()}
        out["diff"][rows] = {
            n: float(np.max(np.abs(got["sharded_jit"] - got[n]) / (1e-6 + np.abs(got[n]))))
            for n in ("loop_eager", "vmap_jit", "direct_jit")
        } | {"shape": list(got["sharded_jit"].shape)}
        placed = sharded.place_batch(x)
        y = sharded.jitted(sharded.place_params(params), placed)
        out["shards"][rows] = {
            "input_rows": placed.shape[0],
            "spec": list(y.sharding.spec),
            "shard_shapes": [list(s.data.shape) for s in y.addressable_shards],
            "shard_devices": sorted(s.device.id for s in y.addressable_shards),
        }
        out["path_devices"][rows] = len(paths["sharded_jit"](params, x).sharding.device_set)
    refusals = {}
    for name, bad in (
        ("features", np.ones((8, model.in_features + 1), np.float32)),
        ("nan", np.full((8, model.in_features), np.nan, np.float32)),
        ("empty", np.ones((0, model.in_features), np.float32)),
    ):
        try:
            paths["sharded_jit"](params, bad)
            refusals[name] = "accepted"
        except InvalidInputError as exc:
            refusals[name] = str(exc)
    out["refusals"] = refusals
    errors = {}
    try:
        data_mesh(6)
    except BackendUnavailableError as exc:
        errors["data_mesh"] = str(exc)
    try:  # JAX has started: the emulated device count cannot change any more
        configure_jax(config.backend.model_copy(update={"num_devices": 6}), config.precision)
    except BackendUnavailableError as exc:
        errors["configure_jax"] = str(exc)
    out["errors"] = errors
    from vmapcheck.bench.timing.run import run_bench
    from vmapcheck.config import BenchConfig, EarlyStopConfig, RegressionConfig
    bench = BenchConfig(name="t", batch_sizes=[3, 8], warmup=1, repeats=5, loop_max_batch=1,
                        confidence_level=0.95, peak_matmul_size=64, replay_requests=10,
                        regression=RegressionConfig(factor=1.1, alpha=0.01, baseline=None),
                        early_stop=EarlyStopConfig(min_rounds=5, ci_target=0.01,
                                                   time_budget_s=None, paired_looks=1))
    rows = np.random.default_rng(0).normal(size=(4, model.in_features)).astype(np.float32)
    result = run_bench(model, params, rows, bench, jnp.float32, mesh=mesh)
    out["bench"] = {k: result["figures"]["sharded_jit"][k] for k in ("b3", "b8")}
    out["bench_vmap_flops"] = result["figures"]["vmap_jit"]["b8"]["flops"]
    out["bench_latency"] = sorted(result["latency_ms"]["sharded_jit"])
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def four_devices() -> dict:
    return _run(SHARDED_ON_FOUR_DEVICES)


def test_emulated_cpu_devices_form_the_mesh(four_devices):
    assert four_devices["device_count"] == 4
    assert four_devices["mesh"] == {"data": 4}
    described = four_devices["describe"]
    assert described["devices"] == 4 and described["mesh_shape"] == {"data": 4}
    assert described["device_ids"] == [0, 1, 2, 3]
    assert "not vmap" in described["form"] and "jax.vmap(forward_one" in described["form"]


@pytest.mark.parametrize("rows", ["8", "7", "5", "1"])
def test_sharded_output_equals_loop_vmap_and_direct(four_devices, rows):
    diff = four_devices["diff"][rows]
    assert diff.pop("shape")[0] == int(rows)
    assert all(rel < 1e-5 for rel in diff.values()), diff


@pytest.mark.parametrize("rows,padded", [("8", 8), ("7", 8), ("5", 8), ("1", 4)])
def test_the_batch_is_split_over_every_device_padded_to_a_multiple(four_devices, rows, padded):
    shards = four_devices["shards"][rows]
    assert shards["input_rows"] == padded
    assert shards["spec"] == ["data"]
    assert shards["shard_devices"] == [0, 1, 2, 3]
    assert shards["shard_shapes"] == [[padded // 4, 2]] * 4
    if rows == "8":  # no padding: the path's own output stays on all four devices
        assert four_devices["path_devices"]["8"] == 4


def test_the_sharded_path_refuses_invalid_input_like_every_path(four_devices):
    refusals = four_devices["refusals"]
    in_features = compose_config().model.in_features
    assert refusals["features"] == f"expected {in_features} features, got {in_features + 1}"
    assert refusals["nan"].startswith("expected finite values, got NaN")
    assert refusals["empty"] == "expected at least one row, got an empty batch"


def test_more_devices_than_present_is_an_error_naming_key_asked_and_present(four_devices):
    for where in ("data_mesh", "configure_jax"):
        message = four_devices["errors"][where]
        assert message.startswith("backend.num_devices=6 asks for 6 devices, but 4 are present")
        assert "cpu (cpu)" in message


def test_bench_times_the_sharded_path_with_its_mesh_and_padding(four_devices):
    b3, b8 = four_devices["bench"]["b3"], four_devices["bench"]["b8"]
    assert four_devices["bench_latency"] == ["b3", "b8"]
    assert b3["devices"] == 4.0 and b3["padded_rows"] == 4.0 and b8["padded_rows"] == 8.0
    assert b8["compile_ms"] > 0 and b8["gflops"] > 0
    # XLA analyses one device's program; the report counts the whole mesh's work.
    assert b8["flops"] == 4 * b8["flops_per_device"]
    assert b8["flops"] == pytest.approx(four_devices["bench_vmap_flops"], rel=0.05)


# --- in this process: the two emulated CPU devices of tests/conftest.py ----------------


def test_a_mesh_of_every_device_by_default_and_too_many_refused():
    present = len(jax.devices())
    assert data_mesh().size == present
    with pytest.raises(BackendUnavailableError, match=rf"num_devices={present + 1} asks for"):
        data_mesh(present + 1)


def test_in_this_process_a_batch_is_split_over_the_two_emulated_devices():
    assert len(jax.devices()) == 2 and dict(data_mesh().shape) == {"data": 2}
    model = build_model(ModelConfig(name="mlp", in_features=3, hidden=[4], out_features=2))
    params = model.init(jax.random.key(0))
    sharded = ShardedForward(model, data_mesh(), "sharded_jit")
    x = jax.random.normal(jax.random.key(1), (3, 3), jnp.float32)
    placed = sharded.place_batch(x)
    y = sharded.jitted(sharded.place_params(params), placed)
    assert placed.shape[0] == sharded.padded_rows(3) == 4  # 3 rows padded to 2 x 2
    assert sorted(s.device.id for s in y.addressable_shards) == [0, 1]
    assert [list(s.data.shape) for s in y.addressable_shards] == [[2, 2]] * 2
    expected = jax.vmap(model.forward_one, in_axes=(None, 0))(params, x)
    np.testing.assert_allclose(sharded(params, x), expected, rtol=1e-5, atol=1e-6)


def test_sharded_path_on_one_device_still_runs_and_pads_nothing():
    model = build_model(ModelConfig(name="mlp", in_features=3, hidden=[4], out_features=2))
    sharded = ShardedForward(model, data_mesh(1), "sharded_jit")
    out = sharded(model.init(jax.random.key(0)), jnp.ones((3, 3), jnp.float32))
    assert out.shape == (3, 2) and sharded.padded_rows(3) == 3


@pytest.mark.parametrize("override", ["0", "-1", "'2'"])  # '2': a string, not an int
def test_num_devices_must_be_a_positive_int_or_null(override):
    with pytest.raises(ConfigError, match=r"backend\.num_devices"):
        compose_config(f"backend.num_devices={override}")


def test_backends_default_to_a_meaningful_mesh():
    assert compose_config("backend=cpu").backend.num_devices == 2
    assert compose_config("backend=gpu").backend.num_devices is None
    assert compose_config("backend=tpu").backend.num_devices is None
