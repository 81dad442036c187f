"""The guard: bounded compiles, limits before any copy, refusals by reason, no raw values."""

from __future__ import annotations

import io
import json
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.bench.timing.progress import PlainLines, Progress
from vmapcheck.bench.timing.sampling import CompileCounter
from vmapcheck.config import GuardConfig, GuardReplayConfig, ModelConfig
from vmapcheck.core.models import Model, build_model
from vmapcheck.data.anonymize import find_canaries
from vmapcheck.errors import ArtifactError, ConfigError, InvalidInputError, NonFiniteOutputError
from vmapcheck.guard.predictor import INVALID_KINDS, REASONS, Guard
from vmapcheck.guard.replay import (
    REQUEST_CANARY,
    SERVED,
    replay,
    replay_summary,
    request_stream,
    run_replay,
)
from vmapcheck.io import atomic_write_json

FEATURES = 4
BUCKETS = [1, 8, 64, 256, 1024]
# The f32 within-run tolerance of conf/precision/f32.yaml.
RTOL, ATOL = 1e-5, 1e-6
CANARY = REQUEST_CANARY
# float32 stores 123456.7890625: every decimal form of the canary starts with this.
CANARY_TEXT = "123456.7"


def guard_config(**changes) -> GuardConfig:
    replay_changes = changes.pop("replay", {})
    replay_config = {
        "n_requests": 10_000,
        "invalid_share": 0.1,
        "seed": 0,
        "noise_std": 0.1,
        "unbucketed_requests": 0,
        "plant_canary": False,
    } | replay_changes
    return GuardConfig(
        **{
            "buckets": BUCKETS,
            "max_batch": 1024,
            "max_request_bytes": 1 << 20,
            "precompile": False,
            "latency_edges_ms": [0.1, 1.0, 10.0, 100.0],
            "latency_window": 1000,
            "replay": GuardReplayConfig(**replay_config),
        }
        | changes
    )


@pytest.fixture(scope="module")
def model() -> Model:
    return build_model(ModelConfig(name="mlp", in_features=FEATURES, hidden=[16], out_features=3))


@pytest.fixture(scope="module")
def params(model):
    return model.init(jax.random.key(0))


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(50, FEATURES)).astype(np.float32)


def test_a_long_random_stream_compiles_at_most_once_per_bucket(model, params, rows):
    config = guard_config()
    guard = Guard(model, params, jnp.float32, config)
    assert guard.compiles == 0  # precompile off: buckets compile on first use
    CompileCounter.start()
    before = CompileCounter.count
    report = replay(guard, request_stream(rows, jnp.float32, config))
    process_compiles = CompileCounter.count - before

    assert report["requests"] == 10_000
    assert report["mismatched"] == {}
    # Every batch size 1..1024 arrived, every bucket was used, and each compiled once.
    metrics = report["metrics"]
    assert set(metrics["requests_per_bucket"]) == {str(b) for b in BUCKETS}
    assert guard.compiles == len(BUCKETS) == report["compiles_during_replay"]
    # The real jax.monitoring count over the whole replay, not only the guard's own tally.
    assert process_compiles <= len(BUCKETS)
    assert metrics["compiles_within_bound"] is True
    # Every invalid kind was planted and refused for its own reason.
    for reason in REASONS:
        assert report["outcomes"][reason] == metrics["refused"][reason] > 0
        assert metrics["invalid_share"][reason] == metrics["refused"][reason] / 10_000
    assert 0.08 < metrics["invalid_share_total"] < 0.12
    assert report["outcomes"][SERVED] == metrics["served"]
    assert metrics["padding_overhead"] == metrics["rows_padding"] / metrics["rows_real"] > 0
    assert sum(metrics["latency_ms"]["histogram"]["counts"]) == metrics["served"]
    assert report["latency_ms"]["n"] == metrics["served"]
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]


def test_precompile_compiles_every_bucket_once_and_nothing_after(model, params, rows):
    guard = Guard(model, params, jnp.float32, guard_config(precompile=True))
    assert guard.compiles == len(BUCKETS)
    for n in (1, 2, 7, 8, 9, 63, 65, 300, 1024):
        guard.predict(np.resize(rows, (n, FEATURES)))
    assert guard.compiles == len(BUCKETS)
    assert guard.metrics()["requests_per_bucket"] == {
        "1": 1,
        "8": 3,
        "64": 2,
        "256": 1,
        "1024": 2,
    }


