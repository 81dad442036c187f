"""Exceptions whose messages name what was wrong, where, what was expected and found."""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import re
import sys
from collections.abc import Iterable, Iterator
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


class ProcessGroupError(VmapcheckError):
    """A multi-process run (``backend.processes``, docs/multiprocess.md) could not form its
    group of processes, or one of them failed: the process named, with its exit code."""


class ModelCodeError(VmapcheckError):
    """The model's own code (its factory, init or forward) raised: the model named, where
    in its code, and the fix when one is known (:func:`model_code_error`)."""


class UnsupportedVersionError(VmapcheckError):
    """An installed package vmapcheck depends on (jax, jaxlib) is outside the version range
    vmapcheck declares for it (:mod:`vmapcheck.versions`)."""


# How close a known name must be to a mistyped one to be suggested (difflib's ratio:
# ``comapre``/``compare`` 0.86, ``flax_mpl``/``flax_mlp`` 0.88, ``tolerence``/``tolerance``
# 0.89); below it a guess misleads more than it helps (``mlp``/``toy`` 0.0).
SUGGEST_CUTOFF = 0.6


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    """``" (did you mean X?)"`` naming the known name closest to a mistyped ``name`` (two
    or three when they are about as close: ``" (did you mean X or Y?)"``), or ``""`` when
    none is close (:data:`SUGGEST_CUTOFF`) or ``name`` is itself known. Appended to an
    error that already names ``name`` and what was expected.

    Names are compared without their leading dashes, which every option shares
    (``--bogus`` is not close to ``--out``), and a name differing in case only
    (``MLP``) is close. ``prefix``: put before each name shown (a key's parent path,
    ``precision.``) and not compared: a shared prefix would make any two names look
    alike."""
    known = [str(k) for k in known]
    if name in known:
        return ""

    def bare(text: str) -> str:
        return text.lstrip("-").lower()

    def score(k: str) -> float:
        return difflib.SequenceMatcher(None, bare(name), bare(k)).ratio()

    scores = {k: score(k) for k in known}
    close = sorted((k for k in known if scores[k] >= SUGGEST_CUTOFF), key=lambda k: -scores[k])
    if not close:
        return ""
    # The best, and any other within 0.05 of it (3 at most): a tie is not broken by guessing.
    close = [k for k in close if scores[close[0]] - scores[k] < 0.05][:3]
    return f" (did you mean {' or '.join(prefix + k for k in close)}?)"


# --- the boundary: what a command, a stage or the API shows of an error -------------------
#
# Exit statuses of every command and stage (docs/errors.md lists them): 0 done; 1 the
# command found what it looks for (a regression, a divergence, a failed check); 2 refused:
# a bad flag, setting, file or value, or the model's own code raising, named in one line;
# 3 an internal error (a bug in vmapcheck: one line, the traceback with VMAPCHECK_DEBUG=1).
REFUSED = 2
INTERNAL = 3
# The exit code of a stage or command stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130
# Its output's reader went away (``vmapcheck registry | head -2``): quiet, with the status
# a shell gives a Unix tool that SIGPIPE ended (128 + 13).
BROKEN_PIPE = 141
# Set (to anything but "", "0", "false", "no") to see the traceback behind a one-line error.
DEBUG_ENV = "VMAPCHECK_DEBUG"


def debug_wanted() -> bool:
    """Whether the user asked for tracebacks (:data:`DEBUG_ENV`; ``vmapcheck --debug`` sets it)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


# What an OSError's errno means for the file it names: what was expected of it.
_OS_EXPECTED = {
    errno.ENOENT: "expected an existing file or folder, found none",
    errno.ELOOP: "expected a file, found a symbolic link loop",
    errno.EACCES: "expected a file this user may read (or write), found it not permitted",
    errno.EPERM: "expected a file this user may read (or write), found it not permitted",
    errno.EISDIR: "expected a file, found a directory",
    errno.ENOTDIR: "expected a folder in its path, found a file",
    errno.ENOSPC: "expected room on its device, found the device full",
    errno.EDQUOT: "expected room on its device, found the disk quota used up",
    errno.EROFS: "expected a writable file system, found a read-only one",
    errno.ENAMETOOLONG: "expected a shorter name, found one over the system's limit",
    errno.EEXIST: "expected nothing there, found a file",
    errno.ENXIO: "expected a regular file, found a device or socket",
}

# The errors that outside input causes (a file, a value, a nesting): shown as one line.
OUTSIDE_ERRORS = (OSError, UnicodeError, RecursionError, OverflowError, MemoryError)


def os_expected(exc: OSError) -> str:
    """What was expected of the file an OSError names and what was found, with the
    system's words (``expected a file, found a symbolic link loop (Too many levels of
    symbolic links)``); the system's words alone for an errno not listed."""
    expected = _OS_EXPECTED.get(exc.errno or -1, "")
    said = exc.strerror or str(exc) or type(exc).__name__
    return f"{expected} ({said})" if expected else said


