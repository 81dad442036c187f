"""A real MLflow sqlite store with runs that logged params, registered by the real registry.

No mocks: the runs are real MLflow runs holding a ``params/`` artifact as ``track`` logs
it, and :func:`vmapcheck.tracking.registry.register_if_verified` registers them (a servable
pyfunc logged into the run, then a version with alias ``verified``).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import jax

from tests.helpers.config import compose_config
from vmapcheck.core.models import build_model
from vmapcheck.io import atomic_write_json
from vmapcheck.params_io import model_contract, save_params
from vmapcheck.tracking import registry

RUNTIME = {"backend": "cpu", "jax_version": "0.11.2", "jaxlib_version": "0.11.2"}


def local_path(uri: str) -> Path:
    """The folder of a ``file://`` artifact URI."""
    return Path(unquote(urlparse(uri).path))


class Store:
    """A real MLflow sqlite store at ``root``/mlflow.db (``root`` holds an empty store made
    by the ``empty_mlflow_store`` fixture) with file artifacts under ``root``/mlartifacts,
    for the config composed with ``overrides`` (as ``dvc exp run -S``)."""

    def __init__(self, root: Path, *overrides: str) -> None:
        from mlflow.tracking import MlflowClient

        self.root = Path(root)
        self.uri = f"sqlite:///{self.root}/mlflow.db"
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        self.experiment = self.client.create_experiment(
            "vmapcheck", artifact_location=(self.root / "mlartifacts").as_uri()
        )
        self.config = compose_config(*overrides)
        self.name = self.config.registry.registered_model
        self.model = build_model(self.config.model)
        self.features = [f"x{i}" for i in range(self.model.in_features)]
        self.count = 0

    def params(self, seed: int):
        """The params drawn from ``seed`` (what :meth:`params_folder` saves), on the host."""
        return jax.device_get(self.model.init(jax.random.key(seed)))

    def params_folder(self, seed: int, source: dict | None = None) -> Path:
        """data/params as train writes it, for params drawn from ``seed``."""
        self.count += 1
        folder = self.root / f"params{self.count}"
        folder.mkdir()
        params = self.params(seed)
        save_params(folder, params, {"model": self.model.name, "source": source or {}})
        contract = model_contract(self.model, params, self.features)
        atomic_write_json(folder / "contract.json", contract)
        return folder

    def logged_run(self, folder: Path, verdict: str = "passed") -> dict:
        """A run that logged ``folder`` as its params/ artifact, as tracking.log_run does;
        returns log_run's result. The run is left RUNNING, as ``track`` leaves it while it
        registers, then completed."""
        run = self.client.create_run(self.experiment, tags={"verdict": verdict})
        run_id = run.info.run_id
        self.client.log_artifacts(run_id, str(folder), artifact_path="params")
        return {
            "run_id": run_id,
            "tracking_uri": self.uri,
            "verdict": verdict,
            "git_commit": "c0ffee" * 6 + "abcd",
            "git_dirty": "false",
        }

    def complete(self, run_id: str) -> None:
        """What ``track`` does last: mark the run complete (vmapcheck.tracking.store)."""
        self.client.set_tag(run_id, "pipeline_complete", "true")
        self.client.set_terminated(run_id)

    def run_and_register(self, seed: int, verdict: str = "passed") -> dict:
        folder = self.params_folder(seed)
        info = self.logged_run(folder, verdict)
        result = registry.register_if_verified(self.config, info, RUNTIME, folder)
        self.complete(info["run_id"])
        return result | {"run_id": info["run_id"], "folder": folder}

    def verified(self) -> str:
        return str(self.client.get_model_version_by_alias(self.name, registry.VERIFIED).version)

    def artifact(self, run_id: str, name: str) -> Path:
        """The run's copy of a params file in the artifact store."""
        return self.root / "mlartifacts" / run_id / "artifacts" / "params" / name

    def version_file(self, result: dict, relative: str) -> Path:
        """A file of the model a registration logged (``relative`` to its folder, e.g.
        ``artifacts/params/params.safetensors``)."""
        return local_path(result["source"]) / relative
