"""Verified params in the MLflow Model Registry, against a real sqlite store (no mocks).

Register on pass and never on fail, the `verified` alias and rollback, and loading by
models:/ URI with the sha256 digests and the contract checked again.
"""

from __future__ import annotations

import json
import re
import shutil

import jax
import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file, save_file

from tests.helpers.config import compose_config
from tests.helpers.registry import RUNTIME, Store
from vmapcheck import cli
from vmapcheck.compose import compose_yaml
from vmapcheck.config import precision_names, validate_config
from vmapcheck.core.models import build_model
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import read_json, sha256_file
from vmapcheck.tracking import registered_params, registry, registry_commands

NAME = "vmapcheck-mlp"
FEATURES = [f"x{i}" for i in range(8)]


@pytest.fixture
def store(tmp_path, empty_mlflow_store):
    empty_mlflow_store(tmp_path / "mlflow.db")  # Store opens it as a fresh store
    return Store(tmp_path)


def test_passing_runs_register_versions_and_move_verified_a_failing_run_does_not(store):
    first = store.run_and_register(seed=1)
    assert first["status"] == "registered" and first["version"] == "1"
    assert first["previous"] is None and first["uri"] == f"models:/{NAME}/1"
    assert store.verified() == "1"
    second = store.run_and_register(seed=2)
    assert (second["version"], second["previous"]) == ("2", "1")
    assert store.verified() == "2"

    failed = store.run_and_register(seed=3, verdict="failed")
    assert failed["status"] == "not registered" and "check failed" in failed["why"]
    versions = registry_commands.list_versions(store.uri, NAME)
    assert [str(v.version) for v in versions] == ["1", "2"]  # the earlier version stays
    assert store.verified() == "2"  # a failing run never moves the alias

    # What verified each version is on its tags, with the digest of each file.
    tags = versions[1].tags
    assert tags["verified"] == "true" and tags["verified_by_run"] == second["run_id"]
    assert tags["git_commit"] == "c0ffee" * 6 + "abcd" and tags["jax_version"] == "0.11.2"
    assert tags["model"] == "mlp" and tags["backend"] == "cpu" and tags["precision"] == "f32"
    assert tags["params_sha256"] == sha256_file(second["folder"] / "params.safetensors")
    assert tags["contract_sha256"] == sha256_file(second["folder"] / "contract.json")
    assert versions[1].run_id == second["run_id"]
    # The version is the MLflow model logged into the verified run, its params files
    # under params_path, byte for byte the run's.
    logged = store.client.get_logged_model(second["model_id"])
    assert logged.source_run_id == second["run_id"]
    assert versions[1].source == second["source"] == logged.artifact_location.rstrip("/")
    assert tags["params_path"] == "artifacts/params"
    for name in ("params.safetensors", "manifest.json", "contract.json"):
        copy = store.version_file(second, f"artifacts/params/{name}")
        assert sha256_file(copy) == sha256_file(second["folder"] / name)
    assert (store.version_file(second, "MLmodel")).is_file()


def test_rollback_moves_verified_to_the_previous_verified_version(store):
    first = store.run_and_register(seed=1)
    store.run_and_register(seed=2)
    moved = registry_commands.rollback(store.uri, NAME)
    assert (moved["from"], moved["to"]) == ("2", "1")
    assert "moved from version 2" in moved["message"] and "to version 1" in moved["message"]
    assert first["run_id"] in moved["message"]
    assert store.verified() == "1"
    left = store.client.get_model_version(NAME, "2")
    assert "rolled_back_at" in left.tags and left.tags["rolled_back_to"] == "1"
    with pytest.raises(ArtifactError, match=r"at version 1 .*no earlier version was verified"):
        registry_commands.rollback(store.uri, NAME)
    assert store.verified() == "1"


