"""The model ``vmapcheck init`` sets the project up for (``--model``): a shipped option,
or the user's factory (``package.module:function``), imported and called to read its
widths and input contract into conf/model/<name>.yaml."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from vmapcheck.errors import ConfigError, did_you_mean
from vmapcheck.project.options import OPTION_NAME, shipped_options


@dataclass(frozen=True)
class ModelChoice:
    """The model the project checks: a shipped option (``mlp``) or the user's factory."""

    name: str
    # None for a shipped option: conf/model/<name>.yaml of the package holds it.
    config: dict[str, Any] | None = None
    # The files and folders of the user's model code, relative to the root (DVC deps).
    code: tuple[str, ...] = ()


def target_hidden(model: ModelChoice) -> str:
    """The deployment target's ``hidden`` (registry.target.hidden) as config.yaml writes
    it: the layer widths of the model's option when it sets them as a list (``[32, 32]``
    for mlp), else ``null`` (any)."""
    if model.config is not None:
        hidden = model.config.get("hidden")
    else:
        option = files("vmapcheck.conf") / "model" / f"{model.name}.yaml"
        hidden = yaml.safe_load(option.read_text(encoding="utf-8")).get("hidden")
    if not isinstance(hidden, list) or not all(isinstance(n, int) for n in hidden):
        return "null"
    return json.dumps(hidden)


