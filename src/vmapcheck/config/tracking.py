"""Config groups ``tracking`` and ``registry``: the MLflow store runs are logged to, and
the registered model with its deployment target."""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from vmapcheck.config.fields import REGISTERED_MODEL_PATTERN, PositiveInt, Strict
from vmapcheck.config.run import BackendName, PrecisionName

# The stores this project logs to: a sqlite file (tracking=local) or a tracking server.
SQLITE_URI = "sqlite:///"
HTTP_SCHEMES = ("http://", "https://")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be the MLflow store here, or None when it can; the caller names
    the key (``tracking.tracking_uri``, ``MLFLOW_TRACKING_URI``) and the value found.

    Accepted: ``sqlite:///<path>`` and ``http(s)://host...``. A bare folder or file and a
    ``file:`` URI (MLflow's file store, in maintenance mode) get the sqlite URI to use
    instead; any other scheme is refused (MLflow would fail later, with a traceback).
    """
    if uri.startswith(SQLITE_URI):
        path = uri[len(SQLITE_URI) :].split("?", 1)[0]
        if not path.strip():
            return "expected sqlite:///<path to a .db file>, with a path"
        if path.strip() == ":memory:" or "mode=memory" in uri:
            # SQLAlchemy reads sqlite:///:memory: as a database that ends with the process
            # (nothing logged or registered would remain), and MLflow's own paths make a
            # file named ':memory:' of it: neither is a store.
            return (
                "an in-memory SQLite database keeps no run or registered version after the "
                "process ends: expected sqlite:///<path to a .db file>, e.g. sqlite:///mlflow.db"
            )
        return None
    if uri.startswith(HTTP_SCHEMES):
        return None
    if uri.rstrip("/") == "sqlite:" or uri == "sqlite://":
        # SQLAlchemy's spelling of an in-memory database.
        return (
            "sqlite:// with no path is an in-memory database, which keeps no run: expected "
            "sqlite:///<path to a .db file>, e.g. sqlite:///mlflow.db"
        )
    if "://" not in uri or uri.startswith("file:"):
        path = uri.removeprefix("file://").removeprefix("file:").rstrip("/") or "."
        suggested = path if path.endswith(".db") else f"{path}/mlflow.db"
        return (
            "a folder or file is MLflow's file store (in maintenance mode, not supported "
            f"here): use sqlite:///<path>/mlflow.db, e.g. sqlite:///{suggested}"
        )
    scheme = uri.split("://", 1)[0]
    return (
        "expected sqlite:///<path> (tracking=local) or the http:// or https:// URL of an "
        f"MLflow tracking server (tracking=server), not scheme {scheme!r}"
    )


# MLflow's limit on an experiment's name (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH;
# tests/test_config.py checks they agree): a longer one is refused here, not by MLflow at
# track after the whole run. Kept here so that validating the config does not import MLflow.
MAX_EXPERIMENT_NAME_LENGTH = 500


def credential_problem(uri: str) -> str | None:
    """Why ``uri`` may not be a setting because it holds a credential (a user or password,
    a query or fragment, where tokens go), or None. Said without the secret: the message is
    printed and logs keep it. Checked where the config is validated and where Hydra
    composes params.yaml (:mod:`vmapcheck.running`'s resolver), so that no credential given
    in a setting is written to a file."""
    try:
        parts = urllib.parse.urlsplit(uri)
        has_user = parts.username is not None or parts.password is not None
    except ValueError:  # e.g. a port that is not a number: tracking_uri_problem's to say
        return None
    if has_user:
        # (The environment's MLFLOW_TRACKING_URI may hold them: it is never written.)
        return (
            "a user or password in the URL would be stored in params.yaml, dvc.lock "
            "and MLflow's tags: give the URL without them, and the credentials in "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
            "MLFLOW_TRACKING_TOKEN), which MLflow reads"
        )
    if parts.query or parts.fragment:
        # A token in a query string is a credential stored in params.yaml as well.
        return (
            "expected a URL without a query or fragment (?... or #...): a token there "
            "would be stored in params.yaml, dvc.lock and MLflow's tags; give a token in "
            "MLFLOW_TRACKING_TOKEN, which MLflow reads"
        )
    return None


class TrackingConfig(Strict):
    """Where runs are logged (``tracking=local``: a sqlite file; ``tracking=server``: an
    MLflow tracking server) and how long to wait for a server (vmapcheck.tracking.store).

    The ``http_*`` settings apply whenever the store is reached over HTTP (also when
    ``MLFLOW_TRACKING_URI`` names a server) and replace MLflow's defaults, which wait about
    four minutes on a dead server: each request waits at most ``http_timeout_s`` per
    attempt and is retried ``http_max_retries`` times, sleeping ``http_backoff_factor`` x
    (0, 2, 4, ...) s plus up to ``http_backoff_jitter`` s between attempts.
    """

    name: Literal["local", "server"]
    tracking_uri: Annotated[str, Field(min_length=1)]
    # null: the server's own artifact store (mlflow server --artifacts-destination).
    artifact_root: Annotated[str, Field(min_length=1)] | None
    # The experiment of every model's runs, or with experiment_per_model the prefix of one
    # per model (``<experiment>-<model.name>``). No quotes or spaces: it goes into search
    # filters.
    experiment: Annotated[
        str, Field(pattern=r"^[A-Za-z0-9_./-]+$", max_length=MAX_EXPERIMENT_NAME_LENGTH)
    ]
    experiment_per_model: bool
    # MLflow reads these as integers (MLFLOW_HTTP_REQUEST_TIMEOUT, ..._MAX_RETRIES,
    # ..._BACKOFF_FACTOR) and bounds retries by 10 and the factor by 120.
    http_timeout_s: Annotated[int, Field(gt=0, le=600)]
    http_max_retries: Annotated[int, Field(ge=0, le=10)]
    http_backoff_factor: Annotated[int, Field(ge=0, le=120)]
    http_backoff_jitter: Annotated[float, Field(ge=0.0, le=60.0)]

    @field_validator("tracking_uri", mode="after")
    @classmethod
    def _a_store_mlflow_supports_here(cls, uri: str) -> str:
        problem = tracking_uri_problem(uri)
        if problem:
            raise ValueError(problem)
        problem = credential_problem(uri)
        if problem:
            raise ValueError(problem)
        return uri

    @model_validator(mode="after")
    def _uri_fits_the_store(self) -> TrackingConfig:
        is_http = self.tracking_uri.startswith(HTTP_SCHEMES)
        if self.name == "server":
            if not is_http or not self.tracking_uri.split("://", 1)[1].strip("/"):
                raise ValueError(
                    "tracking.tracking_uri must be an http:// or https:// URL of an MLflow "
                    "tracking server when tracking.name='server' (e.g. http://127.0.0.1:5000)"
                )
            if self.artifact_root is not None and "://" not in self.artifact_root:
                raise ValueError(
                    "tracking.artifact_root must be null (the server's own artifact store) or "
                    "a URI the server and this machine both reach (s3://...) when "
                    "tracking.name='server', not a local folder"
                )
        else:
            if is_http:
                raise ValueError(
                    "tracking.tracking_uri names a server but tracking.name='local': use "
                    "tracking=server (e.g. dvc exp run -S tracking=server "
                    "-S tracking.tracking_uri=...)"
                )
            if self.artifact_root is None:
                raise ValueError(
                    "tracking.artifact_root must name a folder (or URI) for the local store"
                )
        return self


class DeploymentTargetConfig(Strict):
    """What ``@verified`` serves (registry.target; docs/registry.md, "The deployment
    target"). A passing run moves the alias only when its settings are these; any other
    passing run is registered without it (vmapcheck.tracking.registry.off_target).

    Each key names a config group's option as ``-S <group>=<option>`` does, with the key
    of the run's config it is compared with: ``model`` (model.name), ``hidden``
    (model.hidden, the layer widths; null: any), ``backend`` (backend.name), ``precision``
    (precision.name and its dtype), ``bench`` (bench.name, the benchmark profile).
    """

    model: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    hidden: list[PositiveInt] | None
    backend: BackendName
    precision: PrecisionName
    bench: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]


class RegistryConfig(Strict):
    """The MLflow Model Registry entry of verified params (vmapcheck.tracking.registry)."""

    # A run whose check passed registers its params as a new version of this model and
    # moves alias `verified` to it when it matches `target`; null: never register.
    registered_model: Annotated[str, Field(pattern=REGISTERED_MODEL_PATTERN)] | None
    # The deployment target: the settings of the runs whose params @verified may serve.
    target: DeploymentTargetConfig
