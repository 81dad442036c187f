"""A forward that samples (``Model(stochastic=True)``): one key per row on every path.

The shared-key bug (every row of a batch drawing from one key) must fail with a line
saying the rows share their randomness; the per-row-key model must pass agreement and
composition, and the float64 oracle must say it does not judge it (never a false FAIL).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.check.rules import SHARED_RANDOMNESS, rules_for
from vmapcheck.core import forms
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.core.models import Model, mlp_init
from vmapcheck.core.oracle import draw_problem
from vmapcheck.core.paths import build_paths, build_vector_paths
from vmapcheck.core.record import ORACLE_NOT_JUDGED
from vmapcheck.errors import ConfigError, InvalidInputError
from vmapcheck.examples.mc_dropout import make_model
from vmapcheck.testing import check_batching

EXAMPLES = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)


def _model(**kwargs):
    model = make_model(4, [16, 16], 2, rate=0.5, **kwargs)
    return model, model.init(jax.random.key(0))


def test_every_path_gives_row_i_the_loops_key():
    model, params = _model()
    base = forms.forward_keys(3)
    x = jnp.asarray(EXAMPLES)
    outputs = {
        name: np.asarray(p(params, x))
        for name, p in build_paths(model, jnp.float32, key=base).items()
    }
    keys = forms.row_keys(base, 6)
    by_hand = np.stack([np.asarray(model.forward_one(params, x[i], keys[i])) for i in range(6)])
    for name, out in outputs.items():
        np.testing.assert_allclose(out, by_hand, rtol=1e-5, atol=1e-6, err_msg=name)
    # One unbatched example gets row 0's key: what the loop gives row 0 of any batch.
    for name, one in build_vector_paths(model, jnp.float32, key=base).items():
        np.testing.assert_allclose(
            np.asarray(one(params, x[0])), by_hand[0], rtol=1e-6, err_msg=name
        )
    # The rows really are sampled: the same input with another key gives another output.
    assert not np.allclose(by_hand[0], np.asarray(model.forward_one(params, x[0], keys[1])))


def test_regroupings_move_each_rows_key_with_its_row():
    model, params = _model()
    base = forms.forward_keys(0)
    x = forms.with_keys(model, jnp.asarray(EXAMPLES), base)
    for name, path in build_paths(model, jnp.float32, key=base).items():
        whole = np.asarray(path(params, x))
        for regrouping in REGROUPINGS.values():
            again = np.asarray(regrouping.run(path, params, x))
            np.testing.assert_allclose(
                again, whole, rtol=1e-5, atol=1e-6, err_msg=f"{name} {regrouping.name}"
            )


def test_per_row_keys_pass_and_the_oracle_repeats_float32_draws():
    model, params = _model()
    report = check_batching(model, params, EXAMPLES)
    assert report.passed, report.summary
    # Its masks are drawn in float32: float64 draws the same from the same keys.
    assert report.details["oracle"] == "float64 (CPU)"
    assert set(report.oracle) == set(report.paths)
    assert max(report.oracle.values()) < 1e-5
    # The duplicate rows run for a stochastic model, judged by copies_differ.
    rules = report.details["cases"]["duplicate_rows"]["rules"]
    assert set(rules) == {"copies_differ"} and rules["copies_differ"]["passed"]
    assert all(c["passed"] for c in report.details["composition"]["examples"].values())


def _noisy_model() -> tuple[Model, object]:
    """Gaussian noise drawn in the default float: 64 bits under x64, another sample."""
    widths = [4, 8, 2]

    def forward_one(params, x, key):
        hidden = jax.nn.relu(x @ params["layers"][0]["W"] + params["layers"][0]["b"])
        out = hidden @ params["layers"][1]["W"] + params["layers"][1]["b"]
        return out + 0.1 * jax.random.normal(key, (2,)).astype(out.dtype)

    model = Model(
        name="noisy",
        in_features=4,
        out_features=2,
        forward_one=forward_one,
        init=lambda key: mlp_init(key, widths),
        stochastic=True,
    )
    return model, model.init(jax.random.key(0))


def test_draws_float64_cannot_repeat_are_not_judged_and_no_false_fail():
    model, params = _noisy_model()
    assert draw_problem(model, params, EXAMPLES[0], jnp.float32) is not None
    report = check_batching(model, params, EXAMPLES)
    assert report.passed, report.summary
    assert report.details["oracle"] == ORACLE_NOT_JUDGED
    assert report.oracle == {}  # no figure, no failure
    assert "float64 oracle   not judged:" in report.summary


def test_shared_key_in_forward_batch_fails_saying_the_rows_share_their_randomness():
    model, params = _model(shared_key=True)
    report = check_batching(model, params, EXAMPLES)
    assert not report.passed
    shared = [f for f in report.failures if SHARED_RANDOMNESS in f]
    assert {f.split(":")[0] for f in shared} == {
        "duplicate_rows/direct_eager",
        "duplicate_rows/direct_jit",
    }
    assert (
        "copies_differ: 8 copies with different keys get one output on direct_eager, "
        f"direct_jit: {SHARED_RANDOMNESS}" in report.summary
    )


def test_forward_one_ignoring_its_key_fails_on_every_path():
    widths = [4, 8, 2]

    def forward_one(params, x, key):
        fixed = jax.random.key(42)  # the bug: a constant key, every row the same mask
        del key
        mask = jax.random.bernoulli(fixed, jnp.float32(0.5), (8,)).astype(x.dtype) * 2
        hidden = jax.nn.relu(x @ params["layers"][0]["W"] + params["layers"][0]["b"]) * mask
        return hidden @ params["layers"][1]["W"] + params["layers"][1]["b"]

    model = Model(
        name="fixed_key",
        in_features=4,
        out_features=2,
        forward_one=forward_one,
        init=lambda key: mlp_init(key, widths),
        stochastic=True,
    )
    report = check_batching(model, model.init(jax.random.key(0)), EXAMPLES)
    assert not report.passed
    rule = report.details["cases"]["duplicate_rows"]["rules"]["copies_differ"]
    assert not rule["passed"] and SHARED_RANDOMNESS in rule["text"]
    # Agreement alone cannot see it: every path draws from the same fixed key.
    assert report.details["cases"]["examples"]["passed"]


def test_a_stochastic_model_must_take_the_key():
    with pytest.raises(
        ConfigError, match=r"stochastic=True, so forward_one must take \(params, x, key\)"
    ):
        Model(
            name="no_key",
            in_features=4,
            out_features=2,
            forward_one=lambda params, x: x,
            init=lambda key: {},
            stochastic=True,
        )
    with pytest.raises(ConfigError, match=r"takes a third argument .* not stochastic"):
        Model(
            name="undeclared",
            in_features=4,
            out_features=2,
            forward_one=lambda params, x, key: x,
            init=lambda key: {},
        )


def test_keys_of_the_wrong_shape_are_refused_by_name():
    model, params = _model()
    path = build_paths(model, jnp.float32)["vmap_jit"]
    x = jnp.asarray(EXAMPLES)
    with pytest.raises(InvalidInputError, match=r"keys: expected shape \(6,\)"):
        path(params, forms.Keyed(x, forms.row_keys(forms.forward_keys(0), 5)))
    with pytest.raises(InvalidInputError, match="keys: expected typed PRNG keys"):
        path(params, forms.Keyed(x, jnp.zeros((6, 2), jnp.uint32)))
    # Keys given to a model that does not sample: refused, not silently dropped.
    plain = Model(
        name="plain",
        in_features=4,
        out_features=2,
        forward_one=lambda p, x: x[:2],
        init=lambda key: {},
    )
    with pytest.raises(InvalidInputError, match="keys: model 'plain' is not stochastic"):
        build_paths(plain, jnp.float32)["vmap_jit"](
            {}, forms.Keyed(x, forms.row_keys(forms.forward_keys(0), 6))
        )


def test_the_seed_picks_the_keys():
    model, params = _model()
    first = check_batching(model, params, EXAMPLES, paths=["loop_eager", "vmap_eager"], seed=1)
    again = check_batching(model, params, EXAMPLES, paths=["loop_eager", "vmap_eager"], seed=1)
    other = check_batching(model, params, EXAMPLES, paths=["loop_eager", "vmap_eager"], seed=2)
    assert first.passed and other.passed
    assert first.details["cases"]["examples"] == again.details["cases"]["examples"]
    with pytest.raises(ConfigError, match="seed: expected an int >= 0"):
        check_batching(model, params, EXAMPLES, seed=-1)


def test_copies_agree_flips_to_copies_differ_only_for_a_stochastic_model():
    assert rules_for(("copies_agree",), stochastic=False) == ("copies_agree",)
    assert rules_for(("copies_agree",), stochastic=True) == ("copies_differ",)


USER_SAMPLER = """
import jax
import jax.numpy as jnp