def test_rollback_after_several_moves_skips_versions_rolled_back_from(store):
    for seed in (1, 2, 3):
        store.run_and_register(seed)
    assert registry_commands.rollback(store.uri, NAME)["to"] == "2"
    store.run_and_register(seed=4)  # a new passing run moves verified to version 4
    assert store.verified() == "4"
    # Version 3 was rolled back from: the previous verified version of 4 is 2.
    assert registry_commands.rollback(store.uri, NAME)["to"] == "2"
    assert registry_commands.rollback(store.uri, NAME)["to"] == "1"


def test_a_version_whose_run_did_not_complete_is_neither_loaded_nor_rolled_back_to(store):
    from vmapcheck.tracking.attempts import mark_failed

    store.run_and_register(seed=1)
    second = store.run_and_register(seed=2)
    # A track killed after registering version 3: the next track marks its run FAILED.
    third = store.run_and_register(seed=3)
    mark_failed(store.uri, third["run_id"], "left RUNNING by a track that did not finish")
    uri = f"models:/{NAME}@verified"
    with pytest.raises(
        ArtifactError,
        match=rf"\(version 3\): its run {third['run_id']} is not a complete run: its status "
        r"is FAILED \(left RUNNING.*`vmapcheck rollback --model vmapcheck-mlp`",
    ):
        registered_params.load_registered_params(store.model, uri, store.uri)
    assert f"not loaded: its run {third['run_id']}" in registry_commands.show(store.uri, NAME)
    # Version 2's run was deleted since: rollback skips it too.
    store.client.delete_run(second["run_id"])
    assert registry_commands.rollback(store.uri, NAME)["to"] == "1"
    assert registered_params.load_registered_params(store.model, uri, store.uri)[3].version == "1"


def test_rollback_with_nothing_to_roll_back_to_errors_clearly(store):
    with pytest.raises(ArtifactError, match=f"no registered model '{NAME}'"):
        registry_commands.rollback(store.uri, NAME)
    store.run_and_register(seed=1)
    with pytest.raises(ArtifactError, match="no earlier version was verified"):
        registry_commands.rollback(store.uri, NAME)
    store.client.delete_registered_model_alias(NAME, registry.VERIFIED)
    with pytest.raises(ArtifactError, match="no version holds the alias"):
        registry_commands.rollback(store.uri, NAME)


def test_the_command_line_shows_versions_and_rolls_back(store, root, tmp_path, monkeypatch, capsys):
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    assert cli.main(["rollback"]) == 2
    assert f"registry: error: no registered model '{NAME}'" in capsys.readouterr().err
    store.run_and_register(seed=1)
    second = store.run_and_register(seed=2)
    assert cli.main(["registry"]) == 0
    out = capsys.readouterr().out
    assert f"registered model {NAME}" in out and "version 2 @verified" in out
    assert f"verified_by_run = {second['run_id']}" in out
    assert cli.main(["rollback", "--model", NAME]) == 0
    assert f"models:/{NAME}@verified moved from version 2" in capsys.readouterr().out
    assert cli.main(["rollback"]) == 2
    assert "nothing to roll back to" in capsys.readouterr().err
    assert cli.main(["registry", "--model", "a/b"]) == 2
    assert "--model: expected a registered model name" in capsys.readouterr().err


def test_loading_by_alias_or_version_verifies_the_params(store):
    first = store.run_and_register(seed=1)
    store.run_and_register(seed=2)
    params, manifest, contract, info = registered_params.load_registered_params(
        store.model, f"models:/{NAME}@verified", store.uri
    )
    assert (info.version, info.registered_model) == ("2", NAME)
    assert info.params_source == f"models:/{NAME}@verified"
    assert contract["inputs"]["features"] == FEATURES and manifest["sha256"] == info.params_sha256
    expected = jax.device_get(store.model.init(jax.random.key(2)))
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    pinned = registered_params.load_registered_params(store.model, f"models:/{NAME}/1", store.uri)
    assert pinned[3].version == "1" and pinned[3].run_id == first["run_id"]


