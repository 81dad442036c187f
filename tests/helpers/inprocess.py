"""The pipeline's stages in this test process: ``vmapcheck.pipeline.<stage>.run`` on a
temporary :class:`~vmapcheck.layout.Layout`, through ``run_stage`` as stages/<stage>.py
calls it (config validated from the Layout's params.yaml, errors turned into exit 2).

Under DVC each stage is a process of its own, and what it sets for the process ends with
it: JAX's config (``configure_jax``: platform, x64, matmul precision; prepare and train
turn the key-reuse checks on; check enables x64 for its oracle), MLflow's tracking URI
(track sets it, and MLflow copies it into ``MLFLOW_TRACKING_URI``) and the
``MLFLOW_HTTP_*`` variables. :func:`run_stage` runs a stage with the tracking variables
cleared (the stage finds the store its config names, in its own root) and puts all of it
back afterwards, so the next stage and the tests after it see the process as
tests/conftest.py set it up.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.config import ROOT
from tests.helpers.project import run
from vmapcheck.compose import compose_yaml
from vmapcheck.config import Config, load_config
from vmapcheck.layout import Layout
from vmapcheck.pipeline.stage import run_stage as stage_main
from vmapcheck.tracking.server import HTTP_ENV

# dvc.yaml's order.
STAGES = ("prepare", "train", "forward", "check", "bench", "track")

# What configure_jax, enable_key_reuse_checks and configure_cpu_float64 change. (The CPU
# device count cannot change once JAX has started: backend.num_devices must match the
# process, 2 as conftest.py sets it, which is also conf/backend/cpu.yaml's.)
JAX_SETTINGS = (
    "jax_platforms",
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_debug_key_reuse",
)
# Read by the stages (a store outside the temporary root, a queued experiment's root),
# or written by them.
ENVIRONMENT = ("MLFLOW_TRACKING_URI", "DVC_ROOT", *HTTP_ENV.values())


def write_params(root: Path, *overrides: str) -> Config:
    """``root``'s params.yaml composed from the repository's conf/ with Hydra
    ``overrides`` (as ``dvc exp run -S`` writes it); returns it validated."""
    layout = Layout(root)
    layout.params_yaml.write_text(compose_yaml(ROOT / "conf", list(overrides)))
    return load_config(layout.params_yaml)


def inputs_repository(root: Path) -> Layout:
    """``root`` made a git repository (track logs the commit) holding what the stages read
    besides params.yaml: requirements.lock and dvc.yaml (track records them) and the
    stored references (check compares a run with its model's); its Layout. Write the
    params (:func:`write_params`) and commit before running the stages."""
    source, layout = Layout(ROOT), Layout(root)
    shutil.copy2(source.requirements_lock, layout.requirements_lock)
    shutil.copy2(source.dvc_yaml, layout.dvc_yaml)
    # conf/config.yaml's reference.dir, where every shipped model's reference is stored.
    shutil.copytree(ROOT / "data" / "reference", root / "data" / "reference")
    run(root, "git", "init", "-q")
    return layout


@contextmanager
def stage_process() -> Iterator[None]:
    """Inside: a stage's view of the process (no tracking variables from outside);
    after: JAX's settings, MLflow's tracking URI and the environment as before."""
    import jax
    import mlflow

    saved = {name: jax.config.values[name] for name in JAX_SETTINGS}
    with pytest.MonkeyPatch.context() as patch:
        for name in ENVIRONMENT:
            patch.delenv(name, raising=False)
        try:
            yield
        finally:
            for name, value in saved.items():
                jax.config.update(name, value)
            mlflow.set_tracking_uri(None)  # the default again (it also unsets the variable)


def run_stage(root: Path, name: str) -> int:
    """Stage ``name``'s body on the project at ``root``, in this process; its exit code."""
    module = importlib.import_module(f"vmapcheck.pipeline.{name}")
    with stage_process():
        return stage_main(name, module.run, Path(root))


def run_stages(root: Path, *names: str) -> None:
    """Stages ``names`` in order; each must exit 0."""
    for name in names:
        code = run_stage(root, name)
        assert code == 0, f"stage {name} exited {code} (its error is printed above)"


def judge_planted(root: Path, *overrides: str) -> Layout:
    """A planted model (``overrides``: its data, model and factory) through prepare, train,
    forward and check at ``root``, untrained, without a stored reference (a planted model
    has none), on this process's 2 CPU devices; its Layout, to read check's reports."""
    root.mkdir(parents=True, exist_ok=True)
    write_params(
        root,
        *overrides,
        "data.standard_batch=8",
        "reference.required=false",
        "train.steps=0",
        "backend.num_devices=2",
    )
    run_stages(root, "prepare", "train", "forward", "check")
    return Layout(root)
