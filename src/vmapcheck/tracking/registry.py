"""Verified params in the MLflow Model Registry: register, alias ``verified``, rollback, load.

- ``track`` calls :func:`register_if_verified` after logging a run. Only when the run's
  check passed (every check) are the params the run logged (its ``params/`` folder:
  params.safetensors, manifest.json, contract.json) logged as a servable MLflow model and
  registered as a new version of the registered model ``registry.registered_model``, and
  alias ``verified`` moved to it when the run is the deployment target
  (``registry.target``). Earlier versions stay. A failing run touches nothing in the
  registry.
- Each version's tags say what verified it (run id, git commit, jax version, model,
  backend, precision, when) and hold the sha256 of each of its three files, recorded in
  the registry's own store when the run verified them.
- :func:`vmapcheck.tracking.registry_commands.rollback` moves ``verified`` back, and
  :func:`vmapcheck.tracking.registry_commands.promote` to a version on purpose.
- :func:`vmapcheck.tracking.registered_params.load_registered_params` loads params by
  ``models:/`` URI (``train.params_source``), each file checked against the digests
  recorded here.

A version is a real MLflow model: :func:`vmapcheck.tracking.serving.log_verified_model`
logs a pyfunc into the verified run (the params files as artifacts under
``artifacts/params/``, the serving settings, the code, a signature built from the
contract), and the version's source is that logged model's artifact folder. So
``mlflow.pyfunc.load_model("models:/<name>@verified")`` predicts through the guard and
``mlflow models serve -m models:/<name>@verified`` serves it (docs/registry.md). The tag
``params_path`` says where the params files lie within the source (versions registered
before it pointed at the run's ``params/`` folder itself, and have none).

The alias moves to a newly registered version only when its run is the deployment
target (``registry.target``: :func:`off_target`); any other passing run is registered
without it, and ``vmapcheck promote`` moves it on purpose.

This module holds the registry's vocabulary (tags, the params artifact's digests, where
an alias points, whether a version's run is complete) and the registering that ``track``
does; the commands (``vmapcheck registry``, ``rollback``, ``promote``) are in
:mod:`vmapcheck.tracking.registry_commands`.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vmapcheck.config import Config, precision_dtype
from vmapcheck.core.record import RuntimeRecord
from vmapcheck.errors import ArtifactError
from vmapcheck.io import read_json, sha256_file
from vmapcheck.layout import CONTRACT_FILE, MANIFEST_FILE, PARAMS_FILE
from vmapcheck.tracking.records import (
    OffTarget,
    RegistryOutcome,
    TrackReport,
)
from vmapcheck.tracking.store import incomplete_because

VERIFIED = "verified"
# The run artifact folder that holds the params (tracking.log_run logs data/params there).
PARAMS_ARTIFACT = "params"
# Each file of a version, with the tag holding its sha256.
DIGEST_TAGS = {
    PARAMS_FILE: "params_sha256",
    MANIFEST_FILE: "manifest_sha256",
    CONTRACT_FILE: "contract_sha256",
}
# Tags on a version: it was verified (every check passed), by which run, and whether
# `verified` was rolled back from it (then rollback skips it).
TAG_VERIFIED = "verified"
TAG_RUN = "verified_by_run"
TAG_ROLLED_BACK = "rolled_back_at"
# On a version registered with the alias move left for later (``track``: after the run is
# complete); removed once the alias moved. Still there on a version whose run completed:
# the track died in between, and :func:`settle_pending_alias` makes the move.
TAG_ALIAS_PENDING = "verified_alias_pending"
# Where the params files lie within a version's source (absent: at its root).
TAG_PARAMS_PATH = "params_path"
# A digest of everything a version serves (:func:`served_identity`): a passing run whose
# identity is that of the version @verified points at re-verifies it, not a copy of it.
TAG_SERVED = "served_sha256"
# On a version whose run was not the deployment target (registry.target): how it differs
# (:func:`off_target`). It was registered without the alias, and rollback skips it
# unless it was promoted (``vmapcheck promote``, which tags it ``promoted_at``).
TAG_OFF_TARGET = "off_deployment_target"
TAG_PROMOTED = "promoted_at"
# Where the deployment target is set, as messages name it.
TARGET_SETTING = "registry.target in conf/config.yaml"
# The precision settings that judge a run and play no part in serving it.
TOLERANCES = ("tolerance", "cross_run_tolerance")
# Waiting for a version to be READY (local and server stores create it READY at once).
AWAIT_READY_S = 60


def registry_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` whose registry is the store ``tracking_uri``."""
    from mlflow.tracking import MlflowClient

    # The registry lives in the same store as the runs, whatever MLFLOW_REGISTRY_URI says.
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def utc_now() -> str:
    """Now, as the registry's time tags hold it (ISO 8601, UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def folder_digests(folder: Path) -> dict[str, str]:
    """sha256 of the params artifact's three files, by tag name (see DIGEST_TAGS).

    Raises:
        ArtifactError: a file is missing, or the manifest's own sha256 of the params file
            is not the file's (the artifact is inconsistent, so it is never registered).
    """
    folder = Path(folder)
    digests = {}
    for name, tag in DIGEST_TAGS.items():
        if not (folder / name).is_file():
            raise ArtifactError(f"{folder / name}: not found (a params artifact has {name})")
        digests[tag] = sha256_file(folder / name)
    recorded = read_json(folder / MANIFEST_FILE).get("sha256")
    if recorded != digests["params_sha256"]:
        raise ArtifactError(
            f"{folder / MANIFEST_FILE}: records sha256 {recorded} for {PARAMS_FILE}, "
            f"the file is {digests['params_sha256']}"
        )
    return digests


def verify_folder(folder: Path, expected: dict[str, str], where: str) -> None:
    """Check each file of a downloaded params artifact against the recorded digests.

    Raises:
        ArtifactError: naming ``where`` (the models:/ URI), the file and both digests.
    """
    for name, tag in DIGEST_TAGS.items():
        want = expected.get(tag)
        if not want:
            raise ArtifactError(
                f"{where}: the version has no {tag} tag; only versions registered by a "
                "passing vmapcheck run (with their digests) are loaded"
            )
        path = Path(folder) / name
        if not path.is_file():
            raise ArtifactError(f"{where}: the version's artifact has no {name}; refused")
        found = sha256_file(path)
        if found != want:
            raise ArtifactError(
                f"{where}: {name}: sha256 check failed: the registry recorded {want} when the "
                f"version was verified, the artifact is {found} (changed since); refused"
            )
    recorded = read_json(Path(folder) / MANIFEST_FILE).get("sha256")
    if recorded != expected["params_sha256"]:
        raise ArtifactError(
            f"{where}: {MANIFEST_FILE} records sha256 {recorded} for {PARAMS_FILE}, the "
            f"registry recorded {expected['params_sha256']}; refused"
        )


def download_folder(tracking_uri: str, source: str, dest: Path, where: str) -> Path:
    """Copy the artifact folder ``source`` (an artifact URI) into ``dest``; return it."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    try:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(dest), tracking_uri=tracking_uri
        )
    except (MlflowException, OSError) as exc:
        raise ArtifactError(f"{where}: cannot download its artifact {source}: {exc}") from None
    return Path(local)


def alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The version of ``name`` that ``alias`` points at (None: none, or no such model)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def dangling_alias(client: Any, name: str, alias: str) -> str | None:
    """The version number ``alias`` of ``name`` names when that version is not in the
    store (MLflow drops an alias with its version, but a store edited or restored in part
    can keep one); None: the alias is unset, resolves, or there is no such model.
    MLflow's own lookup then only says "not found", which reads as "no alias"."""
    from mlflow.exceptions import MlflowException

    try:
        number = client.get_registered_model(name).aliases.get(alias)
    except MlflowException:
        return None
    if number is None:
        return None
    try:
        client.get_model_version(name, str(number))
    except MlflowException:
        return str(number)
    return None


def dangling_alias_line(name: str, alias: str, number: str) -> str:
    """One line saying that ``alias`` of ``name`` points at the missing version ``number``."""
    return (
        f"models:/{name}@{alias} points at version {number}, which is not in the store "
        f"(deleted, or the store restored in part): `vmapcheck promote --version N` moves "
        "it to a version that exists"
    )


def untrusted_because(client: Any, version: Any) -> str | None:
    """Why the run that registered ``version`` is not a complete run (None: it is)."""
    from mlflow.exceptions import MlflowException

    run_id = version.run_id or version.tags.get(TAG_RUN)
    if not run_id:
        return "it names no run that verified it"
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return f"its run {run_id} is not in the store"
    why = incomplete_because(run)
    return None if why is None else f"its run {run_id} is not a complete run: {why}"


