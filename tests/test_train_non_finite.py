"""train refuses non-finite gradients and params (issue 42, item 4).

A model whose forward stays finite while its gradient is NaN (the untaken branch of a
``jnp.where``: tests/helpers/untaken_branch.py) used to train to params full of NaN
(its validation loss stayed finite: the where masks the NaN in the forward), save them
and print ``trained=True``. ``fit`` now refuses at the step the gradient went NaN, naming
the leaf and the cause; the train stage writes no params, keeps the error in its record
and ``vmapcheck summary`` shows it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.untaken_branch import make_model
from vmapcheck.core.training import fit
from vmapcheck.errors import NonFiniteTrainingError

FAQ = "https://docs.jax.dev/en/latest/faq.html#gradients-contain-nan-where-using-where"


def _splits(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    y = np.tanh(x[:, :3]).astype(np.float32)
    return {"train": (x[:40], y[:40]), "val": (x[40:50], y[40:50]), "test": (x[50:], y[50:])}


def _train_config(*overrides):
    return compose_config("train.steps=6", "train.eval_every=3", *overrides).train


def test_fit_refuses_a_nan_gradient_naming_the_leaf_the_step_and_the_fix():
    model = make_model(form="where")
    with pytest.raises(NonFiniteTrainingError) as info:
        fit(model, model.init(jax.random.key(0)), _splits(), _train_config(), jax.random.key(1))
    message = str(info.value)
    # Found at the first evaluation step (3), named at the step it appeared (1).
    assert message.startswith(
        "model 'sqrt_where': training step 1: the gradient of params leaf 'layers[0].W' is "
        "not finite (NaN or Inf), and of 1 more: layers[0].b, while the training loss is "
        "finite ("
    ), message
    assert "Refused: no params are saved and the run does not pass as trained." in message
    assert "double where" in message and FAQ in message


def test_fit_trains_the_double_where_fix():
    model = make_model(form="where_fixed")
    params, metrics = fit(
        model, model.init(jax.random.key(0)), _splits(), _train_config(), jax.random.key(1)
    )
    assert metrics["trained"] and np.isfinite(metrics["val_loss"])
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params))


def test_given_params_holding_nan_are_never_returned():
    """Evaluated, not trained (train.params_file, a registered version: those are
    verified on reading; fit refuses them too, whatever chose them)."""
    from dataclasses import replace

    model = replace(make_model(form="where_fixed"), trainable=False)
    params = model.init(jax.random.key(0))
    params["layers"][1]["b"] = params["layers"][1]["b"].at[2].set(np.inf)
    with pytest.raises(NonFiniteTrainingError, match=r"leaf layers\[1\]\.b: expected finite"):
        fit(model, params, _splits(), _train_config(), jax.random.key(1))


def test_the_train_stage_refuses_writes_no_params_and_says_why(tmp_path, capsys):
    from tests.helpers.inprocess import run_stage, write_params
    from vmapcheck.io import read_json
    from vmapcheck.layout import Layout
    from vmapcheck.running import failed_stages
    from vmapcheck.tracking.review import run_summary

    write_params(
        tmp_path,
        "model.name=sqrt_where",
        "model.in_features=4",
        "model.hidden=[16]",
        "model.out_features=3",
        "data.n_rows=120",
        "data.standard_batch=8",
        "+model.factory._target_=tests.helpers.untaken_branch.make_model",
        "+model.factory.form=where",
        "+model.factory.in_features=${model.in_features}",
        "+model.factory.hidden=${model.hidden}",
        "+model.factory.out_features=${model.out_features}",
        "train.steps=4",
        "train.eval_every=2",
    )
    layout = Layout(tmp_path)
    assert run_stage(tmp_path, "prepare") == 0
    capsys.readouterr()
    assert run_stage(tmp_path, "train") == 2
    out, err = capsys.readouterr()
    assert "trained=True" not in out
    assert err.startswith(
        "train: error: model 'sqrt_where': training step 1: the gradient of params leaf "
        "'layers[0].W' is not finite (NaN or Inf)"
    ), err
    # Nothing written: no params folder, no metrics of a run that did not pass.
    assert not layout.params.exists() and not layout.train_report.exists()
    record = read_json(layout.stage_time("train"))
    assert record["exit_code"] == 2
    assert record["error"].startswith("NonFiniteTrainingError: model 'sqrt_where': training")
    (line,) = failed_stages(layout)
    assert line.startswith("stage train (started ")
    assert "failed: NonFiniteTrainingError: model 'sqrt_where': training step 1" in line
    # What `make demo` prints after `dvc repro` failed: the stage, its error.
    run_summary(layout, repro_status=1)
    assert "summary: stage train (started " in capsys.readouterr().out


def test_a_stage_error_is_kept_in_its_record_without_credentials(tmp_path, capsys):
    """Any stage's error (exit 2) goes to its record, redacted like the printed line: the
    record is a DVC output, cached and shared."""
    from tests.helpers.inprocess import write_params
    from vmapcheck.errors import TrackingStoreError
    from vmapcheck.io import read_json
    from vmapcheck.layout import Layout
    from vmapcheck.pipeline.stage import run_stage

    def body(config, layout):
        raise TrackingStoreError("cannot reach https://alice:s3cret@mlflow.example/ (refused)")

    write_params(tmp_path)
    assert run_stage("track", body, tmp_path) == 2
    record = read_json(Layout(tmp_path).stage_time("track"))
    assert record["error"] == (
        "TrackingStoreError: cannot reach https://***@mlflow.example/ (refused)"
    )
    assert "s3cret" not in capsys.readouterr().err
