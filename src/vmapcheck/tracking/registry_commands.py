"""The registry's commands: where alias ``verified`` points, moved by hand.

- :func:`show` lists a registered model's versions, which holds which alias, and their
  tags (``vmapcheck registry``).
- :func:`rollback` moves ``verified`` back to the newest earlier version that was
  verified, not itself rolled back from (the version it leaves is tagged so, which is
  how "the previous verified version" stays findable after several moves), and whose run
  is complete (vmapcheck.tracking.store.is_complete).
- :func:`promote` moves it to a version on purpose, one off the deployment target too.

Usage: ``vmapcheck registry [--model NAME]`` (``make registry``), ``vmapcheck rollback
[--model NAME]`` (``make rollback``) and ``vmapcheck promote [--model NAME] (--version N
| --run RUN_ID)`` (``make promote VERSION=N``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vmapcheck.config import REGISTERED_MODEL_PATTERN, Config, load_config, precision_dtype
from vmapcheck.errors import ArtifactError, ConfigError, VmapcheckError
from vmapcheck.io import read_json
from vmapcheck.layout import MANIFEST_FILE, Layout
from vmapcheck.tracking.registered_params import resolve_version
from vmapcheck.tracking.registry import (
    TAG_ALIAS_PENDING,
    TAG_OFF_TARGET,
    TAG_PROMOTED,
    TAG_ROLLED_BACK,
    TAG_RUN,
    TAG_VERIFIED,
    TARGET_SETTING,
    VERIFIED,
    alias_version,
    dangling_alias,
    dangling_alias_line,
    registry_client,
    untrusted_because,
    utc_now,
)
from vmapcheck.tracking.server import probe
from vmapcheck.tracking.sqlite_store import require_existing_store
from vmapcheck.tracking.store import resolve_tracking_uri
from vmapcheck.tracking.uri import is_http


def list_versions(tracking_uri: str, name: str) -> list[Any]:
    """Every version of registered model ``name``, oldest first.

    Raises:
        ArtifactError: no such registered model in the store.
    """
    from mlflow.exceptions import MlflowException

    client = registry_client(tracking_uri)
    try:
        client.get_registered_model(name)
    except MlflowException:
        raise ArtifactError(
            f"no registered model {name!r} in {tracking_uri}: a run registers one when "
            "its check passes"
        ) from None
    found, token = [], None
    while True:
        page = client.search_model_versions(f"name = '{name}'", page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            break
    return sorted(found, key=lambda v: int(v.version))


def previous_verified(
    versions: list[Any],
    current: str,
    untrusted: Callable[[Any], str | None] = lambda version: None,
) -> Any | None:
    """The newest version before ``current`` that was verified, not rolled back from, not
    off the deployment target unless it was promoted (the alias never held it otherwise),
    and not ``untrusted`` (a reason, e.g.
    :func:`vmapcheck.tracking.registry.untrusted_because`; None: trusted)."""
    for v in reversed(versions):
        if (
            int(v.version) < int(current)
            and v.tags.get(TAG_VERIFIED) == "true"
            and TAG_ROLLED_BACK not in v.tags
            and (TAG_OFF_TARGET not in v.tags or TAG_PROMOTED in v.tags)
            and untrusted(v) is None
        ):
            return v
    return None


def _describe(version: Any) -> str:
    run = version.tags.get(TAG_RUN) or version.run_id or "?"
    digest = version.tags.get("params_sha256", "?")
    return f"version {version.version} (run {run}, params sha256 {digest[:12]})"


def rollback(tracking_uri: str, name: str) -> dict[str, Any]:
    """Move alias ``verified`` of ``name`` back to the previous verified version.

    The version it leaves gets tags ``rolled_back_at`` and ``rolled_back_to``, so a later
    rollback goes further back rather than returning to it. An alias move a dead ``track``
    left pending (:func:`vmapcheck.tracking.registry.settle_pending_alias`) is dropped, so
    the next track does not undo the rollback.

    Raises:
        ArtifactError: no such model, no version holds the alias, or none earlier was verified.
    """
    client = registry_client(tracking_uri)
    versions = list_versions(tracking_uri, name)
    current = alias_version(client, name, VERIFIED)
    missing = dangling_alias(client, name, VERIFIED)
    if missing is not None:
        raise ArtifactError(
            f"{dangling_alias_line(name, VERIFIED, missing)}; rollback goes back from a "
            "version that exists"
        )
    if current is None:
        raise ArtifactError(
            f"models:/{name}@{VERIFIED}: no version holds the alias; nothing to roll back"
        )
    target = previous_verified(versions, current.version, lambda v: untrusted_because(client, v))
    if target is None:
        raise ArtifactError(
            f"models:/{name}@{VERIFIED} is at {_describe(current)}, and no earlier version "
            "was verified (or every earlier one was rolled back from, or its run is not "
            "complete): nothing to roll back to"
        )
    client.set_registered_model_alias(name, VERIFIED, target.version)
    client.set_model_version_tag(name, current.version, TAG_ROLLED_BACK, utc_now())
    client.set_model_version_tag(name, current.version, "rolled_back_to", target.version)
    # A move a dead track left pending would undo this rollback at the next track: it is
    # dropped (the version keeps its other tags and can be rolled back to).
    dropped = _drop_pending_moves(client, name, versions)
    note = f"; the pending alias move to version(s) {', '.join(dropped)} dropped" if dropped else ""
    return {
        "registered_model": name,
        "alias": VERIFIED,
        "from": str(current.version),
        "to": str(target.version),
        "message": (
            f"rollback: models:/{name}@{VERIFIED} moved from {_describe(current)} "
            f"to {_describe(target)}{note}"
        ),
    }


def _drop_pending_moves(client: Any, name: str, versions: list[Any]) -> list[str]:
    """Drop every alias move a dead track left pending on a complete run's version (it
    would undo a rollback or a promotion at the next track); the versions dropped."""
    dropped = [
        str(v.version)
        for v in versions
        if TAG_ALIAS_PENDING in v.tags and untrusted_because(client, v) is None
    ]
    for number in dropped:
        client.delete_model_version_tag(name, number, TAG_ALIAS_PENDING)
    return dropped


def _chosen_version(
    tracking_uri: str, name: str, versions: list[Any], version: str | None, run_id: str | None
) -> Any:
    """The version ``promote`` was given: by number, or the newest one ``run_id`` registered."""
    if (version is None) == (run_id is None):
        raise ConfigError(
            "promote: expected one of --version N or --run RUN_ID, found "
            + ("both" if version is not None else "neither")
        )
    numbers = ", ".join(str(v.version) for v in versions) or "none"
    if version is not None:
        chosen = [v for v in versions if str(v.version) == str(version)]
        if not chosen:
            raise ArtifactError(
                f"--version {version}: no such version of {name!r} in {tracking_uri} "
                f"(its versions: {numbers})"
            )
        return chosen[0]
    chosen = [v for v in versions if run_id in (v.run_id, v.tags.get(TAG_RUN))]
    if not chosen:
        raise ArtifactError(
            f"--run {run_id}: registered no version of {name!r} in {tracking_uri} (a run "
            f"registers one when its check passes; `vmapcheck registry` lists them)"
        )
    return chosen[-1]


def promote(
    tracking_uri: str, name: str, version: str | None = None, run_id: str | None = None
) -> dict[str, Any]:
    """Move alias ``verified`` of ``name`` to a version on purpose: ``version`` (its number)
    or the newest version run ``run_id`` registered. Any verified version whose run is
    complete may be promoted, one off the deployment target too (a passing run with
    other settings registers such a version without the alias): the message then says
    how it differs, since ``@verified`` now serves it (its signature's dtype included).

    The version gets ``promoted_at`` and ``promoted_from`` (the version the alias held,
    or ``none``) and loses ``rolled_back_at``/``rolled_back_to``, so rollback can return
    to it; an alias move a dead ``track`` left pending is dropped, as by :func:`rollback`.

    Raises:
        ConfigError: neither or both of ``version`` and ``run_id``.
        ArtifactError: no such model or version, a version no passing run verified, or
            one whose run is not complete.
    """
    client = registry_client(tracking_uri)
    versions = list_versions(tracking_uri, name)
    chosen = _chosen_version(tracking_uri, name, versions, version, run_id)
    number = str(chosen.version)
    where = f"models:/{name}/{number}"
    if chosen.tags.get(TAG_VERIFIED) != "true":
        raise ArtifactError(
            f"{where}: not tagged {TAG_VERIFIED}=true; only versions a passing vmapcheck run "
            "registered are promoted"
        )
    untrusted = untrusted_because(client, chosen)
    if untrusted is not None:
        raise ArtifactError(f"{where}: {untrusted}; only versions of complete runs are promoted")
    current = alias_version(client, name, VERIFIED)
    # Said, then moved: the promotion repairs an alias left pointing at nothing.
    missing = dangling_alias(client, name, VERIFIED)
    off = chosen.tags.get(TAG_OFF_TARGET)
    note = (
        f"; version {number} is off the deployment target ({TARGET_SETTING}): {off}" if off else ""
    )
    if current is not None and str(current.version) == number:
        return {
            "registered_model": name,
            "alias": VERIFIED,
            "from": number,
            "to": number,
            "message": f"promote: models:/{name}@{VERIFIED} is already {_describe(chosen)}; "
            f"nothing moved{note}",
        }
    client.set_registered_model_alias(name, VERIFIED, number)
    client.set_model_version_tag(name, number, TAG_PROMOTED, utc_now())
    previous = str(current.version) if current is not None else (missing or "none")
    client.set_model_version_tag(name, number, "promoted_from", previous)
    for tag in (TAG_ROLLED_BACK, "rolled_back_to"):
        if tag in chosen.tags:
            client.delete_model_version_tag(name, number, tag)
    dropped = _drop_pending_moves(client, name, versions)
    pending = (
        f"; the pending alias move to version(s) {', '.join(dropped)} dropped" if dropped else ""
    )
    moved_from = f"from {_describe(current)} " if current is not None else ""
    if missing is not None:
        moved_from = f"from version {missing} (which is not in the store) "
    return {
        "registered_model": name,
        "alias": VERIFIED,
        "from": str(current.version) if current is not None else None,
        "to": number,
        "message": f"promote: models:/{name}@{VERIFIED} moved {moved_from}to "
        f"{_describe(chosen)}{note}{pending}",
    }


def show(tracking_uri: str, name: str) -> str:
    """The versions of ``name`` as text: which holds which alias, and their tags."""
    versions = list_versions(tracking_uri, name)
    client = registry_client(tracking_uri)
    # search_model_versions leaves ModelVersion.aliases empty: the model holds the map.
    held: dict[str, list[str]] = {}
    for alias, number in client.get_registered_model(name).aliases.items():
        held.setdefault(str(number), []).append(alias)
    lines = [f"registered model {name} in {tracking_uri}: {len(versions)} version(s)"]
    numbers = {str(v.version) for v in versions}
    for number, aliases in sorted(held.items()):
        if number not in numbers:  # an alias naming a version the store lacks
            lines.extend(f"  {dangling_alias_line(name, a, number)}" for a in sorted(aliases))
    for v in reversed(versions):
        names = sorted(held.get(str(v.version), []))
        named = f" @{', @'.join(names)}" if names else ""
        state = " (rolled back from)" if TAG_ROLLED_BACK in v.tags else ""
        if TAG_OFF_TARGET in v.tags:
            state += " (off the deployment target" + (
                ", promoted)"
                if TAG_PROMOTED in v.tags
                else ": `vmapcheck promote` moves the alias to it)"
            )
        if TAG_ALIAS_PENDING in v.tags:
            state += (
                f" (alias {VERIFIED} move pending: the next track makes it if its run is complete)"
            )
        lines.append(f"  version {v.version}{named}{state}  source {v.source}")
        untrusted = untrusted_because(client, v)
        if untrusted:
            lines.append(f"      not loaded: {untrusted}")
        for key in sorted(v.tags):
            lines.append(f"      {key} = {v.tags[key]}")
    if not versions:
        lines.append("  (none)")
    return "\n".join(lines)


def local_params_note(tracking_uri: str, name: str, params_dir: Path) -> str | None:
    """A line saying that ``params_dir`` came from an alias of ``name`` that has moved
    since (DVC cannot see the registry: ``train`` reruns only when params.yaml changes)."""
    manifest = params_dir / MANIFEST_FILE
    if not manifest.is_file():
        return None
    source = read_json(manifest).get("source", {})
    if source.get("registered_model") != name or "@" not in source.get("params_source", ""):
        return None
    now = resolve_version(tracking_uri, source["params_source"])
    if str(now.version) == source.get("version"):
        return f"{params_dir} holds version {now.version}, where {source['params_source']} points"
    return (
        f"{params_dir} holds version {source.get('version')} from {source['params_source']}, "
        f"which now points at version {now.version}: run `dvc repro --force --single-item "
        "train` then `dvc repro` to use it"
    )


def _command(layout: Layout, model: str | None, action: Callable[[str, str], None]) -> int:
    """Resolve the store and the registered model, then ``action(uri, name)``; errors go to
    stderr as ``registry: error: ...`` with exit 2."""
    from mlflow.exceptions import MlflowException

    try:
        config = load_config(layout.params_yaml)
        uri = resolve_tracking_uri(config.tracking, layout.root)
        require_existing_store(uri, "the registry")
        if is_http(uri):
            # A server that does not answer is said so: its reads would otherwise look
            # like an empty registry ("no registered model").
            probe(uri, config.tracking)
        # Only an absent --model means the configured one: an empty name (`--model ''`, a
        # shell variable left unset) matches nothing and is refused below, never read as
        # "the default model".
        name = model if model is not None else config.registry.registered_model
        if name is None:
            raise ConfigError("registry.registered_model is null and no --model was given")
        if not re.fullmatch(REGISTERED_MODEL_PATTERN, name):
            raise ConfigError(
                f"--model: expected a registered model name matching "
                f"{REGISTERED_MODEL_PATTERN}, found {name!r}"
            )
        action(uri, name)
    except VmapcheckError as exc:
        print(f"registry: error: {exc}", file=sys.stderr)
        return 2
    except MlflowException as exc:  # the store refused or could not be reached
        print(f"registry: error: {exc.message}", file=sys.stderr)
        return 2
    return 0


def target_line(config: Config) -> str:
    """The deployment target (``registry.target``) as one line, for ``vmapcheck registry``."""
    target = config.registry.target
    hidden = "any" if target.hidden is None else str(target.hidden)
    return (
        f"deployment target ({TARGET_SETTING}): model {target.model}, hidden {hidden}, "
        f"backend {target.backend}, precision {target.precision} "
        f"({precision_dtype(target.precision)}), bench {target.bench}; a passing run of it "
        f"moves @{VERIFIED}, `vmapcheck promote` any other"
    )


def run_show(layout: Layout, model: str | None = None) -> int:
    """``vmapcheck registry``: the versions of ``model`` (default:
    ``registry.registered_model``), the deployment target, and whether ``layout.params`` is
    where its alias points."""

    def action(uri: str, name: str) -> None:
        print(show(uri, name))
        print(target_line(load_config(layout.params_yaml)))
        note = local_params_note(uri, name, layout.params)
        if note:
            print(note)

    return _command(layout, model, action)


def run_rollback(layout: Layout, model: str | None = None) -> int:
    """``vmapcheck rollback``: move alias ``verified`` of ``model`` back (:func:`rollback`)."""
    return _command(layout, model, lambda uri, name: print(rollback(uri, name)["message"]))


def run_promote(
    layout: Layout,
    model: str | None = None,
    version: str | None = None,
    run_id: str | None = None,
) -> int:
    """``vmapcheck promote``: move alias ``verified`` of ``model`` to a version on purpose
    (:func:`promote`)."""

    def action(uri: str, name: str) -> None:
        print(promote(uri, name, version, run_id)["message"])

    return _command(layout, model, action)
