"""A tracking URI: which store it names (a tracking server, an sqlite file) and how a
message shows it: without the user name and password ``MLFLOW_TRACKING_URI`` may hold."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from vmapcheck.config.tracking import HTTP_SCHEMES, SQLITE_URI


def is_http(uri: str) -> bool:
    """Whether ``uri`` names a tracking server (``http://`` or ``https://``)."""
    return uri.startswith(HTTP_SCHEMES)


def shown(uri: str) -> str:
    """``uri`` without a user name or password, for messages."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:////abs/path.db`` URI, else None."""
    if not uri.startswith(SQLITE_URI):
        return None
    return Path(uri[len(SQLITE_URI) :].split("?", 1)[0])
