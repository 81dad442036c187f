"""Reading params.yaml into a :class:`~vmapcheck.config.whole.Config`: the errors named by
key (what was expected and found), the project's own keys set aside, and the digests and
flat views of a config that runs are compared by."""

from __future__ import annotations

import hashlib
import json
import re
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from vmapcheck.config.whole import Config
from vmapcheck.errors import ArtifactError, ConfigError, describe, did_you_mean, redact
from vmapcheck.io import read_text_bounded

# The discriminator of a tagged union (data.source): pydantic puts the tag's value into an
# error's location (data.synthetic.split), where it is no key of params.yaml.
_TAG_KEYS = ("source",)


def _key_path(loc: tuple[Any, ...], raw: Any = None) -> str:
    """The params.yaml key an error's ``loc`` points at (``data.split``), without the
    union tags pydantic inserts (``data.synthetic.split``)."""
    path = ""
    node = raw
    for part in loc:
        if (
            isinstance(node, dict)
            and isinstance(part, str)
            and part not in node
            and any(node.get(tag) == part for tag in _TAG_KEYS)
        ):
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return path or "<root>"


# A value found in params.yaml is shown at most this long (an unknown key may hold a list
# of thousands); a mapping is named by its kind only.
_SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    """A value found in the config as an error shows it: its repr, cut; ``a mapping``."""
    if isinstance(value, dict):
        return "a mapping"
    # A URL's user and password are never shown (the error is printed, and kept in logs).
    text = redact(repr(value))
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _tag_key(key: str, err: ErrorDetails) -> str:
    """The key of a tagged union's tag (``data.source``) for an error pydantic reports
    on the whole section (``data``)."""
    tag = str(err.get("ctx", {}).get("discriminator", "")).strip("'\"")
    return f"{key}.{tag}" if tag and key != "<root>" else tag or key


def _value_types(annotation: Any, raw: Any) -> list[Any]:
    """The config sections (pydantic models) or mappings (``dict[str, X]``) a value of
    ``annotation`` can be, ``raw`` (the value found) choosing among a tagged union's
    members by its tag (``data.source``); other annotations (leaves) give none."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _value_types(get_args(annotation)[0], raw)
    if origin in (Union, types.UnionType):
        members = [t for arg in get_args(annotation) for t in _value_types(arg, raw)]
        tagged = [
            m
            for m in members
            if isinstance(m, type)
            and issubclass(m, BaseModel)
            and isinstance(raw, dict)
            and any(
                raw.get(tag) in get_args(m.model_fields[tag].annotation)
                for tag in _TAG_KEYS
                if tag in m.model_fields
            )
        ]
        return tagged or members
    if origin is dict:
        return [annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def known_keys(key: str, raw: Any = None) -> list[str]:
    """The dotted keys the schema accepts beside ``key`` (a dotted params.yaml key, as
    :func:`_key_path` writes it: ``precision.tolerence``), each with its parent's path
    (``precision.tolerance``, ``precision.dtype``, ...): what a mistyped key was meant to
    be. ``raw``: the parsed params.yaml, which picks a tagged union's member. Empty where
    any key is accepted (a mapping of the user's names, e.g. ``model.inputs``)."""
    parts = [re.sub(r"\[\d+\]$", "", part) for part in key.split(".")]
    kinds: list[Any] = [Config]
    node = raw
    for part in parts[:-1]:
        found: list[Any] = []
        for kind in kinds:
            if get_origin(kind) is dict:
                found += _value_types(get_args(kind)[1], (node or {}).get(part))
            elif part in kind.model_fields:
                value = node.get(part) if isinstance(node, dict) else None
                found += _value_types(kind.model_fields[part].annotation, value)
        kinds = found
        node = node.get(part) if isinstance(node, dict) else None
    parent = ".".join(parts[:-1])
    names = sorted(
        {
            name
            for kind in kinds
            if isinstance(kind, type) and issubclass(kind, BaseModel)
            for name in kind.model_fields
        }
    )
    return [f"{parent}.{name}" if parent else name for name in names]


def describe_errors(errors: Sequence[ErrorDetails], source: str, raw: Any = None) -> str:
    lines = [f"invalid configuration in {source}:"]
    for err in errors:
        key = _key_path(err["loc"], raw)
        if err["type"] == "extra_forbidden":
            found = err["input"]
            what = _shown(found) if isinstance(found, dict) else f"value {_shown(found)}"
            hint = (
                " (a key of your project's own, read by its stages: list it in project_keys, "
                "conf/config.yaml)"
                if len(err["loc"]) == 1
                else ""
            )
            parent, _, name = key.rpartition(".")
            siblings = [k.rpartition(".")[2] for k in known_keys(key, raw)]
            close = did_you_mean(name, siblings, prefix=f"{parent}." if parent else "")
            lines.append(f"  {key}: unknown key (found {what}){close or hint}")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        elif err["type"] == "union_tag_invalid":
            # Reported on the section (its input: the whole mapping); the tag is the key.
            ctx = err.get("ctx", {})
            lines.append(
                f"  {_tag_key(key, err)}: expected one of {ctx.get('expected_tags')}, "
                f"found {ctx.get('tag')!r}"
            )
        elif err["type"] == "union_tag_not_found":
            lines.append(f"  {_tag_key(key, err)}: required key is missing")
        elif err["type"] == "value_error":
            # Our own validators' messages say what was expected and found; the input is
            # then the whole section (a mapping), which adds nothing.
            message = err["msg"].removeprefix("Value error, ")
            found = err.get("input")
            shown = "" if isinstance(found, dict) else f", found {_shown(found)}"
            lines.append(f"  {key}: {message}{shown}")
        elif key.endswith("secret_env"):
            # The name of a variable is asked for: a value that is not one may be the
            # secret itself, pasted in, and is not shown.
            lines.append(
                f"  {key}: {err['msg']} (the name of an environment variable), found a "
                "value that is not one (not shown: it may be the secret itself)"
            )
        else:
            found = err.get("input")
            lines.append(f"  {key}: {err['msg']}, found {_shown(found)}")
    return "\n".join(lines)


def validate_config(raw: Any, source: str = "params.yaml") -> Config:
    """Validate a mapping (parsed params.yaml) into a :class:`Config`.

    Raises:
        ConfigError: naming every offending key with what was expected and found.
    """
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, found {type(raw).__name__}"
        )
    raw = without_project_keys(raw, source)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc.errors(), source, raw)) from None
    # After the keys' own ranges (a seed's is narrower, and named): a key with none.
    too_wide = _beyond_int64(raw)
    if too_wide:
        key, value = too_wide
        raise ConfigError(
            f"invalid configuration in {source}:\n  {key}: expected an integer within int64 "
            f"({-(2**63)} to {2**63 - 1}: numpy, JAX and MLflow hold it as one), found {value}"
        )
    return config