def test_a_tampered_registered_version_is_refused_naming_the_uri(store):
    first = store.run_and_register(seed=1)
    stored = store.version_file(first, "artifacts/params/params.safetensors")
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    stored.write_bytes(bytes(raw))
    uri = f"models:/{NAME}@verified"
    with pytest.raises(ArtifactError, match=r"models:/vmapcheck-mlp@verified \(version 1\): "):
        registered_params.load_registered_params(store.model, uri, store.uri)
    with pytest.raises(ArtifactError, match=r"params\.safetensors: sha256 check failed"):
        registered_params.load_registered_params(store.model, uri, store.uri)

    # Changed params with a manifest made to agree: the registry's own record refuses them.
    arrays = load_file(str(stored))
    arrays = {k: v + 1.0 for k, v in arrays.items()}
    save_file(arrays, str(stored))
    manifest_path = store.version_file(first, "artifacts/params/manifest.json")
    manifest = read_json(manifest_path)
    manifest["sha256"] = sha256_file(stored)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="sha256 check failed: the registry recorded"):
        registered_params.load_registered_params(store.model, uri, store.uri)


def test_params_that_break_the_models_contract_are_refused(store):
    store.run_and_register(seed=1)
    uri = f"models:/{NAME}/1"
    wider = build_model(compose_config("model.hidden=[16,32]").model)
    with pytest.raises(ArtifactError, match=r"models:/vmapcheck-mlp/1 \(version 1\): .*leaf"):
        registered_params.load_registered_params(wider, uri, store.uri)
    toy = build_model(compose_config("model=toy").model)
    with pytest.raises(ArtifactError, match=r"params are of model 'mlp'.*'toy'"):
        registered_params.load_registered_params(toy, uri, store.uri)


def test_unknown_unverified_or_malformed_sources_are_refused(store):
    with pytest.raises(ArtifactError, match=r"models:/vmapcheck-mlp@verified: not found"):
        registered_params.load_registered_params(store.model, f"models:/{NAME}@verified", store.uri)
    first = store.run_and_register(seed=1)
    # A version registered by hand, without the digests a passing run records.
    store.client.create_model_version(NAME, first["source"], run_id=first["run_id"])
    with pytest.raises(ArtifactError, match=r"\(version 2\): not tagged verified=true"):
        registered_params.load_registered_params(store.model, f"models:/{NAME}/2", store.uri)
    with pytest.raises(ArtifactError, match=r"models:/vmapcheck-mlp/7: not found"):
        registered_params.load_registered_params(store.model, f"models:/{NAME}/7", store.uri)
    for bad in ("models:/vmapcheck-mlp", "models:/vmapcheck-mlp/latest", "runs:/abc/params"):
        with pytest.raises(ConfigError, match="expected models:/<name>@<alias>"):
            registered_params.parse_models_uri(bad)


def test_registering_refuses_a_run_whose_logged_params_differ(store):
    folder = store.params_folder(seed=1)
    info = store.logged_run(folder)
    stored = store.artifact(info["run_id"], "contract.json")
    stored.write_text(stored.read_text().replace('"x0"', '"renamed"'))
    with pytest.raises(ArtifactError, match=r"contract.json: sha256 check failed"):
        registry.register_if_verified(store.config, info, RUNTIME, folder)
    assert not store.client.search_model_versions(f"name = '{NAME}'")


def test_params_loaded_from_the_registry_are_re_verified_not_registered_again(store):
    store.run_and_register(seed=1)
    source = {
        "params_source": f"models:/{NAME}@verified",
        "registered_model": NAME,
        "version": "1",
    }
    folder = store.params_folder(seed=1, source=source)
    info = store.logged_run(folder)
    result = registry.register_if_verified(store.config, info, RUNTIME, folder)
    assert result["status"] == "re-verified" and result["version"] == "1"
    assert [str(v.version) for v in registry_commands.list_versions(store.uri, NAME)] == ["1"]
    assert store.client.get_model_version(NAME, "1").tags["reverified_by_run"] == info["run_id"]


