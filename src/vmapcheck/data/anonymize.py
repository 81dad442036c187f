"""What leaves ``prepare``: a raw table with its personal data removed or coarsened.

Direct identifiers are dropped, except at most one join key, replaced by a keyed
pseudonym (HMAC-SHA256 under a secret read from the environment, so the pseudonym cannot
be recomputed from a guessed value without the secret). Quasi-identifiers are
generalized (a date to its year or decade, a whole number such as an age to its band of
ten, a code to its first characters) or dropped.
Features and targets are kept. Shapes: rows on axis 0, as in :class:`RawTable`.

:func:`find_canaries` is the check that this holds: it scans output files, compressed
members included, for planted raw values.
"""

from __future__ import annotations

import bz2
import datetime as dt
import gzip
import hashlib
import hmac
import io
import json
import lzma
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vmapcheck.data.sources import RawTable, Schema
from vmapcheck.errors import ArtifactError, ConfigError, VmapcheckError

QUASI_POLICIES = ("drop", "year", "decade", "band10", "prefix1", "prefix2", "prefix3")
MIN_SECRET_CHARS = 16
PSEUDONYM_ACTION = "pseudonymized (HMAC-SHA256)"

# Strict ISO calendar date. date.fromisoformat alone would also take "19870212" or
# "1987-W06-4" (Python >= 3.11), which are not what the policy promises to read.
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
# A whole number in plain decimal, small enough for int32 (an age, a count).
_WHOLE_NUMBER = re.compile(r"-?[0-9]{1,9}")


class AnonymizationError(VmapcheckError):
    """The raw table cannot be anonymized as configured (secret missing, value unusable)."""


@dataclass(frozen=True)
class AnonymizePolicy:
    """How identifiers leave ``prepare`` (config ``data.anonymize``).

    ``join_key``: an identifier column kept as a keyed pseudonym, or None (every
    identifier dropped). ``secret_env``: the environment variable holding the HMAC secret
    (its name only; the secret is read when needed and never stored). ``group_by``: an
    identifier column whose equal values are one record (kept together when splitting),
    or None (each row its own record).
    """

    join_key: str | None
    secret_env: str
    group_by: str | None


@dataclass(frozen=True)
class AnonymizedTable:
    """Rows on axis 0; nothing here is a raw identifier or quasi-identifier value.

    ``features`` (n_rows, n_features) and ``targets`` (n_rows, n_targets) float32;
    ``join_keys`` (n_rows,) '<U64' hex pseudonyms ("" where the raw value was empty) or
    None; ``generalized``: "<column>.<level>" -> (n_rows,) array (int32 for year, decade
    and band10, '<UN' for prefixN), dropped columns absent; ``group_ids`` (n_rows,) int64, rows of
    one record share an id (dense 0..k-1 in order of first appearance); ``columns``: one
    manifest entry per source column ({name, role, action, dtype}), never a value.
    """

    features: np.ndarray
    targets: np.ndarray
    feature_names: tuple[str, ...]
    target_names: tuple[str, ...]
    join_keys: np.ndarray | None
    generalized: dict[str, np.ndarray]
    group_ids: np.ndarray
    columns: list[dict[str, str]]


def validate_policy(schema: Schema, policy: AnonymizePolicy) -> None:
    """Check the policy against the schema; raises ConfigError naming the config key.

    Cheap and needs no data: call it before reading the source file, so a typo in the
    config fails fast.
    """
    identifiers = schema.identifiers
    choices = f"one of {', '.join(identifiers)}" if identifiers else "no identifier exists"
    for key, column in (("join_key", policy.join_key), ("group_by", policy.group_by)):
        if column is not None and column not in identifiers:
            raise ConfigError(
                f"data.anonymize.{key}: expected an identifier column ({choices}) or null, "
                f"found {column!r}"
            )
    if policy.join_key is not None and not policy.secret_env:
        raise ConfigError(
            "data.anonymize.secret_env: expected the name of an environment variable, found "
            f"{policy.secret_env!r}"
        )
    for column, level in schema.quasi_identifiers.items():
        if level not in QUASI_POLICIES:
            raise ConfigError(
                f"data.quasi_identifiers.{column}: expected one of {', '.join(QUASI_POLICIES)}, "
                f"found {level!r}"
            )


