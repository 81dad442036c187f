"""A tracking server: how long a run waits for it, and telling a server that went away.

**How long.** By default MLflow retries a failed request 7 times with exponential backoff
and waits up to 120 s per attempt: about four minutes on a dead server. The
``tracking.http_*`` settings go into MLflow's own variables (``MLFLOW_HTTP_REQUEST_TIMEOUT``,
``..._MAX_RETRIES``, ``..._BACKOFF_FACTOR``, ``..._BACKOFF_JITTER``, which
``mlflow.utils.rest_utils.http_request`` reads on every request, artifact uploads
included) before the first request. They replace values already in the environment: the
config is what the run records. A server is probed first (``GET <uri>/health``, one
attempt of at most ``http_timeout_s``), so a stopped server fails ``track`` within
seconds with a :class:`~vmapcheck.errors.TrackingStoreError` naming the URI; a server
that stops answering later is recognized by :func:`reaching`, which probes again.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

from vmapcheck.config import TrackingConfig
from vmapcheck.errors import TrackingStoreError, first_line
from vmapcheck.tracking.uri import is_http, shown

# MLflow's variables for the tracking.http_* settings (mlflow/environment_variables.py).
HTTP_ENV = {
    "http_timeout_s": "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "http_max_retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "http_backoff_factor": "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "http_backoff_jitter": "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER",
}


def http_settings(tracking: TrackingConfig) -> dict[str, str]:
    """MLflow's environment variables for the ``tracking.http_*`` settings."""
    return {
        HTTP_ENV["http_timeout_s"]: str(tracking.http_timeout_s),
        HTTP_ENV["http_max_retries"]: str(tracking.http_max_retries),
        HTTP_ENV["http_backoff_factor"]: str(tracking.http_backoff_factor),
        HTTP_ENV["http_backoff_jitter"]: repr(float(tracking.http_backoff_jitter)),
    }


def apply_http_settings(tracking: TrackingConfig) -> dict[str, str]:
    """Put the settings into this process's environment (before any MLflow request)."""
    values = http_settings(tracking)
    os.environ.update(values)
    return values


def worst_request_s(tracking: TrackingConfig) -> float:
    """The longest one request can take against a server that accepts connections but
    never answers: every attempt times out, with urllib3's backoff in between (no sleep
    before the first retry, then factor x 2, 4, ... s, plus up to the jitter each)."""
    retries = tracking.http_max_retries
    sleeps = [tracking.http_backoff_factor * 2 ** (k - 1) for k in range(2, retries + 1)]
    return (
        (retries + 1) * tracking.http_timeout_s
        + sum(min(s, 120) for s in sleeps)
        + len(sleeps) * tracking.http_backoff_jitter
    )


def health(uri: str, timeout_s: float) -> str | None:
    """Why ``GET <uri>/health`` failed (one attempt), or None when the server answers OK."""
    # A user and password in the URL (MLFLOW_TRACKING_URI may hold them) go as HTTP basic
    # auth, as MLflow sends them; urllib would take them for part of the host name.
    parts = urlsplit(uri)
    request = urllib.request.Request(shown(uri).rstrip("/") + "/health")
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.status == 200:
                return None
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout_s:g} s"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror.lower()
        return str(reason)[:200]
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return (exc.strerror or type(exc).__name__).lower()


def _unreachable(uri: str, why: str, seconds: float, when: str = "") -> str:
    return (
        f"the MLflow tracking server {shown(uri)} does not answer{when} (GET /health: {why}; "
        f"gave up after {seconds:.1f} s). Nothing was lost: the reports are on disk (reports/); "
        "once the server answers, `dvc repro` reruns track and logs them as one run. Check "
        "tracking.tracking_uri (or MLFLOW_TRACKING_URI) if the server moved."
    )


def probe(uri: str, tracking: TrackingConfig) -> None:
    """Raise :class:`TrackingStoreError` naming ``uri`` unless the server answers."""
    started = time.monotonic()
    why = health(uri, tracking.http_timeout_s)
    if why is not None:
        raise TrackingStoreError(_unreachable(uri, why, time.monotonic() - started))


@contextlib.contextmanager
def reaching(uri: str, tracking: TrackingConfig) -> Iterator[None]:
    """Report a failure of the store's requests as the server going away, when it has.

    MLflow raises its own errors (after the bounded retries) for a server that stopped
    answering; this probes the server again and, if it is down, replaces them by one
    :class:`TrackingStoreError` naming the URI. Any other error passes unchanged.
    """
    started = time.monotonic()
    try:
        yield
    except TrackingStoreError:
        raise
    except Exception as exc:
        if not is_http(uri):
            raise
        why = health(uri, tracking.http_timeout_s)
        if why is None:
            raise
        first = first_line(exc)
        raise TrackingStoreError(
            _unreachable(uri, why, time.monotonic() - started, " any more")
            + f" (the request that failed: {type(exc).__name__}: {first})"
        ) from None