def test_registration_can_be_switched_off(store):
    config = store.config.model_copy(
        update={"registry": store.config.registry.model_copy(update={"registered_model": None})}
    )
    folder = store.params_folder(seed=1)
    result = registry.register_if_verified(config, store.logged_run(folder), RUNTIME, folder)
    assert result == {"status": "not registered", "why": "registry.registered_model is null"}


def _raw(root):
    return yaml.safe_load(compose_yaml(root / "conf"))


def test_registry_settings_are_validated_naming_the_key(root):
    raw = _raw(root)
    assert validate_config(raw).registry.registered_model == "vmapcheck-mlp"
    assert compose_config("model=toy").registry.registered_model == "vmapcheck-toy"
    raw["registry"]["registered_model"] = "a/b"
    with pytest.raises(ConfigError, match=r"registry\.registered_model"):
        validate_config(raw)
    raw = _raw(root)
    raw["train"]["params_source"] = "models:/vmapcheck-mlp/latest"
    with pytest.raises(ConfigError, match=r"train\.params_source"):
        validate_config(raw)
    raw["train"]["params_source"] = "models:/vmapcheck-mlp@verified"
    assert validate_config(raw).train.params_source == "models:/vmapcheck-mlp@verified"
    raw["train"]["params_file"] = "data/raw/mine.safetensors"
    raw["train"]["params_sha256"] = "0" * 64
    with pytest.raises(ConfigError, match=r"params_file and train\.params_source both"):
        validate_config(raw)


@pytest.mark.parametrize("command", [["rollback"], ["registry"]])
def test_a_store_that_does_not_exist_is_refused_not_created(
    command, root, tmp_path, monkeypatch, capsys
):
    # `make rollback` with a mistyped sqlite URI used to create an empty store there.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    missing = tmp_path / "nowhere" / "mlflow.db"
    overrides = [f"tracking.tracking_uri=sqlite:///{missing}"]
    (tmp_path / "params.yaml").write_text(compose_yaml(root / "conf", overrides))
    monkeypatch.chdir(tmp_path)
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert f"registry: error: no MLflow store at {missing} (tracking.tracking_uri" in err
    assert "none is created here" in err
    assert not missing.parent.exists()


def test_a_version_registered_as_a_bare_params_folder_still_loads(store):
    # Before versions were servable models they pointed at the run's params/ folder, with
    # the same digests and no params_path tag: train still loads them.
    first = store.run_and_register(seed=1)
    tags = dict(store.client.get_model_version(NAME, "1").tags)
    del tags["params_path"]
    folder = store.client.get_run(first["run_id"]).info.artifact_uri + "/params"
    store.client.create_model_version(NAME, folder, run_id=first["run_id"], tags=tags)
    uri = f"models:/{NAME}/2"
    params, _, _, info = registered_params.load_registered_params(store.model, uri, store.uri)
    assert info.version == "2"
    for a, b in zip(jax.tree.leaves(store.params(1)), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)


def stranded(store, seed: int) -> dict:
    """What a track SIGKILLed between completing its run and moving the alias leaves: a
    version registered with the move left for later (tagged pending), its run complete."""
    folder = store.params_folder(seed)
    info = store.logged_run(folder)
    result = registry.register_if_verified(store.config, info, RUNTIME, folder, move_alias=False)
    store.complete(info["run_id"])
    return result | {"run_id": info["run_id"]}


def pending(store, version: str) -> bool:
    return registry.TAG_ALIAS_PENDING in store.client.get_model_version(NAME, version).tags


