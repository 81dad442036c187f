"""Verified params loaded from the MLflow Model Registry by ``models:/`` URI.

:func:`load_registered_params` loads params by ``models:/<name>@<alias>`` or
``models:/<name>/<version>``: it downloads the version's files, checks each against the
sha256 recorded when the version was registered (:mod:`vmapcheck.tracking.registry`) and
the params against the model's contract, and refuses with an error naming the URI when
anything differs, or when the run that registered the version is not complete (a
``track`` killed after registering: ``vmapcheck rollback``). ``train`` uses it
(``train.params_source``), so every later stage reads those params from ``data/params``
as usual. URIs are resolved with an explicit client: MLflow 3.17's ``models:/`` artifact
repository resolves names against the global registry URI, not the ``tracking_uri``
passed to ``download_artifacts``.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vmapcheck.config import MODELS_URI_PATTERN
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import read_json
from vmapcheck.layout import CONTRACT_FILE, MANIFEST_FILE, PARAMS_FILE
from vmapcheck.params_io import check_contract, contract_of, read_params_file
from vmapcheck.tracking.registry import (
    TAG_PARAMS_PATH,
    TAG_VERIFIED,
    VERIFIED,
    download_folder,
    registry_client,
    untrusted_because,
    verify_folder,
)
from vmapcheck.tracking.sqlite_store import require_existing_store


@dataclass(frozen=True)
class ModelsUri:
    """A parsed ``models:/<name>/<version>`` or ``models:/<name>@<alias>``."""

    name: str
    version: str | None
    alias: str | None

    def __str__(self) -> str:
        return f"models:/{self.name}" + (
            f"/{self.version}" if self.version is not None else f"@{self.alias}"
        )


def parse_models_uri(uri: str) -> ModelsUri:
    """Parse the two forms vmapcheck resolves; anything else (a stage, ``latest``, an
    MLflow 3 logged-model id) is a ConfigError naming the forms."""
    if not isinstance(uri, str) or not re.fullmatch(MODELS_URI_PATTERN, uri):
        raise ConfigError(
            f"params source {uri!r}: expected models:/<name>@<alias> (e.g. "
            f"models:/vmapcheck-mlp@{VERIFIED}) or a pinned version models:/<name>/<version>"
        )
    rest = uri[len("models:/") :]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return ModelsUri(name, None, alias)
    name, version = rest.split("/", 1)
    return ModelsUri(name, version, None)


@dataclass(frozen=True)
class RegisteredParams:
    """Where verified params came from (recorded in data/params/manifest.json)."""

    params_source: str  # the URI as configured
    registered_model: str
    version: str
    run_id: str | None
    params_sha256: str


def resolve_version(tracking_uri: str, uri: str) -> Any:
    """The model version ``uri`` names (an alias is resolved now).

    Raises:
        ConfigError: a malformed URI.
        ArtifactError: no such model, version or alias in the store (naming the URI).
    """
    from mlflow.exceptions import MlflowException

    parsed = parse_models_uri(uri)
    client = registry_client(tracking_uri)
    try:
        if parsed.alias is not None:
            return client.get_model_version_by_alias(parsed.name, parsed.alias)
        return client.get_model_version(parsed.name, parsed.version)
    except MlflowException as exc:
        raise ArtifactError(f"{uri}: not found in {tracking_uri} ({exc.message})") from None


def fetch_registered_params(
    tracking_uri: str, uri: str, dest: Path
) -> tuple[RegisteredParams, Path]:
    """Download the params artifact ``uri`` names into ``dest`` and check every file
    against the sha256 digests recorded on the version when it was verified.

    Returns:
        Where the params came from, and the local folder holding the checked files.

    Raises:
        ArtifactError: naming ``uri`` and the version: unknown, not verified by vmapcheck,
            or a file missing or changed since.
    """
    version = resolve_version(tracking_uri, uri)
    where = f"{uri} (version {version.version})"
    if version.tags.get(TAG_VERIFIED) != "true":
        raise ArtifactError(
            f"{where}: not tagged {TAG_VERIFIED}=true; only versions a passing vmapcheck "
            "run registered are loaded"
        )
    untrusted = untrusted_because(registry_client(tracking_uri), version)
    if untrusted is not None:
        raise ArtifactError(
            f"{where}: {untrusted}; only versions registered by a complete run are loaded "
            f"(`vmapcheck rollback --model {version.name}` moves @{VERIFIED} to the previous one)"
        )
    from mlflow.exceptions import MlflowException

    try:
        source = registry_client(tracking_uri).get_model_version_download_uri(
            version.name, version.version
        )
    except MlflowException as exc:
        raise ArtifactError(f"{where}: no download location ({exc.message})") from None
    # A servable version holds its params under params_path; an older one is the folder.
    inner = version.tags.get(TAG_PARAMS_PATH, "").strip("/")
    source = f"{source.rstrip('/')}/{inner}" if inner else source
    local = download_folder(tracking_uri, source, Path(dest), where)
    verify_folder(local, version.tags, where)
    info = RegisteredParams(
        params_source=uri,
        registered_model=version.name,
        version=str(version.version),
        run_id=version.run_id,
        params_sha256=version.tags["params_sha256"],
    )
    return info, local


def load_registered_params(
    model: Any, uri: str, tracking_uri: str
) -> tuple[Any, dict[str, Any], dict[str, Any], RegisteredParams]:
    """Verified params for ``model`` (a :class:`vmapcheck.core.models.Model`) from ``uri``.

    Checks, before the params are used: each file's sha256 against the registry's record
    (:func:`fetch_registered_params`); the manifest's and contract.json's params leaves
    against ``model``'s template (name, shape, dtype); the params file's sha256 again, its
    format (safetensors, never unpickled), and every leaf (``read_params_file``).

    Returns:
        (params pytree shaped like ``model.init``'s, its manifest, its contract, where
        it came from).

    Raises:
        ArtifactError / ConfigError: naming ``uri`` and what failed.
    """
    import jax

    require_existing_store(tracking_uri, f"train.params_source={uri}")
    template = jax.eval_shape(model.init, jax.random.key(0))
    with tempfile.TemporaryDirectory() as tmp:
        info, folder = fetch_registered_params(tracking_uri, uri, Path(tmp))
        where = f"{uri} (version {info.version})"
        manifest = read_json(folder / MANIFEST_FILE)
        contract = read_json(folder / CONTRACT_FILE)
        try:
            if contract.get("model") != model.name:
                raise ArtifactError(
                    f"params are of model {contract.get('model')!r}, the configured model is "
                    f"{model.name!r}"
                )
            expected = contract_of(template)
            check_contract(manifest.get("contract", {}), expected)
            check_contract(contract.get("params", {}), expected)
            params = read_params_file(folder / PARAMS_FILE, template, info.params_sha256)
        except ArtifactError as exc:
            raise ArtifactError(f"{where}: {exc}") from None
    return params, manifest, contract, info


def manifest_source(info: RegisteredParams) -> dict[str, Any]:
    """The ``source`` entry ``train`` writes into the manifest for registry params."""
    return asdict(info)