def anonymize(
    raw: RawTable, policy: AnonymizePolicy, environ: Mapping[str, str] = os.environ
) -> AnonymizedTable:
    """Drop, pseudonymize and generalize ``raw``'s personal columns; keep the numbers.

    Every identifier is dropped except ``policy.join_key``, whose values become
    ``hmac.new(secret, value.encode(), sha256).hexdigest()`` with the secret
    ``environ[policy.secret_env]`` (UTF-8; at least 16 characters). Values are hashed
    exactly as they are (no case or whitespace folding); an empty value stays "" rather
    than becoming one pseudonym shared by every row without a key. Quasi-identifiers
    follow their policy in ``raw.schema``. Raises ConfigError for a policy that does not
    fit the schema, AnonymizationError for a missing/short secret or a value the policy
    cannot use (naming the column and row, never the value).
    """
    schema = raw.schema
    validate_policy(schema, policy)
    columns: list[dict[str, str]] = []

    join_keys = None
    for column in schema.identifiers:
        if column == policy.join_key:
            join_keys = _pseudonyms(raw.identifiers[column], policy.secret_env, environ)
            action, dtype = PSEUDONYM_ACTION, str(join_keys.dtype)
        else:
            action, dtype = "dropped", "none"
        columns.append({"name": column, "role": "identifier", "action": action, "dtype": dtype})

    generalized: dict[str, np.ndarray] = {}
    for column, level in schema.quasi_identifiers.items():
        entry = {"name": column, "role": "quasi_identifier"}
        if level == "drop":
            columns.append({**entry, "action": "dropped", "dtype": "none"})
            continue
        values = raw.quasi_identifiers[column]
        if level in ("year", "decade"):
            out = _years(raw.source, column, level, values)
            if level == "decade":
                out = (out // 10 * 10).astype(np.int32)
            action = f"generalized to {level}"
        elif level == "band10":
            out = _bands(raw.source, column, 10, values)
            action = "generalized to band of 10 (its lower bound)"
        else:
            n = int(level.removeprefix("prefix"))
            out = _prefixes(raw.source, column, n, values)
            action = f"generalized to first {n} character{'s' if n > 1 else ''}"
        generalized[f"{column}.{level}"] = out
        columns.append({**entry, "action": action, "dtype": str(out.dtype)})

    for role, names, block in (
        ("feature", schema.features, raw.features),
        ("target", schema.targets, raw.targets),
    ):
        for name in names:
            columns.append(
                {"name": name, "role": role, "action": "kept", "dtype": str(block.dtype)}
            )

    group_ids = (
        np.arange(raw.n_rows, dtype=np.int64)
        if policy.group_by is None
        else _group_ids(raw.identifiers[policy.group_by])
    )
    return AnonymizedTable(
        features=raw.features.copy(),
        targets=raw.targets.copy(),
        feature_names=schema.features,
        target_names=schema.targets,
        join_keys=join_keys,
        generalized=generalized,
        group_ids=group_ids,
        columns=columns,
    )


def _pseudonyms(values: np.ndarray, secret_env: str, environ: Mapping[str, str]) -> np.ndarray:
    """(n_rows,) str -> (n_rows,) '<U64' hex HMAC-SHA256; "" stays "" (no key, no join)."""
    secret = environ.get(secret_env)
    if secret is None or len(secret) < MIN_SECRET_CHARS:
        state = "is not set" if secret is None else f"is shorter than {MIN_SECRET_CHARS} characters"
        raise AnonymizationError(
            f"environment variable {secret_env} (data.anonymize.secret_env) {state}; the join "
            f"key is pseudonymized with a secret of at least {MIN_SECRET_CHARS} characters, "
            f"e.g. export {secret_env}=$(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    key = secret.encode("utf-8")
    # One HMAC per distinct value: equal raw values get equal pseudonyms by construction.
    unique, inverse = np.unique(values, return_inverse=True)
    digests = [
        "" if v == "" else hmac.new(key, v.encode("utf-8"), hashlib.sha256).hexdigest()
        for v in unique.tolist()
    ]
    return np.asarray(digests, dtype="<U64")[inverse.reshape(-1)]


def _first_bad_row(source: str, column: str, bad: np.ndarray, problem: str) -> None:
    """Raise naming the first bad row (1-based) of ``column``; the value is not shown."""
    rows = np.flatnonzero(bad)
    if rows.size:
        more = f" ({rows.size} rows in all)" if rows.size > 1 else ""
        raise AnonymizationError(
            f"{source}: column {column!r}, row {rows[0] + 1}: {problem}{more} (the value is "
            "not shown: it is personal data)"
        )


def _years(source: str, column: str, level: str, values: np.ndarray) -> np.ndarray:
    """(n_rows,) ISO dates YYYY-MM-DD -> (n_rows,) int32 years; a bad date raises."""
    unique, inverse = np.unique(values, return_inverse=True)
    years = np.zeros(unique.shape[0], dtype=np.int32)
    ok = np.zeros(unique.shape[0], dtype=bool)
    for j, text in enumerate(unique.tolist()):
        if _ISO_DATE.fullmatch(text):
            try:
                years[j] = dt.date.fromisoformat(text).year
                ok[j] = True
            except ValueError:  # well-formed but impossible, e.g. 1987-02-30
                pass
    # A number of years (an age) is no date: say which policy takes it, without a value.
    numbers = not ok.all() and all(_WHOLE_NUMBER.fullmatch(t) for t in unique[~ok].tolist())
    _first_bad_row(
        source,
        column,
        ~ok[inverse.reshape(-1)],
        f"expected an ISO date YYYY-MM-DD for policy {level!r} "
        f"(data.quasi_identifiers.{column}), found a value that is not one"
        + ("; a whole number such as an age in years takes policy 'band10'" if numbers else ""),
    )
    return years[inverse.reshape(-1)]


def _bands(source: str, column: str, width: int, values: np.ndarray) -> np.ndarray:
    """(n_rows,) whole numbers as text -> (n_rows,) int32 lower bound of each one's band
    of ``width`` (59 -> 50 for 10; -1 -> -10); anything else, "" included, raises."""
    unique, inverse = np.unique(values, return_inverse=True)
    ok = np.asarray([bool(_WHOLE_NUMBER.fullmatch(t)) for t in unique.tolist()], dtype=bool)
    _first_bad_row(
        source,
        column,
        ~ok[inverse.reshape(-1)],
        f"expected a whole number for policy 'band{width}' (data.quasi_identifiers.{column}), "
        "found a value that is not one",
    )
    numbers = np.asarray([int(t) for t in unique.tolist()], dtype=np.int64)
    return (numbers // width * width).astype(np.int32)[inverse.reshape(-1)]


def _prefixes(source: str, column: str, n: int, values: np.ndarray) -> np.ndarray:
    """(n_rows,) str -> (n_rows,) '<U{n}' first n characters; "" stays "".

    A non-empty value of n characters or fewer would pass through whole, which is no
    generalization at all: refuse it rather than publish it.
    """
    lengths = np.char.str_len(values)
    _first_bad_row(
        source,
        column,
        (lengths > 0) & (lengths <= n),
        f"policy 'prefix{n}' (data.quasi_identifiers.{column}) would keep the whole value "
        f"(it has {n} character{'s' if n > 1 else ''} or fewer); choose a shorter prefix or "
        "'drop'",
    )
    return np.asarray([v[:n] for v in values.tolist()], dtype=f"<U{n}").reshape(values.shape)


def _group_ids(values: np.ndarray) -> np.ndarray:
    """(n_rows,) str -> (n_rows,) int64 dense ids in order of first appearance.

    An empty value is a missing id, not a shared one: each such row is its own record.
    """
    ids: dict[object, int] = {}
    out = np.empty(values.shape[0], dtype=np.int64)
    for i, value in enumerate(values.tolist()):
        out[i] = ids.setdefault(value if value != "" else (i,), len(ids))
    return out


# ---------------------------------------------------------------------------------------
# Canary scan

_MAX_DEPTH = 4  # archives inside archives: deep enough for .npz in .zip, bounded for bombs


def find_canaries(paths: Iterable[Path], canaries: Iterable[str]) -> list[tuple[Path, str]]:
    """Every (file, canary) such that the file holds the canary, in file then canary order.

    ``paths`` are files or folders (walked recursively); a missing path raises
    ArtifactError, since a scan of nothing proves nothing. Each file is read as bytes,
    whatever its type (text, JSON, sqlite, .npz...). A canary is searched as UTF-8,
    UTF-16 and UTF-32 (both byte orders; numpy stores '<U' strings as UTF-32-LE) and as
    JSON escapes it. Compression could hide a value, so zip archives (.npz, .zip...),
    gzip, bz2 and xz content is also scanned decompressed (nested up to a few levels), and
    a Parquet file's column values are scanned as text. Each hit is reported once, with
    the outermost file's path.
    """
    wanted = list(dict.fromkeys(canaries))
    if any(not c for c in wanted):
        raise ValueError("find_canaries: an empty canary would match every file")
    patterns = {c: _encodings(c) for c in wanted}
    hits: list[tuple[Path, str]] = []
    for file in _files(paths):
        blobs = list(_blobs(file.read_bytes(), 0))
        for canary in wanted:
            if any(p in blob for blob in blobs for p in patterns[canary]):
                hits.append((file, canary))
    return hits


def _encodings(canary: str) -> list[bytes]:
    forms = {
        canary.encode(codec)
        for codec in ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
    }
    forms.add(json.dumps(canary)[1:-1].encode("ascii"))  # "\u00e9" for é, as JSON writes it
    return sorted(forms)


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in map(Path, paths):
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            yield path
        else:
            raise ArtifactError(f"{path}: not found; nothing to scan for canaries")


# What a damaged or falsely-detected archive raises. Its raw bytes are scanned anyway;
# only its insides are skipped.
_DAMAGED = (
    zipfile.BadZipFile,
    OSError,
    EOFError,
    ValueError,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,
    RuntimeError,
)


def _blobs(data: bytes, depth: int) -> Iterator[bytes]:
    """The bytes themselves, then every decompressed form found inside them."""
    yield data
    if depth >= _MAX_DEPTH:
        return
    inner: list[bytes] = []
    if zipfile.is_zipfile(io.BytesIO(data)):
        inner = _zip_members(data)
    elif data[:2] == b"\x1f\x8b":
        inner = _decompressed(gzip.decompress, data)
    elif data[:3] == b"BZh":
        inner = _decompressed(bz2.decompress, data)
    elif data[:6] == b"\xfd7zXZ\x00":
        inner = _decompressed(lzma.decompress, data)
    elif data[:4] == b"PAR1" and data[-4:] == b"PAR1":
        inner = _parquet_text(data)
    for blob in inner:
        yield from _blobs(blob, depth + 1)


def _zip_members(data: bytes) -> list[bytes]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except _DAMAGED:
        return []
    members = []
    with archive:
        for info in archive.infolist():
            try:
                members.append(archive.read(info))
            except _DAMAGED:
                continue  # one damaged member does not hide the others
    return members


def _decompressed(decompress: Callable[[bytes], bytes], data: bytes) -> list[bytes]:
    try:
        return [decompress(data)]
    except _DAMAGED:
        return []


def _parquet_text(data: bytes) -> list[bytes]:
    """Parquet pages are usually compressed (snappy): scan each column's values as text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError):
        return []
    return [
        "\n".join(map(str, table.column(j).to_pylist())).encode("utf-8")
        for j in range(table.num_columns)
    ]