def test_an_alias_move_a_dead_track_left_undone_is_made_by_the_next_one(store):
    store.run_and_register(seed=1)
    second = stranded(store, seed=2)
    assert store.verified() == "1" and pending(store, "2")
    assert "version 2 (alias verified move pending" in registry_commands.show(store.uri, NAME)

    assert registry.settle_pending_alias(store.uri, NAME) == [
        f"alias verified of '{NAME}' moved to version 2 (from version 1): its run "
        f"{second['run_id']} completed, but the track that registered it ended before "
        "moving the alias"
    ]
    assert store.verified() == "2" and not pending(store, "2")
    assert registry.settle_pending_alias(store.uri, NAME) == []  # made once

    # A track that lives to move the alias leaves nothing pending.
    third = stranded(store, seed=3)
    registry.move_verified_alias(store.uri, third)
    assert store.verified() == "3" and not pending(store, "3")
    # A pending version older than the alias's is only cleared: the alias stays.
    fourth = stranded(store, seed=4)
    fifth = stranded(store, seed=5)
    registry.move_verified_alias(store.uri, fifth)
    assert registry.settle_pending_alias(store.uri, NAME) == []
    assert store.verified() == "5" and not pending(store, fourth["version"])


def test_a_pending_alias_move_to_a_version_whose_run_is_not_complete_is_not_made(store):
    from vmapcheck.tracking.attempts import mark_failed

    store.run_and_register(seed=1)
    folder = store.params_folder(seed=2)
    info = store.logged_run(folder)
    registry.register_if_verified(store.config, info, RUNTIME, folder, move_alias=False)
    # The track died before completing the run; the next track marked it FAILED.
    mark_failed(store.uri, info["run_id"], "left RUNNING by a track that did not finish")
    (line,) = registry.settle_pending_alias(store.uri, NAME)
    assert line.startswith(
        f"alias verified not moved to version 2 of '{NAME}' (its alias move is pending): "
        f"its run {info['run_id']} is not a complete run: its status is FAILED"
    )
    assert store.verified() == "1" and pending(store, "2")


def test_rollback_drops_a_pending_alias_move_so_the_next_track_keeps_it(store):
    store.run_and_register(seed=1)
    store.run_and_register(seed=2)
    stranded(store, seed=3)
    moved = registry_commands.rollback(store.uri, NAME)
    assert (moved["from"], moved["to"]) == ("2", "1")
    assert moved["message"].endswith("; the pending alias move to version(s) 3 dropped")
    assert registry.settle_pending_alias(store.uri, NAME) == []
    assert store.verified() == "1" and not pending(store, "3")


def test_a_run_serving_what_verified_serves_re_verifies_it_instead_of_a_copy(store):
    first = store.run_and_register(seed=1)
    # The same params, serving settings, code and runtime (a rerun for a tolerance).
    again = store.run_and_register(seed=1)
    assert again["status"] == "re-verified" and again["version"] == "1"
    assert "serves the same params, settings, code and runtime" in again["why"]
    tags = store.client.get_model_version(NAME, "1").tags
    assert tags["reverified_by_run"] == again["run_id"] != first["run_id"]
    assert tags["verified_by_run"] == first["run_id"]
    assert [str(v.version) for v in registry_commands.list_versions(store.uri, NAME)] == ["1"]
    assert store.verified() == "1"
    # Served differently (another guard limit): a new version, though the params are equal.
    store.config = compose_config("guard.max_batch=512")
    other = store.run_and_register(seed=1)
    assert (other["status"], other["version"], other["previous"]) == ("registered", "2", "1")
    versions = registry_commands.list_versions(store.uri, NAME)
    assert versions[0].tags["params_sha256"] == versions[1].tags["params_sha256"]
    assert versions[0].tags["served_sha256"] != versions[1].tags["served_sha256"]
    assert store.verified() == "2"


# --- the deployment target (registry.target) --------------------------------------

F64_OFF_TARGET = "this run's precision is f64 (float64), the deployment target's is f32 (float32)"


def served_dtype(store, version: str) -> np.dtype:
    """The float dtype of the signature version ``version`` serves (its MLmodel)."""
    from mlflow.models import Model

    from tests.helpers.registry import local_path

    source = store.client.get_model_version(NAME, version).source
    signature = Model.load(str(local_path(source) / "MLmodel")).signature
    return signature.inputs.inputs[0].type