def _parse_factory_args(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs (values read as YAML: ``hidden=[64, 64]``, ``width=128``)."""
    args = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--factory-arg: expected key=value, found {pair!r}")
        args[key] = yaml.safe_load(value)
    return args


def _import_factory(root: Path, target: str) -> tuple[Any, Any]:
    """Import ``module:function`` as the stages will (the root first on ``sys.path``, as
    ``python -m`` puts it); return (module, function)."""
    module_name, sep, function = target.partition(":")
    if not sep or not module_name or not function.isidentifier():
        raise ConfigError(
            f"--model: expected a shipped option ({', '.join(shipped_options('model'))}) or "
            f"your factory as package.module:function, found {target!r}"
        )
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"--model {target}: cannot import {module_name!r} from {root} ({exc}). The stages "
            "import it the same way (`python -m` from the repository's root): keep the package "
            "at the root, or install it in this environment (pip install -e .)"
        ) from None
    finally:
        sys.path.remove(str(root))
    if not callable(getattr(module, function, None)):
        raise ConfigError(f"--model {target}: module {module_name!r} has no function {function!r}")
    return module, getattr(module, function)


def _code_paths(root: Path, module: Any, target: str) -> tuple[str, ...]:
    """The top-level package (folder) or module file of ``module``, relative to ``root``."""
    top = importlib.import_module(module.__name__.split(".")[0])
    if top.__file__ is None:
        # A namespace package (no __init__.py): no one folder to record as the model's code.
        raise ConfigError(
            f"--model {target}: package {top.__name__!r} is a namespace package (no "
            "__init__.py), expected a package or module file under the project"
        )
    origin = Path(top.__file__).resolve()
    path = origin.parent if origin.name == "__init__.py" else origin
    try:
        return (path.relative_to(root.resolve()).as_posix(),)
    except ValueError:
        raise ConfigError(
            f"--model {target}: {module.__name__!r} is installed at {path}, outside this "
            "repository, so DVC cannot track its code: name the folders to track with "
            "--model-code PATH (repeatable)"
        ) from None


def _model_config(
    name: str, target: str, factory: Any, factory_args: dict[str, Any], model: Any
) -> dict:
    """conf/model/<name>.yaml's content, from the Model the factory returned. A factory
    argument named like a width (in_features, out_features) is the config's width,
    interpolated, so that `-S model.in_features=...` changes both at once."""
    config: dict[str, Any] = {
        "name": name,
        "in_features": int(model.in_features),
        "out_features": int(model.out_features),
        "inputs": None,
    }
    if model.inputs is not None:
        config["inputs"] = {
            leaf.name: {
                "shape": [int(n) for n in leaf.shape],
                "dtype": leaf.dtype,
                **({"vocab": int(leaf.vocab)} if leaf.vocab is not None else {}),
                "meaning": leaf.meaning,
            }
            for leaf in model.inputs.leaves
        }
    parameters = inspect.signature(factory).parameters
    widths = {
        key: f"${{model.{key}}}" for key in ("in_features", "out_features") if key in parameters
    }
    # Every knob with a default is written too, so that `-S model.factory.<knob>=...`
    # overrides it (Hydra refuses a key the file lacks); a default YAML cannot hold (a
    # function, an object) is left to the factory.
    defaults = {
        key: list(p.default) if isinstance(p.default, tuple) else p.default
        for key, p in parameters.items()
        if p.default is not inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and key not in factory_args
        and key not in widths
        and _plain(p.default)
    }
    config["factory"] = {
        "_target_": target.replace(":", "."),
        **factory_args,
        **defaults,
        **widths,
    }
    return config


def _plain(value: Any) -> bool:
    """Whether a factory default is plain data a config file holds: None, a bool, int,
    float or str, or a list or tuple of them."""
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, bool | int | float | str)


def _check_init_leaves(model: Any, target: str) -> None:
    """Refuse, naming the leaves, a model whose ``init`` train would refuse after the
    data stage: leaves that follow JAX's default float dtype (``check`` runs with x64 on,
    the float64 oracle, where such a leaf is float64 and the stored float32 params no
    longer match: docs/own-model.md, init), and non-float leaves not declared in
    ``state_leaves`` (docs/state-leaves.md; the refusal train gives,
    :func:`vmapcheck.core.state.partition`). ``init`` is evaluated abstractly."""
    import jax

    from vmapcheck.core.state import partition
    from vmapcheck.params_io import contract_of

    with jax.enable_x64(True):
        shapes = contract_of(jax.eval_shape(model.init, jax.random.key(0)))
    wide = sorted(name for name, leaf in shapes.items() if leaf["dtype"] == "float64")
    if wide:
        raise ConfigError(
            f"--model {target}: init returns float64 leaves when JAX runs in x64 mode "
            f"(the check stage's float64 oracle): {', '.join(wide)}; expected float32: "
            "create them with an explicit dtype=jnp.float32 (docs/own-model.md, init)"
        )
    try:
        partition(model, jax.eval_shape(model.init, jax.random.key(0)))
    except ConfigError as exc:
        raise ConfigError(f"--model {target}: {exc}") from None


def resolve_model(
    root: Path,
    target: str,
    name: str | None = None,
    factory_args: list[str] | None = None,
    model_code: list[str] | None = None,
) -> ModelChoice:
    """The project's model: a shipped option by name, or ``package.module:function``,
    imported and called with ``factory_args`` to read its widths and input contract.

    Raises:
        ConfigError: an unknown option, a factory that cannot be imported or called or
            that returns no Model, a bad name, model code outside the repository.
    """
    from vmapcheck.core.models import Model

    if ":" not in target:
        if target not in shipped_options("model"):
            raise ConfigError(
                f"--model: expected a shipped option ({', '.join(shipped_options('model'))}) "
                f"or your factory as package.module:function, found {target!r}"
                + did_you_mean(target, shipped_options("model"))
            )
        if name not in (None, target) or factory_args or model_code:
            raise ConfigError(
                f"--model {target} is a shipped option: --name, --factory-arg and "
                "--model-code are for a factory of your own"
            )
        return ModelChoice(name=target)
    args = _parse_factory_args(factory_args or [])
    module, factory = _import_factory(root, target)
    try:
        model = factory(**args)
    except Exception as exc:  # the user's code: any failure is reported, named
        raise ConfigError(
            f"--model {target}: calling it with {args or 'no arguments'} raised "
            f"{type(exc).__name__}: {exc} (give its arguments with --factory-arg key=value)"
        ) from None
    if not isinstance(model, Model):
        raise ConfigError(
            f"--model {target}: expected it to return a vmapcheck.core.models.Model, "
            f"found {type(model).__name__}"
        )
    _check_init_leaves(model, target)
    name = name or model.name
    if not OPTION_NAME.match(name or ""):
        raise ConfigError(
            f"--name: expected a letter, then letters, digits, _ or - (it names "
            f"data/reference/<name>/ and the MLflow runs), found {name!r}"
        )
    if name in shipped_options("model"):
        raise ConfigError(
            f"--name: {name!r} is a shipped model option; choose another name for yours"
        )
    code = tuple(model_code) if model_code else _code_paths(root, module, target)
    for path in code:
        if not (root / path).exists():
            raise ConfigError(f"--model-code: {path} does not exist under {root}")
    return ModelChoice(
        name=name, config=_model_config(name, target, factory, args, model), code=code
    )