def _beyond_int64(raw: Any, key: str = "") -> tuple[str, int] | None:
    """The first integer in ``raw`` (a parsed params.yaml) outside int64, with its dotted
    key, or None. Every key's own range is narrower; this one holds for keys that have
    none, where such a value would overflow (``OverflowError``) in the stage that uses it."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return (key or "<root>", raw) if not -(2**63) <= raw < 2**63 else None
    children = (
        raw.items() if isinstance(raw, dict) else enumerate(raw) if isinstance(raw, list) else ()
    )
    for name, value in children:
        found = _beyond_int64(value, f"{key}.{name}" if key else str(name))
        if found:
            return found
    return None


def without_project_keys(raw: dict[str, Any], source: str = "params.yaml") -> dict[str, Any]:
    """``raw`` without the project's own keys (``project_keys``: a list of names, none of
    them one of vmapcheck's), which vmapcheck does not read.

    Raises:
        ConfigError: ``project_keys`` is not a list of names, or names a key of vmapcheck's.
    """
    keys = raw.get("project_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(
            f"{source}: project_keys: expected a list of the project's own top-level keys, "
            f"found {keys!r}"
        )
    clash = sorted(set(keys) & (set(Config.model_fields) - {"project_keys"}))
    if clash:
        raise ConfigError(
            f"{source}: project_keys: {', '.join(clash)} is vmapcheck's own key, not the "
            "project's: rename the project's key (conf/project.yaml and the stages reading it)"
        )
    return {k: v for k, v in raw.items() if k not in keys}


def read_params(path: str | Path = "params.yaml") -> tuple[str, Any]:
    """params.yaml's text and what it parses to (not validated).

    Raises:
        ConfigError: the file is missing or not YAML.
    """
    path = Path(path)
    try:
        # Bounded and type-checked before it is opened: a FIFO, /dev/zero or a huge file
        # is refused at once (it would block, or fill the memory).
        text = read_text_bounded(path, PARAMS_MAX_BYTES, "a params file")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: not found; run `vmapcheck params` to compose it from conf/"
        ) from None
    except ArtifactError as exc:
        raise ConfigError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {describe(exc)}") from None
    except OSError as exc:  # a symlink loop, no permission: describe names the file
        raise ConfigError(str(describe(exc))) from None
    try:
        return text, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{path}: expected YAML nested a few hundred levels at most, found it nested "
            "too deeply to read"
        ) from None


# The largest params.yaml read (a composed one is a few kB): a bigger file is refused
# with its size before it is read.
PARAMS_MAX_BYTES = 4 * 2**20


def load_config(path: str | Path = "params.yaml") -> Config:
    """Read and validate params.yaml (the composed Hydra config)."""
    _, raw = read_params(path)
    return validate_config(raw, source=str(path))


def config_digest(config: Config) -> str:
    """sha256 of the settings that determine params and cases (seed, model, data, train)."""
    subset = config.model_dump(include={"seed", "model", "data", "train"})
    return hashlib.sha256(json.dumps(subset, sort_keys=True).encode()).hexdigest()


def flatten(config: Config) -> dict[str, Any]:
    """Flatten to dotted keys (``precision.tolerance.rtol``) for logging as params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else key, sub)
        else:
            out[prefix] = value

    walk("", config.model_dump())
    return out
