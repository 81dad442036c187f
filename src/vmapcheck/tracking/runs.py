"""``vmapcheck compare`` (``make compare``): logged runs side by side.

One row per run, newest first: the last ``-n`` runs, or those an MLflow filter string
picks (``--filter "tags.model = 'mlp' and tags.precision = 'f64'"``), from every
experiment of this project (``tracking.experiment`` and ``<experiment>-<model>``,
see ``tracking.experiment_per_model``), or one (``--experiment``), or all (``--all``).

Columns: run name, start time, verdict, benchmark verdict, jax (/jaxlib when it differs),
backend/device, precision, git commit (``*``: dirty), the worst ``max_rel`` of three
families of agreement metrics (``agree/*/*/max_rel``: between paths;
``reference/*/*/max_rel``: against the stored reference; ``oracle/*/*/max_rel``: against
float64), then the p50 latency of ``vmap_jit`` and ``direct_jit`` and ``vmap_over_loop``
at the largest batch size that every listed run measured (``latency_ms/<path>/b<batch>/p50``,
``speedup/b<batch>/vmap_over_loop``). ``-`` marks a figure a run does not have.

The verdict column holds a complete run's verdict (vmapcheck.tracking.store.is_complete);
any other run shows its status: ``failed`` for one a killed ``track`` left unfinished
(marked so by the next ``track``), ``running``, or ``incomplete``.
"""

from __future__ import annotations

import datetime
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmapcheck.core.paths import PATHS
from vmapcheck.errors import VmapcheckError
from vmapcheck.layout import Layout
from vmapcheck.tracking.store import is_complete

# The paths whose p50 latency each row shows.
HEADLINE = tuple(p.name for p in PATHS.values() if p.headline)

DEFAULT_N = 10
MAX_N = 1000
WORST = {"agree max_rel": "agree", "ref max_rel": "reference", "f64 max_rel": "oracle"}
LATENCY = re.compile(r"^latency_ms/vmap_jit/b(\d+)/p50$")


class CompareError(VmapcheckError):
    """Nothing to compare, or the store or filter cannot be read."""


@dataclass(frozen=True)
class Selection:
    """The runs picked (newest first) and from where, for the table's title."""

    runs: list[Any]
    experiments: list[str]
    tracking_uri: str


def _store_exists(tracking_uri: str) -> bool:
    """False for a sqlite store whose file does not exist (MLflow would create it)."""
    prefix = "sqlite:///"
    if tracking_uri.startswith(prefix):
        return Path(tracking_uri[len(prefix) :]).is_file()
    return True


def project_experiments(client: Any, prefix: str | None) -> list[Any]:
    """Active experiments named ``prefix`` or ``prefix-<anything>`` (every one for None),
    sorted by name."""
    from mlflow.entities import ViewType

    # The config pattern keeps quotes out of prefix; LIKE's "_" is re-checked below.
    filter_string = None if prefix is None else f"name LIKE '{prefix}%'"
    found, token = [], None
    while True:
        page = client.search_experiments(
            view_type=ViewType.ACTIVE_ONLY,
            filter_string=filter_string,
            max_results=1000,
            page_token=token,
        )
        found.extend(page)
        token = page.token
        if not token:
            break
    if prefix is not None:
        found = [e for e in found if e.name == prefix or e.name.startswith(f"{prefix}-")]
    return sorted(found, key=lambda e: e.name)


def select_runs(
    tracking_uri: str,
    n: int = DEFAULT_N,
    filter_string: str | None = None,
    prefix: str | None = None,
    experiment: str | None = None,
) -> Selection:
    """The newest ``n`` runs matching ``filter_string`` in ``experiment`` (exact name) or
    in every experiment of ``prefix`` (None with no ``experiment``: every experiment).

    Raises:
        CompareError: no store, no such experiment, no run, or a filter MLflow refuses.
    """
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if not 1 <= n <= MAX_N:
        raise CompareError(f"-n: expected a number of runs from 1 to {MAX_N}, got {n}")
    if not _store_exists(tracking_uri):
        raise CompareError(
            f"no MLflow store at {tracking_uri}: nothing logged yet (make demo logs a run)"
        )
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        if experiment is not None:
            found = client.get_experiment_by_name(experiment)
            experiments = [found] if found is not None and found.lifecycle_stage == "active" else []
        else:
            experiments = project_experiments(client, prefix)
    except MlflowException as exc:
        raise CompareError(f"cannot read experiments from {tracking_uri}: {exc.message}") from None
    if not experiments:
        wanted = (
            f"experiment {experiment!r}"
            if experiment is not None
            else "any experiment"
            if prefix is None
            else f"experiment {prefix!r} or {prefix + '-<model>'!r}"
        )
        raise CompareError(
            f"no {wanted} in {tracking_uri}: nothing logged there yet (make demo logs a run)"
        )
    try:
        runs = client.search_runs(
            [e.experiment_id for e in experiments],
            filter_string=filter_string or "",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=n,
            order_by=["attributes.start_time DESC"],
        )
    except MlflowException as exc:
        raise CompareError(
            f"--filter {filter_string!r}: MLflow refused it ({exc.message}); "
            "e.g. \"tags.model = 'mlp' and metrics.`check/passed` = 1\""
        ) from None
    names = [e.name for e in experiments]
    if not runs:
        why = f" matching {filter_string!r}" if filter_string else ""
        raise CompareError(f"no run{why} in experiment(s) {', '.join(names)} of {tracking_uri}")
    return Selection(runs=list(runs), experiments=names, tracking_uri=tracking_uri)


