"""The layer-by-layer walk shared by the data, forward and jit stages.

Each batched path with activations is evaluated on a probe (:func:`evaluate_probe`, eager or
under ``jax.jit``), its activations lined up by layer (:func:`_layer_table`), and
:func:`walk_layers` finds the first layer where a path is non-finite or two paths disagree.
The paths are the :data:`~vmapcheck.core.paths.PATHS` entries that take a batch and
expose activations; a run is keyed by its entry's form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

import jax
import numpy as np

from vmapcheck.check.diagnosis.subject import (
    Probe,
    Subject,
    error_line,
    feeding_leaves,
    make_finding,
    measurement_text,
)
from vmapcheck.check.schema import Evidence
from vmapcheck.core.compare import flat_index, measure
from vmapcheck.core.forms import OUTPUT
from vmapcheck.core.paths import PATHS, ForwardPath
from vmapcheck.params_io import leaf_paths

if TYPE_CHECKING:
    from vmapcheck.check.schema import AgreedLayer, Finding
    from vmapcheck.core.record import Measurement


@dataclass
class _Run:
    """One form evaluated on one probe."""

    path: str
    names: list[str]
    arrays: list[np.ndarray]
    per_layer: bool
    error: str | None = None
    note: str | None = None


def evaluate_probe(subject: Subject, probe: Probe, jit: bool) -> dict[str, _Run]:
    """Each form's activations on ``probe`` (eager, or under jax.jit), checked against
    the form's own forward: activations that do not reproduce it are not trusted per
    layer, and the form is compared on its forward's output alone."""
    params = subject.run_params
    x, _ = subject.inputs(probe)
    runs: dict[str, _Run] = {}
    for entry in layered_paths(jit):
        form = entry.form
        assert entry.activations is not None  # layered_paths keeps those that have them
        activations = entry.activations(subject.model)
        plain = entry.forward(subject.model)
        if activations is None or plain is None:
            continue
        layers, per_layer = activations
        path = entry.name
        try:
            fn = jax.jit(layers) if jit else layers
            arrays = [np.asarray(a) for a in jax.block_until_ready(fn(params, x))]
            names = list(layers.names)
            forward = jax.jit(plain) if jit else plain
            out = np.asarray(jax.block_until_ready(forward(params, x)))
        except Exception as exc:  # a crashing path is a finding, not the diagnosis' end
            runs[form] = _Run(path, [], [], False, error=error_line(exc))
            continue
        run = _Run(path, names, arrays, per_layer)
        same = measure(arrays[-1], out, subject.tolerance, "precision.tolerance")
        if not (same["passed"] or _same_non_finite(arrays[-1], out)):
            run.note = (
                f"the activations of {path} do not reproduce its forward output "
                f"({same['reason']}): compared on the forward's output only"
            )
            run.names, run.arrays, run.per_layer = [OUTPUT], [out], False
        runs[form] = run
    return runs


def layered_paths(jit: bool) -> list[ForwardPath]:
    """The batched paths the diagnosis walks layer by layer, in one mode."""
    return [
        p
        for p in PATHS.values()
        if p.takes == "batch" and p.activations is not None and p.jit == jit
    ]


