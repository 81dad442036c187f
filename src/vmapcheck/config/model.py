"""Config group ``model``: which network, its widths, and its input leaves."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from vmapcheck.config.fields import PositiveInt, Strict

BUILTIN_MODELS = ("toy", "mlp")


class LeafConfig(Strict):
    """One input leaf of a model whose example is a dict of leaves (model.inputs.<leaf>):
    its per-example shape, dtype ("float": the run's precision; "int32" ids in
    [0, vocab); "bool" a mask) and meaning (vmapcheck.core.contract.Leaf)."""

    shape: Annotated[list[PositiveInt], Field(min_length=1)]
    dtype: Literal["float", "int32", "bool"]
    vocab: PositiveInt | None = None
    meaning: str = ""

    @model_validator(mode="after")
    def _ids_have_a_vocab(self) -> LeafConfig:
        if (self.dtype == "int32") != (self.vocab is not None):
            raise ValueError(
                "expected vocab (ids are in [0, vocab)) exactly for an int32 leaf, found "
                f"dtype {self.dtype} with vocab {self.vocab}"
            )
        return self

    @property
    def size(self) -> int:
        """The table columns the leaf takes: the product of its shape."""
        size = 1
        for n in self.shape:
            size *= n
        return size


class ModelConfig(Strict):
    """Which model, and its layer widths. ``toy`` is the seed's fixed 3 -> 2 model.

    Any other name is a user's model: ``factory`` is a Hydra ``_target_`` (with its
    keyword arguments) returning a :class:`vmapcheck.core.models.Model`. ``hidden`` (the
    hidden layer widths) is read by the built-in ``mlp`` only, which requires it; a
    user's model may leave it out (its factory gets whatever its own keys pass).
    """

    name: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    in_features: PositiveInt
    # validate_default: a missing hidden is checked too (required for mlp).
    hidden: Annotated[list[PositiveInt] | None, Field(validate_default=True)] = None
    out_features: PositiveInt
    factory: dict[str, Any] | None = None
    # None: one example is a flat float vector (in_features,). Else a dict of leaves, in
    # this order, taking in_features table columns together.
    inputs: dict[str, LeafConfig] | None = None

    @model_validator(mode="after")
    def _inputs_take_the_features(self) -> ModelConfig:
        if self.inputs is None:
            return self
        if self.name in BUILTIN_MODELS:
            raise ValueError(f"model {self.name!r} takes a flat vector: model.inputs must be null")
        if not self.inputs:
            raise ValueError("expected at least one leaf in model.inputs, found none")
        sizes = {name: leaf.size for name, leaf in self.inputs.items()}
        if sum(sizes.values()) != self.in_features:
            raise ValueError(
                f"model.inputs take {sum(sizes.values())} table columns "
                f"({', '.join(f'{k}: {v}' for k, v in sizes.items())}) but "
                f"model.in_features={self.in_features}: they must be equal"
            )
        return self

    @field_validator("hidden", mode="after")
    @classmethod
    def _mlp_needs_hidden(cls, hidden: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if hidden is None and info.data.get("name") == "mlp":
            raise ValueError(
                "expected the hidden layer widths of the built-in model 'mlp' (a list such "
                "as [32, 32], or [] for none; conf/model/mlp.yaml sets them)"
            )
        return hidden

    @model_validator(mode="after")
    def _factory_for_own_models(self) -> ModelConfig:
        if self.name in BUILTIN_MODELS and self.factory is not None:
            raise ValueError(f"model {self.name!r} is built in: model.factory must be null")
        if self.name not in BUILTIN_MODELS and not (self.factory or {}).get("_target_"):
            raise ValueError(
                f"model {self.name!r} is not built in ({', '.join(BUILTIN_MODELS)}): "
                "model.factory._target_ must name a function returning a vmapcheck Model"
            )
        return self

    @model_validator(mode="after")
    def _toy_is_fixed(self) -> ModelConfig:
        # toy reads no hidden: leaving it out is the same as its fixed [].
        hidden = [] if self.hidden is None else self.hidden
        if self.name == "toy" and (self.in_features, hidden, self.out_features) != (
            3,
            [],
            2,
        ):
            raise ValueError(
                "model 'toy' is the seed's fixed model: expected in_features=3, hidden=[], "
                f"out_features=2, found in_features={self.in_features}, "
                f"hidden={self.hidden}, out_features={self.out_features}"
            )
        return self