def test_a_request_over_the_limits_is_refused_before_any_copy_or_transfer(model, params):
    config = guard_config(precompile=True)
    guard = Guard(model, params, jnp.float32, config)
    # Read-only broadcast views: 16 GiB and 4 KiB x 1025 rows if anything materialised them.
    huge = np.broadcast_to(np.float32(1.0), (1 << 30, FEATURES))
    too_many_rows = np.broadcast_to(np.float32(1.0), (1025, FEATURES))
    compiles = guard.compiles
    tracemalloc.start()
    try:
        # Any host-to-device transfer, explicit or implicit, raises in here.
        with jax.transfer_guard("disallow_explicit"):
            with pytest.raises(InvalidInputError, match=r"guard\.max_request_bytes") as big:
                guard.predict(huge)
            with pytest.raises(InvalidInputError, match=r"at most guard\.max_batch=1024") as rows:
                guard.predict(too_many_rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert big.value.reason == "too_many_bytes" and rows.value.reason == "batch_too_large"
    assert "17179869184 bytes" in str(big.value)
    assert peak < 1 << 20  # nothing near the request's size was allocated
    assert guard.compiles == compiles
    metrics = guard.metrics()
    assert metrics["refused"]["too_many_bytes"] == metrics["refused"]["batch_too_large"] == 1
    assert metrics["rows_real"] == metrics["rows_padding"] == 0
    # The transfer guard does catch a served request (so the check above means something).
    with (
        jax.transfer_guard("disallow_explicit"),
        pytest.raises(Exception, match="Disallowed host-to-device transfer"),
    ):
        guard.predict(np.ones((3, FEATURES), dtype=np.float32))


def _invalid(kind: str, x: np.ndarray):
    return {
        "type": x.tolist(),
        "too_many_bytes": np.broadcast_to(x[:1], (1 << 20, FEATURES)),
        "rank": x[None],
        "features": np.concatenate([x, x[:, :1]], axis=1),
        "empty": x[:0],
        "batch_too_large": np.resize(x, (1025, FEATURES)),
        "dtype": x.astype(np.float64),
        "non_finite_input": np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x),
    }[kind]


@pytest.mark.parametrize("kind", INVALID_KINDS)
def test_each_invalid_kind_is_refused_with_its_reason_counted(model, params, rows, kind):
    guard = Guard(model, params, jnp.float32, guard_config())
    guard.predict(rows[:3])
    with pytest.raises(InvalidInputError) as info:
        guard.predict(_invalid(kind, rows[:10].copy()))
    assert info.value.reason == kind
    metrics = guard.metrics()
    assert metrics["requests"] == 2 and metrics["served"] == 1
    assert metrics["refused"] == {r: int(r == kind) for r in REASONS}
    assert metrics["invalid_share"][kind] == 0.5


def test_the_guard_uses_the_shared_validation_messages(model, params, rows):
    guard = Guard(model, params, jnp.float32, guard_config())
    with pytest.raises(InvalidInputError, match="expected 4 features, got 5"):
        guard.predict(_invalid("features", rows[:4]))
    with pytest.raises(InvalidInputError, match="expected dtype float32, got float64"):
        guard.predict(rows[:4].astype(np.float64))
    with pytest.raises(InvalidInputError, match=r"got NaN in 1 element\(s\) \(first at index"):
        guard.predict(_invalid("non_finite_input", rows[:4].copy()))


def test_a_non_finite_output_is_refused_not_returned(model, params, rows):
    layers = [dict(layer) for layer in params["layers"]]
    layers[0]["W"] = layers[0]["W"] * 1e38  # finite params whose products overflow float32
    guard = Guard(model, {"layers": layers}, jnp.float32, guard_config())
    with pytest.raises(NonFiniteOutputError, match=r"NaN or Inf for \d+ of 5 row\(s\)") as info:
        guard.predict(rows[:5])
    assert "no output returned" in str(info.value)
    metrics = guard.metrics()
    assert metrics["numeric_errors"] == 1 and metrics["served"] == 0
    assert sum(metrics["latency_ms"]["histogram"]["counts"]) == 0


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_params_holding_nan_or_inf_are_refused_when_the_guard_is_built(model, params, value):
    layers = [dict(layer) for layer in params["layers"]]
    layers[-1]["b"] = layers[-1]["b"].at[1].set(value)
    with pytest.raises(ArtifactError, match=r"Guard params: leaf layers\[1\]\.b: expected finite"):
        Guard(model, {"layers": layers}, jnp.float32, guard_config())


