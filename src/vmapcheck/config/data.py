"""Config group ``data``: where the table comes from (``data.source``: synthetic, a file,
a bundled table), its columns' roles, its split and anonymization."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from vmapcheck.config.fields import Fraction, NonNegativeFloat, PositiveInt, Strict


class SplitConfig(Strict):
    train: Fraction
    val: Fraction
    test: Fraction

    @model_validator(mode="after")
    def _sums_to_one(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"split fractions must sum to 1, found {total:g}")
        return self


QuasiPolicy = Literal["drop", "year", "decade", "band10", "prefix1", "prefix2", "prefix3"]


class AnonymizeConfig(Strict):
    """What leaves ``prepare``: identifiers are dropped, except an optional keyed join key."""

    # An identifier column kept as an HMAC-SHA256 pseudonym (null: drop every identifier).
    join_key: str | None
    # Name of the environment variable holding the HMAC secret (never its value).
    secret_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    # An identifier column whose equal values are one record: a record never spans splits.
    group_by: str | None


class _DataCommon(Strict):
    quasi_identifiers: dict[str, QuasiPolicy]
    anonymize: AnonymizeConfig
    split: SplitConfig
    standard_batch: PositiveInt


class SyntheticDataConfig(_DataCommon):
    """A raw table generated from the key stream: identifiers, quasi-identifiers, numbers."""

    source: Literal["synthetic"]
    n_rows: Annotated[int, Field(ge=20)]
    n_features: PositiveInt
    n_targets: PositiveInt
    noise_std: NonNegativeFloat


class _DeclaredColumns(_DataCommon):
    """A table whose feature and target columns are declared by name, in order."""

    features: Annotated[list[str], Field(min_length=1)]
    targets: Annotated[list[str], Field(min_length=1)]

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_targets(self) -> int:
        return len(self.targets)


class FileDataConfig(_DeclaredColumns):
    """The user's table (.csv or .parquet) with a declared schema; every column declared."""

    source: Literal["csv"]
    path: Annotated[str, Field(min_length=1)]
    delimiter: Annotated[str, Field(min_length=1, max_length=1)]
    identifiers: list[str]


class _BundledTableConfig(_DeclaredColumns):
    """A table scikit-learn ships, its columns declared by name (no file, no identifier)."""


class DiabetesDataConfig(_BundledTableConfig):
    """The diabetes table scikit-learn ships (vmapcheck.data.builtin.diabetes_raw_table):
    442 patients, unscaled, no identifier. Every column of it in exactly one role (checked
    by ``prepare`` against the table: vmapcheck.data.builtin.diabetes_schema)."""

    source: Literal["diabetes"]


class DigitsDataConfig(_BundledTableConfig):
    """The handwritten digits scikit-learn ships (vmapcheck.data.builtin.digits_raw_table):
    1,797 8x8 images, 64 pixel columns and the label as ten indicator columns; no
    identifier or quasi-identifier. Every column of it in exactly one role (checked by
    ``prepare`` against the table: vmapcheck.data.builtin.digits_schema)."""

    source: Literal["digits"]


class DigitTokensDataConfig(_BundledTableConfig):
    """The same digits as token sequences (vmapcheck.data.builtin.digit_tokens_raw_table):
    each image's 64 pixels row-major are ids 0..16, cropped to a length drawn from a
    fixed-seed generator and padded (id 0, mask 0); 64 id columns, 64 mask columns and the
    label as ten indicator columns; no identifier or quasi-identifier. Every column of it
    in exactly one role (checked by ``prepare`` against the table:
    vmapcheck.data.builtin.digit_tokens_schema)."""

    source: Literal["digit_tokens"]


DataConfig = Annotated[
    SyntheticDataConfig
    | FileDataConfig
    | DiabetesDataConfig
    | DigitsDataConfig
    | DigitTokensDataConfig,
    Field(discriminator="source"),
]