# --- registering -------------------------------------------------------------------


def register_verified(
    tracking_uri: str,
    name: str,
    run_id: str,
    params_dir: Path,
    config: Config,
    tags: dict[str, str] | None = None,
    move_alias: bool = True,
    off_target_because: str | None = None,
) -> RegistryOutcome:
    """Log run ``run_id``'s params as a servable MLflow model, register it as a new
    version of ``name`` and move alias ``verified`` to it. Call only for a run whose check
    passed. ``move_alias=False`` leaves the alias to :func:`move_verified_alias`, called
    once the run is complete (``track``: the alias never points at a half-logged run).
    ``off_target_because`` (how the run differs from the deployment target,
    :func:`off_target`) registers the version without the alias, ever: it is tagged
    ``off_deployment_target`` with the reason, never ``verified_alias_pending``, and only
    ``vmapcheck promote`` (:mod:`vmapcheck.tracking.registry_commands`) moves the alias to it.

    The digests recorded on the version are those of ``params_dir`` (the folder the run
    logged as ``params/``). The run's copy in the artifact store is downloaded and checked
    against them; that copy is what the model is logged from
    (:func:`vmapcheck.tracking.serving.log_verified_model`, with ``config``'s model,
    backend, precision and guard), and the logged model's copy is checked again before it is
    registered. So the version serves exactly the bytes that were verified.

    Returns:
        the outcome with status "registered" and every key but ``why``
        (:class:`vmapcheck.tracking.records.RegistryOutcome` says what each holds).
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

    from vmapcheck.tracking.serving import PARAMS_PATH, log_verified_model

    client = registry_client(tracking_uri)
    digests = folder_digests(params_dir)
    try:
        run_params = client.get_run(run_id).info.artifact_uri.rstrip("/") + "/" + PARAMS_ARTIFACT
        with tempfile.TemporaryDirectory() as tmp:
            where = f"run {run_id} artifact {PARAMS_ARTIFACT}/"
            verified = download_folder(tracking_uri, run_params, Path(tmp) / "run", where)
            verify_folder(verified, digests, where)
            logged = log_verified_model(tracking_uri, run_id, verified, config)
            source = logged["artifact_location"]
            where = f"logged model {logged['model_id']} {PARAMS_PATH}/"
            copy = download_folder(
                tracking_uri, f"{source}/{PARAMS_PATH}", Path(tmp) / "model", where
            )
            verify_folder(copy, digests, where)
        try:
            client.create_registered_model(
                name, description="Params whose run passed every vmapcheck check (alias verified)."
            )
        except MlflowException as exc:  # another run (a parallel sweep) created it first
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
        previous = alias_version(client, name, VERIFIED)
        if off_target_because is not None:
            alias_tags, alias_state = {TAG_OFF_TARGET: off_target_because}, "stays"
        elif move_alias:
            alias_tags, alias_state = {}, "moved"
        else:
            alias_tags, alias_state = {TAG_ALIAS_PENDING: utc_now()}, "pending"
        version = client.create_model_version(
            name,
            source,
            run_id=run_id,
            tags={
                TAG_VERIFIED: "true",
                TAG_RUN: run_id,
                "verified_at": utc_now(),
                TAG_PARAMS_PATH: PARAMS_PATH,
                **digests,
            }
            | (tags or {})
            | alias_tags,
            description=f"Verified by run {run_id}: every check passed.",
            await_creation_for=AWAIT_READY_S,
            model_id=logged["model_id"],
        )
        number = str(version.version)  # an int from a sqlite store, a str over REST
        if alias_state == "moved":
            client.set_registered_model_alias(name, VERIFIED, number)
    except MlflowException as exc:
        raise ArtifactError(
            f"registering run {run_id}'s params as a version of {name!r} in {tracking_uri} "
            f"failed: {exc.message}"
        ) from None
    return {
        "status": "registered",
        "registered_model": name,
        "version": number,
        "uri": f"models:/{name}/{number}",
        "alias": VERIFIED,
        "previous": str(previous.version) if previous is not None else None,
        "verified_alias": alias_state,
        "off_target": off_target_because,
        "source": source,
        "model_id": logged["model_id"],
        "params_sha256": digests["params_sha256"],
    }


def move_verified_alias(tracking_uri: str, registered: RegistryOutcome) -> None:
    """Move alias ``verified`` to the version :func:`register_verified` made with
    ``move_alias=False`` (``registered``: its result), then drop the version's
    ``verified_alias_pending`` tag. ``track`` calls it after the run is complete, so a
    track that dies earlier leaves the alias where it was; one that dies after the run is
    complete but before the move leaves the tag, and the next ``track`` moves the alias
    (:func:`settle_pending_alias`).

    Raises:
        ArtifactError: the store refused the move (the alias stays where it was).
    """
    from mlflow.exceptions import MlflowException

    name, number = registered["registered_model"], registered["version"]
    client = registry_client(tracking_uri)
    try:
        client.set_registered_model_alias(name, VERIFIED, number)
        client.delete_model_version_tag(name, number, TAG_ALIAS_PENDING)
    except MlflowException as exc:
        raise ArtifactError(
            f"moving alias {VERIFIED} of {name!r} to version {number} in {tracking_uri} "
            f"failed: {exc.message} (the next track retries the move)"
        ) from None


def _versions_where(client: Any, name: str, keep: Callable[[Any], bool]) -> list[Any]:
    """The versions of ``name`` that ``keep``, in the store's order (none when ``name`` is
    not registered)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        return []
    found: list[Any] = []
    token: str | None = None
    while True:
        page = client.search_model_versions(f"name = '{name}'", page_token=token)
        found.extend(v for v in page if keep(v))
        token = page.token
        if not token:
            break
    return found


