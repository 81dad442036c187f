"""The forward paths: one :data:`PATHS` entry per path, and every consumer iterates it.

A path is a way of computing the model's outputs for a batch ``X`` (batch axis 0) or for
one example: a *form* (how the batch is formed from the model's functions, see
:mod:`vmapcheck.core.forms`) run eager or under ``jax.jit``. The forward stage runs
every entry, check compares every pair, bench times every entry at every batch size,
the diagnosis evaluates every entry that has activations, and plots, tracking and the
report list them in this order. No code elsewhere parses a path's name or tests for a
literal one: a question about a path is an attribute of its entry.

To add a path: write its form in :mod:`vmapcheck.core.forms` and add one entry below
(docs/development.md); dvc.yaml's plot lists its CSV.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from vmapcheck.core.record import MeshRecord
from vmapcheck.errors import ConfigError

# The registry's facts (names, modes, caps, what each path computes) are read by the
# report, track's HTML and the CLI, which run no JAX: JAX, the forms and the models are
# imported only where a path is built or run.
if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

    from vmapcheck.core import forms
    from vmapcheck.core.models import Model, Params

    Forward = Callable[[Params, Any], jax.Array]
else:
    Forward = Callable[..., Any]


def _form(name: str) -> Callable[..., Any]:
    """``vmapcheck.core.forms.<name>``, imported at its first call (see above)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module("vmapcheck.core.forms"), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"vmapcheck.core.forms.{name}, imported at its first call."
    return call


@dataclass(frozen=True)
class Compiled:
    """A path ready to call: ``finish(fn(*place(params, x)), rows)``.

    ``fn`` is what runs (already ``jax.jit``-ed for a jit path, so ``fn.lower(...)``
    gives its compiled cost); ``place`` puts params and the batch where ``fn`` expects
    them (a distributed path shards them); ``finish`` drops whatever ``place`` added
    (padding rows). ``devices``: how many devices the program runs on (XLA's cost
    analysis is per device); ``rows_run(rows)``: the rows actually computed.
    """

    fn: Forward
    place: Callable[[Params, Any], tuple[Params, Any]] = lambda params, x: (params, x)
    finish: Callable[[jax.Array, int], jax.Array] = lambda out, _rows: out
    devices: int = 1
    rows_run: Callable[[int], int] = lambda rows: rows
    about: MeshRecord | None = None
    # The batch's row count (vmapcheck.core.contract.rows), given by the builder, which
    # has JAX loaded already: no import on a call.
    rows_of: Callable[[Any], int] = field(kw_only=True)

    def __call__(self, params: Params, x: Any) -> jax.Array:
        return self.finish(self.fn(*self.place(params, x)), self.rows_of(x))


def _single_device(path: ForwardPath, model: Model, _mesh: Mesh | None) -> Compiled | None:
    import jax

    from vmapcheck.core.contract import rows

    fn = path.forward(model)
    if fn is None:
        return None
    return Compiled(jax.jit(fn) if path.jit else fn, rows_of=rows)


def _sharded(path: ForwardPath, model: Model, mesh: Mesh | None) -> Compiled:
    from vmapcheck.core import contract, forms
    from vmapcheck.core.mesh import view

    # Every device of the run's mesh on the one axis "data" (the run's mesh may be 2-D).
    mesh = view(mesh if mesh is not None else forms.data_mesh(), path.mesh_axes)
    sharded = forms.ShardedForward(model, mesh, path.name)
    return Compiled(
        fn=sharded.jitted,
        place=lambda params, x: (sharded.place_params(params), sharded.place_batch(x)),
        finish=sharded.finish,
        devices=sharded.devices,
        rows_run=sharded.padded_rows,
        about=sharded.describe(),
        rows_of=contract.rows,
    )


def _partitioned(path: ForwardPath, model: Model, mesh: Mesh | None) -> Compiled:
    """A tensor-parallel path (vmapcheck.core.mesh): params split over "model", and the
    batch over "data" when the path's mesh has that axis."""
    from vmapcheck.core import contract, forms
    from vmapcheck.core.mesh import MeshForward, view

    mesh = view(mesh if mesh is not None else forms.data_mesh(), path.mesh_axes)
    split = MeshForward(model, mesh, path.name, split_batch=forms.DATA_AXIS in path.mesh_axes)
    return Compiled(
        fn=split.jitted,
        place=lambda params, x: (split.place_params(params), split.place_batch(x)),
        finish=split.finish,
        devices=split.devices,
        rows_run=split.padded_rows,
        about=split.describe(),
        rows_of=contract.rows,
    )


