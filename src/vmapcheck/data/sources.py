"""Raw tables: the user's CSV or Parquet file, a synthetic one generated from a key, or
the diabetes table that scikit-learn ships (real patients, loaded unscaled).

A :class:`RawTable` has rows on axis 0: ``features`` (n_rows, n_features) and
``targets`` (n_rows, n_targets) float32, plus one (n_rows,) str array per identifier and
quasi-identifier column. It holds RAW personal values: it lives in memory inside
``prepare`` only, and what leaves ``prepare`` is :func:`vmapcheck.data.anonymize.anonymize`'s
output.

Error messages name the file, the column and, where it applies, the row (1-based data
row, and for CSV the line of the file where that row starts). They never show a value
from the file: stage errors are printed to logs, identifier and quasi-identifier values
are personal data, and so may be whatever a misplaced column put in a feature column (an
e-mail address). A bad feature or target value is described by its kind and length only.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vmapcheck.errors import ConfigError, SourceError, describe
from vmapcheck.io import file_kind

SUFFIXES = (".csv", ".parquet")

# The config key of each role, for messages that tell the user what to change.
ROLE_KEYS = {
    "identifier": "data.identifiers",
    "quasi-identifier": "data.quasi_identifiers",
    "feature": "data.features",
    "target": "data.targets",
}

# Delimiters a wrongly-configured file is likely to use, with a name for messages.
_DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}

# A bad feature/target value is never shown (a misplaced column can hold e-mail addresses):
# the message describes it by its kind and length only. A decimal comma gets a hint.
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")


@dataclass(frozen=True)
class Schema:
    """Which column of the raw table plays which role; every column has exactly one.

    ``features`` are in model input order (column j of ``RawTable.features`` is
    ``features[j]``); ``quasi_identifiers`` maps each column to its generalization policy
    (see :data:`vmapcheck.data.anonymize.QUASI_POLICIES`, checked there). Lists are accepted
    and stored as tuples. An invalid schema raises :class:`ConfigError` naming the key.
    """

    identifiers: tuple[str, ...]
    quasi_identifiers: dict[str, str]
    features: tuple[str, ...]
    targets: tuple[str, ...]

    def __post_init__(self) -> None:
        # Config hands over lists; freeze them so a schema cannot change after checks.
        object.__setattr__(self, "identifiers", tuple(self.identifiers))
        object.__setattr__(self, "quasi_identifiers", dict(self.quasi_identifiers))
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "targets", tuple(self.targets))
        for role in ("feature", "target"):
            if not self.columns_of(role):
                raise ConfigError(f"{ROLE_KEYS[role]}: expected at least one column, found none")
        seen: dict[str, str] = {}
        for role in ROLE_KEYS:
            key = ROLE_KEYS[role]
            for column in self.columns_of(role):
                if not isinstance(column, str) or not column:
                    raise ConfigError(f"{key}: expected non-empty column names, found {column!r}")
                if column in seen:
                    where = (
                        f"twice in {key}"
                        if seen[column] == role
                        else f"in both {ROLE_KEYS[seen[column]]} and {key}"
                    )
                    raise ConfigError(
                        f"column {column!r} is listed {where}; each column has exactly one role"
                    )
                seen[column] = role

    def columns_of(self, role: str) -> tuple[str, ...]:
        """The columns of one role: identifier, quasi-identifier, feature or target."""
        return {
            "identifier": self.identifiers,
            "quasi-identifier": tuple(self.quasi_identifiers),
            "feature": self.features,
            "target": self.targets,
        }[role]

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column: identifiers, quasi-identifiers, features, targets (file order)."""
        return self.identifiers + tuple(self.quasi_identifiers) + self.features + self.targets

    def role_of(self, column: str) -> str:
        for role in ROLE_KEYS:
            if column in self.columns_of(role):
                return role
        raise KeyError(column)


