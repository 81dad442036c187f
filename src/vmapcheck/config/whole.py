"""The whole validated configuration (:class:`Config`): one field per conf/ group, plus
the seed, and the checks that span groups."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from vmapcheck.config.bench import BenchConfig, BudgetConfig
from vmapcheck.config.data import DataConfig
from vmapcheck.config.fields import Seed, Strict
from vmapcheck.config.guard import DTYPE_BYTES, GuardConfig, byte_limit_problem, example_bytes
from vmapcheck.config.model import ModelConfig
from vmapcheck.config.run import BackendConfig, PrecisionConfig, TrainConfig, VerdictConfig
from vmapcheck.config.tracking import (
    MAX_EXPERIMENT_NAME_LENGTH,
    RegistryConfig,
    TrackingConfig,
)


class ReferenceConfig(Strict):
    dir: Annotated[str, Field(min_length=1)]
    required: bool


class Config(Strict):
    """The whole validated configuration (one field per conf/ group, plus the seed)."""

    seed: Seed
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    backend: BackendConfig
    precision: PrecisionConfig
    bench: BenchConfig
    guard: GuardConfig
    budget: BudgetConfig
    tracking: TrackingConfig
    registry: RegistryConfig
    reference: ReferenceConfig
    # Which kinds of finding fail the run; a project's params.yaml from before the kinds
    # has none, and gets the default (every kind fails, as before).
    verdict: VerdictConfig = Field(default_factory=VerdictConfig)
    # The top-level keys of params.yaml that belong to the project vmapcheck joined (its
    # own stages read them; `vmapcheck init` lists them from the project's params, which
    # it keeps in conf/project.yaml). vmapcheck leaves them alone; any other unknown key
    # is refused (a typo of one of vmapcheck's).
    # (A pydantic field: pydantic copies the default for each instance.)
    project_keys: list[str] = []  # noqa: RUF012

    @model_validator(mode="after")
    def _data_fits_model(self) -> Config:
        features = "data.n_features" if self.data.source == "synthetic" else "data.features"
        targets = "data.n_targets" if self.data.source == "synthetic" else "data.targets"
        if self.data.n_features != self.model.in_features:
            raise ValueError(
                f"{features} gives {self.data.n_features} features but model.in_features="
                f"{self.model.in_features}: the table must have as many features as the model"
            )
        if self.data.n_targets != self.model.out_features:
            raise ValueError(
                f"{targets} gives {self.data.n_targets} targets but model.out_features="
                f"{self.model.out_features}"
            )
        return self

    @model_validator(mode="after")
    def _full_batch_within_byte_limit(self) -> Config:
        problem = byte_limit_problem(
            self.guard, example_bytes(self.model, DTYPE_BYTES[self.precision.dtype])
        )
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _experiment_name_fits_mlflow(self) -> Config:
        # With experiment_per_model the name MLflow gets is <experiment>-<model.name>
        # (vmapcheck.tracking.store): its whole length is bounded, not the prefix alone.
        if not self.tracking.experiment_per_model:
            return self
        name = f"{self.tracking.experiment}-{self.model.name}"
        if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
            raise ValueError(
                f"tracking.experiment with experiment_per_model makes the experiment name "
                f"'<tracking.experiment>-{self.model.name}': expected at most "
                f"{MAX_EXPERIMENT_NAME_LENGTH} characters (MLflow's limit), found {len(name)}"
            )
        return self


# vmapcheck's own top-level keys of params.yaml (every field of Config but the list of
# the project's keys): what the track stage depends on, as dvc.yaml params, so that a key
# of the user's own (`-S lr=0.3`) reruns none of vmapcheck's stages.
CONFIG_KEYS: tuple[str, ...] = tuple(name for name in Config.model_fields if name != "project_keys")