@dataclass(frozen=True)
class ForwardPath:
    """One forward path and everything the pipeline needs to know about it.

    Attributes:
        name: the path's name in outputs, reports, metrics and plots (``vmap_jit``).
        form: the form it computes (shared by its eager and jit entries).
        jit: whether it runs under ``jax.jit`` (else eager).
        takes: ``"batch"``: ``X`` (rows, *example) -> (rows, *out), batch axis 0;
            ``"vector"``: one example, unbatched.
        about: one line for reports: what it computes.
        forward: the form, untransformed: ``model -> (params, x) -> y``; returns None
            when the model lacks it (then ``missing`` says why).
        activations: ``model -> (Layers, per_layer)`` on a batch, for the diagnosis'
            layer-by-layer comparison; None: the diagnosis compares its output only.
        build: ``(path, model, mesh) -> Compiled | None``; the default jit-compiles
            ``forward`` for a jit path.
        bench_cap: the ``bench.*`` setting capping the batch sizes it is timed at.
        forward_cap: the ``budget.*`` setting capping the rows of a valid case it runs
            in the forward stage (:func:`row_cap`); check compares it with the other
            paths on those rows, and its report says so.
        same_program_as: a path computing the same program on one device; a
            distributed path is judged against it, and a stored reference made before
            this path existed stands in with that path's output.
        mesh_axes: the mesh axes it splits over (``("data",)``: the batch,
            ``("model",)``: the params, both: a 2-D mesh); empty for a one-device path.
            A path with any is ``distributed`` (not vmap: vmap vectorizes on one
            device), and the diagnosis names its axes when it is the first to diverge.
        parallelism: how it distributes, in the words every output uses beside "not
            vmap" ("data-parallel", "tensor-parallel", ...); "" for a one-device path.
        headline: shown in run comparisons (``vmapcheck compare``).
        plain: the untransformed per-example path (the loop, eager): the one a case's
            loss is computed from, against the stored reference.
        no_eager: why the form has no eager entry ("" when it has one).
        flops_as: a path doing the same arithmetic whose flop count stands for this
            one's, where XLA's cost analysis cannot count it (a loop's body is counted
            once, whatever its trip count).
    """

    name: str
    form: str
    jit: bool
    takes: Literal["batch", "vector"]
    about: str
    forward: Callable[[Model], Forward | None]
    activations: Callable[[Model], forms.Activations | None] | None = None
    missing: str = ""
    build: Callable[[ForwardPath, Model, Mesh | None], Compiled | None] = field(
        default=_single_device
    )
    bench_cap: str | None = None
    forward_cap: str | None = None
    same_program_as: str | None = None
    mesh_axes: tuple[str, ...] = ()
    parallelism: str = ""
    headline: bool = False
    plain: bool = False
    no_eager: str = ""
    flops_as: str | None = None

    @property
    def distributed(self) -> bool:
        """Runs on a mesh of devices (data or tensor parallelism, not vmap)."""
        return bool(self.mesh_axes)

    @property
    def mode(self) -> str:
        """``"jit"`` or ``"eager"``."""
        return "jit" if self.jit else "eager"

    def compile(
        self, model: Model, mesh: Mesh | None = None, key: jax.Array | None = None
    ) -> Compiled | None:
        """This path for ``model``; None when the model lacks its form.

        A stochastic model (``Model.stochastic``) is compiled as its
        :func:`~vmapcheck.core.forms.keyed_model`, and ``place`` gives an input that is
        not :class:`~vmapcheck.core.forms.Keyed` yet its row keys split from ``key`` (the
        run's :func:`~vmapcheck.core.forms.forward_keys`; None: those of seed 0, the
        Python API's default), so row ``i`` of any path gets the same key.
        """
        if not model.stochastic:
            return self.build(self, model, mesh)
        from vmapcheck.core import forms

        compiled = self.build(self, forms.keyed_model(model), mesh)
        if compiled is None:
            return None
        base = key if key is not None else forms.forward_keys(0)
        example = self.takes == "vector"
        place = compiled.place

        def keyed_place(params: Params, x: Any) -> tuple[Params, Any]:
            return place(params, forms.with_keys(model, x, base, example=example))

        return replace(compiled, place=keyed_place)


