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
from vmapcheck.core.leaves import check_finite, leaf_paths
from vmapcheck.core.models import Model, Params
from vmapcheck.core.record import TrainMetrics
from vmapcheck.core.state import ParamsPartition, partition
from vmapcheck.errors import ArtifactError, NonFiniteOutputError, NonFiniteTrainingError


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
    """update(params, opt_state, X, Y) -> (params, opt_state, loss, grads_finite): one
    pure step.

    ``leaves`` (:func:`vmapcheck.core.state.partition` of the params) says which leaves
    are trained: the gradient is taken with respect to those only, and ``opt_state`` is
    ``optimizer.init(leaves.trainable(params))``. The declared state leaves are passed
    through untouched. X: (batch, in_features) or a batch pytree, batch axis 0; Y:
    (batch, out_features). ``grads_finite``: bool ``(len(leaves.trainable_names),)``,
    whether each trainable leaf's gradient of this step is finite, in that order (read
    by :func:`fit` at its evaluation steps only: no host sync per step).
    """
    loss = make_loss(model)

    def update(params: Params, opt_state: Any, features: jax.Array, targets: jax.Array):
        trainable, state = leaves.split(params)

        def trainable_loss(weights: dict[str, jax.Array]) -> jax.Array:
            return loss(leaves.merge(weights, state), features, targets)

        value, grads = jax.value_and_grad(trainable_loss)(trainable)
        grads_finite = jnp.stack(
            [jnp.all(jnp.isfinite(grads[name])) for name in leaves.trainable_names]
        )
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        stepped = leaves.merge(optax.apply_updates(trainable, updates), state)
        return stepped, opt_state, value, grads_finite

    return update


# Where a NaN gradient under a finite forward usually comes from, and its fix: said by
# the error that refuses such a run (train), and in docs/python-api.md.
NAN_GRADIENT_CAUSE = (
    "A usual cause: a jnp.where (or jnp.select, lax.select) whose untaken branch is NaN "
    "or Inf on the masked values (jnp.sqrt, jnp.log or a division of them, "
    "jnp.linalg.norm at 0): the forward is finite, but the untaken branch's gradient, "
    "0 * NaN, is NaN. The fix is the 'double where' of the JAX FAQ "
    "(https://docs.jax.dev/en/latest/faq.html#gradients-contain-nan-where-using-where): "
    "make the masked values safe before the unsafe function too, e.g. "
    "jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0). "
    "vmapcheck.testing.check_batching(model, params, examples) names the leaf on a few rows"
)


def _non_finite_step(
    model: Model,
    leaves: ParamsPartition,
    first_step: int,
    losses: list[jax.Array],
    finite: list[jax.Array],
) -> None:
    """Refuse the first of the steps ``first_step, first_step + 1, ...`` whose training
    loss (``losses``: one scalar per step) or gradients (``finite``: one bool vector per
    step, :func:`make_update`'s ``grads_finite``) are not finite: named, with the first
    leaf. One transfer to the host for all of them.

    Raises:
        NonFiniteTrainingError: a step's loss or a gradient leaf is NaN or Inf.
    """
    if not losses:
        return
    # device_get of the lists: no stacking program to compile.
    host_losses = np.asarray(jax.device_get(losses))
    host_finite = np.asarray(jax.device_get(finite))
    for offset, (value, flags) in enumerate(zip(host_losses, host_finite, strict=True)):
        step = first_step + offset
        bad = [name for name, ok in zip(leaves.trainable_names, flags, strict=True) if not ok]
        if np.isfinite(value) and not bad:
            continue
        also = f", and of {len(bad) - 1} more: {', '.join(bad[1:])}" if bad[1:] else ""
        refused = "Refused: no params are saved and the run does not pass as trained."
        if not np.isfinite(value):
            grads = f" (the gradient of params leaf {bad[0]!r} too{also})" if bad else ""
            raise NonFiniteTrainingError(
                f"model {model.name!r}: training step {step}: the training loss is "
                f"{float(value)}{grads}: the forward gives NaN or Inf on this step's rows, "
                f"or training diverged (try a lower train.learning_rate). {refused}"
            )
        raise NonFiniteTrainingError(
            f"model {model.name!r}: training step {step}: the gradient of params leaf "
            f"{bad[0]!r} is not finite (NaN or Inf){also}, while the training loss is "
            f"finite ({float(value):.6g}). {refused} {NAN_GRADIENT_CAUSE}. To see the "
            "check's verdict (and log it to MLflow) on the initial params instead: "
            "train.steps=0"
        )