def test_non_finite_outputs_of_padding_rows_are_dropped_not_refused():
    # log(0) = -inf: the zero padding rows' outputs are non-finite, real rows' are not.
    log_model = Model(
        name="log",
        in_features=2,
        out_features=2,
        forward_one=lambda p, x: jnp.log(x) * p["scale"],
        init=lambda key: {"scale": jnp.ones((), dtype=jnp.float32)},
    )
    guard = Guard(log_model, log_model.init(None), jnp.float32, guard_config())
    x = np.full((5, 2), np.e, dtype=np.float32)
    np.testing.assert_allclose(guard.predict(x), np.ones((5, 2)), rtol=RTOL)
    assert guard.metrics()["rows_padding"] == 3 and guard.metrics()["numeric_errors"] == 0


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 100, 256, 1000])
def test_padding_does_not_change_results(model, params, rows, n):
    guard = Guard(model, params, jnp.float32, guard_config())
    x = np.resize(rows, (n, FEATURES)) * np.linspace(0.5, 2.0, n, dtype=np.float32)[:, None]
    out = guard.predict(x)
    assert out.shape == (n, 3) and out.dtype == np.float32
    unpadded = jax.vmap(model.forward_one, in_axes=(None, 0))(params, jnp.asarray(x))
    np.testing.assert_allclose(out, np.asarray(unpadded), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        out, np.asarray(model.forward_batch(params, jnp.asarray(x))), rtol=RTOL, atol=ATOL
    )


def test_the_stream_is_reproducible_and_plants_the_canary(rows):
    config = guard_config(replay={"n_requests": 200, "plant_canary": True})

    def shapes():
        return [
            (req.expected, np.shape(req.x)) for req in request_stream(rows, jnp.float32, config)
        ]

    assert shapes() == shapes()
    planted = [
        req
        for req in request_stream(rows, jnp.float32, config)
        if req.expected in (SERVED, "dtype", "non_finite_input", "features")
    ]
    assert planted and all(np.isclose(np.asarray(r.x), CANARY).any() for r in planted)


def test_no_request_value_reaches_metrics_report_or_errors(model, params, rows, tmp_path):
    config = guard_config(
        max_batch=256,
        buckets=[1, 8, 64, 256],
        precompile=True,
        replay={"n_requests": 400, "invalid_share": 0.3, "unbucketed_requests": 20}
        | {"plant_canary": True},
    )
    log = io.StringIO()
    progress = Progress(PlainLines("bench", log))
    report = run_replay(model, params, rows, jnp.float32, config, progress=progress)
    assert report["mismatched"] == {} and report["compiles_within_bound"] is True
    # Its progress: both replays, every request counted; no request value in it either.
    assert "bench: guard replay (4 buckets): done, 400 requests in" in log.getvalue()
    assert "bench: guard replay without buckets: done, 20 requests in" in log.getvalue()
    assert CANARY_TEXT not in log.getvalue()
    assert report["unbucketed"]["requests"] == 20
    assert report["unbucketed"]["compiles"] == report["unbucketed"]["distinct_batch_sizes"] > 4
    assert set(report["latency_ms"]) == {
        "bucketed",
        "bucketed_prefix",
        "unbucketed_prefix",
        "unbucketed_prefix_no_compile",
    }
    text = json.dumps(report)
    assert CANARY_TEXT not in text
    atomic_write_json(tmp_path / "report.json", report)
    # The same scan as the privacy end-to-end test, on the written report...
    assert find_canaries([tmp_path], [CANARY_TEXT, "123456,7"]) == []
    # ...which does find the canary where it is (the scan works on this kind of file).
    atomic_write_json(tmp_path / "control.json", {"x": float(np.float32(CANARY))})
    assert find_canaries([tmp_path], [CANARY_TEXT]) == [(tmp_path / "control.json", CANARY_TEXT)]
    # Error messages name shapes, counts and indices, never a value.
    guard = Guard(model, params, jnp.float32, config)
    for request in request_stream(rows, jnp.float32, config):
        try:
            guard.predict(request.x)
        except (InvalidInputError, NonFiniteOutputError) as exc:
            assert CANARY_TEXT not in str(exc)
    assert CANARY_TEXT not in json.dumps(guard.metrics())


def test_a_byte_limit_below_one_full_batch_is_a_config_error(model, params):
    config = guard_config(max_request_bytes=16384)
    Guard(model, params, jnp.float32, config)  # 1024 rows x 4 features x 4 bytes: it fits
    with (
        jax.enable_x64(True),  # float64 without x64 is refused on its own
        pytest.raises(ConfigError, match=r"guard\.max_request_bytes=16384 is below .* 32768"),
    ):
        Guard(model, params, np.float64, config)  # x 8 bytes does not


