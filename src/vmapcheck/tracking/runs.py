"""``vmapcheck compare`` (``make compare``): logged runs side by side.

One row per run, newest first: the last ``-n`` runs, or those an MLflow filter string
picks (``--filter "tags.model = 'mlp' and tags.precision = 'f64'"``), from every
experiment of this project (``tracking.experiment`` and ``<experiment>-<model>``,
see ``tracking.experiment_per_model``), or one (``--experiment``), or all (``--all``).

Columns, the summary first: run name, verdict (PASSED or FAILED, green or red on a
terminal), the figure that decided it, the worst bound ratio between paths (the largest
``agree/<case>/bound_ratio``: ``|a - b|`` over its bound, vmapcheck.core.compare; above 1
fails; runs logged before it: ``_summary/worst_bound_ratio``), the tolerance it was judged by (tags
``tolerance.rtol``, ``tolerance.atol``), the worst ``max_rel`` between paths,
against the stored reference and against float64 (the run's ``_summary/*`` metrics; for
runs logged before those, the largest ``agree/*/*/max_rel``, ``reference/*/*/max_rel``,
``oracle/*/*/max_rel``), vmap over the loop and over the direct form at the largest batch
size that every listed run measured (``speedup/b0128/vmap_over_loop``), benchmark
verdict, the p50 latency of the headline paths there (``latency_ms/<path>/b0128/p50``),
then bench profile, jax (/jaxlib when it differs), backend/device, precision, git commit
(``*``: dirty) and start time. ``-`` marks a figure a run does not have. Batch labels are
read zero-padded (``b0128``) or not (``b128``, runs logged before padding).

The table fits the width it is given (the terminal's, for ``vmapcheck compare``): the
columns at the end of that list are left out first, and the note under the table names
them; long run names wrap.

Under the table, the address of the same runs (the newest :data:`COMPARE_VIEW_MAX`) in
MLflow's compare view, in its ML mode (vmapcheck.tracking.ui.compare_url): the runs
table's own Compare button opens that view without ``workflowType``.

The verdict column holds a complete run's verdict (vmapcheck.tracking.store.is_complete),
``PASSED`` or ``FAILED``; any other run shows its status in lower case: ``abandoned`` for
one a killed ``track`` left unfinished (marked FAILED by the next ``track``), ``running``,
``killed``, or ``incomplete``. On a terminal (stdout a TTY, ``NO_COLOR`` unset) PASSED is
green, FAILED red and the others yellow; piped, the table has no colour codes.
"""

from __future__ import annotations

import datetime
import io
import os
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from vmapcheck.core.paths import PATHS
from vmapcheck.errors import VmapcheckError
from vmapcheck.layout import Layout
from vmapcheck.report.headline import batch_label
from vmapcheck.tracking.store import ABANDONED_TAG, LOG_FAILED_TAG, is_complete
from vmapcheck.tracking.uri import sqlite_file

# The paths whose p50 latency each row shows.
HEADLINE = tuple(p.name for p in PATHS.values() if p.headline)

DEFAULT_N = 10
MAX_N = 1000
# Column: (the run's summary metric, the family it is the worst of in older runs).
WORST = {
    "agree max_rel": ("_summary/worst_max_rel", "agree"),
    "ref max_rel": ("_summary/worst_vs_reference_max_rel", "reference"),
    "f64 max_rel": ("_summary/worst_vs_f64_max_rel", "oracle"),
}
SPEEDUPS = {"vmap/loop": "vmap_over_loop", "vmap/direct": "vmap_over_direct"}
# The deciding figure and the tolerance it is read against: the worst bound ratio (each
# case's worst, ``agree/<case>/bound_ratio``; runs logged before it carry only the summary
# metric) and the tags of the tolerance rule (vmapcheck.tracking.log.run_tags).
BOUND_RATIO = re.compile(r"^agree/[^/]+/bound_ratio$")
BOUND_SUMMARY = "_summary/worst_bound_ratio"
TOLERANCE = {"rtol": "tolerance.rtol", "atol": "tolerance.atol"}
# The verdict column's colours on a terminal (rich styles), by the text shown.
VERDICT_STYLES = {"PASSED": "bold green", "FAILED": "bold red"}
OTHER_STYLE = "yellow"  # running, abandoned, incomplete: not a verdict
LATENCY = re.compile(r"^latency_ms/vmap_jit/b(\d+)/p50$")
# A run name wraps to no narrower than this many characters.
RUN_MIN = 24
# Left out first when the table is wider than the terminal (last first); the others stay.
DROP_ORDER = (
    "started",
    "backend/device",
    "commit",
    "jax",
    "precision",
    "bench",
    *(f"{path} p50 ms" for path in reversed(HEADLINE)),
    "perf",
    "vmap/direct",
    "f64 max_rel",
    "ref max_rel",
    "atol",
)


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
    database = sqlite_file(tracking_uri)
    return database is None or database.is_file()


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
            f"no MLflow store at {tracking_uri}: nothing logged yet (dvc repro logs a run)"
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
            f"no {wanted} in {tracking_uri}: nothing logged there yet (dvc repro logs a run)"
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
    """A complete run's verdict tag in capitals (``PASSED``, ``FAILED``); any other run's
    status in lower case: ``abandoned`` (marked FAILED by a later track), ``running``,
    ``killed``, ``log failed`` (logging it stopped part-way: not its check), or
    ``incomplete`` for one ended but not complete."""
    if is_complete(run):
        return run.data.tags["verdict"].upper()
    status = run.info.status
    if run.data.tags.get(LOG_FAILED_TAG):
        return "log failed"  # its check may have passed: the logging did not
    if run.data.tags.get(ABANDONED_TAG):
        return "abandoned"
    return "incomplete" if status in ("FINISHED", "FAILED") else status.lower()