def _pending_versions(client: Any, name: str) -> list[Any]:
    """The versions of ``name`` tagged ``verified_alias_pending``, newest first (none when
    ``name`` is not registered)."""
    found = _versions_where(client, name, lambda v: TAG_ALIAS_PENDING in v.tags)
    return sorted(found, key=lambda v: int(v.version), reverse=True)


def settle_pending_alias(tracking_uri: str, name: str) -> list[str]:
    """Finish an alias move that a dead ``track`` left undone; one line per version
    settled (none: nothing was pending).

    A version still tagged ``verified_alias_pending`` was registered by a run whose check
    passed, and the track died before moving ``verified`` to it. If that run is complete
    and the version is newer than the one the alias holds (or none holds it), the alias
    moves to it; a version the alias already holds, or one older than it, only loses the
    tag. A version whose run is not complete keeps the tag and the alias stays: the run
    may still be completing (a live track), and one that was marked FAILED never is.

    Raises:
        ArtifactError: the store refused a read or a write (the alias stays where it was).
    """
    from mlflow.exceptions import MlflowException

    client = registry_client(tracking_uri)
    lines = []
    try:
        pending = _pending_versions(client, name)
        if not pending:
            return []
        current = alias_version(client, name, VERIFIED)
        held = int(current.version) if current is not None else 0
        for version in pending:  # newest first
            number = str(version.version)
            run = version.run_id or version.tags.get(TAG_RUN, "?")
            untrusted = untrusted_because(client, version)
            if untrusted is not None:
                lines.append(
                    f"alias {VERIFIED} not moved to version {number} of {name!r} (its alias "
                    f"move is pending): {untrusted}"
                )
                continue
            if int(number) > held:
                client.set_registered_model_alias(name, VERIFIED, number)
                lines.append(
                    f"alias {VERIFIED} of {name!r} moved to version {number}"
                    + (f" (from version {held})" if held else "")
                    + f": its run {run} completed, but the track that registered it "
                    "ended before moving the alias"
                )
                held = int(number)
            client.delete_model_version_tag(name, number, TAG_ALIAS_PENDING)
    except MlflowException as exc:
        raise ArtifactError(
            f"finishing the pending move of alias {VERIFIED} of {name!r} in {tracking_uri} "
            f"failed: {exc.message} (the alias stays where it was; the next track retries)"
        ) from None
    return lines


