"""The Flax NNX transformer encoder (vmapcheck.examples.flax_transformer) on the digits as
padded token sequences (``data=digit_tokens``), at the level of the model alone: real
JAX, real rows of the digit_tokens table, no mocks, no harness.

Tested here: the input contract ({tokens: (64,) int32, mask: (64,) bool}, built from the
table's 128 feature columns); params named after the layers, float32, deterministic from
the key; ``forward_one`` under a Python loop, ``jax.vmap`` and the hand-batched
``forward_batch`` agreeing on real rows; all-padding and no-padding sequences giving
finite outputs; the id at a padded position changing nothing; each batching mistake of
tests/helpers/transformer_faults.py changing ``forward_batch`` (first at the layer it is
planted in) and leaving ``forward_one`` as it was; and a few Adam steps lowering the loss.
Skipped when Flax is not installed (``pip install -e '.[flax]'``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers.inprocess import judge_planted
from vmapcheck.core.contract import take
from vmapcheck.core.models import Model
from vmapcheck.core.paths import PATHS
from vmapcheck.data.builtin import (
    DIGIT_TOKENS_FEATURES,
    DIGITS_TARGETS,
    digit_tokens_raw_table,
    digit_tokens_schema,
)
from vmapcheck.io import read_json
from vmapcheck.params_io import leaf_paths

pytest.importorskip("flax", reason="flax is not installed: pip install -e '.[flax]'")

from tests.helpers.transformer_faults import FAULTS
from tests.helpers.transformer_faults import make_model as make_planted
from vmapcheck.examples.flax_transformer import LAYERS, make_model

# conf/model/flax_transformer.yaml's factory keys.
VOCAB, SEQ_LEN, D_MODEL, HEADS, FF, OUT = 17, 64, 32, 4, 64, 10
KWARGS = {"vocab": VOCAB, "seq_len": SEQ_LEN, "d_model": D_MODEL, "heads": HEADS, "ff": FF}
# Rows of the table the tests run on: enough for a real mix of lengths.
ROWS = 24
# Where each planted fault first shows in the batched form's activations.
FIRST_WRONG = {
    "softmax_over_batch": "attn",
    "mask_wrong_axis": "attn",
    "layernorm_over_batch": "ln1",
    "ids_as_float": "embed",
}


@pytest.fixture(scope="module")
def model() -> Model:
    return make_model(**KWARGS, out_features=OUT, output_names=list(DIGITS_TARGETS))


@pytest.fixture(scope="module")
def params(model):
    return model.init(jax.random.key(0))


@pytest.fixture(scope="module")
def table():
    """(batch {tokens, mask} of every row, targets (1797, 10)) of the digit_tokens table."""
    raw = digit_tokens_raw_table(digit_tokens_schema({}, DIGIT_TOKENS_FEATURES, DIGITS_TARGETS))
    spec = make_model(**KWARGS, out_features=OUT).inputs
    return spec.from_table(raw.features, raw.schema.features), raw.targets


@pytest.fixture(scope="module")
def batch(table):
    """The first :data:`ROWS` rows as jax arrays: {tokens (ROWS, 64) int32, mask bool}."""
    rows, _ = table
    return {name: jnp.asarray(leaf[:ROWS]) for name, leaf in rows.items()}


def _close(a, b, err_msg: str = "") -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5, err_msg=err_msg)


# jax.jit(model.forward_one) of each model, compiled once per test session.
_JITTED: dict[int, object] = {}


def _loop(model: Model, params, batch, *, jit: bool = True) -> np.ndarray:
    """forward_one on each row in a Python loop, stacked: (rows, out). Jitted (compiled
    once, then row after row) unless ``jit`` is False."""
    one = _JITTED.setdefault(id(model), jax.jit(model.forward_one)) if jit else model.forward_one
    n = batch["tokens"].shape[0]
    return np.stack([np.asarray(one(params, take(batch, i))) for i in range(n)])


# --- the contract and the params -------------------------------------------------------


def test_the_contract_is_token_ids_then_mask_bits_from_the_table(model, table, batch):
    spec = model.inputs
    assert spec is not None and spec.names == ("tokens", "mask")
    tokens, mask = spec.leaves
    assert (tokens.shape, tokens.dtype, tokens.vocab) == ((64,), "int32", VOCAB)
    assert (mask.shape, mask.dtype) == ((64,), "bool")
    assert spec.size == model.in_features == 128 and model.out_features == OUT
    assert model.outputs() == DIGITS_TARGETS
    assert model.forward_batch is not None and model.trainable
    assert model.activations_one is not None and model.activations_batch is not None
    rows, _ = table
    assert rows["tokens"].dtype == np.int32 and rows["mask"].dtype == np.bool_
    lengths = rows["mask"].sum(axis=1)
    assert lengths.min() >= 16 and lengths.max() == 64
    # The rows the tests run on mix lengths: most are padded, some may be full.
    assert np.unique(np.asarray(batch["mask"]).sum(axis=1)).size > ROWS // 2


def test_params_are_named_after_the_layers_float32_and_deterministic_from_the_key(model, params):
    shapes = {name: leaf.shape for name, leaf in leaf_paths(params).items()}
    d = D_MODEL
    projection = {"kernel": (d, d), "bias": (d,)}
    expected = {
        "embed.tokens.embedding": (VOCAB, d),
        "embed.positions.embedding": (SEQ_LEN, d),
        **{
            f"attn.{p}.{k}": s
            for p in ("query", "key", "value", "out")
            for k, s in projection.items()
        },
        "ln1.scale": (d,),
        "ln1.bias": (d,),
        "ff.hidden.kernel": (d, FF),
        "ff.hidden.bias": (FF,),
        "ff.out.kernel": (FF, d),
        "ff.out.bias": (d,),
        "ln2.scale": (d,),
        "ln2.bias": (d,),
        "head.kernel": (d, OUT),
        "head.bias": (OUT,),
    }
    assert shapes == expected
    assert sum(leaf.size for leaf in jax.tree.leaves(params)) == 11_466
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    # Every tapped layer but the pool is a params subtree (the diagnosis names its leaves).
    assert {name.split(".")[0] for name in shapes} == set(LAYERS) - {"pool"}
    template = jax.eval_shape(model.init, jax.random.key(0))
    assert jax.tree.structure(template) == jax.tree.structure(params)
    again, other = (
        leaf_paths(model.init(jax.random.key(0))),
        leaf_paths(model.init(jax.random.key(1))),
    )
    for name, leaf in leaf_paths(params).items():
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(again[name]), err_msg=name)
    for name in ("embed.tokens.embedding", "attn.query.kernel", "head.kernel"):
        assert not np.array_equal(np.asarray(other[name]), np.asarray(leaf_paths(params)[name]))


# --- the three forms -------------------------------------------------------------------


def test_loop_vmap_and_forward_batch_agree_on_real_rows(model, params, batch):
    one = _loop(model, params, batch)
    assert one.shape == (ROWS, OUT) and np.all(np.isfinite(one))
    vmapped = jax.vmap(model.forward_one, in_axes=(None, 0))
    forms = {
        "jit(vmap)": jax.jit(vmapped)(params, batch),
        "jit(forward_batch)": jax.jit(model.forward_batch)(params, batch),
    }
    for name, out in forms.items():
        assert out.shape == (ROWS, OUT), name
        _close(out, one, name)
    # Outputs differ between rows: the agreement is not that of a constant.
    assert np.ptp(one, axis=0).min() > 1e-3


def test_the_eager_forms_agree_too(model, params, batch):
    """Op by op, without jit (the harness's eager paths)."""
    expected = _loop(model, params, batch)
    _close(_loop(model, params, take(batch, slice(0, 3)), jit=False), expected[:3], "loop")
    _close(jax.vmap(model.forward_one, in_axes=(None, 0))(params, batch), expected, "vmap")
    _close(model.forward_batch(params, batch), expected, "forward_batch")


def test_activations_walk_the_layers_and_end_at_the_output(model, params, batch):
    first = take(batch, 0)
    one = model.activations_one(params, first)
    many = model.activations_batch(params, batch)
    assert [name for name, _ in one] == list(LAYERS) == [name for name, _ in many]
    shapes = [a.shape for _, a in one]
    assert shapes == [(SEQ_LEN, D_MODEL)] * 5 + [(D_MODEL,), (OUT,)]
    assert [a.shape for _, a in many] == [(ROWS, *s) for s in shapes]
    _close(one[-1][1], model.forward_one(params, first))
    _close(many[-1][1], model.forward_batch(params, batch))
    for (name, a), (_, b) in zip(one, many, strict=True):
        _close(b[0], a, name)  # row 0 of the batch is the single sequence, layer by layer


# --- padding ---------------------------------------------------------------------------


def test_all_padding_and_no_padding_sequences_give_finite_outputs(model, params, table):
    rows, _ = table
    full = np.flatnonzero(rows["mask"].all(axis=1))[:2]  # real rows without padding
    assert full.size == 2
    cases = {
        "no padding": {name: jnp.asarray(leaf[full]) for name, leaf in rows.items()},
        "all padding": {
            "tokens": jnp.zeros((2, SEQ_LEN), jnp.int32),
            "mask": jnp.zeros((2, SEQ_LEN), bool),
        },
        "all padding, ids left in": {
            "tokens": jnp.asarray(rows["tokens"][full]),
            "mask": jnp.zeros((2, SEQ_LEN), bool),
        },
    }
    # Params whose head bias is not zero, so that "finite" is not "zero".
    shifted = {**params, "head": {**params["head"], "bias": params["head"]["bias"] + 0.5}}
    forward_batch = jax.jit(model.forward_batch)
    # Gradients stay finite too (the masked softmax and the pool's division).
    grad = jax.jit(jax.grad(lambda p, x: jnp.sum(model.forward_batch(p, x))))
    for name, case in cases.items():
        for p in (params, shifted):
            batched = np.asarray(forward_batch(p, case))
            assert np.all(np.isfinite(batched)), name
            _close(batched, _loop(model, p, case), name)
            grads = grad(p, case)
            assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads)), name
    # Nothing real: the pool is 0, the output the head's bias.
    _close(forward_batch(shifted, cases["all padding"]), np.full((2, OUT), 0.5))