def _non_finite_params(model: Model, params: Params, what: str) -> None:
    """Refuse ``params`` with a NaN or Inf leaf: the first named, in tree order, as
    :func:`vmapcheck.core.leaves.check_finite` names it (count and first index)."""
    try:
        check_finite(leaf_paths(params), f"model {model.name!r}: the {what}")
    except ArtifactError as exc:
        # Every step's gradients were finite by then: a NaN in the params as given or
        # drawn by init, or an update that overflowed on the last step (whose loss no
        # later step computed).
        raise NonFiniteTrainingError(
            f"{exc}. Refused: no params are saved and the run does not pass as trained "
            "(a NaN or Inf in the params as given or drawn by the model's init, or an "
            "update that overflowed: try a lower train.learning_rate)"
        ) from None


def fit(
    model: Model,
    params: Params,
    splits: dict[str, tuple[Any, np.ndarray]],
    config: TrainConfig,
    batches_key: jax.Array,
) -> tuple[Params, TrainMetrics]:
    """Train on ``splits['train']``, keep the params with the lowest validation loss.

    Returns the chosen params and metrics (train/val/test loss, best step). ``test`` is
    touched once, at the end. A model that is not trainable (toy) is returned unchanged,
    with its losses reported. Only the trainable leaves are stepped; the declared state
    leaves (``model.state_leaves``) are returned bit-identical.

    Raises:
        ConfigError: before any step, a params leaf that is not float and not declared
            as state, or a ``state_leaves`` entry that covers no leaf
            (:func:`vmapcheck.core.state.partition`).
        NonFiniteTrainingError: a training step's loss or gradient is NaN or Inf (the
            first such step and leaf named; checked at each evaluation step, every
            step since the last one), or a chosen params leaf is.
        NonFiniteOutputError: the validation loss is NaN or Inf at an evaluation step.
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
        # Each step's loss and per-leaf gradient finiteness, kept on the device and read
        # at the evaluation steps: a NaN gradient (the untaken branch of a where) can
        # leave the forward, and so the validation loss, finite while the params fill
        # with NaN; it is refused at its step, before any params are chosen or saved.
        losses: list[jax.Array] = []
        finite: list[jax.Array] = []
        for step in range(1, config.steps + 1):
            rows = np.asarray(jax.random.choice(step_keys[step - 1], n_train, (size,), False))
            batch = keyed(take(train_x, rows), step)
            params, opt_state, step_loss, grads_finite = update(
                params, opt_state, batch, train_y[rows]
            )
            losses.append(step_loss)
            finite.append(grads_finite)
            if step % config.eval_every == 0 or step == config.steps:
                _non_finite_step(model, leaves, step - len(losses) + 1, losses, finite)
                losses, finite = [], []
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
    # Whatever chose them (trained, or given and evaluated): never returned with a NaN.
    _non_finite_params(model, chosen, "chosen params")
    metrics: TrainMetrics = {
        "trained": bool(model.trainable and config.steps > 0),
        "best_step": best["step"],
        "train_loss": float(loss(chosen, train_x, train_y)),
        "val_loss": best["val_loss"],
        "test_loss": float(loss(chosen, *splits["test"])),
    }
    return chosen, metrics