from vmapcheck.core.models import Model


def make_model(in_features: int = 3, keyed: bool = True) -> Model:
    def noisy(params, x, key):
        return x @ params["W"] + 0.1 * jax.random.normal(key, (2,), jnp.float32)

    def plain(params, x):
        return x @ params["W"]

    return Model(
        name="sampler",
        in_features=in_features,
        out_features=2,
        forward_one=noisy if keyed else plain,
        init=lambda key: {"W": jax.random.normal(key, (in_features, 2), jnp.float32)},
        stochastic=True,
    )
"""


def test_init_takes_a_users_stochastic_model_and_refuses_one_without_a_key(tmp_path):
    import subprocess
    import sys

    import yaml

    root = tmp_path / "user"
    (root / "mymodels").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "sampler.py").write_text(USER_SAMPLER)

    def init(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "vmapcheck", "init", "--model", *args]
        return subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)

    refused = init("mymodels.sampler:make_model", "--factory-arg", "keyed=false")
    assert refused.returncode != 0
    assert "stochastic=True, so forward_one must take (params, x, key)" in refused.stderr
    done = init("mymodels.sampler:make_model")
    assert done.returncode == 0, done.stderr
    model = yaml.safe_load((root / "conf" / "model" / "sampler.yaml").read_text())
    assert model["factory"]["_target_"] == "mymodels.sampler.make_model"