# repr=False: the default repr would print every personal value into a log or a failed
# test's report; ours shows shapes and column names only.
@dataclass(frozen=True, repr=False)
class RawTable:
    """Rows on axis 0. Holds RAW personal values: never write it anywhere.

    ``features``: (n_rows, n_features) float32, columns in ``schema.features`` order;
    ``targets``: (n_rows, n_targets) float32; ``identifiers`` and ``quasi_identifiers``:
    column -> (n_rows,) str array, in schema order. ``source`` names where the rows came
    from (a path, "synthetic" or :data:`DIABETES_SOURCE`), for error messages; it is never
    a value.
    """

    features: np.ndarray
    targets: np.ndarray
    identifiers: dict[str, np.ndarray]
    quasi_identifiers: dict[str, np.ndarray]
    schema: Schema
    source: str = "table"

    def __post_init__(self) -> None:
        n = self.features.shape[0]
        expected = {
            "features": (n, len(self.schema.features)),
            "targets": (n, len(self.schema.targets)),
        }
        for name, shape in expected.items():
            array = getattr(self, name)
            if array.shape != shape or array.dtype != np.float32:
                raise ValueError(
                    f"RawTable.{name}: expected float32 {shape}, found {array.dtype} {array.shape}"
                )
        for name, columns in (
            ("identifiers", self.schema.identifiers),
            ("quasi_identifiers", tuple(self.schema.quasi_identifiers)),
        ):
            arrays = getattr(self, name)
            if tuple(arrays) != columns:
                raise ValueError(
                    f"RawTable.{name}: expected columns {list(columns)}, found {list(arrays)}"
                )
            for column, values in arrays.items():
                if values.shape != (n,) or values.dtype.kind != "U":
                    raise ValueError(
                        f"RawTable.{name}[{column!r}]: expected a ({n},) str array, found "
                        f"{values.dtype} {values.shape}"
                    )

    @property
    def n_rows(self) -> int:
        return int(self.features.shape[0])

    def __repr__(self) -> str:
        return (
            f"RawTable(source={self.source!r}, n_rows={self.n_rows}, "
            f"features={list(self.schema.features)}, targets={list(self.schema.targets)}, "
            f"identifiers={list(self.identifiers)}, "
            f"quasi_identifiers={list(self.quasi_identifiers)}; values not shown)"
        )


# ---------------------------------------------------------------------------------------
# Reading a file


def read_table(path: Path, schema: Schema, delimiter: str = ",") -> RawTable:
    """Read a ``.csv`` or ``.parquet`` file into a :class:`RawTable`, validated on the way.

    CSV is read as text only (every field a string; nothing is coerced to a number, a date
    or a missing value behind our back) with the stdlib ``csv`` reader, which gives exact
    line numbers and field counts. Every column of the file must be declared in
    ``schema``: an undeclared column could hold personal data, so it is refused rather
    than carried along or silently ignored. An empty identifier or quasi-identifier value
    is allowed; feature and target values must be finite numbers within float32 range.
    Raises :class:`SourceError` naming the file, column and row.
    """
    path = Path(path)
    if len(delimiter) != 1:
        raise ConfigError(f"data.delimiter: expected one character, found {delimiter!r}")
    try:
        mode = os.stat(path).st_mode  # follows symlinks; a loop is ELOOP, not "not found"
    except FileNotFoundError:
        raise SourceError(
            f"{path}: file not found; expected a {' or '.join(SUFFIXES)} table"
        ) from None
    except OSError as exc:
        raise SourceError(f"{describe(exc)}; expected a {' or '.join(SUFFIXES)} table") from None
    if not stat.S_ISREG(mode):
        # Checked before any open: a FIFO would block it, a device never end.
        raise SourceError(
            f"{path}: expected a {' or '.join(SUFFIXES)} table (a regular file), found "
            f"{file_kind(mode)}"
        )
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise SourceError(
            f"{path}: unsupported file type {suffix or '(no suffix)'!r}; expected "
            f"{' or '.join(SUFFIXES)}"
        )
    if path.stat().st_size == 0:
        raise SourceError(
            f"{path}: the file is empty (0 bytes); expected a header row and at least one data row"
        )
    if suffix == ".csv":
        return _read_csv(path, schema, delimiter)
    return _read_parquet(path, schema)


