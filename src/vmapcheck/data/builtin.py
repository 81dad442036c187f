"""Raw tables that need no user file: the synthetic table generated from a key, and the
diabetes table scikit-learn ships inside its package (nothing is downloaded).

Both return a :class:`vmapcheck.data.sources.RawTable` under a
:class:`vmapcheck.data.sources.Schema`, like a user's CSV or Parquet file.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.errors import ConfigError, SourceError
from vmapcheck.io import atomic_path

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

# A bad feature/target value is shown, but cut short: a whole line glued into one field
# by a quoting error should not flood the message.
_SHOW_CHARS = 40
from vmapcheck.data.sources import ROLE_KEYS, RawTable, Schema, _checked_float32, read_table


# ---------------------------------------------------------------------------------------
# Synthetic source

SYNTHETIC_IDENTIFIERS = ("id", "name", "email", "phone")
SYNTHETIC_QUASI = ("birth_date", "postcode")

# The named draws of synthetic_raw_table, one subkey each from a single split. The tuple
# is fixed: its length decides every subkey, so changing it changes every generated table.
SYNTHETIC_DRAWS = (
    "features",
    "mix",
    "head",
    "noise",
    "id",
    "first_name",
    "last_name",
    "email_domain",
    "phone",
    "birth_date",
    "postcode",
)

FIRST_NAMES = (
    "Anna", "Ben", "Chloe", "David", "Elif", "Farid", "Grace", "Hugo",
    "Ines", "Jonas", "Keiko", "Liam", "Maya", "Noah", "Olga", "Pavel",
)  # fmt: skip
LAST_NAMES = (
    "Adams", "Berger", "Costa", "Dubois", "Evans", "Fischer", "Garcia", "Hansen",
    "Ito", "Jensen", "Kowalski", "Larsen", "Moreau", "Novak", "Okafor", "Petrov",
)  # fmt: skip
# Reserved for documentation (RFC 2606): a generated address can never reach anyone.
EMAIL_DOMAINS = ("example.com", "example.org", "example.net")
BIRTH_FIRST = dt.date(1940, 1, 1)
BIRTH_LAST = dt.date(2005, 12, 31)


def synthetic_schema(n_features: int, n_targets: int, quasi_policy: dict[str, str]) -> Schema:
    """The synthetic table's schema: features "x0".."x{n-1}", targets "y0".."y{t-1}".

    ``quasi_policy`` gives the generalization policy of each of :data:`SYNTHETIC_QUASI`
    (exactly those columns; the policy names are checked by anonymize).
    """
    unknown = [c for c in quasi_policy if c not in SYNTHETIC_QUASI]
    missing = [c for c in SYNTHETIC_QUASI if c not in quasi_policy]
    if unknown or missing:
        found = "; ".join(
            f"{what} {', '.join(map(repr, cols))}"
            for what, cols in (("unknown", unknown), ("missing", missing))
            if cols
        )
        raise ConfigError(
            f"data.quasi_identifiers: the synthetic source has the quasi-identifier columns "
            f"{', '.join(SYNTHETIC_QUASI)} and needs one policy for each; {found}"
        )
    return Schema(
        identifiers=SYNTHETIC_IDENTIFIERS,
        quasi_identifiers={c: quasi_policy[c] for c in SYNTHETIC_QUASI},
        features=tuple(f"x{j}" for j in range(n_features)),
        targets=tuple(f"y{j}" for j in range(n_targets)),
    )


def synthetic_raw_table(
    key: jax.Array,
    n_rows: int,
    n_features: int,
    n_targets: int,
    noise_std: float,
    quasi_policy: dict[str, str],
) -> RawTable:
    """A raw table shaped like a real customer table, generated from ``key`` alone.

    Numbers: X ~ N(0, 1) (n_rows, n_features) float32 and
    ``targets = tanh(X @ A) @ B + noise_std * N(0, 1)`` with A (f, 2f) / sqrt(f) and
    B (2f, t) / sqrt(2f), all N(0, 1) draws. Personal-looking columns: unique ascending
    ids "C0000123", names from small first/last-name lists, emails derived from them (at
    reserved example domains), fictional +1-xxx-555-xxxx phone numbers, ISO birth dates in
    1940..2005 and 5-digit postcodes. ``key`` is split once into :data:`SYNTHETIC_DRAWS`;
    each subkey is used exactly once.
    """
    schema = synthetic_schema(n_features, n_targets, quasi_policy)
    keys = dict(zip(SYNTHETIC_DRAWS, jax.random.split(key, len(SYNTHETIC_DRAWS)), strict=True))
    n, f, t = n_rows, n_features, n_targets
    f32 = jnp.float32
    features = jax.random.normal(keys["features"], (n, f), dtype=f32)
    mix = jax.random.normal(keys["mix"], (f, 2 * f), dtype=f32) / jnp.sqrt(f)
    head = jax.random.normal(keys["head"], (2 * f, t), dtype=f32) / jnp.sqrt(2 * f)
    noise = noise_std * jax.random.normal(keys["noise"], (n, t), dtype=f32)
    targets = jnp.tanh(features @ mix) @ head + noise

    def ints(name: str, low: int, high: int) -> list[int]:
        return np.asarray(jax.random.randint(keys[name], (n,), low, high)).tolist()

    # Ids: ascending with random gaps, so they are unique and look like a real register.
    numbers = (100 + np.cumsum(ints("id", 1, 20), dtype=np.int64)).tolist()
    width = max(7, len(str(numbers[-1]))) if numbers else 7
    first = [FIRST_NAMES[i] for i in ints("first_name", 0, len(FIRST_NAMES))]
    last = [LAST_NAMES[i] for i in ints("last_name", 0, len(LAST_NAMES))]
    domains = [EMAIL_DOMAINS[i] for i in ints("email_domain", 0, len(EMAIL_DOMAINS))]
    phones = [divmod(v, 10_000) for v in ints("phone", 0, 800 * 10_000)]
    days = (BIRTH_LAST - BIRTH_FIRST).days + 1
    offsets = np.asarray(ints("birth_date", 0, days), dtype="timedelta64[D]")
    births = (np.datetime64(BIRTH_FIRST.isoformat(), "D") + offsets).astype(np.str_)
    postcodes = [f"{v:05d}" for v in ints("postcode", 1000, 100_000)]

    def strs(values: Sequence[str]) -> np.ndarray:
        return np.asarray(values, dtype=np.str_).reshape(n)

    identifiers = {
        "id": strs([f"C{v:0{width}d}" for v in numbers]),
        "name": strs([f"{a} {b}" for a, b in zip(first, last, strict=True)]),
        "email": strs(
            [
                f"{a.lower()}.{b.lower()}{v % 1000}@{d}"
                for a, b, v, d in zip(first, last, numbers, domains, strict=True)
            ]
        ),
        "phone": strs([f"+1-{200 + area}-555-{line:04d}" for area, line in phones]),
    }
    return RawTable(
        features=np.asarray(features),
        targets=np.asarray(targets),
        identifiers=identifiers,
        quasi_identifiers={"birth_date": strs(births.tolist()), "postcode": strs(postcodes)},
        schema=schema,
        source="synthetic",
    )


def write_csv(path: Path, raw: RawTable, delimiter: str = ",") -> None:
    """Write ``raw`` as CSV (atomically): identifiers, quasi-identifiers, features, targets.

    Floats are written as the shortest text that reads back to the same float32, so
    :func:`read_table` returns identical arrays. The file holds raw personal values: it is
    for tests and for the shipped example file of synthetic (fictional) people only.
    """
    schema = raw.schema
    columns = [raw.identifiers[c] for c in schema.identifiers]
    columns += [raw.quasi_identifiers[c] for c in schema.quasi_identifiers]
    columns += [raw.features[:, j].astype(np.str_) for j in range(raw.features.shape[1])]
    columns += [raw.targets[:, j].astype(np.str_) for j in range(raw.targets.shape[1])]
    with atomic_path(Path(path)) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter=delimiter, lineterminator="\n")
        writer.writerow(schema.columns)
        writer.writerows(zip(*(c.tolist() for c in columns), strict=True))


# ---------------------------------------------------------------------------------------
# The diabetes table that scikit-learn ships

DIABETES_SOURCE = "sklearn.datasets.load_diabetes(scaled=False)"
# The ten baseline variables in scikit-learn's order, then the target, which scikit-learn
# leaves unnamed: a quantitative measure of disease progression one year after baseline.
DIABETES_BASELINE = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
DIABETES_TARGET = "progression"
DIABETES_COLUMNS = (*DIABETES_BASELINE, DIABETES_TARGET)
DIABETES_ROWS = 442


def diabetes_schema(
    quasi_policy: dict[str, str], features: Sequence[str], targets: Sequence[str]
) -> Schema:
    """The diabetes table's columns in their configured roles; every column exactly once.

    The table has no identifier column (one row per patient, no id). Like
    :func:`read_table` with an undeclared CSV column, a column of the table that no role
    names is refused, and so is a name that is not one of its columns: raises
    :class:`ConfigError` naming the key, what was expected and what was found.
    """
    schema = Schema(
        identifiers=(),
        quasi_identifiers=quasi_policy,
        features=tuple(features),
        targets=tuple(targets),
    )  # refuses a column named twice and an empty list of features or targets
    for role in ("quasi-identifier", "feature", "target"):
        unknown = [c for c in schema.columns_of(role) if c not in DIABETES_COLUMNS]
        if unknown:
            raise ConfigError(
                f"{ROLE_KEYS[role]}: expected columns of the diabetes table "
                f"({', '.join(DIABETES_COLUMNS)}), found {', '.join(map(repr, unknown))}"
            )
    missing = [c for c in DIABETES_COLUMNS if c not in schema.columns]
    if missing:
        raise ConfigError(
            "data.quasi_identifiers, data.features, data.targets: expected every column of "
            f"the diabetes table ({', '.join(DIABETES_COLUMNS)}) in one of them, found "
            f"{', '.join(map(repr, missing))} in none; declare each column (a "
            "quasi-identifier with policy 'drop' is removed)"
        )
    return schema


def diabetes_raw_table(schema: Schema) -> RawTable:
    """scikit-learn's diabetes table, unscaled, with columns in ``schema``'s roles.

    442 rows, one per patient: age (years), sex (coded 1 or 2), bmi, bp (average blood
    pressure), six blood serum measurements s1..s6, and ``progression``, the target.
    ``schema`` comes from :func:`diabetes_schema`. The table ships inside the installed
    scikit-learn package: nothing is downloaded. Quasi-identifier values become text, as
    a file would hold them: a whole number without a fraction ("59"), any other number as
    Python writes it. Raises :class:`SourceError` if the installed package holds another
    table (other columns or another number of rows).
    """
    from sklearn.datasets import load_diabetes  # a slow import that only this source needs

    bunch = load_diabetes(scaled=False)
    data = np.asarray(bunch.data, dtype=np.float64)  # (442, 10)
    target = np.asarray(bunch.target, dtype=np.float64)  # (442,)
    names = tuple(bunch.feature_names)
    if (
        names != DIABETES_BASELINE
        or data.shape != (DIABETES_ROWS, len(DIABETES_BASELINE))
        or target.shape != (DIABETES_ROWS,)
    ):
        raise SourceError(
            f"{DIABETES_SOURCE}: expected {DIABETES_ROWS} rows of the columns "
            f"{', '.join(DIABETES_BASELINE)} and one target per row, found the columns "
            f"{', '.join(names)}, data of shape {data.shape} and targets of shape "
            f"{target.shape}: the installed scikit-learn ships another table"
        )
    values = {**dict(zip(DIABETES_BASELINE, data.T, strict=True)), DIABETES_TARGET: target}

    def where(column: str, i: int) -> str:
        return f"{DIABETES_SOURCE}: column {column!r}, row {i + 1}"

    def numeric(column: str) -> np.ndarray:
        column_values = values[column]
        never = np.zeros(column_values.shape, dtype=bool)
        return _checked_float32(
            column, column_values, never, never, lambda i: repr(float(column_values[i])), where
        )

    def block(columns: Sequence[str]) -> np.ndarray:
        return np.stack([numeric(c) for c in columns], axis=1)

    def texts(column: str) -> np.ndarray:
        return np.asarray(
            [str(int(v)) if v.is_integer() else repr(v) for v in values[column].tolist()],
            dtype=np.str_,
        )

    return RawTable(
        features=block(schema.features),
        targets=block(schema.targets),
        identifiers={},
        quasi_identifiers={c: texts(c) for c in schema.quasi_identifiers},
        schema=schema,
        source=DIABETES_SOURCE,
    )