def test_the_id_at_a_padded_position_changes_nothing(model, params, batch):
    mask = np.asarray(batch["mask"])
    assert (~mask).any(axis=1).sum() > ROWS // 2  # most rows are padded
    rng = np.random.default_rng(3)
    noise = rng.integers(1, VOCAB, size=mask.shape).astype(np.int32)
    tokens = np.asarray(batch["tokens"])
    in_padding = {"tokens": jnp.asarray(np.where(mask, tokens, noise)), "mask": batch["mask"]}
    forward_batch = jax.jit(model.forward_batch)
    _close(forward_batch(params, in_padding), forward_batch(params, batch))
    _close(_loop(model, params, in_padding), _loop(model, params, batch))
    # The same change at the real positions does change the outputs (the test can fail).
    in_real = {"tokens": jnp.asarray(np.where(mask, noise, tokens)), "mask": batch["mask"]}
    moved = np.abs(np.asarray(forward_batch(params, in_real)) - _loop(model, params, batch))
    assert moved.max() > 1e-2


# --- planted batching mistakes ---------------------------------------------------------


def test_no_fault_is_the_healthy_model(params, batch, model):
    healthy = make_planted("none", **KWARGS, out_features=OUT)
    _close(healthy.forward_batch(params, batch), model.forward_batch(params, batch))
    with pytest.raises(ValueError, match="unknown fault 'nan'"):
        make_planted("nan", **KWARGS, out_features=OUT)


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "none"])
def test_a_planted_fault_breaks_forward_batch_only(fault, model, params, batch):
    planted = make_planted(fault, **KWARGS, out_features=OUT)
    first = take(batch, 0)
    _close(planted.forward_one(params, first), model.forward_one(params, first), "forward_one")
    right = np.asarray(model.forward_batch(params, batch))
    wrong = np.asarray(planted.forward_batch(params, batch))
    assert np.all(np.isfinite(wrong))
    # Far beyond float32 noise (the healthy forms agree within 1e-5).
    assert np.abs(wrong - right).max() > 1e-2 * max(1.0, np.abs(right).max()), fault
    # The layers before the planted one are untouched; it diverges there first.
    good = dict(model.activations_batch(params, batch))
    bad = planted.activations_batch(params, batch)
    assert [name for name, _ in bad] == list(LAYERS)
    diverged = [name for name, a in bad if not np.allclose(a, good[name], rtol=1e-5, atol=1e-5)]
    assert diverged and diverged[0] == FIRST_WRONG[fault], diverged