def worst(metrics: dict[str, float], family: str, stat: str = "max_rel") -> float | None:
    """Largest ``<family>/<case>/<pair or path>/<stat>`` metric, None when there is none."""
    values = [
        v
        for k, v in metrics.items()
        if k.startswith(f"{family}/") and k.endswith(f"/{stat}") and k.count("/") == 3
    ]
    return max(values) if values else None


def common_batch(runs: list[Any]) -> int | None:
    """The largest batch size with a ``vmap_jit`` p50 in every run (None: no such size)."""
    sizes = None
    for run in runs:
        mine = {int(m.group(1)) for k in run.data.metrics if (m := LATENCY.match(k))}
        sizes = mine if sizes is None else sizes & mine
    return max(sizes) if sizes else None


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def shown_verdict(run: Any) -> str:
    """A complete run's verdict tag; any other run's status, lowercase (``failed``,
    ``running``, ``killed``), or ``incomplete`` for one FINISHED but not complete."""
    if is_complete(run):
        return run.data.tags["verdict"]
    status = run.info.status
    return "incomplete" if status == "FINISHED" else status.lower()


def compare_rows(runs: list[Any]) -> tuple[list[dict[str, str]], int | None]:
    """One dict of display strings per run (keys are the table's columns), and the batch
    size the latency columns are taken at."""
    batch = common_batch(runs)
    rows = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        jax, jaxlib = tags.get("jax_version", "-"), tags.get("jaxlib_version", "-")
        commit = tags.get("git_commit", "-")
        started = datetime.datetime.fromtimestamp(run.info.start_time / 1000)
        row = {
            "run": run.info.run_name or run.info.run_id,
            "started": started.strftime("%Y-%m-%d %H:%M"),
            "verdict": shown_verdict(run),
            "perf": tags.get("perf_verdict", "-"),
            "jax": jax if jaxlib in (jax, "-") else f"{jax}/{jaxlib}",
            "backend/device": f"{tags.get('backend', '-')}/{tags.get('device_kind', '-')}",
            "precision": tags.get("precision", "-"),
            "commit": (commit[:7] if commit not in ("unknown", "-") else commit)
            + ("*" if tags.get("git_dirty") == "true" else ""),
        }
        for column, family in WORST.items():
            row[column] = _fmt(worst(metrics, family))
        label = f"b{batch}" if batch is not None else None
        for path in HEADLINE:
            row[f"{path} p50 ms"] = _fmt(metrics.get(f"latency_ms/{path}/{label}/p50"), ".4g")
        row["vmap/loop"] = _fmt(metrics.get(f"speedup/{label}/vmap_over_loop"), ".3g")
        rows.append(row)
    return rows, batch


def format_compare(selection: Selection, width: int | None = None) -> str:
    """The selection as a text table (rich), with what the columns mean underneath.

    ``width`` None: the table's natural width, nothing wrapped or cut (pipe it to
    ``less -S`` on a narrow terminal); a number: rich fits the table into it."""
    from rich.console import Console
    from rich.table import Table

    rows, batch = compare_rows(selection.runs)
    table = Table(
        title=f"{len(rows)} run(s), newest first, from {', '.join(selection.experiments)}"
    )
    numeric = {*WORST, *(f"{path} p50 ms" for path in HEADLINE), "vmap/loop"}
    for column in rows[0]:
        table.add_column(
            column, justify="right" if column in numeric else "left", no_wrap=width is None
        )
    for row in rows:
        style = "" if row["verdict"] in ("passed", "running") else "bold red"
        table.add_row(*row.values(), style=style)
    buffer = io.StringIO()
    Console(file=buffer, width=width or 100_000, force_terminal=False).print(table)
    where = (
        f"at batch {batch} (the largest every listed run measured)"
        if batch is not None
        else "not shown: the listed runs share no batch size"
    )
    notes = [
        buffer.getvalue().rstrip(),
        f"store: {selection.tracking_uri}",
        "max_rel: the worst over every case and pair (agree/*/*/max_rel), against the stored "
        "reference (reference/*/*/max_rel) and against float64 (oracle/*/*/max_rel)",
        f"latency p50 and vmap/loop (speedup/b<batch>/vmap_over_loop) {where}; "
        "commit*: uncommitted changes",
    ]
    return "\n".join(notes)


def run_compare(
    layout: Layout,
    n: int = DEFAULT_N,
    filter_string: str = "",
    experiment: str | None = None,
    all_experiments: bool = False,
    width: int | None = None,
) -> int:
    """``vmapcheck compare``: print the table of :func:`select_runs`'s pick (this project's
    experiments, ``experiment`` alone, or every one with ``all_experiments``); exit 2 with
    a message when there is nothing to compare."""
    from vmapcheck.config import load_config
    from vmapcheck.tracking.store import resolve_tracking_uri

    try:
        config = load_config(layout.params_yaml)
        selection = select_runs(
            resolve_tracking_uri(config.tracking, layout.root),
            n=n,
            filter_string=filter_string.strip() or None,
            prefix=None if all_experiments else config.tracking.experiment,
            experiment=experiment,
        )
    except VmapcheckError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(format_compare(selection, width))
    return 0