def _eager_and_jit(
    name: str,
    about: str,
    headline: bool = False,
    plain: bool = False,
    same_form_as: str | None = None,
    **fields: Any,
) -> list[ForwardPath]:
    """The form ``name`` eager and under jit (``headline``: the jit entry is shown in
    run comparisons; ``plain``: the eager entry is the plain path; ``same_form_as``: a
    form computing the same program, each mode standing for the same mode)."""
    return [
        ForwardPath(
            name=f"{name}_eager",
            form=name,
            jit=False,
            about=about,
            plain=plain,
            same_program_as=f"{same_form_as}_eager" if same_form_as else None,
            **fields,
        ),
        ForwardPath(
            name=f"{name}_jit",
            form=name,
            jit=True,
            about=f"jax.jit({about})",
            headline=headline,
            same_program_as=f"{same_form_as}_jit" if same_form_as else None,
            **fields,
        ),
    ]


def _compiled_loop(form: str, about: str) -> ForwardPath:
    """The per-row loop compiled once by the ``lax`` primitive ``form`` (map, scan): jit
    only, since outside jit it traces and compiles its body on every call. A stored
    reference made before it existed stands in with the unrolled loop's output
    (``loop_jit``), and its flops are vmap's (XLA's cost analysis counts a loop's body
    once, whatever its trip count)."""
    return ForwardPath(
        name=f"{form}_jit",
        form=form,
        jit=True,
        takes="batch",
        about=about,
        forward=_form(f"{form}_forward"),
        activations=_form(f"{form}_activations"),
        same_program_as="loop_jit",
        no_eager=f"outside jit, lax.{form} traces and compiles its body on every call",
        flops_as="vmap_jit",
    )


_NO_DIRECT = "provides no hand-batched forward (forward_batch)"

# lax.map's batch_size for chunked_jit: small, so that the shipped cases (32 rows, one
# row) meet both of its parts: the vmapped chunks and, for rows not a multiple of it, the
# rows left over, vmapped on their own after the loop.
_CHUNK_ROWS = 4

PATHS: dict[str, ForwardPath] = {
    p.name: p
    for p in [
        *_eager_and_jit(
            "loop",
            "stack([forward_one(params, x) for x in X])",
            takes="batch",
            forward=_form("loop_forward"),
            activations=_form("loop_activations"),
            plain=True,
            # One Python-level forward per row, unrolled by jit: capped in the benchmark,
            # and in the forward stage by the budget.
            bench_cap="loop_max_batch",
            forward_cap="loop_max_rows",
        ),
        _compiled_loop(
            "map",
            "jax.jit(lax.map(lambda x: forward_one(params, x), X)): the per-row loop "
            "compiled once, as a scan over the rows",
        ),
        _compiled_loop(
            "scan",
            "jax.jit(lax.scan(lambda _, x: (_, forward_one(params, x)), None, X)): one "
            "row at a time in a compiled loop, no carry",
        ),
        ForwardPath(
            name="chunked_jit",
            form="chunked",
            jit=True,
            takes="batch",
            about=f"jax.jit(lax.map(lambda x: forward_one(params, x), X, "
            f"batch_size={_CHUNK_ROWS})): the rows {_CHUNK_ROWS} at a time under vmap in a "
            "compiled loop, the rows left over vmapped after it",
            forward=partial(_form("chunked_forward"), batch_size=_CHUNK_ROWS),
            activations=partial(_form("chunked_activations"), batch_size=_CHUNK_ROWS),
            # A stored reference made before this path existed stands in with vmap's
            # output, the program each chunk runs; XLA counts a loop's body once.
            same_program_as="vmap_jit",
            no_eager="outside jit, lax.map traces and compiles its body on every call",
            flops_as="vmap_jit",
        ),
        *_eager_and_jit(
            "vmap",
            "vmap(forward_one, in_axes=(None, 0))(params, X)",
            takes="batch",
            forward=_form("vmap_forward"),
            activations=_form("vmap_activations"),
            headline=True,
        ),
        *_eager_and_jit(
            "vmap_of_jit",
            "vmap(jit(forward_one), in_axes=(None, 0))(params, X)",
            takes="batch",
            forward=_form("vmap_of_jit_forward"),
            activations=_form("vmap_of_jit_activations"),
            same_form_as="vmap",
        ),
        *_eager_and_jit(
            "direct",
            "forward_batch(params, X), the model's hand-batched form",
            takes="batch",
            forward=_form("direct_forward"),
            activations=_form("direct_activations"),
            missing=_NO_DIRECT,
            headline=True,
        ),
        ForwardPath(
            name="sharded_jit",
            form="sharded",
            jit=True,
            takes="batch",
            about="jit(vmap(forward_one)) with the batch axis split over a device mesh "
            "(data parallelism, not vmap)",
            forward=_form("vmap_forward"),
            build=_sharded,
            same_program_as="vmap_jit",
            mesh_axes=("data",),
            parallelism="data-parallel",
        ),
        ForwardPath(
            name="tensor_parallel_jit",
            form="tensor_parallel",
            jit=True,
            takes="batch",
            about="jit(vmap(forward_one)) with the params split over the mesh axis 'model' "
            "by the model's partitioning (or the default rule), the batch replicated "
            "(tensor parallelism, not vmap)",
            forward=_form("vmap_forward"),
            build=_partitioned,
            same_program_as="vmap_jit",
            mesh_axes=("model",),
            parallelism="tensor-parallel",
        ),
        ForwardPath(
            name="data_model_jit",
            form="data_model",
            jit=True,
            takes="batch",
            about="jit(vmap(forward_one)) on a 2-D mesh: the batch split over 'data', the "
            "params over 'model' (data and tensor parallelism, not vmap)",
            forward=_form("vmap_forward"),
            build=_partitioned,
            same_program_as="vmap_jit",
            mesh_axes=("data", "model"),
            parallelism="data- and tensor-parallel",
        ),
        *_eager_and_jit(
            "one",
            "forward_one(params, x) on one unbatched example",
            takes="vector",
            forward=_form("one_forward"),
        ),
    ]
}