def _read_csv(path: Path, schema: Schema, delimiter: str) -> RawTable:
    records: list[list[str]] = []
    lines: list[int] = []  # the line where each record starts (a quoted field may span lines)
    end = 0
    try:
        raw = path.read_bytes()
    except OSError as exc:  # no permission, or gone since it was checked
        raise SourceError(f"{describe(exc)}; expected a readable .csv table") from None
    try:
        # Decoded whole, not through a reader: a decoder reading ahead by blocks fails at
        # the block that holds the bad byte, lines before it; the byte's offset is exact.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SourceError(f"{path}: line {line}: not UTF-8 text; save the file as UTF-8") from None
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        for record in reader:
            start, end = end + 1, reader.line_num
            if not record or (len(record) == 1 and not record[0].strip()):
                continue  # a blank line separates nothing: skip it, as spreadsheets do
            records.append(record)
            lines.append(start)
    except csv.Error as exc:
        # csv's messages describe the quoting problem, never the field's content.
        raise SourceError(f"{path}: line {end + 1}: malformed CSV ({exc})") from None
    if not records:
        raise SourceError(
            f"{path}: no header row: the file holds only blank lines; expected a header row "
            "and at least one data row"
        )
    header, rows, row_lines = records[0], records[1:], lines[1:]
    _check_header(path, header, schema, delimiter)
    if not rows:
        raise SourceError(f"{path}: has a header but no data rows; expected at least one row")
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise SourceError(
                f"{path}: row {i + 1} (line {row_lines[i]}) has {len(row)} fields, the header "
                f"has {len(header)}; check the quoting and data.delimiter ({delimiter!r})"
            )
    position = {name: j for j, name in enumerate(header)}

    def texts(column: str) -> np.ndarray:
        j = position[column]
        return np.asarray([row[j] for row in rows], dtype=np.str_)

    def where(column: str, i: int) -> str:
        return f"{path}: column {column!r}, row {i + 1} (line {row_lines[i]})"

    return RawTable(
        features=_numeric_block(schema.features, texts, where),
        targets=_numeric_block(schema.targets, texts, where),
        identifiers={c: texts(c) for c in schema.identifiers},
        quasi_identifiers={c: texts(c) for c in schema.quasi_identifiers},
        schema=schema,
        source=str(path),
    )


def _read_parquet(path: Path, schema: Schema) -> RawTable:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path}: not a readable Parquet file ({exc})") from None
    header = list(table.column_names)
    _check_header(path, header, schema, delimiter=None)
    if table.num_rows == 0:
        raise SourceError(f"{path}: has columns but no data rows; expected at least one row")

    def where(column: str, i: int) -> str:
        return f"{path}: column {column!r}, row {i + 1}"

    def numeric(column: str) -> np.ndarray:
        data = table.column(column)
        kind = data.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            # Numbers stored as text: parse them exactly as CSV fields are parsed.
            return _parse_floats(column, _arrow_texts(data), where)
        if not (
            pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
        ):
            raise SourceError(
                f"{path}: column {column!r}: expected a numeric column, found type {kind}"
            )
        empty = data.is_null().to_numpy(zero_copy_only=False)
        # safe=False: a huge int64 becomes the nearest float64 (float32 is coarser anyway).
        values = data.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        unparsable = np.zeros_like(empty)
        return checked_float32(column, values, empty, unparsable, None, where)

    def block(columns: Sequence[str]) -> np.ndarray:
        return np.stack([numeric(c) for c in columns], axis=1)

    return RawTable(
        features=block(schema.features),
        targets=block(schema.targets),
        identifiers={c: _arrow_texts(table.column(c)) for c in schema.identifiers},
        quasi_identifiers={c: _arrow_texts(table.column(c)) for c in schema.quasi_identifiers},
        schema=schema,
        source=str(path),
    )


def _arrow_texts(data) -> np.ndarray:
    """A Parquet column as (n_rows,) str: null -> "", dates as ISO text, bytes as UTF-8."""

    def text(value: object) -> str:
        if value is None:
            return ""
        if isinstance(value, dt.date):  # datetime too: ISO, like a CSV would hold
            return value.isoformat()
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        return str(value)

    return np.asarray([text(v) for v in data.to_pylist()], dtype=np.str_)


