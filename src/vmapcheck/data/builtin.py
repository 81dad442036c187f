"""Raw tables that need no user file: the synthetic table generated from a key, and the
diabetes table and the digits images that scikit-learn ships inside its package (nothing
is downloaded), the latter also as padded token sequences (``digit_tokens``).

Each returns a :class:`vmapcheck.data.sources.RawTable` under a
:class:`vmapcheck.data.sources.Schema`, like a user's CSV or Parquet file.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.data.sources import ROLE_KEYS, RawTable, Schema, checked_float32
from vmapcheck.errors import ConfigError, SourceError
from vmapcheck.io import atomic_path

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
# Tables that scikit-learn ships: every column of the table in exactly one configured role


def _bundled_schema(
    table: str,
    columns: Sequence[str],
    listing: str,
    quasi_policy: dict[str, str],
    features: Sequence[str],
    targets: Sequence[str],
) -> Schema:
    """The columns of the bundled ``table`` in their configured roles; each exactly once.

    ``columns``: the table's columns; ``listing``: how messages list them. Like
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
    known = set(columns)
    for role in ("quasi-identifier", "feature", "target"):
        unknown = [c for c in schema.columns_of(role) if c not in known]
        if unknown:
            raise ConfigError(
                f"{ROLE_KEYS[role]}: expected columns of the {table} table "
                f"({listing}), found {', '.join(map(repr, unknown))}"
            )
    declared = set(schema.columns)
    missing = [c for c in columns if c not in declared]
    if missing:
        raise ConfigError(
            "data.quasi_identifiers, data.features, data.targets: expected every column of "
            f"the {table} table ({listing}) in one of them, found "
            f"{', '.join(map(repr, missing))} in none; declare each column (a "
            "quasi-identifier with policy 'drop' is removed)"
        )
    return schema


def _bundled_raw_table(source: str, values: dict[str, np.ndarray], schema: Schema) -> RawTable:
    """A :class:`RawTable` of ``values`` (column -> float64 (n_rows,)) in ``schema``'s roles.

    Features and targets become float32 (refusing a non-finite or out-of-range value,
    naming its column and row); quasi-identifier values become text, as a file would
    hold them: a whole number without a fraction ("59"), any other number as Python
    writes it.
    """

    def where(column: str, i: int) -> str:
        return f"{source}: column {column!r}, row {i + 1}"

    def numeric(column: str) -> np.ndarray:
        column_values = values[column]
        never = np.zeros(column_values.shape, dtype=bool)
        # Numbers already (no text they were parsed from, as a Parquet column): nothing
        # is empty or unparsable, so only non-finite and out-of-range values are refused.
        return checked_float32(column, column_values, never, never, None, where)

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
        source=source,
    )