def describe(exc: BaseException) -> str | None:
    """One line for an error that a bad file or value causes (:data:`OUTSIDE_ERRORS`):
    what it concerns (the file, when the error names one), what was expected and what
    was found; None for any other error (a bug: :func:`internal_error`)."""
    if isinstance(exc, OSError):
        names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
        where = " -> ".join(names) if names else "a file or connection"
        return f"{where}: {os_expected(exc)}"
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"expected UTF-8 text, found the byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start} ({exc.reason})"
        )
    if isinstance(exc, UnicodeError):
        return f"expected text that can be encoded, found {first_line(exc)}"
    if isinstance(exc, RecursionError):
        return (
            "expected input nested at most a few hundred levels deep, found it nested too "
            "deeply for Python to read (RecursionError)"
        )
    if isinstance(exc, OverflowError):
        return f"expected a number in range, found one too large ({first_line(exc)})"
    if isinstance(exc, MemoryError):
        return (
            "ran out of memory (MemoryError): a file, a batch or a setting is too large "
            "for this machine"
        )
    return None


# vmapcheck's own code, and the interpreter's library (JAX, numpy and the rest of
# site-packages included): what is not the user's code.
_VMAPCHECK = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARY = tuple({os.path.join(os.path.abspath(p), "") for p in (sys.prefix, sys.base_prefix)})


def user_frame(exc: BaseException) -> str | None:
    """``file:line in function`` where ``exc`` left the user's code (a model's factory,
    init or forward): the innermost traceback frame that is neither vmapcheck's nor a
    library's, provided no vmapcheck frame lies below it (then the error is
    vmapcheck's own); None when there is none."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        path = os.path.abspath(code.co_filename)
        if path.startswith(_VMAPCHECK):
            found = None
        elif not (
            path.startswith(_LIBRARY) or "site-packages" in path or code.co_filename.startswith("<")
        ):
            found = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return found


def known_model_fault(exc: BaseException, model: str | None = None) -> str | None:
    """One line naming the model, the fault and its fix, for an error of the model's code
    whose cause is known (a ``jax.pure_callback`` without ``vmap_method``, which JAX
    refuses to batch); None for any other error."""
    who = f"model {model!r}" if model else "the model"
    if isinstance(exc, NotImplementedError) and "vmap_method" in str(exc):
        where = user_frame(exc)
        return (
            f"{who}: its forward calls jax.pure_callback without vmap_method"
            + (f" ({where})" if where else "")
            + ", so vmap cannot batch it; pass vmap_method='sequential' (one callback per "
            "row), or 'expand_dims' / 'broadcast_all' when the callback takes a batch"
        )
    return None


def model_code_error(exc: BaseException, model: str | None = None) -> str | None:
    """One line for an error the model's code raised (its factory, init or forward),
    naming the model, where in its code and the fix when one is known; None when the
    error did not come from the model's code."""
    who = f"model {model!r}" if model else "the model"
    known = known_model_fault(exc, model)
    if known is not None:
        return known
    where = user_frame(exc)
    if where is None:
        return None
    return (
        f"{who}: its code raised {type(exc).__name__}: {first_line(exc)} (at {where}); "
        f"fix the model's code there ({DEBUG_ENV}=1 shows the traceback)"
    )


def internal_error(exc: BaseException) -> str:
    """One line for an error no refusal foresaw: its type and message, and how to see more."""
    return (
        f"internal error: {type(exc).__name__}: {first_line(exc)} (a bug in vmapcheck or in "
        f"the model's code; {DEBUG_ENV}=1 shows the traceback)"
    )


