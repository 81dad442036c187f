"""What the diagnosis runs on, and the shape of its results.

:class:`Subject` (the model, params and numerics under diagnosis, with the input ladder
of :class:`Probe`), :class:`DataSources` (the stored data the data stage judges) and
:class:`StoredRun` (the run's outputs); :data:`STAGES`, the protocol's stages in order;
and the helpers every stage reports with (:func:`stage_result`, :func:`make_finding`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vmapcheck.check.schema import Evidence, Finding, StageResult, StageStatus
from vmapcheck.config import DataConfig, ToleranceConfig
from vmapcheck.core.contract import InputSpec, cast_floats, rows
from vmapcheck.core.forms import Keyed, cast_tree, forward_keys, keyed_model, row_keys
from vmapcheck.core.models import Model, Params
from vmapcheck.core.paths import PATHS
from vmapcheck.core.record import ForwardRecord


def _one_device_programs() -> str:
    """The paths the distributed paths are judged against (their ``same_program_as``)."""
    return ", ".join(
        dict.fromkeys(
            p.same_program_as for p in PATHS.values() if p.distributed and p.same_program_as
        )
    )


# (stage, what it examines), in the protocol's order.
STAGES = (
    ("data", "data and preprocessing"),
    ("key_stream", "key stream"),
    ("shapes", "shapes and dtypes"),
    ("forward", "forward without jit, minimal input first, layer by layer"),
    ("loss", "loss"),
    ("gradients", "gradients, leaf by leaf"),
    ("update", "one optimizer update, leaf by leaf"),
    ("jit", "jit added back, path by path"),
    ("backend", "the run's backend against this machine's CPU"),
    ("sharding", f"sharding over the device mesh against {_one_device_programs()}"),
    ("reference", "this run against the stored verified run"),
)
STAGE_NAMES = tuple(name for name, _ in STAGES)


# --- what the diagnosis runs on -------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """An input of the ladder: ``x`` a batch of the model's input contract (``(rows,
    in_features)`` or a dict of leaves, batch axis 0); ``y`` (rows, out_features) or
    None. ``label`` says where it comes from (never its values)."""

    label: str
    x: Any
    y: np.ndarray | None = None


@dataclass(frozen=True)
class Subject:
    """The model and numerics under diagnosis.

    ``params``: as loaded (float32 leaves); they enter every computation cast to
    ``dtype``, as in the forward stage. ``probes``: the input ladder, minimal first.
    ``tolerance``: between paths of one run (precision.tolerance); ``cross_run_tolerance``:
    between backends or runs. ``optimizer``: the training optimizer (None: not trained).
    ``seed``: the key stream's root seed (None: the key stream is not examined).
    """

    model: Model
    params: Params
    dtype: Any
    tolerance: ToleranceConfig
    cross_run_tolerance: ToleranceConfig
    probes: tuple[Probe, ...]
    optimizer: optax.GradientTransformation | None = None
    seed: int | None = None
    # A stochastic model's base key (Model.stochastic): set from ``seed`` (None: 0) when
    # the subject is made, as the forward stage draws it.
    keys: jax.Array | None = None

    def __post_init__(self) -> None:
        # A stochastic model is diagnosed as every path runs it: its keyed_model over
        # Keyed inputs, row i with the forward stage's key (vmapcheck.core.forms). Every
        # stage then walks it as a deterministic model; inputs come keyed (``keyed``).
        if self.model.stochastic:
            object.__setattr__(self, "keys", forward_keys(self.seed or 0))
            object.__setattr__(self, "model", keyed_model(self.model))

    @property
    def run_params(self) -> Params:
        return cast_tree(self.params, self.dtype)

    def keyed(self, x: Any, example: bool = False) -> Any:
        """A batch ``x`` (batch axis 0; one unbatched ``example``) as the subject's model
        takes it: with its row keys (row 0's for an example) for a stochastic model, as
        :func:`vmapcheck.core.forms.with_keys` gives them; else ``x`` itself."""
        if self.keys is None or isinstance(x, Keyed):
            return x
        if example:
            return Keyed(x, row_keys(self.keys, 1)[0])
        return Keyed(x, row_keys(self.keys, rows(x)))

    def inputs(self, probe: Probe) -> tuple[jax.Array, jax.Array | None]:
        x = self.keyed(cast_floats(probe.x, self.dtype))
        y = None if probe.y is None else jnp.asarray(probe.y, dtype=self.dtype)
        return x, y


@dataclass(frozen=True)
class DataSources:
    """Where the data stage finds the stored data: ``cases`` (data/cases), ``prepared``
    (data/prepared), the data config and seed that made them, the folder the raw
    source path is relative to, and the input contract the cases were built for."""

    cases: Path
    prepared: Path
    config: DataConfig
    seed: int
    root: Path
    contract: InputSpec | None = None


@dataclass(frozen=True)
class StoredRun:
    """The run being diagnosed: ``outputs`` (data/forward/outputs.npz, ``<case>.<path>``),
    ``record`` (data/forward/record.json) and the inputs ``cases`` (name -> x) whose
    outputs the backend stage recomputes here."""

    outputs: dict[str, np.ndarray]
    record: ForwardRecord
    cases: dict[str, np.ndarray]


# --- stage results --------------------------------------------------------------------


def make_finding(stage: str, message: str, **fields: Any) -> Finding:
    """The first divergence of a stage; every key present (None when it does not apply).
    ``figures``: a :class:`~vmapcheck.core.record.Measurement`, whose figures (the
    bound ratio, errors, ULPs, tolerance and element) the finding takes."""
    base = {
        "stage": stage,
        "what": None,
        "input": None,
        "layer": None,
        "leaf": None,
        "params_leaves": None,
        "paths": None,
        "pair": None,
        "element": None,
        "bound_ratio": None,
        "max_abs": None,
        "max_rel": None,
        "max_ulp": None,
        "ulp_dtype": None,
        "tolerance": None,
    }
    figures = {k: v for k, v in fields.pop("figures", {}).items() if k in base}
    return cast(Finding, {**base, **figures, **fields, "message": message})


def measurement_text(measured: Mapping[str, Any]) -> str:
    """A measurement's figures (:class:`~vmapcheck.core.record.Measurement`, or a
    finding that took them) as the diagnosis writes them, the deciding one first:
    ``2.1 of its bound, max_rel 0.003, max_abs 4e-05, 5120 ULP (float32) at element
    (0, 3); tolerance rtol=1e-05 atol=1e-06 (precision.tolerance, not widened)``."""
    ratio, element, tol = (measured.get(k) for k in ("bound_ratio", "element", "tolerance"))
    return (
        (f"{ratio:.3g} of its bound, " if ratio is not None else "")
        + f"max_rel {measured['max_rel']:.3g}, max_abs {measured['max_abs']:.3g}, "
        f"{measured['max_ulp']} ULP ({measured['ulp_dtype']})"
        + (f" at element {tuple(element)}" if element else "")
        + (
            f"; tolerance rtol={tol['rtol']:g} atol={tol['atol']:g} ({tol['from']}, not widened)"
            if tol
            else ""
        )
    )


def stage_result(
    name: str,
    evidence: list[Evidence],
    finding: Finding | None = None,
    summary: str = "",
    skipped: str | None = None,
) -> StageResult:
    """Stage ``name``'s result: skipped (``skipped`` says why), diverged (``finding``),
    else ruled out (``summary`` says on what evidence)."""
    title = dict(STAGES)[name]
    status: StageStatus
    if skipped is not None:
        status, summary = "skipped", skipped
    elif finding is not None:
        status, summary = "diverged", finding["message"]
    else:
        status = "ruled_out"
    return {
        "stage": name,
        "title": title,
        "status": status,
        "summary": summary,
        "finding": finding,
        "evidence": evidence,
    }


def error_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def layer_of(leaf: str) -> str:
    """``layers[1].W`` -> ``layers[1]``: the layer a params leaf belongs to."""
    return leaf.rsplit(".", 1)[0] if "." in leaf else leaf


def feeding_leaves(layer: str, leaves: Iterable[str], n_layers: int) -> list[str] | None:
    """The params leaves feeding ``layer``, when the model names its layers after them
    (``layers[1]`` -> ``layers[1].W``, ``layers[1].b``); a one-layer model's leaves all
    feed its one layer."""
    leaves = list(leaves)
    named = [leaf for leaf in leaves if leaf.startswith((f"{layer}.", f"{layer}["))]
    if named:
        return named
    return leaves if n_layers == 1 else None
