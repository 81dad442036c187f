"""Exceptions whose messages name what was wrong, where, what was expected and found."""


class VmapcheckError(Exception):
    """Base class: every error the tool raises on bad input or a failed precondition."""


class ConfigError(VmapcheckError):
    """A config value is missing, unknown, of the wrong type or impossible."""


class BackendUnavailableError(VmapcheckError):
    """The configured JAX backend cannot be initialised on this machine."""


class InvalidInputError(VmapcheckError, ValueError):
    """An input batch violates the model's contract (rank, feature count, dtype, values).

    ``reason`` is a short category ("rank", "features", "empty", "dtype",
    "non_finite_input", and the guard's "type", "batch_too_large", "too_many_bytes") that
    metrics can count without keeping the message.
    """

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class ArtifactError(VmapcheckError):
    """A file produced by an earlier stage is missing, malformed or does not match."""


class SourceError(VmapcheckError):
    """The raw input table is missing, malformed or does not match the declared schema."""


class NonFiniteOutputError(VmapcheckError, ArithmeticError):
    """The model returned NaN or Inf for a valid input: refused instead of an output."""


class TrackingStoreError(VmapcheckError):
    """The MLflow store (a tracking server or the local sqlite file) cannot be reached or used."""


class SettingsChangedError(VmapcheckError):
    """params.yaml changed during a pipeline run (another ``dvc exp run`` in the same
    workspace): its stages ran with different settings, and it is not logged as one run."""


class ResourceError(VmapcheckError):
    """A stage's work cannot fit in this machine's memory: refused before it starts."""


class UnsupportedVersionError(VmapcheckError):
    """An installed package vmapcheck depends on (jax, jaxlib) is outside the version range
    vmapcheck declares for it (:mod:`vmapcheck.versions`)."""


# The exit code of a stage or command stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130
