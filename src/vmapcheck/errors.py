"""Exceptions whose messages name what was wrong, where, what was expected and found."""


class VmapcheckError(Exception):
    """Base class: every error the tool raises on bad input or a failed precondition."""


class ConfigError(VmapcheckError):
    """A config value is missing, unknown, of the wrong type or impossible."""


class BackendUnavailableError(VmapcheckError):
    """The configured JAX backend cannot be initialised on this machine."""


class InvalidInputError(VmapcheckError, ValueError):
    """An input batch violates the model's contract (rank, feature count, dtype, values)."""


class ArtifactError(VmapcheckError):
    """A file produced by an earlier stage is missing, malformed or does not match."""


class SourceError(VmapcheckError):
    """The raw input table is missing, malformed or does not match the declared schema."""