def test_under_a_tight_byte_limit_the_size_is_refused_first(model, params, rows):
    # One full float32 batch exactly: every wider, longer or float64 request is too big.
    config = guard_config(
        buckets=[8, 64],
        max_batch=64,
        max_request_bytes=64 * FEATURES * 4,
        replay={"n_requests": 400, "invalid_share": 0.5, "seed": 3},
    )
    guard = Guard(model, params, jnp.float32, config)
    report = replay(guard, request_stream(rows, jnp.float32, config))
    assert report["mismatched"] == {}
    assert report["outcomes"]["too_many_bytes"] > report["outcomes"]["rank"] > 0
    assert guard.compiles <= 2


@pytest.mark.parametrize(
    "dtype,expected",
    [
        (jnp.int32, "expected one of float32, float64, bfloat16 (the run's precision), got int32"),
        (jnp.bool_, "got bool"),
        (np.float16, "got float16"),
        (np.float64, "float64 needs jax_enable_x64"),
    ],
)
def test_a_dtype_no_run_can_have_is_refused_when_the_guard_is_built(model, params, dtype, expected):
    # int32 used to be served (every output zero); float64 without x64 built with a warning.
    assert not jax.config.read("jax_enable_x64")
    with pytest.raises(
        ConfigError, match=r"^Guard dtype \(the dtype every request must have\)"
    ) as e:
        Guard(model, params, dtype, guard_config())
    assert expected in str(e.value)


def test_float64_is_served_when_x64_is_on(model, params, rows):
    with jax.enable_x64(True):
        guard = Guard(model, params, np.float64, guard_config())
        assert guard.predict(rows[:3].astype(np.float64)).dtype == np.float64


def test_params_that_are_not_the_models_are_refused_naming_the_leaf(model, params):
    wrong = jax.tree.map(lambda leaf: leaf, params)
    wrong["layers"][0]["W"] = jnp.zeros((FEATURES + 1, 16), jnp.float32)
    with pytest.raises(ArtifactError) as info:
        Guard(model, wrong, jnp.float32, guard_config())
    assert str(info.value) == (
        "Guard params: params do not match the model's contract: leaf layers[0].W: expected "
        "shape [4, 16] dtype float, found shape [5, 16] dtype float"
    )
    with pytest.raises(ArtifactError, match=r"missing leaf layers\[1\]\.b"):
        Guard(
            model,
            {"layers": [params["layers"][0], {"W": params["layers"][1]["W"]}]},
            jnp.float32,
            guard_config(),
        )


@pytest.mark.parametrize(
    "request_of",
    [
        lambda rows: np.ma.masked_all(rows.shape, np.float32),  # every value masked
        lambda rows: np.ma.masked_array(rows, mask=np.zeros(rows.shape, bool)),
        lambda rows: rows.astype(object),
    ],
    ids=["fully_masked", "masked_none", "object"],
)
def test_masked_and_object_arrays_are_refused_for_their_type(model, params, rows, request_of):
    guard = Guard(model, params, jnp.float32, guard_config())
    with pytest.raises(InvalidInputError, match="expected a plain numeric array, got ") as info:
        guard.predict(request_of(rows[:4]))
    assert info.value.reason == "type"
    assert guard.metrics()["refused"]["type"] == 1 and guard.metrics()["served"] == 0


def test_the_replay_stops_at_its_time_budget_and_says_how_many_it_sent(model, params, rows):
    """A budget shorter than the stream: the replay sends a prefix (one request at least),
    the un-bucketed comparison replays a prefix of that, and the report and its line say
    how many of the planned requests were sent and why."""
    config = guard_config(
        buckets=[1, 8, 64, 256],
        max_batch=256,
        replay={"n_requests": 100_000, "time_budget_s": 0.5, "unbucketed_requests": 5000},
    )
    log = io.StringIO()
    report = run_replay(
        model, params, rows, jnp.float32, config, progress=Progress(PlainLines("bench", log))
    )
    assert report["stopped_by_budget"] is True
    assert 1 <= report["requests"] < report["requests_planned"] == 100_000
    assert report["unbucketed"]["requests"] <= report["requests"]
    assert report["mismatched"] == {} and report["compiles_within_bound"] is True
    assert set(report["wall_s"]) == {"bucketed", "unbucketed"}
    # Its wall time: the budget, plus at most the one request under way when it ran out.
    assert report["wall_s"]["bucketed"] < 0.5 + 10
    assert "of 100000: its 0.5 s budget ran out" in replay_summary(report)
    assert any("time budget of 0.5 s (bench.replay_time_budget_s)" in n for n in report["notes"])
    # The progress line counts what was sent, not the planned total.
    assert f"done, {report['requests']:,} requests in" in log.getvalue()


def test_without_a_budget_every_request_is_sent(model, params, rows):
    config = guard_config(replay={"n_requests": 50, "time_budget_s": None})
    report = run_replay(model, params, rows, jnp.float32, config)
    assert report["stopped_by_budget"] is False and report["requests"] == 50
