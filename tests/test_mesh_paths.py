"""The mesh paths with partitioned params (vmapcheck.core.mesh): tensor_parallel_jit (params
split over the mesh axis "model") and data_model_jit (a 2-D data x model mesh).

This process has the two emulated CPU devices tests/conftest.py sets: the tensor-parallel
path splits over "model" = 2 here, which is enough for the planted sharding mistakes of
tests/helpers/mesh_faults.py to show. The shipped transformer and ResNet on 8 devices (a
2 x 4 data x model mesh, and "model" = 8) run in one subprocess started with 8 emulated
devices (the device count is fixed when JAX starts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers.config import compose_config
from tests.helpers.mesh_faults import FAULTS, make_model
from tests.helpers.subprocess_json import json_of_python
from vmapcheck.check.diagnosis.runs import sharding_stage
from vmapcheck.check.diagnosis.subject import StoredRun, Subject
from vmapcheck.config import ModelConfig
from vmapcheck.core.mesh import (
    MODEL_AXIS,
    default_partitioning,
    grid_shape,
    partition_specs,
    run_mesh,
    view,
)
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import PATHS, build_paths, describe_meshes, mesh_label
from vmapcheck.errors import ConfigError
from vmapcheck.testing import check_batching

MESH_PATHS = [p.name for p in PATHS.values() if p.distributed]
PARTITIONED = [p.name for p in PATHS.values() if MODEL_AXIS in p.mesh_axes]


def _mlp():
    return build_model(ModelConfig(name="mlp", in_features=3, hidden=[4], out_features=2))


# --- the mesh's shape: config, default, refusals -------------------------------------


@pytest.mark.parametrize(("devices", "shape"), [(8, (2, 4)), (2, (2, 1)), (1, (1, 1)), (9, (3, 3))])
def test_the_default_grid_puts_the_smallest_prime_factor_on_data(devices, shape):
    assert grid_shape(devices, None) == shape


def test_a_model_axis_that_does_not_divide_the_devices_is_refused_naming_key_and_values():
    assert grid_shape(8, 2) == (4, 2)
    with pytest.raises(ConfigError) as error:
        grid_shape(8, 3)
    message = str(error.value)
    assert message.startswith("backend.model_axis=3: expected a divisor of the mesh's 8")
    assert "(1, 2, 4, 8)" in message and "found 3" in message


def test_the_config_refuses_it_before_any_stage_runs():
    config = compose_config("backend.num_devices=2", "+backend.model_axis=2")
    assert config.backend.model_axis == 2
    with pytest.raises(ConfigError, match=r"backend\.model_axis=3: expected a divisor of "):
        compose_config("backend.num_devices=2", "+backend.model_axis=3")
    with pytest.raises(ConfigError, match=r"backend\.model_axis"):
        compose_config("+backend.model_axis=0")


def test_every_mesh_path_views_the_runs_devices_in_its_own_shape():
    mesh = run_mesh(2, 2)
    assert dict(mesh.shape) == {"data": 1, "model": 2}
    for name in MESH_PATHS:
        axes = PATHS[name].mesh_axes
        seen = view(mesh, axes)
        assert tuple(seen.axis_names) == axes and seen.size == 2


# --- the partitioning: declared, default, validated ----------------------------------


def test_the_default_rule_splits_a_weights_output_axis_where_the_axis_size_divides_it():
    model = build_model(compose_config("model=flax_transformer").model)
    params = jax.eval_shape(model.init, jax.random.key(0))
    specs = default_partitioning(params, 8)
    assert specs["attn"]["query"]["kernel"] == P(None, MODEL_AXIS)  # (32, 32)
    assert specs["ff"]["hidden"]["kernel"] == P(None, MODEL_AXIS)  # (32, 64)
    assert specs["embed"]["tokens"]["embedding"] == P(None, MODEL_AXIS)  # (17, 32)
    assert specs["head"]["kernel"] == P()  # (32, 10): 10 is no multiple of 8
    assert specs["attn"]["query"]["bias"] == P()  # rank 1: replicated


def test_a_declared_partitioning_is_used_and_checked_leaf_by_leaf():
    model = make_model("none")
    params = model.init(jax.random.key(0))
    assert partition_specs(model, params, 2)["W2"] == P(MODEL_AXIS, None)
    cases = {
        "a tree that is not the params'": (lambda p: {"W1": P()}, "shaped like the params"),
        "a leaf that is no spec": (lambda p: {**model.partitioning(p), "b2": "model"}, "b2"),
        "the batch axis": (lambda p: {**model.partitioning(p), "b2": P("data")}, "b2"),
        "too many entries": (lambda p: {**model.partitioning(p), "b1": P(None, None)}, "b1"),
    }
    for what, (partitioning, named) in cases.items():
        wrong = type(model)(**{**model.__dict__, "partitioning": partitioning})
        with pytest.raises(ConfigError, match=named):
            partition_specs(wrong, params, 2)
        assert what
    with pytest.raises(ConfigError, match=r"leaf W1: .* axis 1 of size 8 over 3 devices"):
        partition_specs(model, params, 3)


# --- on this process's two devices, and on a mesh of one ------------------------------


def test_the_mesh_paths_agree_with_the_loop_and_say_what_they_split():
    model = _mlp()
    params = model.init(jax.random.key(0))
    paths = build_paths(model, jnp.float32, mesh=run_mesh(2, 2))
    x = jax.random.normal(jax.random.key(1), (5, 3), jnp.float32)
    loop = np.asarray(paths["loop_eager"](params, x))
    for name in PARTITIONED:
        np.testing.assert_allclose(np.asarray(paths[name](params, x)), loop, rtol=1e-5, atol=1e-6)
    about = describe_meshes(model, run_mesh(2, 2))
    assert about["tensor_parallel_jit"]["mesh_shape"] == {"model": 2}
    assert about["data_model_jit"]["mesh_shape"] == {"data": 1, "model": 2}
    labels = {name: mesh_label(entry) for name, entry in about.items()}
    assert labels["sharded_jit"] == "sharded_jit (data-parallel over mesh data=2, not vmap)"
    assert labels["tensor_parallel_jit"] == (
        "tensor_parallel_jit (tensor-parallel over mesh model=2, not vmap)"
    )
    assert labels["data_model_jit"] == (
        "data_model_jit (data- and tensor-parallel over mesh data=1 x model=2, not vmap)"
    )


def test_on_one_device_the_mesh_paths_run_on_a_mesh_of_one_and_say_so():
    # A single TPU chip, or a plain CPU: no pretend split.
    model = _mlp()
    mesh = run_mesh(1, None)
    params = model.init(jax.random.key(0))
    x = jnp.ones((3, 3), jnp.float32)
    paths = build_paths(model, jnp.float32, mesh=mesh)
    for name, about in describe_meshes(model, mesh).items():
        assert about["devices"] == 1
        assert "a mesh of 1: nothing split" in mesh_label(about)
        np.testing.assert_allclose(paths[name](params, x), paths["vmap_jit"](params, x))
        if name in PARTITIONED:
            assert about["note"].startswith("a mesh of 1 device on axis 'model': no param")


# --- the planted sharding mistakes ----------------------------------------------------

KEPT = ("loop_eager", "vmap_jit", *MESH_PATHS)


@pytest.fixture(scope="module")
def planted() -> dict:
    rows = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    reports = {}
    for fault in FAULTS:
        model = make_model(fault)
        params = model.init(jax.random.key(0))
        reports[fault] = check_batching(
            model, params, rows, paths=KEPT, gradients=False, bitwise="off"
        )
    return reports


def test_the_healthy_hand_written_tensor_parallel_model_passes(planted):
    assert planted["none"].passed, planted["none"].summary


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "none"])
def test_each_planted_sharding_mistake_fails_naming_the_path_and_the_mesh_axis(planted, fault):
    report = planted[fault]
    assert not report.passed
    assert any("-vs-tensor_parallel_jit" in f for f in report.failures)
    # Invisible on one device and on a model axis of 1: the data-parallel path and the
    # 2-D mesh of this process (data=2 x model=1) agree with the loop.
    assert all("tensor_parallel_jit" in f for f in report.failures), report.failures
    assert (
        "tensor_parallel_jit (tensor-parallel over mesh model=2, not vmap) diverges on mesh "
        "axis 'model' (2 devices)"
    ) in report.summary
    # Which path is data-parallel and which is vmap: said in the verdict line.
    assert "sharded_jit (data-parallel over mesh data=2, not vmap)" in report.summary
    assert report.oracle["tensor_parallel_jit"] > 0.1  # against float64, not just the loop


def test_the_diagnosis_names_the_mesh_axis_of_the_first_mesh_path_to_diverge():
    model = _mlp()
    config = compose_config()
    mesh = run_mesh(2, 2)
    meshes = describe_meshes(model, mesh)
    good = np.ones((4, 2), np.float32)
    outputs = {f"standard.{name}": good for name in ("vmap_jit", *MESH_PATHS)}
    outputs["standard.data_model_jit"] = good * np.float32(1.01)
    outputs["standard.tensor_parallel_jit"] = good * np.float32(1.01)
    subject = Subject(
        model=model,
        params=model.init(jax.random.key(0)),
        dtype=jnp.float32,
        tolerance=config.precision.tolerance,
        cross_run_tolerance=config.precision.cross_run_tolerance,
        probes=(),
    )
    record = {"sharded": meshes["sharded_jit"], "meshes": meshes}
    result = sharding_stage(subject, StoredRun(outputs, record, {}))  # type: ignore[arg-type]
    finding = result["finding"]
    assert finding is not None and finding["paths"] == ["tensor_parallel_jit"]
    assert finding["message"].startswith(
        "case standard: tensor_parallel_jit (tensor-parallel over mesh model=2, not vmap) "
        "differs from vmap_jit"
    )
    assert finding["message"].endswith("it diverges on mesh axis 'model' (2 devices)")


# --- the shipped transformer and ResNet on 8 emulated devices -------------------------

EIGHT_DEVICES = """
    import json
    import jax, numpy as np
    jax.config.update("jax_num_cpu_devices", 8)
    import yaml
    from omegaconf import OmegaConf
    from tests.helpers.config import ROOT
    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model
    from vmapcheck.testing import check_batching
    out = {"devices": len(jax.devices())}
    for name, rows in (("flax_transformer", 4), ("resnet", 4)):
        conf = yaml.safe_load((ROOT / f"src/vmapcheck/conf/model/{name}.yaml").read_text())
        conf = OmegaConf.to_container(OmegaConf.create({"model": conf}), resolve=True)
        model = build_model(ModelConfig.model_validate(conf["model"]))
        params = model.init(jax.random.key(0))
        x = {}
        for leaf in model.contract.leaves:
            rng = np.random.default_rng(1)
            if leaf.vocab is not None:
                x[leaf.name] = rng.integers(0, leaf.vocab, (rows, *leaf.shape)).astype(np.int32)
            elif leaf.dtype == "bool":
                x[leaf.name] = np.arange(leaf.shape[0])[None, :] < rng.integers(
                    8, leaf.shape[0], (rows, 1))
            else:
                x[leaf.name] = rng.normal(size=(rows, *leaf.shape)).astype(np.float32)
        report = check_batching(
            model, params, x,
            paths=("loop_eager", "vmap_jit", "tensor_parallel_jit", "data_model_jit"),
            gradients=False, bitwise="off",
        )
        out[name] = {
            "passed": report.passed,
            "summary": report.summary,
            "oracle": report.oracle,
            "meshes": {k: v["mesh_shape"] for k, v in report.details["meshes"].items()},
            "pairs": sorted(report.pairs),
        }
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def eight_devices() -> dict:
    return json_of_python(EIGHT_DEVICES, jax_platforms="cpu")