def _check_header(path: Path, header: list[str], schema: Schema, delimiter: str | None) -> None:
    """Every schema column present exactly once, and nothing undeclared.

    Column names are safe to show once the header is known to be one. If no schema
    column matches, the "header" may well be the first data row of a file without a
    header, so its entries are not shown.
    """
    required = schema.columns
    if delimiter is not None and len(header) == 1 and len(required) > 1:
        counts = {d: header[0].count(d) for d in _DELIMITER_NAMES if d != delimiter}
        guess = max(counts, key=counts.__getitem__)
        if counts[guess]:
            configured = repr(delimiter)
            if delimiter in _DELIMITER_NAMES:
                configured += f" ({_DELIMITER_NAMES[delimiter]})"
            raise SourceError(
                f"{path}: the header is a single column but the schema has {len(required)} "
                f"columns; the file seems to use {guess!r} ({_DELIMITER_NAMES[guess]}) as its "
                f"delimiter, and data.delimiter is {configured}: set data.delimiter to {guess!r}"
            )
    found = Counter(header)
    if not set(found) & set(required):
        raise SourceError(
            f"{path}: none of the schema's columns ({', '.join(required)}) is in the first "
            "row; does the file lack a header row? (the first row is not shown: without a "
            "header it would be personal data)"
        )
    for column, count in found.items():
        if count > 1:
            at = [str(j + 1) for j, name in enumerate(header) if name == column]
            raise SourceError(
                f"{path}: column {column!r} appears {count} times in the header (positions "
                f"{', '.join(at)}); each column must be named once"
            )
    missing = [c for c in required if c not in found]
    if missing:
        described = ", ".join(f"{c!r} ({schema.role_of(c)})" for c in missing)
        raise SourceError(
            f"{path}: missing column{'s' if len(missing) > 1 else ''} {described}; columns "
            f"found: {', '.join(repr(c) for c in header)}"
        )
    declared = set(required)
    unknown = [(j, c) for j, c in enumerate(header) if c not in declared]
    if unknown:
        described = ", ".join(f"{c!r} (position {j + 1})" for j, c in unknown)
        raise SourceError(
            f"{path}: column{'s' if len(unknown) > 1 else ''} {described} "
            f"{'are' if len(unknown) > 1 else 'is'} not declared in the schema; an "
            "undeclared column could hold personal data, so it is refused: declare it as "
            "an identifier (data.identifiers), a quasi-identifier (data.quasi_identifiers), "
            "a feature (data.features) or a target (data.targets), or remove it from the file"
        )


# ---------------------------------------------------------------------------------------
# Numbers


def _numeric_block(
    columns: Sequence[str],
    texts: Callable[[str], np.ndarray],
    where: Callable[[str, int], str],
) -> np.ndarray:
    """(n_rows, len(columns)) float32, columns in the given (schema) order."""
    return np.stack([_parse_floats(c, texts(c), where) for c in columns], axis=1)


def _parse_floats(column: str, texts: np.ndarray, where: Callable[[str, int], str]) -> np.ndarray:
    """(n_rows,) str -> (n_rows,) float32; the first bad row raises SourceError."""
    n = texts.shape[0]
    unparsable = np.zeros(n, dtype=bool)
    try:
        values = texts.astype(np.float64)
    except ValueError:
        # Slow path only when something is wrong: find every row that does not parse.
        values = np.full(n, np.nan)
        for i, text in enumerate(texts.tolist()):
            try:
                values[i] = float(text)
            except ValueError:
                unparsable[i] = True
    empty = np.char.str_len(np.char.strip(texts)) == 0
    return checked_float32(column, values, empty, unparsable & ~empty, texts, where)


def checked_float32(
    column: str,
    values: np.ndarray,
    empty: np.ndarray,
    unparsable: np.ndarray,
    texts: np.ndarray | None,
    where: Callable[[str, int], str],
) -> np.ndarray:
    """float64 values -> float32, refusing empty, unparsable, non-finite and out-of-range.

    Every forward path refuses non-finite input, so a nan/inf in the source is an error
    here, where its row can still be named, not later in a batch. ``texts`` are the cells
    ``values`` were parsed from (None for a numeric Parquet column); the message describes
    a bad cell by its length, never by its value.
    """
    with np.errstate(over="ignore"):  # overflow is reported below, by row
        out = values.astype(np.float32)
    parsed = ~(empty | unparsable)
    non_finite = parsed & ~np.isfinite(values)
    overflow = parsed & np.isfinite(values) & ~np.isfinite(out)
    bad = empty | unparsable | non_finite | overflow
    if not bad.any():
        return out
    i = int(np.argmax(bad))
    if empty[i]:
        problem = "expected a number, found an empty value"
    elif unparsable[i]:
        text = str(texts[i]) if texts is not None else ""
        problem = f"expected a number, found a non-numeric value of {len(text)} characters"
        if _DECIMAL_COMMA.fullmatch(text.strip()):
            problem += " (it looks like a decimal comma: write numbers with a decimal point)"
    elif non_finite[i]:
        kind = "NaN" if np.isnan(values[i]) else "an infinite value"
        problem = f"expected a finite number, found {kind}"
    else:
        problem = "expected a number within float32 range (about ±3.4e38), found one beyond it"
    more = int(bad.sum()) - 1
    tail = f" ({more} more bad value{'s' if more > 1 else ''} in this column)" if more else ""
    raise SourceError(f"{where(column, i)}: {problem}{tail}")