def test_a_passing_run_off_the_deployment_target_registers_without_moving_verified(store):
    first = store.run_and_register(seed=1)
    assert first["verified_alias"] == "moved" and first["off_target"] is None
    assert store.verified() == "1"

    # `dvc exp run -S precision=f64`: it passed, it is registered, and the alias stays.
    store.config = compose_config("precision=f64")
    f64 = store.run_and_register(seed=2)
    assert (f64["status"], f64["version"], f64["previous"]) == ("registered", "2", "1")
    assert (f64["verified_alias"], f64["off_target"]) == ("stays", F64_OFF_TARGET)
    assert store.verified() == "1"
    tags = store.client.get_model_version(NAME, "2").tags
    assert tags["off_deployment_target"] == F64_OFF_TARGET and tags["verified"] == "true"
    assert registry.TAG_ALIAS_PENDING not in tags  # the next track never moves it either
    assert registry.settle_pending_alias(store.uri, NAME) == []
    assert store.verified() == "1"
    # What @verified serves keeps the target's dtype; the f64 version has its own.
    assert served_dtype(store, "1") == np.dtype(np.float32)
    assert served_dtype(store, "2") == np.dtype(np.float64)
    assert registry.outcome_line(f64) == (
        f"registered as models:/{NAME}/2; @verified stays at version 1: {F64_OFF_TARGET} "
        "(registry.target in conf/config.yaml); promote it with: vmapcheck promote --version 2"
    )

    # The same f64 run again: it re-verifies version 2, no copy, and the alias stays.
    again = store.run_and_register(seed=2)
    assert (again["status"], again["version"], again["verified_alias"]) == (
        "re-verified",
        "2",
        "stays",
    )
    assert registry.outcome_line(again).startswith(
        f"re-verified: version 2 of {NAME} serves the same params, settings, code and "
        "runtime (not registered again); @verified stays at version 1: "
    )
    assert store.client.get_model_version(NAME, "2").tags["reverified_by_run"] == again["run_id"]
    assert len(registry_commands.list_versions(store.uri, NAME)) == 2

    # Each setting of the target is compared, and each difference named.
    for overrides, phrase in (
        (["bench=full"], "this run's bench profile is full, the deployment target's is quick"),
        (
            ["model.hidden=[16]"],
            "this run's model.hidden is [16], the deployment target's is [32, 32]",
        ),
        (["backend=gpu"], "this run's backend is gpu, the deployment target's is cpu"),
    ):
        assert registry.off_target(compose_config(*overrides)) == [phrase]
    assert len(registry.off_target(compose_config("precision=bf16", "bench=full"))) == 2
    assert registry.off_target(compose_config("guard.max_batch=512")) == []

    # A passing run of the target moves the alias, from version 1 (never through 2).
    store.config = compose_config()
    third = store.run_and_register(seed=3)
    assert (third["version"], third["previous"], third["verified_alias"]) == ("3", "1", "moved")
    assert store.verified() == "3"
    # Rollback goes back to the previous version the alias could hold: 1, not 2.
    assert registry_commands.rollback(store.uri, NAME)["to"] == "1"
    assert store.verified() == "1"


def test_the_first_run_of_a_model_off_the_target_leaves_the_alias_unset(store):
    store.config = compose_config("precision=f64")
    first = store.run_and_register(seed=1)
    assert first["status"] == "registered" and first["previous"] is None
    assert registry.outcome_line(first).startswith(
        f"registered as models:/{NAME}/1; @verified is on no version: {F64_OFF_TARGET}"
    )
    assert registry.alias_version(store.client, NAME, registry.VERIFIED) is None
    shown = registry_commands.show(store.uri, NAME)
    assert "(off the deployment target: `vmapcheck promote`" in shown


