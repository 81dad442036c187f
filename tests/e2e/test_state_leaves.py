"""End to end: a model whose params hold declared state leaves (docs/state-leaves.md)
through the real `dvc repro` pipeline: trained, checked and registered.

The shipped Haiku ConvNet (hk.BatchNorm in inference mode; its Haiku state, with int32
counters, folded into the params and declared), on the digits images. The run passes
every check, registers its params, and keeps every state leaf in the params file bit for
bit as the model's init made it, while the weights are trained. The Flax NNX CNN's
running statistics go through the same stages in tests/test_cnn.py (in-process; what DVC
adds does not depend on the model). Nothing is mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from tests.helpers.project import FAST_RUN, committed_project, run
from vmapcheck.config import validate_config
from vmapcheck.core.keys import named_keys
from vmapcheck.core.models import build_model
from vmapcheck.core.state import partition
from vmapcheck.params_io import leaf_paths

pytestmark = pytest.mark.e2e

# The digits images, a small standard case and the fast run settings of every e2e test.
FAST = ["data=digits", "data.standard_batch=8", *FAST_RUN]


def deploying(model: str) -> list[str]:
    """Overrides of a project that deploys ``model`` (registry.target): its passing run
    moves @verified, as in a project made by ``vmapcheck init --model <model>``."""
    return [f"model={model}", f"registry.target.model={model}", "registry.target.hidden=null"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    pytest.importorskip("haiku")
    return committed_project(
        tmp_path_factory.mktemp("vmapcheck-state") / "repo", *FAST, *deploying("haiku_cnn")
    )


def _read(project: Path, *parts: str) -> dict:
    return json.loads(project.joinpath(*parts).read_text())


def _assert_trained_checked_registered_state_kept(project: Path, name: str, counters: int):
    details = _read(project, "reports", "check_details.json")
    assert details["passed"], details["failures"]
    assert details["gradients"]["passed"]
    track = _read(project, "reports", "track.json")
    assert track["verdict"] == "passed"
    assert track["registry"]["status"] == "registered", track["registry"]
    assert track["registry"]["version"] == "1"

    config = validate_config(yaml.safe_load((project / "params.yaml").read_text()))
    assert config.model.name == name
    model = build_model(config.model)
    # The params train started from: the same key stream as the train stage.
    initial = leaf_paths(model.init(named_keys(config.seed)["init"]))
    state = partition(model, initial).state_names
    assert state and set(state) < set(initial)
    contract = _read(project, "data", "params", "contract.json")
    assert contract["state_leaves"] == list(state)
    assert _read(project, "data", "params", "manifest.json")["source"]["trained"]
    saved = load_file(str(project / "data" / "params" / "params.safetensors"))
    assert set(saved) == set(initial)  # every leaf stored, state included
    assert sum(saved[leaf].dtype == np.int32 for leaf in state) == counters
    for leaf in state:
        assert saved[leaf].dtype == initial[leaf].dtype and saved[leaf].shape == initial[leaf].shape
        np.testing.assert_array_equal(saved[leaf], np.asarray(initial[leaf]), leaf)
    trained = [leaf for leaf in initial if leaf not in state]
    assert any(not np.array_equal(saved[leaf], np.asarray(initial[leaf])) for leaf in trained)


def test_the_haiku_model_with_batchnorm_state_is_trained_checked_and_registered(project):
    result = run(project, "dvc", "repro")
    assert "train: model haiku_cnn, trained=True" in result.stdout
    assert (
        "registry: params registered as models:/vmapcheck-haiku_cnn/1; alias verified moved to it"
    ) in result.stdout
    # Haiku's state: four moving averages, each with an int32 counter.
    _assert_trained_checked_registered_state_kept(project, "haiku_cnn", counters=4)
