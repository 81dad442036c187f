"""Typed, validated configuration read from params.yaml.

params.yaml is the composition of conf/ by Hydra (written by ``dvc exp run`` or
``make params``). Stages never read it raw: :func:`load_config` validates it into
:class:`Config`, so an unknown key, a wrong type or an impossible value stops a stage
with a :class:`~vmapcheck.errors.ConfigError` that names the key.

The config is a package, one module per group of settings (``model``, ``data``, ``run``:
train, backend and precision; ``bench``, ``guard``, ``tracking``: tracking and registry),
``whole`` (:class:`Config`) and ``load`` (reading and validating params.yaml). Every
public name is imported from here: ``vmapcheck.config.X`` is the public config API.
"""

from vmapcheck.config.bench import (
    BENCH_ROUNDS,
    MAX_REPEATS,
    MIN_SAMPLES,
    BenchConfig,
    BudgetConfig,
    EarlyStopConfig,
    RegressionConfig,
)
from vmapcheck.config.data import (
    AnonymizeConfig,
    DataConfig,
    DiabetesDataConfig,
    DigitsDataConfig,
    DigitTokensDataConfig,
    FileDataConfig,
    QuasiPolicy,
    SplitConfig,
    SyntheticDataConfig,
)
from vmapcheck.config.fields import (
    MODELS_URI_PATTERN,
    REGISTERED_MODEL_PATTERN,
    Fraction,
    NonNegativeFloat,
    PositiveInt,
)
from vmapcheck.config.guard import (
    DTYPE_BYTES,
    LEAF_BYTES,
    GuardConfig,
    GuardReplayConfig,
    byte_limit_problem,
    example_bytes,
)
from vmapcheck.config.load import (
    config_digest,
    describe_errors,
    flatten,
    load_config,
    read_params,
    validate_config,
    without_project_keys,
)
from vmapcheck.config.model import (
    BUILTIN_MODELS,
    LeafConfig,
    ModelConfig,
)
from vmapcheck.config.run import (
    FINDING_KIND_NAMES,
    MAX_LEARNING_RATE,
    MAX_TOLERANCE,
    BackendConfig,
    BackendName,
    PrecisionConfig,
    PrecisionName,
    ToleranceConfig,
    ToleranceScale,
    TrainConfig,
    VerdictConfig,
    conf_options,
    precision_dtype,
    precision_names,
)
from vmapcheck.config.tracking import (
    HTTP_SCHEMES,
    SQLITE_URI,
    DeploymentTargetConfig,
    RegistryConfig,
    TrackingConfig,
    tracking_uri_problem,
)
from vmapcheck.config.whole import (
    CONFIG_KEYS,
    Config,
    ReferenceConfig,
)

__all__ = [
    "BENCH_ROUNDS",
    "BUILTIN_MODELS",
    "CONFIG_KEYS",
    "DTYPE_BYTES",
    "FINDING_KIND_NAMES",
    "HTTP_SCHEMES",
    "LEAF_BYTES",
    "MAX_LEARNING_RATE",
    "MAX_REPEATS",
    "MAX_TOLERANCE",
    "MIN_SAMPLES",
    "MODELS_URI_PATTERN",
    "REGISTERED_MODEL_PATTERN",
    "SQLITE_URI",
    "AnonymizeConfig",
    "BackendConfig",
    "BackendName",
    "BenchConfig",
    "BudgetConfig",
    "Config",
    "DataConfig",
    "DeploymentTargetConfig",
    "DiabetesDataConfig",
    "DigitTokensDataConfig",
    "DigitsDataConfig",
    "EarlyStopConfig",
    "FileDataConfig",
    "Fraction",
    "GuardConfig",
    "GuardReplayConfig",
    "LeafConfig",
    "ModelConfig",
    "NonNegativeFloat",
    "PositiveInt",
    "PrecisionConfig",
    "PrecisionName",
    "QuasiPolicy",
    "ReferenceConfig",
    "RegistryConfig",
    "RegressionConfig",
    "SplitConfig",
    "SyntheticDataConfig",
    "ToleranceConfig",
    "ToleranceScale",
    "TrackingConfig",
    "TrainConfig",
    "VerdictConfig",
    "byte_limit_problem",
    "conf_options",
    "config_digest",
    "describe_errors",
    "example_bytes",
    "flatten",
    "load_config",
    "precision_dtype",
    "precision_names",
    "read_params",
    "tracking_uri_problem",
    "validate_config",
    "without_project_keys",
]