def served_identity(config: Config, params_dir: Path, runtime_tags: dict[str, str]) -> str:
    """sha256 of what a version registered from ``params_dir`` would serve: the params
    files' digests (:func:`folder_digests`), the serving settings
    (:func:`vmapcheck.tracking.serving.serving_settings`: model, backend, precision but
    its tolerances, guard), the code it carries
    (:func:`vmapcheck.tracking.serving.code_digest`) and the runtime it was verified on
    (``runtime_tags``: model, backend, precision, jax and jaxlib versions)."""
    from vmapcheck.tracking.serving import code_digest, serving_settings

    settings = serving_settings(config)
    # The tolerances judge a run; predict never reads them: a rerun that only changed one
    # serves the same predictions.
    settings["precision"] = {
        key: value for key, value in settings["precision"].items() if key not in TOLERANCES
    }
    served = {
        "params": folder_digests(params_dir),
        "settings": settings,
        "code_sha256": code_digest(config.model),
        "runtime": runtime_tags,
    }
    return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()


def off_target(config: Config) -> list[str]:
    """How the run ``config`` configures differs from the deployment target
    (``registry.target``), one phrase per setting, such as "this run's precision is f64
    (float64), the deployment target's is f32 (float32)"; empty when it is the target."""
    target = config.registry.target
    differences = []

    def compare(what: str, run: Any, wanted: Any) -> None:
        if run != wanted:
            differences.append(f"this run's {what} is {run}, the deployment target's is {wanted}")

    compare("model", config.model.name, target.model)
    if target.hidden is not None:
        compare("model.hidden", config.model.hidden, target.hidden)
    compare("backend", config.backend.name, target.backend)
    run_precision = f"{config.precision.name} ({config.precision.dtype})"
    compare("precision", run_precision, f"{target.precision} ({precision_dtype(target.precision)})")
    compare("bench profile", config.bench.name, target.bench)
    return differences


def _same_served_version(client: Any, name: str, identity: str) -> Any | None:
    """The newest verified version of ``name`` whose ``served_sha256`` is ``identity``
    (:func:`served_identity`), or None."""
    found = _versions_where(
        client,
        name,
        lambda v: v.tags.get(TAG_SERVED) == identity and v.tags.get(TAG_VERIFIED) == "true",
    )
    return max(found, key=lambda v: int(v.version), default=None)