@pytest.mark.parametrize("name", ["flax_transformer", "resnet"])
def test_the_shipped_models_pass_on_a_2x4_mesh_and_a_tensor_parallel_mesh_of_8(eight_devices, name):
    assert eight_devices["devices"] == 8
    run = eight_devices[name]
    assert run["passed"], run["summary"]
    assert run["meshes"] == {
        "tensor_parallel_jit": {"model": 8},
        "data_model_jit": {"data": 2, "model": 4},
    }
    # Against the loop (a pair each) and the float64 oracle (a figure each).
    assert {"loop_eager-vs-tensor_parallel_jit", "loop_eager-vs-data_model_jit"} <= set(
        run["pairs"]
    )
    assert {"tensor_parallel_jit", "data_model_jit"} <= set(run["oracle"])


def test_a_flax_models_with_partitioning_annotations_give_the_tree_docs_mesh_md_says():
    nnx = pytest.importorskip("flax.nnx", reason="flax is not installed: pip install -e '.[flax]'")

    class Two(nnx.Module):
        def __init__(self, rngs):
            kernel = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, MODEL_AXIS))
            self.hidden = nnx.Linear(4, 8, kernel_init=kernel, rngs=rngs)
            self.out = nnx.Linear(8, 3, rngs=rngs)

    # The recipe of docs/mesh.md: built abstractly under a mesh with a "model" axis.
    auto = (jax.sharding.AxisType.Auto,)
    with jax.set_mesh(jax.make_mesh((1,), (MODEL_AXIS,), axis_types=auto)):
        abstract = nnx.eval_shape(lambda: Two(nnx.Rngs(0)))
        # Flax places an annotated variable as it is made: the params too need the mesh.
        params = nnx.to_pure_dict(nnx.state(Two(nnx.Rngs(0))))
    specs = nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(abstract)))
    model = type(_mlp())(
        name="flax_two",
        in_features=4,
        out_features=3,
        forward_one=lambda p, x: x,
        init=lambda key: params,
        partitioning=lambda p: specs,
    )
    checked = partition_specs(model, params, 2)
    assert checked["hidden"]["kernel"] == P(None, MODEL_AXIS)
    assert checked["out"]["kernel"] == P() and checked["hidden"]["bias"] == P()