@dataclass(frozen=True)
class Speedup:
    """A same-run ratio of p50 latencies: ``p50[slower] / p50[faster]`` at each batch size."""

    name: str
    slower: str
    faster: str
    about: str
    # The path vmap is measured against: the plots draw the ratio in its colour.
    against: str


SPEEDUPS = (
    Speedup(
        "vmap_over_loop",
        "loop_jit",
        "vmap_jit",
        "how many times faster vmap is than loop",
        against="loop_jit",
    ),
    Speedup(
        "vmap_over_direct",
        "vmap_jit",
        "direct_jit",
        "vmap's cost against hand-batched",
        against="direct_jit",
    ),
    Speedup(
        "vmap_over_map",
        "map_jit",
        "vmap_jit",
        "how many times faster vmap is than lax.map, a per-row loop compiled once (timed "
        "at every batch size, where the unrolled loop is capped)",
        against="map_jit",
    ),
)


# The plots' colours, in the order series take them: Tableau's 20 (Vega's ``tableau20``,
# matplotlib's ``tab20``) with the ten strong colours first, so the first ten series are
# told apart at a glance, then their light twins.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
    "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip


def series_colours() -> dict[str, str]:
    """Series name -> colour (``#rrggbb``): every batch path in registry order, each its
    own :data:`PALETTE` colour, then every :data:`SPEEDUPS` entry in the colour of the
    path vmap is measured against (``against``: vmap_over_loop is loop_jit's colour).
    The one place a plotted series gets its colour: the DVC plots' Vega templates (a
    scale with this domain and range, written by ``vmapcheck init``), the PNGs of
    reports/plots/ and the HTML report all read it, so a path has one colour everywhere,
    in every run (a path a model lacks keeps its colour, unused). A path added to
    :data:`PATHS` takes the next colour.

    Raises:
        ValueError: more batch paths than :data:`PALETTE` has colours (add colours to
            it), or a speed-up measured against a path that is no batch path.
    """
    names = [p.name for p in batch_paths()]
    if len(names) > len(PALETTE):
        raise ValueError(
            f"{len(names)} batch paths but PALETTE in vmapcheck.core.paths has "
            f"{len(PALETTE)} colours: add colours to it"
        )
    colours = dict(zip(names, PALETTE, strict=False))
    for speedup in SPEEDUPS:
        if speedup.against not in colours:
            raise ValueError(
                f"speed-up {speedup.name!r}: against={speedup.against!r} is no batch path "
                f"of PATHS ({', '.join(names)})"
            )
        colours[speedup.name] = colours[speedup.against]
    return colours