def worst_bound_ratio(metrics: dict[str, float]) -> float | None:
    """The largest ``agree/<case>/bound_ratio`` (the figure the agreement check fails on,
    above 1); the ``_summary/worst_bound_ratio`` of a run without them; None: neither."""
    values = [v for k, v in metrics.items() if BOUND_RATIO.match(k)]
    return max(values) if values else metrics.get(BOUND_SUMMARY)


def at_batch(metrics: dict[str, float], template: str, batch: int | None) -> float | None:
    """``template`` (with ``{}`` for the batch label) at ``batch``: the zero-padded name
    (``b0128``), else the unpadded one older runs logged (``b128``)."""
    if batch is None:
        return None
    for label in (batch_label(batch), f"b{batch}"):
        if (value := metrics.get(template.format(label))) is not None:
            return value
    return None


def compare_rows(runs: list[Any]) -> tuple[list[dict[str, str]], int | None]:
    """One dict of display strings per run (keys are the table's columns, in order), and
    the batch size the speed-up and latency columns are taken at."""
    batch = common_batch(runs)
    rows = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        jax, jaxlib = tags.get("jax_version", "-"), tags.get("jaxlib_version", "-")
        commit = tags.get("git_commit", "-")
        started = datetime.datetime.fromtimestamp(run.info.start_time / 1000)
        row = {"run": run.info.run_name or run.info.run_id, "verdict": shown_verdict(run)}
        row["bound ratio"] = _fmt(worst_bound_ratio(metrics))
        row |= {column: tags.get(tag, "-") for column, tag in TOLERANCE.items()}
        for column, (summary, family) in WORST.items():
            value = metrics.get(summary)
            row[column] = _fmt(value if value is not None else worst(metrics, family))
        for column, name in SPEEDUPS.items():
            row[column] = _fmt(at_batch(metrics, f"speedup/{{}}/{name}", batch), ".3g")
        row["perf"] = tags.get("perf_verdict", "-")
        for path in HEADLINE:
            value = at_batch(metrics, f"latency_ms/{path}/{{}}/p50", batch)
            row[f"{path} p50 ms"] = _fmt(value, ".4g")
        row |= {
            "bench": tags.get("bench", "-"),
            "jax": jax if jaxlib in (jax, "-") else f"{jax}/{jaxlib}",
            "precision": tags.get("precision", "-"),
            "backend/device": f"{tags.get('backend', '-')}/{tags.get('device_kind', '-')}",
            "commit": (commit[:7] if commit not in ("unknown", "-") else commit)
            + ("*" if tags.get("git_dirty") == "true" else ""),
            "started": started.strftime("%Y-%m-%d %H:%M"),
        }
        rows.append(row)
    return rows, batch