# ---------------------------------------------------------------------------------------
# The diabetes table

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

    The table has no identifier column (one row per patient, no id). A column of the
    table that no role names, or a name that is not one of its columns, raises
    :class:`ConfigError` naming the key (:func:`_bundled_schema`).
    """
    return _bundled_schema(
        "diabetes",
        DIABETES_COLUMNS,
        ", ".join(DIABETES_COLUMNS),
        quasi_policy,
        features,
        targets,
    )


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
    return _bundled_raw_table(DIABETES_SOURCE, values, schema)


# ---------------------------------------------------------------------------------------
# The digits images

DIGITS_SOURCE = "sklearn.datasets.load_digits()"
DIGITS_SIDE = 8
DIGITS_CLASSES = 10
DIGITS_ROWS = 1797
# The 64 pixels in scikit-learn's order and names: row-major, pixel_<row>_<column>, each
# an ink count 0..16 (a 4x4 block of the 32x32 scan).
DIGITS_PIXELS = tuple(f"pixel_{r}_{c}" for r in range(DIGITS_SIDE) for c in range(DIGITS_SIDE))
# The label as one indicator column per digit (1.0 for the digit shown, else 0.0): the
# training loss is a mean squared error on targets, so a class is scored, not regressed.
DIGITS_TARGETS = tuple(f"digit_{d}" for d in range(DIGITS_CLASSES))
DIGITS_COLUMNS = (*DIGITS_PIXELS, *DIGITS_TARGETS)
DIGITS_LISTING = (
    f"{DIGITS_PIXELS[0]} .. {DIGITS_PIXELS[-1]}, {DIGITS_TARGETS[0]} .. {DIGITS_TARGETS[-1]}"
)


def digits_schema(
    quasi_policy: dict[str, str], features: Sequence[str], targets: Sequence[str]
) -> Schema:
    """The digits table's columns in their configured roles; every column exactly once.

    The table has no identifier and no quasi-identifier: one row per image, with no id
    of the image or of its writer. A column of the table that no role names, or a name
    that is not one of its columns, raises :class:`ConfigError` naming the key
    (:func:`_bundled_schema`).
    """
    return _bundled_schema(
        "digits", DIGITS_COLUMNS, DIGITS_LISTING, quasi_policy, features, targets
    )


def digits_raw_table(schema: Schema) -> RawTable:
    """scikit-learn's handwritten digits, with columns in ``schema``'s roles.

    1,797 rows, one per 8x8 image: the 64 pixels (:data:`DIGITS_PIXELS`, row-major, ink
    counts 0..16) and the label as ten indicator columns (:data:`DIGITS_TARGETS`).
    ``schema`` comes from :func:`digits_schema`. The images ship inside the installed
    scikit-learn package: nothing is downloaded. Raises :class:`SourceError` if the
    installed package holds another table (other columns, another number of rows, or a
    label outside 0..9).
    """
    from sklearn.datasets import load_digits  # a slow import that only this source needs

    bunch = load_digits()
    data = np.asarray(bunch.data, dtype=np.float64)  # (1797, 64)
    target = np.asarray(bunch.target)  # (1797,) int
    names = tuple(bunch.feature_names)
    if (
        names != DIGITS_PIXELS
        or data.shape != (DIGITS_ROWS, len(DIGITS_PIXELS))
        or target.shape != (DIGITS_ROWS,)
        or not np.isin(target, np.arange(DIGITS_CLASSES)).all()
    ):
        raise SourceError(
            f"{DIGITS_SOURCE}: expected {DIGITS_ROWS} rows of the columns {DIGITS_PIXELS[0]} "
            f".. {DIGITS_PIXELS[-1]} and one label 0..{DIGITS_CLASSES - 1} per row, found "
            f"{len(names)} columns ({', '.join(names[:2])}, ...), data of shape {data.shape} "
            f"and labels of shape {target.shape}: the installed scikit-learn ships another "
            "table"
        )
    onehot = (target[:, None] == np.arange(DIGITS_CLASSES)[None, :]).astype(np.float64)
    values = {
        **dict(zip(DIGITS_PIXELS, data.T, strict=True)),
        **dict(zip(DIGITS_TARGETS, onehot.T, strict=True)),
    }
    return _bundled_raw_table(DIGITS_SOURCE, values, schema)


# ---------------------------------------------------------------------------------------
# The digits images as token sequences

# One token per pixel: the sequence is the image's 64 pixels row-major.
DIGIT_TOKENS_LENGTH = DIGITS_SIDE * DIGITS_SIDE
# The ids are the ink counts 0..16.
DIGIT_TOKENS_VOCAB = 17
# Seeds the numpy Generator that draws the crop lengths: fixed, so the table is the same
# on every machine and in every run (the run's seed does not touch it).
DIGIT_TOKENS_CROP_SEED = 0
DIGIT_TOKENS_SOURCE = (
    f"sklearn.datasets.load_digits() as token sequences (crop lengths from "
    f"numpy.random.default_rng({DIGIT_TOKENS_CROP_SEED}))"
)
# Each sequence keeps a length drawn uniformly from [MIN, MAX] (both included).
DIGIT_TOKENS_MIN_LENGTH = 16
DIGIT_TOKENS_MAX_LENGTH = DIGIT_TOKENS_LENGTH
DIGIT_TOKENS_IDS = tuple(f"token_{i}" for i in range(DIGIT_TOKENS_LENGTH))
DIGIT_TOKENS_MASK = tuple(f"mask_{i}" for i in range(DIGIT_TOKENS_LENGTH))
# The model's input order: the 64 ids, then the 64 mask bits (a {"tokens", "mask"} input
# contract takes them in that order).
DIGIT_TOKENS_FEATURES = (*DIGIT_TOKENS_IDS, *DIGIT_TOKENS_MASK)
DIGIT_TOKENS_COLUMNS = (*DIGIT_TOKENS_FEATURES, *DIGITS_TARGETS)
DIGIT_TOKENS_LISTING = (
    f"{DIGIT_TOKENS_IDS[0]} .. {DIGIT_TOKENS_IDS[-1]}, {DIGIT_TOKENS_MASK[0]} .. "
    f"{DIGIT_TOKENS_MASK[-1]}, {DIGITS_TARGETS[0]} .. {DIGITS_TARGETS[-1]}"
)


def digit_tokens_schema(
    quasi_policy: dict[str, str], features: Sequence[str], targets: Sequence[str]
) -> Schema:
    """The digit-token table's columns in their configured roles; every column exactly once.

    Like :func:`digits_schema`: no identifier and no quasi-identifier, and a column of the
    table that no role names, or a name that is not one of its columns, raises
    :class:`ConfigError` naming the key.
    """
    return _bundled_schema(
        "digit_tokens",
        DIGIT_TOKENS_COLUMNS,
        DIGIT_TOKENS_LISTING,
        quasi_policy,
        features,
        targets,
    )


def digit_tokens_crop(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths (n_rows,) int64, mask (n_rows, 64) bool)``: each row's kept length, drawn
    uniformly from ``[DIGIT_TOKENS_MIN_LENGTH, DIGIT_TOKENS_MAX_LENGTH]`` by
    ``numpy.random.default_rng(DIGIT_TOKENS_CROP_SEED)`` (one draw per row, in row order),
    and the mask that is True at the positions ``< length``."""
    rng = np.random.default_rng(DIGIT_TOKENS_CROP_SEED)
    lengths = rng.integers(
        DIGIT_TOKENS_MIN_LENGTH, DIGIT_TOKENS_MAX_LENGTH, size=n_rows, endpoint=True
    )
    mask = np.arange(DIGIT_TOKENS_LENGTH)[None, :] < lengths[:, None]
    return lengths, mask


