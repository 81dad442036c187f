"""Pure loss / update functions and a small training loop with validation selection.

``loss(params, X, Y)``: mean squared error over a batch (batch axis 0) computed with the
per-example forward under vmap. ``update`` is one optax step on the trainable leaves
only: the model's declared state leaves (``Model.state_leaves``: running statistics,
counters) are neither differentiated nor stepped, and come out bit-identical
(:mod:`vmapcheck.core.state`). The test split is evaluated exactly once, after the params
are chosen on validation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vmapcheck.config import TrainConfig
from vmapcheck.core.contract import rows as batch_rows
from vmapcheck.core.contract import take
from vmapcheck.core.forms import keyed_model, with_keys
from vmapcheck.core.models import Model, Params
from vmapcheck.core.state import ParamsPartition, partition
from vmapcheck.errors import NonFiniteOutputError


def make_loss(model: Model):
    """loss(params, X (n, in), Y (n, out)) -> scalar mean squared error."""

    def loss(params: Params, features: jax.Array, targets: jax.Array) -> jax.Array:
        predictions = jax.vmap(model.forward_one, in_axes=(None, 0))(params, features)
        return jnp.mean((predictions - targets) ** 2)

    return loss


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    if config.optimizer == "adam":
        return _standard_promotion(optax.adam(config.learning_rate))
    return _standard_promotion(optax.sgd(config.learning_rate))


def _standard_promotion(
    optimizer: optax.GradientTransformation,
) -> optax.GradientTransformation:
    """``optimizer`` with JAX's standard dtype promotion inside its own update only.

    optax's adam computes its bias correction as ``decay**count``, a Python float to the
    power of the int32 step count, which ``jax_numpy_dtype_promotion="strict"`` refuses;
    the loss and gradients around it stay under whatever promotion the caller set.
    """

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        with jax.numpy_dtype_promotion("standard"):
            return optimizer.update(updates, state, params)

    return optax.GradientTransformation(optimizer.init, update)


def make_update(model: Model, optimizer: optax.GradientTransformation, leaves: ParamsPartition):
    """update(params, opt_state, X, Y) -> (params, opt_state, loss): one pure step.

    ``leaves`` (:func:`vmapcheck.core.state.partition` of the params) says which leaves
    are trained: the gradient is taken with respect to those only, and ``opt_state`` is
    ``optimizer.init(leaves.trainable(params))``. The declared state leaves are passed
    through untouched. X: (batch, in_features) or a batch pytree, batch axis 0; Y:
    (batch, out_features).
    """
    loss = make_loss(model)

    def update(params: Params, opt_state: Any, features: jax.Array, targets: jax.Array):
        trainable, state = leaves.split(params)

        def trainable_loss(weights: dict[str, jax.Array]) -> jax.Array:
            return loss(leaves.merge(weights, state), features, targets)

        value, grads = jax.value_and_grad(trainable_loss)(trainable)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return leaves.merge(optax.apply_updates(trainable, updates), state), opt_state, value

    return update


def fit(
    model: Model,
    params: Params,
    splits: dict[str, tuple[Any, np.ndarray]],
    config: TrainConfig,
    batches_key: jax.Array,
) -> tuple[Params, dict[str, Any]]:
    """Train on ``splits['train']``, keep the params with the lowest validation loss.

    Returns the chosen params and metrics (train/val/test loss, best step). ``test`` is
    touched once, at the end. A model that is not trainable (toy) is returned unchanged,
    with its losses reported. Only the trainable leaves are stepped; the declared state
    leaves (``model.state_leaves``) are returned bit-identical.

    Raises:
        ConfigError: before any step, a params leaf that is not float and not declared
            as state, or a ``state_leaves`` entry that covers no leaf
            (:func:`vmapcheck.core.state.partition`).
    """
    # Before anything is computed: an int leaf would otherwise crash jax.grad, unnamed.
    leaves = partition(model, params)
    # A stochastic model's rows each draw from a key of their own (forms.with_keys): new
    # keys every step (draw = the step), the same ones for every evaluation (draw = 0).
    # Each key feeds one split (train runs under jax_debug_key_reuse): the evaluation's
    # is cloned for each use. A deterministic model's batches_key is used as before.
    noise = evaluation = None
    if model.stochastic:
        batches_key, noise_key = jax.random.split(batches_key)
        noise = jax.random.split(noise_key, config.steps + 1)
        evaluation = noise[0]  # sliced once: a slice consumes its element

    def keyed(x: Any, draw: int) -> Any:
        if noise is None or evaluation is None:
            return x
        base = jax.random.clone(evaluation) if draw == 0 else noise[draw]
        return with_keys(model, x, base)

    evaluate = jax.jit(make_loss(keyed_model(model)))

    def loss(p: Params, x: Any, y: Any) -> jax.Array:
        return evaluate(p, keyed(x, 0), y)

    train_x, train_y = splits["train"]
    val_x, val_y = splits["val"]
    best = {"step": 0, "val_loss": float(loss(params, val_x, val_y)), "params": params}
    if model.trainable and config.steps > 0:
        optimizer = make_optimizer(config)
        update = jax.jit(make_update(keyed_model(model), optimizer, leaves))
        opt_state = optimizer.init(leaves.trainable(params))
        n_train = batch_rows(train_x)
        size = min(config.batch_size, n_train)
        # One key per step, each drawing that step's minibatch rows once.
        step_keys = jax.random.split(batches_key, config.steps)
        for step in range(1, config.steps + 1):
            rows = np.asarray(jax.random.choice(step_keys[step - 1], n_train, (size,), False))
            batch = keyed(take(train_x, rows), step)
            params, opt_state, _ = update(params, opt_state, batch, train_y[rows])
            if step % config.eval_every == 0 or step == config.steps:
                val_loss = float(loss(params, val_x, val_y))
                if not np.isfinite(val_loss):
                    raise NonFiniteOutputError(
                        f"model {model.name!r}: the validation loss is {val_loss} at step "
                        f"{step} (train.eval_every={config.eval_every}): its training "
                        "diverged or its forward gives NaN or Inf; try a lower "
                        "train.learning_rate"
                    )
                if val_loss < best["val_loss"]:
                    best = {"step": step, "val_loss": val_loss, "params": params}
    chosen = best["params"]
    metrics = {
        "trained": bool(model.trainable and config.steps > 0),
        "best_step": best["step"],
        "train_loss": float(loss(chosen, train_x, train_y)),
        "val_loss": best["val_loss"],
        "test_loss": float(loss(chosen, *splits["test"])),
    }
    return chosen, metrics