def test_ids_as_float_moves_the_upper_half_of_the_ids_one_row_down(params):
    from tests.helpers.transformer_faults import ids_as_float
    from vmapcheck.examples.flax_transformer import embed_batch, module_loader

    module, _ = module_loader(**KWARGS, out_features=OUT)
    embed = module(params).embed
    ids = jnp.arange(VOCAB, dtype=jnp.int32)[None, :]  # one "sequence" of every id
    table = np.asarray(params["embed"]["tokens"]["embedding"])
    positions = np.asarray(params["embed"]["positions"]["embedding"])[:VOCAB]
    rows = np.asarray(ids_as_float(embed, ids))[0] - positions
    landed = [int(np.argmin(np.abs(table - row).sum(axis=1))) for row in rows]
    assert landed == list(range(9)) + list(range(8, 16))
    _close(np.asarray(embed_batch(embed, ids))[0] - positions, table, "healthy")


# --- training --------------------------------------------------------------------------


def test_a_few_adam_steps_lower_the_loss(model, params, table):
    rows, targets = table
    x = {name: jnp.asarray(leaf[:64]) for name, leaf in rows.items()}
    y = jnp.asarray(targets[:64])

    def loss(p):
        predictions = jax.vmap(model.forward_one, in_axes=(None, 0))(p, x)
        return jnp.mean((predictions - y) ** 2)

    optimizer = optax.adam(1e-2)

    @jax.jit
    def step(p, state):
        value, grads = jax.value_and_grad(loss)(p)
        # optax's bias correction raises a Python float to the int32 step count, which
        # strict promotion (tests/conftest.py) refuses: standard promotion for it alone.
        with jax.numpy_dtype_promotion("standard"):
            updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    p, state = params, optimizer.init(params)
    losses = []
    for _ in range(10):
        p, state, value = step(p, state)
        losses.append(float(value))
    final = float(jax.jit(loss)(p))
    assert np.all(np.isfinite(losses)) and final < 0.8 * losses[0], (losses, final)
    # Still the same function in every form after training.
    _close(jax.jit(model.forward_batch)(p, x)[:8], _loop(model, p, take(x, slice(0, 8))))