def _render(
    rows: list[dict[str, str]], columns: list[str], title: str, width: int, color: bool = False
) -> str:
    """The table as text; ``color``: with ANSI colour codes (the verdict's, a terminal's)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    numeric = {*WORST, *SPEEDUPS, "bound ratio", *TOLERANCE, *(f"{p} p50 ms" for p in HEADLINE)}
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(
            # Two-line headers ("agree\nmax_rel"): a column as wide as its figures.
            column.replace(" ", "\n").replace("/", "/\n") if column != "run" else column,
            justify="right" if column in numeric else "left",
            overflow="fold",  # a long run name wraps, never cut to "…"
            no_wrap=column != "run",
        )
    for row in rows:
        style = VERDICT_STYLES.get(row["verdict"], OTHER_STYLE)
        cells = [Text(row[c], style=style) if c == "verdict" else row[c] for c in columns]
        table.add_row(*cells)
    buffer = io.StringIO()
    Console(
        file=buffer,
        width=width,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
    ).print(table)
    return buffer.getvalue().rstrip()


def use_color() -> bool:
    """Colour for a terminal only: stdout a TTY, and no ``NO_COLOR`` (no-color.org) set."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def format_compare(selection: Selection, width: int | None = None, color: bool = False) -> str:
    """The selection as a text table (rich), with what the columns mean underneath;
    ``color``: the verdict in colour (:func:`use_color`).

    ``width`` None: the table's natural width, nothing left out or wrapped; a number:
    no line is longer. Columns are left out in :data:`DROP_ORDER` until the table fits
    (the note says which), then the run names wrap."""
    rows, batch = compare_rows(selection.runs)
    title = f"{len(rows)} run(s), newest first, from {', '.join(selection.experiments)}"
    columns = list(rows[0])
    left_out: list[str] = []
    if width is not None:
        # The width each set of columns needs, its run names folded to RUN_MIN characters
        # (the one column that wraps); rich would squeeze any table into ``width``,
        # cropping cells, so this is measured at a width that crops nothing.
        folded = [row | {"run": row["run"][:RUN_MIN]} for row in rows]
        for column in DROP_ORDER:
            if _widest(_render(folded, columns, "", 100_000)) <= width:
                break
            columns.remove(column)
            left_out.append(column)
    table = _render(rows, columns, title, width or 100_000, color)
    where = (
        f"at batch {batch} (the largest every listed run measured)"
        if batch is not None
        else "not shown: the listed runs share no batch size"
    )
    notes = [
        f"store: {selection.tracking_uri}",
        "bound ratio: the worst |a - b| / (atol + rtol * S) between paths, the figure the "
        "verdict is decided by (above 1 fails), against the tolerance rtol, atol it was "
        "judged with",
        "max_rel: the worst between paths (_summary/worst_max_rel), against the stored "
        "reference (_summary/worst_vs_reference_max_rel) and against float64 "
        "(_summary/worst_vs_f64_max_rel)",
        f"vmap/loop, vmap/direct (speedup/b<batch>/...) and latency p50 {where}; "
        "commit*: uncommitted changes",
    ]
    if left_out:
        notes.append(
            f"left out to fit {width} columns: {', '.join(left_out)} "
            "(--width N, or a wider terminal, shows them)"
        )
    if width is not None:
        notes = [textwrap.fill(note, width, subsequent_indent="  ") for note in notes]
    return "\n".join([table, *notes])


def run_compare(
    layout: Layout,
    n: int = DEFAULT_N,
    filter_string: str = "",
    experiment: str | None = None,
    all_experiments: bool = False,
    width: int | None = None,
) -> int:
    """``vmapcheck compare``: print the table of :func:`select_runs`'s pick (this project's
    experiments, ``experiment`` alone, or every one with ``all_experiments``), fitted to
    ``width`` columns (None: the terminal's width, 80 when it has none); exit 2 with a
    message when there is nothing to compare."""
    from vmapcheck.config import load_config
    from vmapcheck.tracking.sqlite_store import require_store_path, require_usable_store
    from vmapcheck.tracking.store import resolve_tracking_uri

    try:
        config = load_config(layout.params_yaml)
        uri = resolve_tracking_uri(config.tracking, layout.root)
        # A corrupt local store, or a symlink loop or dangling symlink in its place, is
        # named here, not by a traceback from MLflow's reads.
        require_store_path(uri, create_folder=True)
        require_usable_store(uri, write=False)
        selection = select_runs(
            uri,
            n=n,
            filter_string=filter_string.strip() or None,
            prefix=None if all_experiments else config.tracking.experiment,
            experiment=experiment,
        )
    except VmapcheckError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(format_compare(selection, width or shutil.get_terminal_size().columns, use_color()))
    print(compare_view_line(selection))
    return 0


# The most runs the printed compare-view address names (a longer URL is unwieldy).
COMPARE_VIEW_MAX = 20


def compare_view_line(selection: Selection) -> str:
    """Where the listed runs (the newest :data:`COMPARE_VIEW_MAX`) open side by side in
    MLflow's compare view, in its ML mode (vmapcheck.tracking.ui.compare_url)."""
    from vmapcheck.tracking.ui import compare_url, ui_base

    base, first = ui_base(selection.tracking_uri)
    runs = selection.runs[:COMPARE_VIEW_MAX]
    url = compare_url(base, [(r.info.experiment_id, r.info.run_id) for r in runs])
    which = "these runs" if len(runs) == len(selection.runs) else f"the newest {len(runs)}"
    then = f"{first}, then " if first else ""
    return f"{which} side by side in the MLflow UI: {then}{url}"