def speedup_text(ratio: float, interval: Sequence[float] | None = None) -> str:
    """A :data:`SPEEDUPS` ratio as the reports word it: ``1.29x (CI 1.20-1.40)``; ``no
    measurable difference (CI 0.95-1.10)`` when its confidence interval
    (:func:`vmapcheck.bench.timing.latency.speedup_intervals`) holds 1.0, neither a speed-up nor
    a slowdown; ``1.29x`` without an interval."""
    if interval is None or len(interval) != 2:
        return f"{ratio:.2f}x"
    low, high = interval
    ci = f"CI {low:.2f}-{high:.2f}"
    return f"no measurable difference ({ci})" if low <= 1.0 <= high else f"{ratio:.2f}x ({ci})"


def row_cap(path: ForwardPath, budget: Any, rows: int) -> int | None:
    """The rows ``path`` runs of a valid batch case of ``rows`` rows in the forward
    stage when ``budget`` (a :class:`vmapcheck.config.BudgetConfig`) caps it below them,
    else None (it runs them all; ``budget`` None: no budget)."""
    if budget is None or path.forward_cap is None:
        return None
    cap = getattr(budget, path.forward_cap)
    return cap if rows > cap else None


def batch_paths() -> list[ForwardPath]:
    """The entries that take a batch (batch axis 0), in registry order."""
    return [p for p in PATHS.values() if p.takes == "batch"]


def vector_paths() -> list[ForwardPath]:
    """The entries that take one unbatched example."""
    return [p for p in PATHS.values() if p.takes == "vector"]


def path_names(takes: str) -> tuple[str, ...]:
    """Names of the entries that take ``takes`` ("batch" or "vector")."""
    return tuple(p.name for p in PATHS.values() if p.takes == takes)


def plain_path() -> str:
    """The name of the plain path (untransformed, per example)."""
    return next(p.name for p in PATHS.values() if p.plain)


def twin(path: ForwardPath) -> ForwardPath | None:
    """The same form in the other mode (eager <-> jit), if registered."""
    return next((p for p in PATHS.values() if p.form == path.form and p.jit != path.jit), None)


def get(name: str) -> ForwardPath:
    """The entry named ``name``; an unknown name is an error, never a silent default."""
    try:
        return PATHS[name]
    except KeyError:
        raise KeyError(f"unknown forward path {name!r}; registered: {', '.join(PATHS)}") from None


def output_key(case: str, path: str) -> str:
    """Key of one output in data/forward/outputs.npz, e.g. ``standard.vmap_jit``."""
    return f"{case}.{path}"


def split_output_key(key: str) -> tuple[str, ForwardPath]:
    """``standard.vmap_jit`` -> (``standard``, the vmap_jit entry); the path must be known."""
    case, _, name = key.rpartition(".")
    return case, get(name)


def not_provided(model: Model) -> dict[str, str]:
    """Paths this model cannot have, with the reason (reported, not failed)."""
    return {
        p.name: f"model {model.name!r} {p.missing}"
        for p in PATHS.values()
        if p.missing and p.forward(model) is None
    }


def describe_distributed(model: Model, mesh: Mesh | None) -> MeshRecord | None:
    """What the distributed path ran on (devices, mesh, padding), for the reports; None
    when no registered path is distributed."""
    for p in PATHS.values():
        if p.distributed:
            compiled = p.compile(model, mesh)
            return compiled.about if compiled is not None else None
    return None


def describe_meshes(
    model: Model, mesh: Mesh | None, selected: Sequence[str] | None = None
) -> dict[str, MeshRecord]:
    """Every distributed path's mesh (its ``Compiled.about``: parallelism, devices, mesh
    shape by axis, padding; a mesh of one device says so), by path name, for the records
    and the diagnosis; ``selected``: only those paths (None: all)."""
    described: dict[str, MeshRecord] = {}
    for p in PATHS.values():
        if p.distributed and (selected is None or p.name in selected):
            compiled = p.compile(model, mesh)
            if compiled is not None and compiled.about is not None:
                described[p.name] = compiled.about
    return described