# --- the planted mistakes, through the real stages --------------------------------------

# The hand-batched paths: the only ones a mistake in forward_batch can reach.
DIRECT = {p.name for p in PATHS.values() if p.form == "direct"}
# The mistakes that mix a row with its batch-mates (statistics over the batch axis).
BATCH_MIXING = {"softmax_over_batch", "layernorm_over_batch"}


@pytest.mark.stages
@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "none"])
def test_each_planted_mistake_fails_the_check_and_the_diagnosis_names_its_layer(tmp_path, fault):
    from tests.helpers.transformer_faults import factory_overrides

    layout = judge_planted(
        tmp_path / "p", "data=digit_tokens", "model=flax_transformer", *factory_overrides(fault)
    )
    check = read_json(layout.check_details)
    assert not check["passed"]
    pairs = check["cases"]["standard"]["pairs"]
    assert not pairs["loop_eager-vs-direct_eager"]["passed"]
    assert pairs["loop_eager-vs-vmap_eager"]["passed"]  # vmap never sees batch-mates
    mixed = [f for f in check["failures"] if "outputs depend on batch composition" in f]
    if fault in BATCH_MIXING:
        assert {f.split("/")[1].split(":")[0] for f in mixed} == DIRECT, mixed
    else:
        assert not mixed, mixed
    diagnosis = read_json(layout.diagnosis)["first_divergence"]
    assert diagnosis["layer"] == FIRST_WRONG[fault], diagnosis
    print(fault, diagnosis["layer"], next(f for f in check["failures"] if "standard/" in f))
