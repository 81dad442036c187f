"""Stage `train`: fit on train, select on validation, test once -> verified params.

Or, with `train.params_file`, verify the user's params (sha256, safetensors, contract)
and evaluate them instead; or, with `train.params_source` (models:/<name>@<alias> or
models:/<name>/<version>), fetch verified params from the MLflow Model Registry, verify
them against the digests recorded there and the contract
(vmapcheck.tracking.registered_params), and evaluate them (the resolved version and
digest go into the manifest). Either way the params artifact gets a manifest (sha256,
contract, key stream, config digest) and the model's contract beside it.
"""

from collections.abc import Mapping
from dataclasses import replace
from itertools import combinations
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.errors import KeyReuseError

from vmapcheck.config import Config, config_digest
from vmapcheck.core.contract import output_contract_problem
from vmapcheck.core.forms import forward_keys, keyed_model, with_keys
from vmapcheck.core.keys import KEY_NAMES, named_keys
from vmapcheck.core.memory import check_train_memory
from vmapcheck.core.models import build_model
from vmapcheck.core.runtime import configure_cpu_float32
from vmapcheck.core.state import declared_state
from vmapcheck.core.training import fit
from vmapcheck.data.regression import SPLITS, load_split
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import atomic_dir, atomic_write_json, read_json_object
from vmapcheck.layout import Layout
from vmapcheck.params_io import (
    check_features,
    leaf_paths,
    model_contract,
    read_params_file,
    save_params,
)
from vmapcheck.tracking.registered_params import load_registered_params, manifest_source
from vmapcheck.tracking.store import resolve_tracking_uri


def run(config: Config, layout: Layout) -> None:
    runtime = configure_cpu_float32()
    keys = named_keys(config.seed)
    model = build_model(config.model)
    # Before any array is made: a model too big for this machine is refused, with both
    # figures, rather than killed by the system minutes later.
    check_train_memory(model, f"model.hidden={config.model.hidden}, model.factory")
    features = read_json_object(layout.prepared_manifest, ("features",))["features"]
    # Each split's feature table as batches of the model's input contract (batch axis 0).
    splits = {}
    for name in SPLITS:
        table, targets = load_split(layout.prepared, name)
        try:
            splits[name] = (model.contract.from_table(table, features), targets)
        except ArtifactError as exc:
            # The model's inputs and the prepared table disagree: both sides named.
            raise ArtifactError(
                f"{layout.prepared / name}.npz against model.in_features (or model.inputs): "
                f"{exc}; make data.n_features (or data.features) match"
            ) from None
    # Before any work (no compute: shapes only): an output of the wrong shape, dtype or
    # kind is the model's problem, named, not a traceback from the loss.
    # A stochastic model is traced with row 0's key (vmapcheck.core.forms.keyed_model).
    problem = output_contract_problem(
        keyed_model(model),
        jax.eval_shape(model.init, jax.random.key(0)),
        with_keys(model, splits["train"][0], forward_keys(config.seed)),
    )
    if problem:
        raise ConfigError(f"model {model.name!r} (model.factory): {problem}")
    # Targets the loss would compare with outputs of another width (a raw broadcasting
    # error from inside the loss, otherwise): both keys named.
    targets = np.asarray(splits["train"][1])
    if (
        targets.ndim == 2
        and np.issubdtype(targets.dtype, np.floating)
        and targets.shape[1] != model.out_features
    ):
        raise ConfigError(
            f"model.out_features={model.out_features}: expected the prepared targets "
            f"({layout.prepared}, data.n_targets or data.targets) to have as many columns, "
            f"found {targets.shape[1]}"
        )
    # The config holds both or neither (TrainConfig's validator).
    source: Mapping[str, Any]
    if config.train.params_file is not None and config.train.params_sha256 is not None:
        template = jax.eval_shape(model.init, jax.random.key(0))
        params = read_params_file(
            layout.root / config.train.params_file, template, config.train.params_sha256
        )
        # Evaluated, not trained: the user's params are what is verified.
        params, metrics = fit(
            replace(model, trainable=False), params, splits, config.train, keys["batches"]
        )
        source = {
            "params_file": config.train.params_file,
            "params_sha256": config.train.params_sha256,
        }
    elif config.train.params_source is not None:
        params, _, registered_contract, registered = load_registered_params(
            model, config.train.params_source, resolve_tracking_uri(config.tracking, layout.root)
        )
        check_features(features, registered_contract, config.train.params_source)
        print(
            f"train: {config.train.params_source} is version {registered.version} (run "
            f"{registered.run_id}, sha256 {registered.params_sha256}): verified, evaluated"
        )
        params, metrics = fit(
            replace(model, trainable=False), params, splits, config.train, keys["batches"]
        )
        source = manifest_source(registered)
    else:
        params, metrics = fit(
            model, _init(model, keys["init"], config.seed), splits, config.train, keys["batches"]
        )
        source = {"trained": metrics["trained"], "key_stream": list(KEY_NAMES)}
    params = jax.device_get(params)
    contract = model_contract(model, params, features)
    with atomic_dir(layout.params) as folder:
        save_params(
            folder,
            params,
            {
                "model": config.model.name,
                "seed": config.seed,
                "jax_version": runtime.jax_version,
                "config_digest": config_digest(config),
                "source": source,
                "inputs": contract["inputs"],
                "outputs": contract["outputs"],
            },
        )
        atomic_write_json(folder / layout.contract.name, contract)
    atomic_write_json(layout.train_report, metrics)
    print(
        f"train: model {model.name}, trained={metrics['trained']}, best step "
        f"{metrics['best_step']}, val loss {metrics['val_loss']:.4g}, test loss "
        f"{metrics['test_loss']:.4g}"
    )


