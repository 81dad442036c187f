"""Stages 4-8: the computation itself, compared across the paths.

4. ``forward``: eager, minimal input first, layer by layer;
5. ``loss``, 6. ``gradients``, 7. ``update``: the per-example loop against the batched
   forms, leaf by leaf (each form named by its registered eager path);
8. ``jit``: each path under ``jax.jit`` against its eager form, then the gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vmapcheck.check.diagnosis._layers import evaluate_probe, walk_layers
from vmapcheck.check.diagnosis.subject import (
    Probe,
    Subject,
    layer_of,
    make_finding,
    measurement_text,
    stage_result,
)
from vmapcheck.check.schema import Evidence
from vmapcheck.core.compare import flat_index, measure
from vmapcheck.core.contract import rows, take
from vmapcheck.core.gradients import make_loss_one
from vmapcheck.core.models import Model, Params
from vmapcheck.core.paths import PATHS
from vmapcheck.core.state import grad_of_trainable, partition
from vmapcheck.core.training import make_loss
from vmapcheck.params_io import leaf_paths

if TYPE_CHECKING:
    from vmapcheck.check.schema import Finding, StageResult


def _and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (what a summary says was compared)."""
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


# --- 4. forward -----------------------------------------------------------------------


def forward_stage(subject: Subject) -> StageResult:
    """Stage 4: eager loop / vmap / direct, minimal input first, layer by layer."""
    evidence: list[Evidence] = []
    notes = []
    compared: dict[str, None] = {}  # the forms the model has, in registry order
    steps = set(subject.model.preprocessing)
    for probe in subject.probes:
        runs = evaluate_probe(subject, probe, jit=False)
        compared |= dict.fromkeys(runs)
        notes += [r.note for r in runs.values() if r.note]
        finding = walk_layers(
            "forward", subject, probe, runs, lambda n: n not in steps, evidence, "eager"
        )
        if finding is not None:
            return stage_result("forward", evidence, {**finding, "notes": notes})
    per_layer = subject.model.activations_one is not None
    return stage_result(
        "forward",
        evidence,
        summary=(
            f"{_and_list(list(compared))} agree eagerly "
            + ("layer by layer" if per_layer else "on the output (no activations exposed)")
            + f" on {', '.join(p.label for p in subject.probes)}"
            + (f"; {'; '.join(notes)}" if notes else "")
        ),
    )


# --- 5-7. loss, gradients, update -----------------------------------------------------


def _targets(subject: Subject) -> list[Probe]:
    return [p for p in subject.probes if p.y is not None]


def _direct_loss(model: Model) -> Callable | None:
    if model.forward_batch is None:
        return None
    forward_batch = model.forward_batch

    def loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((forward_batch(params, x) - y) ** 2)

    return loss


def _losses(subject: Subject, probe: Probe) -> dict[str, jax.Array]:
    """The mean squared error three ways: the training loss (vmap), the mean of the
    per-example losses in a Python loop, and through the hand-batched forward."""
    params = subject.run_params
    x, y = subject.inputs(probe)
    assert y is not None  # the loss stages run on the probes with targets only
    loss_one = make_loss_one(subject.model)
    out = {
        "loop": jnp.mean(jnp.stack([loss_one(params, take(x, i), y[i]) for i in range(rows(x))])),
        "vmap": make_loss(subject.model)(params, x, y),
    }
    direct = _direct_loss(subject.model)
    if direct is not None:
        out["direct"] = direct(params, x, y)
    return out


