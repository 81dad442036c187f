"""The field types and patterns every section of the config shares, and the strict base
model each section is (an unknown key, a wrong type or a non-finite float is refused)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]

# The largest seed: jax.random.key keeps 32 bits of a seed with 64-bit mode off (2**32
# makes the same key as 0), and a seed past 2**63 overflows its conversion.
MAX_SEED = 2**32 - 1


def _seed_in_range(seed: int) -> int:
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(
            f"expected an integer from 0 to {MAX_SEED} (2**32 - 1: jax.random.key keeps 32 "
            "bits of a seed, a larger one makes a smaller one's key)"
        )
    return seed


Seed = Annotated[int, AfterValidator(_seed_in_range)]


class Strict(BaseModel):
    """The base of every config section: validated strictly, and frozen."""

    # strict: "32" is not silently turned into 32; forbid: typos are errors, not ignored;
    # allow_inf_nan off: every float (tolerances first) is finite, so rtol=inf is refused
    # here rather than making every comparison fail with a NaN bound.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# A registered model's name as vmapcheck.tracking.registry writes it into models:/ URIs (MLflow
# forbids '/' and ':' in names; '@' would read as an alias).
REGISTERED_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
# models:/<name>/<version> (pinned) or models:/<name>@<alias>.
MODELS_URI_PATTERN = (
    r"^models:/[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}(/[1-9][0-9]{0,9}|@[A-Za-z][A-Za-z0-9_\-]{0,63})$"
)