def test_promote_moves_verified_to_a_chosen_version_and_rollback_still_works(store):
    store.run_and_register(seed=1)
    store.config = compose_config("precision=f64")
    f64 = store.run_and_register(seed=2)
    assert store.verified() == "1"

    promoted = registry_commands.promote(store.uri, NAME, version="2")
    assert (promoted["from"], promoted["to"]) == ("1", "2")
    assert promoted["message"] == (
        f"promote: models:/{NAME}@verified moved from version 1 (run "
        f"{store.client.get_model_version(NAME, '1').run_id}, params sha256 "
        f"{store.client.get_model_version(NAME, '1').tags['params_sha256'][:12]}) to version 2 "
        f"(run {f64['run_id']}, params sha256 "
        f"{store.client.get_model_version(NAME, '2').tags['params_sha256'][:12]}); version 2 "
        f"is off the deployment target (registry.target in conf/config.yaml): {F64_OFF_TARGET}"
    )
    assert store.verified() == "2"
    tags = store.client.get_model_version(NAME, "2").tags
    assert tags["promoted_from"] == "1" and "promoted_at" in tags
    assert "(off the deployment target, promoted)" in registry_commands.show(store.uri, NAME)
    again = registry_commands.promote(store.uri, NAME, run_id=f64["run_id"])
    assert "is already version 2" in again["message"] and store.verified() == "2"

    # A later run of the target moves the alias on; rollback returns to the promoted one.
    store.config = compose_config()
    store.run_and_register(seed=3)
    assert store.verified() == "3"
    assert registry_commands.rollback(store.uri, NAME)["to"] == "2"
    assert registry_commands.rollback(store.uri, NAME)["to"] == "1"
    # Promoting a version rolled back from clears that, so rollback may return to it.
    registry_commands.promote(store.uri, NAME, version="3")
    assert "rolled_back_at" not in store.client.get_model_version(NAME, "3").tags
    assert registry_commands.rollback(store.uri, NAME)["to"] == "1"  # 2 was rolled back from

    with pytest.raises(ArtifactError, match=r"--version 9: no such version .* 1, 2, 3\)"):
        registry_commands.promote(store.uri, NAME, version="9")
    with pytest.raises(ArtifactError, match=r"--run nope: registered no version"):
        registry_commands.promote(store.uri, NAME, run_id="nope")
    with pytest.raises(ConfigError, match=r"one of --version N or --run RUN_ID, found both"):
        registry_commands.promote(store.uri, NAME, version="1", run_id="x")


def test_promote_refuses_a_version_whose_run_is_not_complete(store):
    from vmapcheck.tracking.attempts import mark_failed

    store.run_and_register(seed=1)
    dead = stranded(store, seed=2)
    mark_failed(store.uri, dead["run_id"], "killed")
    with pytest.raises(ArtifactError, match=r"models:/vmapcheck-mlp/2: its run .* not a complete"):
        registry_commands.promote(store.uri, NAME, version="2")
    assert store.verified() == "1"


def test_the_command_line_promotes(store, root, tmp_path, monkeypatch, capsys):
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    store.run_and_register(seed=1)
    store.config = compose_config("bench=full")
    store.run_and_register(seed=2)
    assert store.verified() == "1"
    assert cli.main(["promote", "--version", "2"]) == 0
    out = capsys.readouterr().out
    assert f"promote: models:/{NAME}@verified moved from version 1" in out
    assert "this run's bench profile is full" in out
    assert store.verified() == "2"
    assert cli.main(["registry"]) == 0
    assert (
        "deployment target (registry.target in conf/config.yaml): model mlp, hidden [32, 32], "
        "backend cpu, precision f32 (float32), bench quick; a passing run of it moves "
        "@verified, `vmapcheck promote` any other"
    ) in capsys.readouterr().out.splitlines()
    assert cli.main(["promote", "--version", "7"]) == 2
    assert "registry: error: --version 7: no such version" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["promote"])  # one of --version or --run is required


