"""Bitwise batch invariance (vmapcheck.core.bitwise, docs/checks.md "Bitwise batch
invariance"): measured on small plain-JAX models written here, one whose every path
computes a row with the same bits whatever its batch, and planted ones whose
hand-batched form splits a reduction by the batch size (the same sum to the last bits,
or not), directly and through the Python API.

The API checks compile every jit path (~3 s each on 2 cores): each model is checked once
per mode in a module-scoped fixture.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.core import bitwise, bitwise_verdict
from vmapcheck.core.models import Model, no_tap, recorded
from vmapcheck.errors import ConfigError
from vmapcheck.testing import BatchingCheckError, assert_batching_consistent, check_batching

FEATURES, ROWS = 6, 8
# The planted model's batch: 66 % 3 == 0 splits its sum at 2, where one row splits at 3
# (and each half, 33 rows, at 2 again); enough rows that some sums part in the last bits.
SPLIT_ROWS = 66


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w": jax.random.normal(k1, (FEATURES,), jnp.float32),
        "b": jax.random.normal(k2, (FEATURES,), jnp.float32),
    }


def examples(rows: int = ROWS) -> jax.Array:
    return jax.random.normal(jax.random.key(7), (rows, FEATURES), jnp.float32)


# --- a model computed elementwise: the same bits for a row in any batch -----------------


def scale_one(params, x):
    """x (FEATURES,) -> (FEATURES,): max(x * w, b), one rounding per element, no sum."""
    return jnp.maximum(x * params["w"], params["b"])


def scale_batch(params, batch):
    return jnp.maximum(batch * params["w"][None, :], params["b"][None, :])


ELEMENTWISE = Model(
    name="elementwise",
    in_features=FEATURES,
    out_features=FEATURES,
    forward_one=scale_one,
    forward_batch=scale_batch,
    init=init,
)


# --- planted: the hand-batched form splits its sum where the batch size says ------------

# Two classes that tie exactly when computed one example at a time: x . w twice.
CLASSES = 2


def dot_one(params, x):
    """x (FEATURES,) -> (2,): [x . w, x . w], each one dot product."""
    s = x @ params["w"]
    return jnp.stack([s, s])


def split_at(rows: int) -> int:
    """Where the hand-batched form splits the sum: 2 for one row, more for a batch (a
    kernel that tiles its reduction by the batch size)."""
    return 2 + rows % 3


def dot_batch(params, batch):
    """(rows, FEATURES) -> (rows, 2): class 0 summed as two partial dots split at
    split_at(rows), class 1 as one dot: the same value to the last bits, in another
    order."""
    k = split_at(batch.shape[0])
    w = params["w"]
    first = batch[:, :k] @ w[:k]
    split = first + batch[:, k:] @ w[k:]
    return jnp.stack([split, batch @ w], axis=1)


SPLIT = Model(
    name="split_reduction",
    in_features=FEATURES,
    out_features=CLASSES,
    forward_one=dot_one,
    forward_batch=dot_batch,
    init=init,
)


# --- planted, with layers: the split sum after an elementwise layer, both tapped ---------


def tapped_one(params, x, tap=no_tap):
    """x (FEATURES,) -> (2,): the layer "scaled" = x * w, then its sum twice."""
    h = tap("scaled", x * params["w"])
    s = jnp.sum(h)
    return jnp.stack([s, s])


def tapped_batch(params, batch, tap=no_tap):
    """The batch form: "scaled", then its sum split at split_at(rows) (a dot with ones)."""
    h = tap("scaled", batch * params["w"][None, :])
    k = split_at(batch.shape[0])
    ones = jnp.ones((FEATURES,), h.dtype)
    s = h[:, :k] @ ones[:k] + h[:, k:] @ ones[k:]
    return jnp.stack([s, s], axis=1)


TAPPED = Model(
    name="tapped_split",
    in_features=FEATURES,
    out_features=CLASSES,
    forward_one=tapped_one,
    forward_batch=tapped_batch,
    init=init,
    activations_one=recorded(tapped_one, "output"),
    activations_batch=recorded(tapped_batch, "output"),
)


@pytest.fixture(scope="module")
def params():
    return init(jax.random.key(0))


@pytest.fixture(scope="module")
def elementwise_report(params):
    return check_batching(ELEMENTWISE, params, examples())


@pytest.fixture(scope="module")
def split_report(params):
    return check_batching(SPLIT, params, examples(SPLIT_ROWS))


def test_an_elementwise_model_is_bitwise_batch_invariant_on_every_batch_path(
    elementwise_report,
):
    report = elementwise_report
    assert report.passed
    assert report.bitwise, "reported by default"
    assert set(report.bitwise) == {
        name for name in report.paths if name not in ("one_eager", "one_jit")
    }
    for name, path in report.bitwise.items():
        assert path.bitwise, name
        assert (path.rows_differing, path.max_ulp, path.first_op) == (0, 0, ""), name
    section = report.details["bitwise"]
    assert section["mode"] == "report" and section["passed"]
    assert section["rows_alone"] == ROWS and section["case"] == "examples"
    # Every composition was compared: each row alone, the rows permuted, the batch split.
    comps = section["paths"]["direct_jit"]["compositions"]
    assert set(comps) == {"alone", "permuted", "split"}
    assert all(c["rows"] == ROWS and c["rows_differing"] == 0 for c in comps.values())
    assert "bitwise (" in report.summary and "argmax" in report.summary


def test_a_reduction_split_by_the_batch_size_is_found_and_named_with_its_op(split_report, params):
    report = split_report
    # Within tolerance (the same sum to the last bits): agreement passes ...
    assert report.passed, report.failures
    direct = report.bitwise["direct_jit"]
    # ... but the bits part, a few ULP, at the partial dot product of dot_batch.
    assert not direct.bitwise and direct.rows_differing > 0
    assert 0 < direct.max_ulp < 1000
    assert direct.first_op.startswith("dot_general"), direct.first_op
    assert "test_bitwise.py" in direct.first_op and "dot_batch" in direct.first_op
    first = report.details["bitwise"]["paths"]["direct_jit"]["first_op"]
    assert first is not None and first["found_at"] == "jaxpr"
    # The per-row forms never see a batch-mate: the loop is bitwise.
    assert report.bitwise["loop_eager"].bitwise
    line = bitwise_verdict.summary_line(report.details["bitwise"])
    assert "direct_jit no (rows " in line or "direct_eager, direct_jit no (rows " in line
    assert "first at dot_general (test_bitwise.py:" in line


def test_argmax_flips_between_paths_and_compositions_are_counted(split_report):
    section = split_report.details["bitwise"]
    assert section["class_outputs"]
    flips = section["argmax_flips"]
    # Class 0 and 1 tie exactly row by row (the loop picks class 0); the hand-batched
    # sum moves class 0 a few bits either way, so some rows now pick class 1.
    assert flips is not None and flips["rows"] == SPLIT_ROWS
    assert 0 < flips["flipped"] < SPLIT_ROWS
    direct = section["paths"]["direct_jit"]
    assert direct["vs_plain"] is not None and direct["vs_plain"]["argmax_flips"] > 0
    assert split_report.bitwise["direct_jit"].argmax_flips > 0
    assert f"argmax flips {flips['flipped']}/{SPLIT_ROWS}" in split_report.summary


def test_require_fails_a_path_that_is_not_bitwise_and_report_does_not(params):
    x = examples(SPLIT_ROWS)
    with pytest.raises(BatchingCheckError) as raised:
        assert_batching_consistent(
            SPLIT, params, x, bitwise="require", paths=["loop_eager", "direct_jit"]
        )
    failures = raised.value.report.failures
    assert len(failures) == 1 and failures[0].startswith("bitwise/examples/direct_jit:")
    assert "required (bitwise mode 'require')" in failures[0]
    assert "dot_general" in failures[0]
    # "report" (the default) and "off" never fail on bits.
    assert check_batching(SPLIT, params, x, paths=["loop_eager", "direct_jit"]).passed
    off = check_batching(SPLIT, params, x, bitwise="off", paths=["loop_eager", "direct_jit"])
    assert off.passed and off.bitwise == {} and "bitwise" not in off.details


def test_require_passes_a_bitwise_model(params):
    assert_batching_consistent(
        ELEMENTWISE, params, examples(), bitwise="require", paths=["loop_eager", "vmap_jit"]
    )


def test_an_unknown_mode_is_refused_naming_the_keyword(params):
    expected = r"bitwise: expected one of 'report', 'require', 'off', got 'strict'"
    with pytest.raises(ConfigError, match=expected):
        check_batching(ELEMENTWISE, params, examples(), bitwise="strict")


def test_the_first_op_names_its_layer_from_the_models_activations(params):
    report = check_batching(
        TAPPED, params, examples(SPLIT_ROWS), paths=["loop_eager", "direct_eager"]
    )
    direct = report.details["bitwise"]["paths"]["direct_eager"]
    assert not direct["bitwise"]
    first = direct["first_op"]
    assert first is not None and first["found_at"] == "jaxpr"
    # "scaled" is the same bits in any batch; the split sum after it is where they part.
    assert (first["primitive"], first["layer"]) == ("dot_general", "output")
    assert "layer_as_run" not in first  # eager: op by op is how the path runs
    assert report.bitwise["direct_eager"].first_op.startswith("dot_general in output (")


def test_bits_that_part_only_with_another_batch_size_are_said_so(params):
    # 64 rows and one row both split the sum at 3, the halves (32 rows) at 4: each row
    # alone is bitwise on the eager path (op by op, one kernel per shape), split is not.
    assert split_at(64) == split_at(1) != split_at(32)
    report = check_batching(SPLIT, params, examples(64), paths=["loop_eager", "direct_eager"])
    direct = report.details["bitwise"]["paths"]["direct_eager"]
    assert direct["compositions"]["alone"]["rows_differing"] == 0
    assert direct["compositions"]["split"]["rows_differing"] > 0 and not direct["bitwise"]
    first = direct["first_op"]
    assert first is not None and first["found_at"] == "none" and "split" in first["why"]
    assert "under split; first op not located" in bitwise_verdict.path_status(direct)


def test_a_path_that_cannot_run_one_row_is_said_not_measured_never_a_crash(params):
    def pairs_only(p, batch):
        if batch.shape[0] < 2:
            raise ValueError("forward_batch needs 2 rows or more")
        return scale_batch(p, batch)

    model = Model(
        name="pairs_only",
        in_features=FEATURES,
        out_features=FEATURES,
        forward_one=scale_one,
        forward_batch=pairs_only,
        init=init,
    )
    report = check_batching(model, params, examples(), paths=["loop_eager", "direct_eager"])
    direct = report.details["bitwise"]["paths"]["direct_eager"]
    assert not direct["bitwise"] and "ValueError: forward_batch needs 2" in direct["alone_error"]
    assert "direct_eager not measured (a row alone raised ValueError" in report.summary
    assert report.bitwise["loop_eager"].bitwise  # the other paths are still measured


# --- the module's parts, called directly -------------------------------------------------


def test_the_jaxpr_walk_names_the_first_equation_where_the_row_parts(params):
    x = examples(SPLIT_ROWS)
    out = np.asarray(dot_batch(params, x))
    alone = np.stack([np.asarray(dot_batch(params, x[i : i + 1]))[0] for i in range(SPLIT_ROWS)])
    row = int(np.flatnonzero(bitwise.differing_rows(out, alone))[0])
    found = bitwise.first_operation(dot_batch, params, x, row)
    assert found["found_at"] == "jaxpr" and found["primitive"] == "dot_general"
    assert found["row"] == row and "dot_batch" in (found["source"] or "")


def test_the_walk_says_so_when_the_programs_differ_in_structure(params):
    def unrolled(p, batch):  # one equation per row: the traces for 4 rows and 1 differ
        return jnp.stack([scale_one(p, batch[i]) for i in range(batch.shape[0])])

    found = bitwise.first_operation(unrolled, params, examples(4), 1)
    assert found["found_at"] == "none" and "differ in structure" in found["why"]


def test_bits_not_values_are_compared():
    a = np.array([[0.0, 1.0], [2.0, 3.0]], np.float32)
    b = a.copy()
    b[1, 0] = np.nextafter(np.float32(2.0), np.float32(3.0))
    b[0, 0] = -0.0  # equal as values, not as bits
    assert bitwise.differing_rows(a, b).tolist() == [True, True]
    figures = bitwise.against(a, b, np.float32)
    assert figures["rows_differing"] == 2 and figures["first_row"] == 0
    assert figures["max_ulp"] == 1  # -0.0 and 0.0 are 0 ULP apart; the nextafter 1
    assert figures["argmax_flips"] == 0


def test_argmax_flips_need_class_outputs():
    one = np.zeros((3, 1), np.float32)
    assert bitwise.argmax_flips(one, one) is None
    a = np.array([[1.0, 1.0], [0.0, 1.0]], np.float32)
    b = np.array([[1.0, np.nextafter(np.float32(1.0), np.float32(2.0))], [0.0, 1.0]])
    assert bitwise.argmax_flips(a, b.astype(np.float32)).tolist() == [True, False]


# --- the pipeline: forward measures, check reports, the summary, HTML and MLflow show ---


@pytest.mark.stages
def test_the_pipeline_reports_bitwise_batch_invariance(tmp_path):
    from tests.helpers.inprocess import run_stages, write_params
    from vmapcheck.check.schema import read_check_details, read_record
    from vmapcheck.core.paths import batch_paths
    from vmapcheck.layout import Layout
    from vmapcheck.report.check_sections import bitwise as html_section
    from vmapcheck.report.summary import summarize
    from vmapcheck.tracking.log import bitwise_metrics

    write_params(
        tmp_path,
        "data.n_rows=240",
        "data.standard_batch=8",
        "reference.required=false",
        "train.steps=0",
        "backend.num_devices=2",
    )
    run_stages(tmp_path, "prepare", "train", "forward", "check")
    layout = Layout(tmp_path)
    assert "bitwise" in read_record(layout.record)
    check = read_check_details(layout.check_details)  # read back typed, every key
    section = check["bitwise"]
    assert section["mode"] == "report" and section["passed"]
    assert section["case"] == "standard" and section["rows"] == 8
    assert set(section["paths"]) == {p.name for p in batch_paths()}
    # Reported, never failed: the check's verdict is the tolerance's.
    assert not any(f.startswith("bitwise/") for f in check["failures"])
    line = next(x for x in summarize(layout).splitlines() if "bitwise (" in x)
    assert line.startswith("  -    bitwise (cpu, standard, reported): ")
    for name, p in section["paths"].items():
        assert (name in line) and p["compositions"]["alone"]["rows"] == 8
    html = html_section(check)
    assert html["measured"] and len(html["table"]["rows"]) == len(section["paths"])
    # The whole page, the pipeline's section in a report the HTML tests build.
    from tests.test_html_report import make_inputs, parse
    from vmapcheck.report.html import render_report

    shown, bench, train, _ = make_inputs(failed=False)
    page = parse(render_report({**shown, "bitwise": section}, bench, train, None))
    table = page.rows["bitwise-table"]
    assert [row[0] for row in table[1:]] == list(section["paths"])
    assert "reported, never failed" in page.text("bitwise")
    metrics = bitwise_metrics(check)
    assert metrics["bitwise/paths_bitwise"] == sum(p["bitwise"] for p in section["paths"].values())
    assert {f"bitwise/{name}/max_ulp" for name in section["paths"]} <= set(metrics)