def digit_tokens_raw_table(schema: Schema) -> RawTable:
    """scikit-learn's handwritten digits as padded token sequences, columns in ``schema``'s
    roles.

    1,797 rows, one per 8x8 image (:func:`digits_raw_table`'s images, in its order). The
    transformation, the same on every machine:

    1. The 64 pixels, row-major, are the sequence; each pixel's ink count 0..16 is its
       token id (vocabulary :data:`DIGIT_TOKENS_VOCAB` = 17).
    2. Each sequence is cropped to a length drawn uniformly from 16..64
       (:func:`digit_tokens_crop`: ``numpy.random.default_rng(0)``, one draw per row in row
       order; the run's seed does not change it): the first ``length`` pixels are kept.
    3. Padded back to 64: a position at or beyond the length gets id 0 and mask 0; a kept
       position keeps its pixel's id and has mask 1 (a kept pixel may itself be 0, blank
       paper: the mask, not the id, says what is padding).

    Columns: ``token_0`` .. ``token_63`` (the ids, as whole numbers), ``mask_0`` ..
    ``mask_63`` (1.0 real, 0.0 padding) and the label as ten indicator columns
    ``digit_0`` .. ``digit_9`` (as :func:`digits_raw_table`). ``schema`` comes from
    :func:`digit_tokens_schema`. No identifier and no quasi-identifier; nothing is
    downloaded. Raises :class:`SourceError` as :func:`digits_raw_table` does.
    """
    digits = digits_raw_table(digits_schema({}, DIGITS_PIXELS, DIGITS_TARGETS))
    pixels = digits.features.astype(np.float64)  # (1797, 64), whole ink counts 0..16
    _, mask = digit_tokens_crop(digits.n_rows)
    tokens = np.where(mask, pixels, 0.0)
    values = {
        **dict(zip(DIGIT_TOKENS_IDS, tokens.T, strict=True)),
        **dict(zip(DIGIT_TOKENS_MASK, mask.astype(np.float64).T, strict=True)),
        **dict(zip(DIGITS_TARGETS, digits.targets.astype(np.float64).T, strict=True)),
    }
    return _bundled_raw_table(DIGIT_TOKENS_SOURCE, values, schema)
