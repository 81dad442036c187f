"""Exceptions whose messages name what was wrong, where, what was expected and found."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import TextIO


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


class NonFiniteTrainingError(NonFiniteOutputError):
    """Training met a NaN or Inf loss, gradient or params leaf: refused (the step and the
    leaf named), so that no params are saved and no run passes as trained."""


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


# A URL's user name and password (``scheme://user:password@host``): never shown.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")


# A credential in a URL's query (``?token=...``, ``&api_key=...``): never shown either.
_QUERY_SECRET = re.compile(
    r"([?&#][\w.-]*(?:token|key|password|passwd|secret|sig|auth)[\w.-]*=)[^&#\s'\"]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the user name and password of every URL in it, and the value of any
    query parameter named like a credential (token, key, password, ...), as ``***``."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


class Redacting:
    """A text stream that writes to ``stream`` what :func:`redact` leaves: the command
    line and the stages print through it, so that no message (theirs, or a library's
    error they pass on) shows a tracking server's credentials (MLFLOW_TRACKING_URI)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """Inside, sys.stdout and sys.stderr go through :class:`Redacting`."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Redacting(out), Redacting(err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def first_line(error: BaseException | str, limit: int = 300) -> str:
    """The first line of ``error``'s message, at most about ``limit`` characters.

    A longer line keeps its start and its end (where an HTTP client puts the cause, e.g.
    "Connection refused"), joined by " ... " and cut at spaces, never mid-word.
    """
    line = (str(error).splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    half = (limit - 5) // 2
    head = line[:half]
    head = head[: head.rfind(" ")] if " " in head else head
    tail = line[-half:]
    tail = tail[tail.find(" ") + 1 :] if " " in tail else tail
    return f"{head.rstrip()} ... {tail.lstrip()}"