def register_if_verified(
    config: Config,
    info: TrackReport,
    runtime: RuntimeRecord,
    params_dir: Path,
    move_alias: bool = True,
) -> RegistryOutcome:
    """``track``'s hook: register the run's params when its check passed.

    ``info`` is :func:`vmapcheck.tracking.log.log_run`'s result (the run still RUNNING:
    ``track`` completes it afterwards), ``runtime`` the check's
    (``check_details.json``: jax and jaxlib versions, backend). Params that came from this
    registered model (``train.params_source``) are not registered again: the version they
    came from gets ``reverified_by_run``/``reverified_at`` tags and the alias stays
    (otherwise each run from ``@verified`` would make a new version, and move the alias).
    Likewise a run whose :func:`served_identity` is that of the version ``@verified``
    points at (a rerun for a tolerance or a bench setting: the same params, serving
    settings, code and runtime) re-verifies that version rather than registering a copy.

    A run that is not the deployment target (``registry.target``: :func:`off_target`) is
    registered without the alias (tagged ``off_deployment_target`` with why), or, when a
    version already serves exactly what it would, re-verifies that version; ``@verified``
    stays where it is either way (``vmapcheck promote`` moves it on purpose).

    Returns what happened, for reports/track.json: ``{"status": "registered", ...}``
    (see :func:`register_verified`), ``"re-verified"``, or ``"not registered"`` with why.
    A run off the target adds ``"off_target"`` (why) and ``"verified_alias": "stays"``
    (``"held"`` when the version it re-verifies is the one ``@verified`` holds).
    """
    name = config.registry.registered_model
    if info["verdict"] != "passed":
        return {"status": "not registered", "why": "the check failed: the alias stays"}
    if name is None:
        return {"status": "not registered", "why": "registry.registered_model is null"}
    client = registry_client(info["tracking_uri"])
    source = read_json(Path(params_dir) / MANIFEST_FILE).get("source", {})
    if source.get("registered_model") == name and source.get("version"):
        return _reverified(
            client,
            name,
            source["version"],
            info["run_id"],
            f"the params came from {source['params_source']}; not registered again",
        )
    if "jax_version" in runtime:
        jax_version = runtime["jax_version"]
    else:  # JAX imported only where the run recorded no version: track runs none
        import jax

        jax_version = jax.__version__
    runtime_tags = {
        "model": config.model.name,
        "backend": runtime.get("backend", config.backend.name),
        "precision": config.precision.name,
        "jax_version": jax_version,
        "jaxlib_version": runtime.get("jaxlib_version", "unknown"),
    }
    identity = served_identity(config, params_dir, runtime_tags)
    current = alias_version(client, name, VERIFIED)
    # How the run differs from the deployment target (None: it is the target).
    because = "; ".join(off_target(config)) or None
    if because is not None:
        held = str(current.version) if current is not None else None
        same = _same_served_version(client, name, identity)
        if same is not None:
            number = str(same.version)
            return _reverified(
                client,
                name,
                number,
                info["run_id"],
                f"version {number} serves the same params, settings, code and runtime; "
                "not registered again",
                OffTarget(
                    previous=held,
                    verified_alias="stays" if number != held else "held",
                    off_target=because,
                ),
            )
    if because is None and current is not None and current.tags.get(TAG_SERVED) == identity:
        # A rerun for a tolerance, a bench setting or a commit that changed nothing served:
        # a new version would be a byte-for-byte copy (and cost ~2 s of MLflow's
        # pyfunc packaging). This run re-verifies the version instead.
        number = str(current.version)
        return _reverified(
            client,
            name,
            number,
            info["run_id"],
            f"version {number} (@{VERIFIED}) serves the same params, settings, code and "
            "runtime; not registered again",
        )
    tags = {
        "git_commit": info.get("git_commit", "unknown"),
        "git_dirty": info.get("git_dirty", "unknown"),
        **runtime_tags,
        TAG_SERVED: identity,
    }
    return register_verified(
        info["tracking_uri"],
        name,
        info["run_id"],
        params_dir,
        config,
        tags | {"bench": config.bench.name},
        move_alias,
        off_target_because=because,
    )


def _reverified(
    client: Any,
    name: str,
    version: str,
    run_id: str,
    why: str,
    off_target: OffTarget | None = None,
) -> RegistryOutcome:
    """Record on version ``version`` that run ``run_id`` checked and passed what it serves
    again (tags ``reverified_by_run``, ``reverified_at``), instead of a copy registered;
    return the outcome :func:`register_if_verified` reports (``off_target``: for a run
    off the deployment target, where ``@verified`` stands and why)."""
    client.set_model_version_tag(name, version, "reverified_by_run", run_id)
    client.set_model_version_tag(name, version, "reverified_at", utc_now())
    outcome: RegistryOutcome = {
        "status": "re-verified",
        "registered_model": name,
        "version": version,
        "why": why,
    }
    if off_target is not None:
        outcome["previous"] = off_target["previous"]
        outcome["verified_alias"] = off_target["verified_alias"]
        outcome["off_target"] = off_target["off_target"]
    return outcome


def outcome_line(result: RegistryOutcome) -> str:
    """What :func:`register_if_verified` did (``result``), as ``track`` and ``vmapcheck
    summary`` print it after ``registry:``: what was registered, and, for a run off the
    deployment target, where ``@verified`` stays, why, and the command that promotes it."""
    if result.get("off_target") and result.get("verified_alias") != "held":
        number = result["version"]
        what = (
            f"registered as {result['uri']}"
            if result["status"] == "registered"
            else f"re-verified: version {number} of {result['registered_model']} serves the "
            "same params, settings, code and runtime (not registered again)"
        )
        held = result.get("previous")
        stays = f"@{VERIFIED} stays at version {held}" if held else f"@{VERIFIED} is on no version"
        return (
            f"{what}; {stays}: {result['off_target']} ({TARGET_SETTING}); promote it with: "
            f"vmapcheck promote --version {number}"
        )
    if result["status"] == "registered":
        moved = f" (from version {result['previous']})" if result["previous"] else ""
        return f"params registered as {result['uri']}; alias {result['alias']} moved to it{moved}"
    return f"{result['status']}: {result['why']}"