def _gradients(subject: Subject, probe: Probe) -> dict[str, Params]:
    """Each form's gradient, ``{leaf path: gradient}`` of the trainable leaves (the
    declared state leaves are held fixed, as training holds them)."""
    params = subject.run_params
    leaves = partition(subject.model, params)
    x, y = subject.inputs(probe)
    assert y is not None  # the loss stages run on the probes with targets only
    grad_one = grad_of_trainable(make_loss_one(subject.model), leaves)
    per_row = [grad_one(params, take(x, i), y[i]) for i in range(rows(x))]
    out = {
        # The per-example oracle: the mean of each example's gradient, one at a time.
        "loop": jax.tree.map(lambda *g: jnp.mean(jnp.stack(g), axis=0), *per_row),
        "vmap": grad_of_trainable(make_loss(subject.model), leaves)(params, x, y),
    }
    direct = _direct_loss(subject.model)
    if direct is not None:
        out["direct"] = grad_of_trainable(direct, leaves)(params, x, y)
    return out


def _eager_path(form: str) -> str:
    """The name of the registered eager path computing ``form`` (the loss, gradient and
    update stages compute each form eagerly); a form no eager path computes is an error."""
    for path in PATHS.values():
        if path.form == form and not path.jit:
            return path.name
    raise KeyError(
        f"no eager forward path computes the form {form!r}; registered: {', '.join(PATHS)}"
    )


def _compare_trees(
    stage: str,
    subject: Subject,
    probe: Probe,
    trees: dict[str, Params],
    evidence: list[Evidence],
    what: str,
    path: Callable[[str], str] = _eager_path,
) -> Finding | None:
    """Leaf by leaf in tree order, every source against the first (the loop). ``path``
    names a source in findings and pairs: by default the source is a form, named by its
    registered eager path."""
    named = {source: leaf_paths(tree) for source, tree in trees.items()}
    sources = list(trees)
    base = sources[0]
    structures = {s: jax.tree_util.tree_structure(t) for s, t in trees.items()}
    for source in sources[1:]:
        # (jaxlib's stub leaves PyTreeDef unresolved for mypy: the comparison is its own.)
        if structures[source] != structures[base]:  # type: ignore[operator]
            return make_finding(
                stage,
                f"{what} from {source} has tree structure {structures[source]}, from {base} "
                f"{structures[base]}",
                what=f"{what} tree",
                input=probe.label,
                paths=[path(source)],
            )
    for leaf in named[base]:
        for source in sources:
            value = np.asarray(named[source][leaf])
            if not np.all(np.isfinite(value.astype(np.float64))):
                element = flat_index(
                    int(np.flatnonzero(~np.isfinite(value.astype(np.float64)))[0]), value.shape
                )
                return make_finding(
                    stage,
                    f"{what} of leaf {leaf} via {source} on {probe.label} is not finite "
                    f"(first at {tuple(element)})",
                    what=f"non-finite {what}",
                    input=probe.label,
                    layer=layer_of(leaf),
                    leaf=leaf,
                    paths=[path(source)],
                    element=element,
                )
        for source in sources[1:]:
            result = measure(
                named[base][leaf], named[source][leaf], subject.tolerance, "precision.tolerance"
            )
            pair = f"{path(base)}-vs-{path(source)}"
            evidence.append({"what": f"{what} {leaf} on {probe.label}", "pair": pair, **result})
            if not result["passed"]:
                return make_finding(
                    stage,
                    f"{what} of leaf {leaf} diverges on {probe.label}: {pair}: "
                    + measurement_text(result),
                    what=what,
                    input=probe.label,
                    layer=layer_of(leaf),
                    leaf=leaf,
                    paths=[path(source)],
                    pair=pair,
                    figures=result,
                )
    return None


def loss_stage(subject: Subject) -> StageResult:
    """Stage 5: the loss by the loop, by vmap (the training loss) and through direct
    (when the model has forward_batch)."""
    evidence: list[Evidence] = []
    probes = _targets(subject)
    if not probes:
        return stage_result("loss", evidence, skipped="no input with targets")
    sources: list[str] = []
    for probe in probes:
        losses = _losses(subject, probe)
        sources = list(losses)
        finding = _compare_trees(
            "loss",
            subject,
            probe,
            {k: {"loss": v} for k, v in losses.items()},
            evidence,
            "loss",
        )
        if finding is not None:
            return stage_result("loss", evidence, {**finding, "layer": "loss", "leaf": None})
    return stage_result(
        "loss",
        evidence,
        summary=f"{_and_list(sources)} losses agree on {', '.join(p.label for p in probes)}",
    )