def _same_non_finite(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


def _layer_table(runs: dict[str, _Run]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """[(layer, {form: activation})] in the loop's layer order; a form known only by its
    output joins at the last layer."""
    ordered = [r for r in runs.values() if r.error is None]
    per_layer = [r for r in ordered if r.per_layer]
    names = per_layer[0].names if per_layer else [OUTPUT]
    table = []
    for i, name in enumerate(names):
        last = i == len(names) - 1
        arrays = {}
        for form, run in runs.items():
            if run.error is not None:
                continue
            if run.per_layer and name in run.names:
                arrays[form] = run.arrays[run.names.index(name)]
            elif last and not run.per_layer:
                arrays[form] = run.arrays[-1]
        table.append((name, arrays))
    return table


def _odd_paths(failing: list[tuple[str, str]], forms: list[str]) -> list[str]:
    """The forms in every failing pair (the odd one out), else all forms of those pairs."""
    counts = {f: sum(f in pair for pair in failing) for f in forms}
    top = max(counts.values())
    odd = [f for f in forms if counts[f] == top and top == len(failing)]
    return odd or sorted({f for pair in failing for f in pair}, key=forms.index)


def walk_layers(
    stage: str,
    subject: Subject,
    probe: Probe,
    runs: dict[str, _Run],
    only: Callable[[str], bool],
    evidence: list[Evidence],
    mode: str,
    against: dict[str, _Run] | None = None,
) -> Finding | None:
    """Layer by layer (``only`` selects the layers), the first where a path is
    non-finite or two paths disagree. ``against``: compare each form with its own
    counterpart there (eager against jit) instead of the forms with one another."""
    leaves = list(leaf_paths(subject.params))
    for run in [*runs.values(), *(against or {}).values()]:
        if run.error is not None:
            evidence.append({"what": f"{run.path} on {probe.label}", "passed": False})
            return make_finding(
                stage,
                f"{run.path} raised on {probe.label}: {run.error}",
                what="path raised",
                input=probe.label,
                paths=[run.path],
            )
    table = _layer_table(runs)
    other = dict(_layer_table(against)) if against is not None else None
    n_layers = len(table)
    agreed: list[AgreedLayer] = []  # the layers before the divergence, and how close
    for name, arrays in table:
        if not only(name):
            continue
        if against is not None and other is not None:
            pairs = [
                (runs[f].path, against[f].path, arrays[f], other[name][f])
                for f in arrays
                if f in other.get(name, {})
            ]
        else:
            forms = list(arrays)
            pairs = [
                (runs[f].path, runs[g].path, arrays[f], arrays[g])
                for f, g in combinations(forms, 2)
            ]
        candidates = [(runs[f].path, a) for f, a in arrays.items()]
        if against is not None and other is not None:
            candidates += [(against[f].path, a) for f, a in other.get(name, {}).items()]
        non_finite = {
            path: arr
            for path, arr in candidates
            if not np.all(np.isfinite(np.asarray(arr, dtype=np.float64)))
        }
        failing: list[tuple[str, str, Measurement]] = []
        results = []
        for left, right, a, b in pairs:
            result = measure(a, b, subject.tolerance, "precision.tolerance")
            results.append(result)
            evidence.append(
                {"what": f"{name} on {probe.label}", "pair": f"{left}-vs-{right}", **result}
            )
            if not result["passed"]:
                failing.append((left, right, result))
        if not failing and not non_finite:
            agreed.append(
                {
                    "layer": name,
                    "max_abs": max(
                        (err for r in results if (err := r["max_abs"]) is not None), default=0.0
                    ),
                    "max_ulp": max(
                        (ulp for r in results if (ulp := r["max_ulp"]) is not None), default=0
                    ),
                }
            )
            continue
        params_leaves = feeding_leaves(name, leaves, n_layers)
        role = "preprocessing step" if name in subject.model.preprocessing else "layer"
        if non_finite:
            paths = list(non_finite)
            first_path, arr = next(iter(non_finite.items()))
            bad = ~np.isfinite(np.asarray(arr, dtype=np.float64))
            element = flat_index(int(np.flatnonzero(bad)[0]), arr.shape)
            kinds = "NaN" if np.isnan(np.asarray(arr, dtype=np.float64)).any() else "Inf"
            return make_finding(
                stage,
                f"non-finite values ({kinds}) first appear at {role} {name} on {probe.label} "
                f"in {', '.join(paths)} ({int(bad.sum())} element(s) in {first_path}, first at "
                f"{tuple(element)}); every earlier {role} is finite",
                what="non-finite activation",
                input=probe.label,
                layer=name,
                params_leaves=params_leaves,
                paths=paths,
                element=element,
                agreed_before=agreed,
            )
        pair_paths = [(left, right) for left, right, _ in failing]
        all_paths = list(dict.fromkeys(p for pair in pair_paths for p in pair))
        odd = _odd_paths(pair_paths, all_paths) if other is None else all_paths
        left, right, result = next((f for f in failing if set(odd) & {f[0], f[1]}), failing[0])
        dtypes = {runs[f].path: str(arrays[f].dtype) for f in arrays}
        return make_finding(
            stage,
            f"{role} {name} diverges on {probe.label} ({mode}): {left} vs {right}: "
            + measurement_text(result),
            what="activation",
            input=probe.label,
            layer=name,
            params_leaves=params_leaves,
            paths=odd,
            pair=f"{left}-vs-{right}",
            figures=result,
            dtypes=dtypes,
            agreed_before=agreed,
        )
    return None