def user_error(exc: BaseException, model: str | None = None) -> tuple[int, str] | None:
    """(exit status, one line) for ``exc`` at an entry point, or None: show its traceback
    (the user asked for tracebacks, :func:`debug_wanted`). A refusal
    (:class:`VmapcheckError`, :data:`OUTSIDE_ERRORS`, an error of the model's code:
    :func:`model_code_error`, naming ``model`` when given) is :data:`REFUSED`, anything
    else :data:`INTERNAL`. The CLI (``vmapcheck.cli.main``) and every stage
    (``vmapcheck.pipeline.stage.run_stage``) show errors through this one function."""
    if debug_wanted():
        return None
    if isinstance(exc, VmapcheckError):
        return REFUSED, str(exc)
    said = outside_error(exc, model)
    if said is not None:
        return REFUSED, said
    return INTERNAL, internal_error(exc)


def outside_error(exc: BaseException, model: str | None = None) -> str | None:
    """One line for an error from outside vmapcheck, or None (a bug of vmapcheck's): a
    file's OSError names the file (:func:`describe`) even when the model's code met it;
    any other error of the model's code names the model and where
    (:func:`model_code_error`: its endless recursion is not a file nested too deeply);
    a decode, recursion, overflow or memory error elsewhere is :func:`describe`'s."""
    if isinstance(exc, OSError):
        return describe(exc)
    return model_code_error(exc, model) or describe(exc)


def api_error(exc: BaseException, model: str | None = None) -> VmapcheckError | None:
    """What the Python API raises instead of ``exc`` (chained ``from`` it), or None:
    ``exc`` itself goes on (a :class:`VmapcheckError` already, a bug, or the user asked
    for tracebacks, :func:`debug_wanted`). An error of a bad file or value
    (:data:`OUTSIDE_ERRORS`) becomes a one-line :class:`VmapcheckError`, one of the
    model's code a :class:`ModelCodeError` naming ``model``."""
    if isinstance(exc, VmapcheckError) or debug_wanted():
        return None
    said = outside_error(exc, model)
    if said is None:
        return None
    return ModelCodeError(said) if model_code_error(exc, model) == said else VmapcheckError(said)


def quiet_broken_pipe() -> int:
    """After a BrokenPipeError on stdout: point stdout at /dev/null (so Python's own
    flush at exit does not raise again and print), and return :data:`BROKEN_PIPE`."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return BROKEN_PIPE


# A URL's user name and password (``scheme://user:password@host``): never shown.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")


# A URL's query or fragment parameter (``?name=value``, ``&name=value``, ``#name=value``).
_QUERY_PARAM = re.compile(r"([?&#])([\w.-]+)=([^&#\s'\"]+)")
# The words of a parameter's name that make it a credential (``access_token``,
# ``X-Amz-Signature``, ``client_secret``): its value is never shown.
_SECRET_WORDS = frozenset(
    {"token", "password", "passwd", "pwd", "secret", "sig", "signature", "auth"}
    | {"authorization", "credential", "credentials", "apikey", "sas"}
)
# "key" names a credential only alone or after one of these (``api_key``, ``AccessKey``):
# MLflow's own ``viewStateShareKey`` names a saved view, and the link must open it.
_KEY_OWNERS = frozenset(
    {"api", "access", "secret", "private", "auth", "client", "account", "signing"}
    | {"subscription", "master", "session"}
)


def _name_words(name: str) -> list[str]:
    """``viewStateShareKey`` -> ``["view", "state", "share", "key"]``; ``api_key`` ->
    ``["api", "key"]`` (snake, kebab, dotted and camel case split, lower-cased)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return [w.lower() for w in re.split(r"[\s_.-]+", spaced) if w]


def credential_name(name: str) -> bool:
    """Whether a query parameter named ``name`` holds a credential (its value hidden)."""
    words = _name_words(name)
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(
        w == "key" and (len(words) == 1 or (i > 0 and words[i - 1] in _KEY_OWNERS))
        for i, w in enumerate(words)
    )


def redact(text: str) -> str:
    """``text`` with the user name and password of every URL in it, and the value of any
    query parameter named as a credential (:func:`credential_name`: a token, a password,
    an API key, a signature, ...), as ``***``. Other parameters stay as they are, so a
    printed link still opens the page it names."""

    def hide(found: re.Match[str]) -> str:
        mark, name, value = found.groups()
        return f"{mark}{name}={'***' if credential_name(name) else value}"

    return _QUERY_PARAM.sub(hide, _USERINFO.sub(r"\1***@", text))


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
    sys.stdout, sys.stderr = Redacting(out), Redacting(err)
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