# Two params leaves whose first values correlate at least this much were drawn with one
# key (the same threshold as the diagnosis' key-stream stage).
SAME_DRAW = 1.0 - 1e-4
MIN_DRAW = 8


def _init(model: Any, key: jax.Array, seed: int) -> Any:
    """``model.init(key)`` under the key-reuse checker; a key consumed twice is re-raised
    with ``shared_by`` naming the params leaves that share it (when their draws show it)."""
    try:
        return model.init(key)
    except KeyReuseError as exc:
        pair = _leaves_sharing_a_key(model, seed)
        if pair:
            # Read by run_stage (JAX adds notes of its own to this exception); JAX's
            # KeyReuseError declares no such attribute, hence the ignore.
            exc.shared_by = (  # type: ignore[attr-defined]
                f"model {model.name!r}: init draws params leaf {pair[1]} with the key already "
                f"used for leaf {pair[0]}"
            )
        raise


def _leaves_sharing_a_key(model: Any, seed: int) -> tuple[str, str] | None:
    """The first two params leaves that repeat one random draw: both move with the key
    and their first values correlate to 1 (one key fed both). None when none does."""
    with jax.debug_key_reuse(False):
        params = leaf_paths(model.init(named_keys(seed)["init"]))
        elsewhere = leaf_paths(model.init(named_keys(seed + 1)["init"]))
    draws = {}
    for name, leaf in params.items():
        host = np.asarray(leaf)
        if declared_state(model, name):  # computed from draws (statistics), not drawn
            continue
        if not jnp.issubdtype(host.dtype, jnp.floating) or host.size < MIN_DRAW:
            continue
        flat = host.astype(np.float64).ravel()
        moved = not np.array_equal(host, np.asarray(elsewhere.get(name)))
        if moved and np.all(np.isfinite(flat)) and flat.std() > 0:
            draws[name] = flat
    for earlier, later in combinations(draws, 2):
        n = min(draws[earlier].size, draws[later].size)
        a = draws[earlier][:n] - draws[earlier][:n].mean()
        b = draws[later][:n] - draws[later][:n].mean()
        denom = np.sqrt((a * a).sum() * (b * b).sum())
        if denom > 0 and abs((a * b).sum() / denom) >= SAME_DRAW:
            return earlier, later
    return None
