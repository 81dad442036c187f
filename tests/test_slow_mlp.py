"""The planted slowdown of the benchmark's validation (``model=mlp_slow``,
:mod:`vmapcheck.examples.slow_mlp`): its hand-batched path does more arithmetic and
returns the same outputs, so a verdict that flags its loop or vmap paths is a false
alarm (docs/benchmark.md)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from vmapcheck.core.models import mlp_forward_batch
from vmapcheck.errors import ConfigError
from vmapcheck.examples.slow_mlp import make_model

WIDTHS = dict(in_features=8, hidden=[16], out_features=2)


def test_its_outputs_are_the_mlps_and_its_direct_path_does_more_work():
    model = make_model(**WIDTHS, extra_work=0.5)
    params = model.init(jax.random.key(0))
    batch = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)  # (n, in)
    assert model.forward_batch is not None
    out = np.asarray(model.forward_batch(params, batch))
    assert out.shape == (6, 2)
    np.testing.assert_array_equal(out, np.asarray(mlp_forward_batch(params, batch)))
    for i in range(6):  # the loop path is the built-in MLP's, row by row
        np.testing.assert_allclose(out[i], model.forward_one(params, batch[i]), rtol=1e-6)
    flops = {
        name: jax.jit(f).lower(params, batch).compile().cost_analysis()["flops"]
        for name, f in (("direct", model.forward_batch), ("mlp", mlp_forward_batch))
    }
    # 6 rows + ceil(0.5 * 6) = 9 rows of matmuls against 6.
    assert flops["direct"] == pytest.approx(1.5 * flops["mlp"], rel=0.05)


@pytest.mark.parametrize("extra_work", [0.0, 1.5])
def test_an_extra_work_out_of_range_is_refused_naming_the_key(extra_work):
    with pytest.raises(ConfigError, match=rf"model\.factory\.extra_work: .*found {extra_work}"):
        make_model(**WIDTHS, extra_work=extra_work)