def gradients_stage(subject: Subject) -> StageResult:
    """Stage 6: every leaf's gradient: the mean of per-example gradients (loop) against
    the gradient of the vmap loss and of the direct loss."""
    evidence: list[Evidence] = []
    probes = _targets(subject)
    if not probes:
        return stage_result("gradients", evidence, skipped="no input with targets")
    sources: list[str] = []
    for probe in probes:
        gradients = _gradients(subject, probe)
        sources = ["loop mean" if k == "loop" else k for k in gradients]
        finding = _compare_trees("gradients", subject, probe, gradients, evidence, "gradient")
        if finding is not None:
            return stage_result("gradients", evidence, finding)
    n = len(leaf_paths(subject.params))
    return stage_result(
        "gradients",
        evidence,
        summary=f"gradients of all {n} leaves agree ({', '.join(sources)}) on "
        f"{', '.join(p.label for p in probes)}",
    )


def update_stage(subject: Subject) -> StageResult:
    """Stage 7: one optimizer step from each gradient; the new params leaf by leaf."""
    evidence: list[Evidence] = []
    probes = _targets(subject)
    if subject.optimizer is None:
        return stage_result("update", evidence, skipped="the model is not trained (no optimizer)")
    if not probes:
        return stage_result("update", evidence, skipped="no input with targets")
    # The trainable leaves, {leaf path: array}: what optax steps in training.
    params = partition(subject.model, subject.run_params).trainable(subject.run_params)
    optimizer = subject.optimizer
    for probe in probes:
        updated = {}
        for source, grads in _gradients(subject, probe).items():
            state = optimizer.init(params)
            updates, _ = optimizer.update(grads, state, params)
            updated[source] = optax.apply_updates(params, updates)
        finding = _compare_trees("update", subject, probe, updated, evidence, "updated param")
        if finding is not None:
            return stage_result("update", evidence, finding)
    return stage_result(
        "update",
        evidence,
        summary=f"one optimizer step gives the same params from every gradient on "
        f"{', '.join(p.label for p in probes)}",
    )


# --- 8. jit ---------------------------------------------------------------------------


def jit_stage(subject: Subject) -> StageResult:
    """Stage 8: jit added back: each path's jitted activations against its eager ones,
    then the gradients of the training loss and the per-example gradients under jit."""
    evidence: list[Evidence] = []
    for probe in subject.probes:
        eager = evaluate_probe(subject, probe, jit=False)
        jitted = evaluate_probe(subject, probe, jit=True)
        finding = walk_layers(
            "jit", subject, probe, eager, lambda n: True, evidence, "eager vs jit", against=jitted
        )
        if finding is not None:
            return stage_result("jit", evidence, finding)
    params = subject.run_params
    leaves = partition(subject.model, params)
    loss = make_loss(subject.model)
    grad_one = grad_of_trainable(make_loss_one(subject.model), leaves)
    for probe in _targets(subject):
        x, y = subject.inputs(probe)
        per_example = jax.vmap(grad_one, in_axes=(None, 0, 0))
        for what, eager_fn in (
            ("gradient of the training loss", grad_of_trainable(loss, leaves)),
            (
                "mean per-example gradient",
                lambda p, a, b, f=per_example: jax.tree.map(
                    lambda g: jnp.mean(g, axis=0), f(p, a, b)
                ),
            ),
        ):
            trees = {"eager": eager_fn(params, x, y), "jit": jax.jit(eager_fn)(params, x, y)}
            # The sources are the two modes, named as they are.
            finding = _compare_trees(
                "jit", subject, probe, trees, evidence, what, path=lambda mode: mode
            )
            if finding is not None:
                return stage_result("jit", evidence, finding)
    return stage_result(
        "jit",
        evidence,
        summary="every path under jit agrees with its eager form layer by layer; gradients "
        "under jit agree with eager ones",
    )