def mesh_label(about: Mapping[str, Any]) -> str:
    """One line naming a distributed path's parallelism and mesh from its description
    (:func:`describe_meshes`), as every output words it: ``tensor_parallel_jit
    (tensor-parallel over mesh model=8, not vmap)``; ``(..., a mesh of 1: nothing split,
    ...)`` when it ran on one device. A description older than ``parallelism`` is
    sharded_jit's, the only distributed path then: data-parallel."""
    shape = " x ".join(f"{axis}={size}" for axis, size in about.get("mesh_shape", {}).items())
    parallelism = about.get("parallelism", "data-parallel")
    one = ", a mesh of 1: nothing split" if about.get("devices") == 1 else ""
    if not one and about.get("mesh_shape", {}).get("model") == 1:
        one = ", a model axis of 1: no param split"
    return f"{about['path']} ({parallelism} over mesh {shape}{one}, not vmap)"


def mesh_axis_blamed(path: ForwardPath, shape: Mapping[str, int | str], agreeing: set[str]) -> str:
    """The mesh axis (or axes) ``path``'s divergence lies on, in words (``mesh axis
    'model' (8 devices)``): its axes of more than one device in ``shape`` (its mesh's
    ``mesh_shape``: axis -> devices, "?" where not recorded; an axis of 1 splits
    nothing), less those along which another
    distributed path of the same run, named in ``agreeing`` and splitting over that axis
    alone, agreed. The diagnosis and the Python API's summary both word it so."""
    split = [a for a in path.mesh_axes if shape.get(a) != 1]
    cleared = {PATHS[name].mesh_axes[0] for name in agreeing if len(PATHS[name].mesh_axes) == 1}
    blamed = [a for a in split if a not in cleared] or split or list(path.mesh_axes)
    sizes = ", ".join(f"{a!r} ({shape.get(a, '?')} devices)" for a in blamed)
    why = (
        f"; {', '.join(sorted(cleared & set(split)))} alone agreed"
        if cleared & set(split) and len(blamed) < len(split)
        else ""
    )
    return f"mesh axis {sizes}{why}"


def _guarded(compiled: Compiled, check: Callable[[Any], None]) -> Forward:
    def guarded(params: Params, x: Any) -> jax.Array:
        check(x)
        return compiled(params, x)

    return guarded


def build(
    model: Model,
    dtype: Any,
    takes: str = "batch",
    validate: bool = True,
    mesh: Mesh | None = None,
    key: jax.Array | None = None,
) -> dict[str, Forward]:
    """Every path that takes ``takes``, built for ``model``: name -> ``(params, x) -> y``.

    Paths the model lacks are left out (:func:`not_provided` says why). ``mesh``: the
    devices of distributed paths (None: every device present). With ``validate`` (the
    default) each path refuses an invalid input before dispatch, identically. ``key``:
    a stochastic model's base key (:meth:`ForwardPath.compile`); ``x`` may then also be
    a :class:`~vmapcheck.core.forms.Keyed` batch carrying its own row keys.

    Raises:
        ConfigError: ``dtype`` is no float a run can have
            (:func:`vmapcheck.core.contract.float_dtype_problem`), or ``takes`` is neither
            "batch" nor "vector".
    """
    from vmapcheck.core import contract, forms

    problem = contract.float_dtype_problem(dtype)
    if problem:
        raise ConfigError(f"dtype (the run's precision): {problem}")
    if takes not in ("batch", "vector"):
        raise ConfigError(f"takes: expected 'batch' or 'vector', got {takes!r}")
    if takes == "batch":
        check = lambda x: forms.validate_batch(x, model, dtype)  # noqa: E731
    else:
        check = lambda x: forms.validate_vector(x, model, dtype)  # noqa: E731
    built: dict[str, Forward] = {}
    for path in PATHS.values():
        if path.takes != takes:
            continue
        compiled = path.compile(model, mesh, key)
        if compiled is None:
            continue
        built[path.name] = _guarded(compiled, check) if validate else compiled
    return built


def build_paths(
    model: Model,
    dtype: Any,
    validate: bool = True,
    mesh: Mesh | None = None,
    key: jax.Array | None = None,
) -> dict[str, Forward]:
    """The batched paths (:func:`build` with ``takes="batch"``)."""
    return build(model, dtype, "batch", validate, mesh, key)


def build_vector_paths(
    model: Model, dtype: Any, key: jax.Array | None = None
) -> dict[str, Forward]:
    """``forward_one`` itself, eager and jit, for one unbatched example."""
    return build(model, dtype, "vector", key=key)