def test_the_deployment_target_is_validated_naming_the_key(root):
    raw = _raw(root)
    target = validate_config(raw).registry.target
    assert (target.model, target.hidden, target.backend, target.precision, target.bench) == (
        "mlp",
        [32, 32],
        "cpu",
        "f32",
        "quick",
    )
    # Plain values: an override of the run does not move the target with it.
    assert compose_config("precision=f64", "bench=full").registry.target == target
    for key, value, expected in (
        (
            "precision",
            "f16",
            # The options are the shipped files (vmapcheck.config.precision_names).
            rf"registry\.target\.precision: expected one of "
            rf"{re.escape(', '.join(precision_names()))} \(the files of "
            rf"vmapcheck/conf/precision/\), found 'f16'",
        ),
        ("backend", "cuda", r"registry\.target\.backend: .*found 'cuda'"),
        ("hidden", [32, 0], r"registry\.target\.hidden\[1\]: .*greater than 0, found 0"),
        ("bench", "", r"registry\.target\.bench: .*found ''"),
        ("colour", "red", r"registry\.target\.colour: unknown key \(found value 'red'\)"),
    ):
        raw = _raw(root)
        raw["registry"]["target"][key] = value
        with pytest.raises(ConfigError, match=expected):
            validate_config(raw)
    raw = _raw(root)
    del raw["registry"]["target"]
    with pytest.raises(ConfigError, match=r"registry\.target: required key is missing"):
        validate_config(raw)


def test_a_run_off_the_target_serving_what_verified_serves_re_verifies_it(store):
    # A bench profile of one's own timing the same params (the guard's replay settings,
    # which serving_settings holds, unchanged) serves the same: no copy, no move.
    store.run_and_register(seed=1)
    store.config = compose_config("bench.name=mine")
    assert registry.off_target(store.config) == [
        "this run's bench profile is mine, the deployment target's is quick"
    ]
    again = store.run_and_register(seed=1)
    assert (again["status"], again["version"], again["verified_alias"]) == (
        "re-verified",
        "1",
        "held",
    )
    assert registry.outcome_line(again) == (
        "re-verified: version 1 serves the same params, settings, code and runtime; "
        "not registered again"
    )
    assert len(registry_commands.list_versions(store.uri, NAME)) == 1 and store.verified() == "1"


def test_an_empty_or_unknown_model_name_is_refused_and_moves_nothing(
    store, root, tmp_path, monkeypatch, capsys
):
    # `promote --model ''` used to fall back to registry.registered_model and move its alias.
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    store.run_and_register(seed=1)
    store.config = compose_config("bench=full")  # off the target: registered, alias stays
    store.run_and_register(seed=2)
    assert store.verified() == "1"
    for model in ("", " ", "nosuch"):
        assert cli.main(["promote", "--model", model, "--version", "2"]) == 2
        err = capsys.readouterr().err
        assert f"found {model!r}" in err or f"no registered model {model!r}" in err
        assert cli.main(["rollback", "--model", model]) == 2
        capsys.readouterr()
    assert store.verified() == "1"


def _point_alias_at(store, number: int) -> None:
    import sqlite3

    with sqlite3.connect(store.uri.removeprefix("sqlite:///")) as con:
        con.execute(
            "UPDATE registered_model_aliases SET version = ? WHERE alias = 'verified'", (number,)
        )


def test_an_alias_naming_a_missing_version_is_reported_refused_and_repaired(store):
    store.run_and_register(seed=1)
    store.run_and_register(seed=2)
    _point_alias_at(store, 9)  # a store edited or restored in part: MLflow keeps no check
    client = registry.registry_client(store.uri)
    assert registry.dangling_alias(client, NAME, registry.VERIFIED) == "9"
    listing = registry_commands.show(store.uri, NAME)
    assert f"models:/{NAME}@verified points at version 9, which is not in the store" in listing
    with pytest.raises(ArtifactError, match="points at version 9, which is not in the store"):
        registry_commands.rollback(store.uri, NAME)
    moved = registry_commands.promote(store.uri, NAME, version="1")
    assert "moved from version 9 (which is not in the store) to version 1" in moved["message"]
    assert store.verified() == "1"
    assert registry.dangling_alias(client, NAME, registry.VERIFIED) is None
    versions = registry_commands.list_versions(store.uri, NAME)
    assert versions[0].tags["promoted_from"] == "9"
