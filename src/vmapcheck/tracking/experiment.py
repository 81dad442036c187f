"""What an MLflow experiment of vmapcheck runs says about itself: its description, its
kind (MLflow's classic ML view, not the GenAI one) and the saved runs-table view whose
columns are the verdict tags and the summary metrics (:func:`describe_experiment`, set
each time a run is logged into it).
"""

from __future__ import annotations

import json
import time
from typing import Any

from vmapcheck.config import Config
from vmapcheck.report.headline import HEADLINE_SPEEDUPS
from vmapcheck.tracking.store import VIEW_KEY

# MLflow's description tag, of an experiment and of a run (the run's: the verdict,
# vmapcheck.tracking.log.verdict_note).
NOTE_TAG = "mlflow.note.content"
# Opens the experiment in MLflow's classic ML view ("Runs", "Models"), not the GenAI one
# ("Traces", "Evaluations"): the value the UI itself writes when one switches
# (mlflow/server/js: ExperimentKind.CUSTOM_MODEL_DEVELOPMENT).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The saved runs-table view (its columns, tracking.store.VIEW_KEY), listed under the
# runs table's "Views" menu: MLflow 3.17 keeps it in the experiment tag
# ``mlflow.sharedViewState.<key>`` as an envelope {name, createdAt, updatedAt, state},
# ``state`` the view as a JSON string (mlflow/server/js, saved views).
VIEW_NAME = "vmapcheck summary"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
# The tags shown as that view's first columns (the verdict, then what tells runs of one
# experiment apart: every model's runs share it), and the order of its summary metric
# columns after them (by name prefix; the speed-ups' names end with their headline batch).
VIEW_TAGS = ("verdict", "model", "precision", "backend", "bench", "perf_verdict")
VIEW_ORDER = (
    # The figure the verdict is decided by and the tolerance it is read against.
    "_summary/worst_bound_ratio",
    "_summary/tolerance_rtol",
    "_summary/tolerance_atol",
    "_summary/worst_max_rel",
    "_summary/worst_vs_reference_max_rel",
    "_summary/worst_vs_f64_max_rel",
    *(f"_summary/{name}_at_" for name in HEADLINE_SPEEDUPS),
    "_summary/invalid_refused",
    "_summary/invalid_total",
    "_summary/passed",
    "_summary/",
)


def _view_width(name: str) -> int:
    """A metric column wide enough to show its whole name (pixels; MLflow's own ~110)."""
    return max(110, 7 * len(name) + 16)


def _view_rank(name: str) -> tuple[int, str]:
    return next(i for i, p in enumerate(VIEW_ORDER) if name.startswith(p)), name


def experiment_description(config: Config) -> str:
    """What an experiment holds (its ``mlflow.note.content``)."""
    scope = (
        f"model `{config.model.name}`"
        if config.tracking.experiment_per_model
        else "every model, told apart by tag `model`"
    )
    return (
        f"vmapcheck runs of {scope}: one run per pipeline state (`dvc repro`, "
        "`dvc exp run`), checking that the per-example loop, jax.vmap and the hand-batched "
        "forward agree, and timing each. Tag `verdict` says whether every check passed; "
        "the `_summary/*` metrics are the worst agreement errors, the invalid inputs "
        "refused and the vmap speed-ups; `timeline/*` the wall time of each stage. "
        "Metric names: docs/tracking.md. Runs side by side: tick them and click Compare "
        "(add `&workflowType=machine_learning` to its address if MLflow shows its GenAI "
        "view), or open the compare view's address that `vmapcheck compare` prints."
    )


def describe_experiment(
    client: Any, experiment_id: str, config: Config, summary_names: list[str]
) -> None:
    """Set the experiment's description, its ML (not GenAI) kind, and the runs-table view
    (:data:`VIEW_KEY`) whose columns are the verdict tags and the summary metrics.

    The view's metric columns are the union of those already in it and
    ``summary_names`` (the speed-up names carry the headline batch, which differs
    between bench profiles)."""
    experiment = client.get_experiment(experiment_id)
    view_tag = f"{VIEW_TAG_PREFIX}{VIEW_KEY}"
    now = int(time.time() * 1000)
    try:
        envelope = json.loads(experiment.tags[view_tag])
        old = json.loads(envelope["state"])["selectedColumns"]
        created = int(envelope["createdAt"])
    except (KeyError, ValueError, TypeError):  # absent, or not a view this code wrote
        old, created = [], now
    known = {c[len("metrics.`") : -1] for c in old if c.startswith("metrics.`_summary/")}
    names = sorted(known | set(summary_names), key=_view_rank)
    metrics = [f"metrics.`{n}`" for n in names]
    view_tags = [f"tags.`{tag}`" for tag in VIEW_TAGS]
    columns = [*view_tags, *metrics, "attributes.`Source`"]
    tags = {NOTE_TAG: experiment_description(config), EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
    if columns != old:
        state = json.dumps(
            {
                "selectedColumns": columns,
                # The order of the columns, and their widths (which apply to the columns
                # named in columnOrder: mlflow/server/js).
                "columnOrder": [*view_tags, *metrics],
                "columnWidths": {c: _view_width(n) for c, n in zip(metrics, names, strict=True)},
            }
        )
        tags[view_tag] = json.dumps(
            {"name": VIEW_NAME, "createdAt": created, "updatedAt": now, "state": state}
        )
    for key, value in tags.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment_id, key, value)
