"""The served model's HTTP requests, read by vmapcheck before MLflow's scoring server parses
them: named columns taken by name, and a body of the wrong size, type or shape refused early
in vmapcheck's words (never with a stack trace, never echoing a value).

Why here: MLflow's scoring server (``mlflow.pyfunc.scoring_server.invocations``) turns a
``dataframe_split`` or ``dataframe_records`` body into a DataFrame and then, for a tensor
signature such as the verified model's, into a numpy array by column position, before the
pyfunc's ``predict`` runs: the names are gone by then, so a body with its columns in
another order got HTTP 200 with a wrong prediction. It also parsed a 50 MB body before any
limit (a ``RecursionError`` on ``[[[...``: HTTP 500 with no reason) and answered a CSV
parse failure with its stack trace. :func:`install` wraps ``invocations`` in the process
that loads a :class:`~vmapcheck.tracking.serving.VerifiedModel`; a request to any other
model goes to MLflow's function unchanged.

:func:`normalize` is the whole rule, testable without a server: it takes the raw body
and its content type and returns ``{"inputs": ...}`` in the contract's order (batch axis 0),
or raises :class:`BodyRefused` with an HTTP status.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vmapcheck.errors import did_you_mean

# The body formats of MLflow's scoring protocol (``mlflow.pyfunc.scoring_server``).
INPUTS, INSTANCES, SPLIT, RECORDS = "inputs", "instances", "dataframe_split", "dataframe_records"
FORMATS = (INPUTS, INSTANCES, SPLIT, RECORDS)
JSON_TYPE = "application/json"
# JSON characters one element may take in a body: a float32 or float64 written by
# json.dumps is at most 24 ("-1.2345678901234567e-308"), plus separators, indentation of a
# pretty-printed body, and the column name each element repeats in dataframe_records.
CHARS_PER_ELEMENT = 64
# A JSON integer larger than this is no float of any width (float64's largest).
_LARGEST_FLOAT = sys.float_info.max
# Room for the body's braces, keys and ``columns`` list, whatever the batch.
BODY_OVERHEAD = 4096


class BodyRefused(Exception):
    """A request body refused before MLflow parses it: ``status`` is the HTTP status,
    ``reason`` a short category (``body_too_large``, ``content_type``, ``not_json``,
    ``format``, ``columns``, ``row_shape``, ``dtype``)."""

    def __init__(self, message: str, reason: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.reason, self.status = message, reason, status

    def as_json(self) -> str:
        code = "INVALID_PARAMETER_VALUE"
        return json.dumps({"error_code": code, "message": self.message, "reason": self.reason})


@dataclass(frozen=True)
class BodyRule:
    """What a request body must hold, from the model's contract.

    ``features``: a flat-vector model's feature names in the contract's order (one row of
    the request is one value per feature); ``leaves``: a model whose example is a dict of
    leaves, ``{leaf name: number of values per row}``. ``max_batch``: the guard's row limit.
    """

    features: tuple[str, ...] | None
    leaves: Mapping[str, int] | None
    max_batch: int

    @property
    def names(self) -> tuple[str, ...]:
        return self.features if self.features is not None else tuple(self.leaves or {})

    @property
    def max_body_bytes(self) -> int:
        """The largest body a request of ``max_batch`` rows can need (see CHARS_PER_ELEMENT)."""
        per_row = sum((self.leaves or {}).values()) if self.features is None else len(self.names)
        longest = max((len(n) for n in self.names), default=0)
        return self.max_batch * per_row * (CHARS_PER_ELEMENT + longest) + BODY_OVERHEAD


def normalize(data: bytes | str, content_type: str | None, rule: BodyRule) -> dict[str, Any]:
    """The body as ``{"inputs": ...}`` for MLflow's parser: for a flat model a list of rows
    ``(batch, n_features)`` in the contract's feature order; for a dict-of-leaves model
    ``{leaf: rows}``. Named columns (``dataframe_split`` with ``columns``,
    ``dataframe_records``, an ``inputs`` dict) are taken by name; unnamed ones by position.

    Raises:
        BodyRefused: the body is larger than any allowed request (413), not JSON (415 for
            another content type, 400 for a malformed body), not one of MLflow's formats, or
            its names or row lengths do not match the contract (400). The message names the
            limit, key, column or row, never a value.
    """
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime != JSON_TYPE:
        raise BodyRefused(
            f"request refused: Content-Type {mime or '(none)'!r}: the verified model takes "
            f"{JSON_TYPE} with one of the keys {', '.join(FORMATS)}",
            "content_type",
            415,
        )
    limit = rule.max_body_bytes
    if len(data) > limit:
        raise BodyRefused(
            f"request refused: the body has {len(data)} bytes, more than any request of at "
            f"most guard.max_batch={rule.max_batch} rows needs ({limit} bytes)",
            "body_too_large",
            413,
        )
    try:
        body = json.loads(data)
    except json.JSONDecodeError as exc:
        raise BodyRefused(
            f"request refused: the body is not JSON: {exc.msg} at line {exc.lineno} column "
            f"{exc.colno}",
            "not_json",
        ) from None
    except UnicodeDecodeError as exc:
        raise BodyRefused(
            f"request refused: the body is not UTF-8 (byte {exc.start})", "not_json"
        ) from None
    except RecursionError:
        raise BodyRefused(
            "request refused: the body's JSON nests too deep (a request is at most a list of "
            "rows of numbers)",
            "not_json",
        ) from None
    if not isinstance(body, dict):
        raise BodyRefused(
            f"request refused: the body is a JSON {type(body).__name__}, expected an object "
            f"with one of the keys {', '.join(FORMATS)}",
            "format",
        )
    found = [key for key in FORMATS if key in body]
    if len(found) != 1:
        raise BodyRefused(
            f"request refused: the body has the keys {sorted(body)}, expected exactly one of "
            f"{', '.join(FORMATS)}",
            "format",
        )
    key = found[0]
    value = body[key]
    if rule.features is not None:
        return {INPUTS: _flat_rows(key, value, rule.features)}
    return {INPUTS: _leaf_columns(key, value, tuple(rule.leaves or {}))}


def _check_names(key: str, given: Sequence[Any], expected: tuple[str, ...]) -> None:
    """Refuse names that are not exactly the contract's (each once)."""
    given_names = [str(name) for name in given]
    missing = [n for n in expected if n not in given_names]
    unknown = [n for n in given_names if n not in expected]
    repeated = sorted({n for n in given_names if given_names.count(n) > 1})
    if missing or unknown or repeated:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            hint = did_you_mean(unknown[0], missing or expected)
            parts.append(f"unknown {unknown}{hint}")
        if repeated:
            parts.append(f"repeated {repeated}")
        raise BodyRefused(
            f"request refused: {key}: the names do not match the model's ({'; '.join(parts)}); "
            f"expected {list(expected)}, in any order",
            "columns",
        )


def _flat_rows(key: str, value: Any, features: tuple[str, ...]) -> list[list[Any]]:
    """Rows ``(batch, len(features))`` in the contract's order."""
    if key == SPLIT:
        if not isinstance(value, dict) or not isinstance(value.get("data"), list):
            raise BodyRefused(
                f"request refused: {SPLIT} must be an object with a 'data' list of rows "
                "(and 'columns', the feature names)",
                "format",
            )
        rows = value["data"]
        columns = value.get("columns")
        if columns is not None:
            if not isinstance(columns, list):
                raise BodyRefused(
                    f"request refused: {SPLIT}.columns must be a list of names", "format"
                )
            _check_names(f"{SPLIT}.columns", columns, features)
            order = [[str(c) for c in columns].index(name) for name in features]
            _check_rows(f"{SPLIT}.data", rows, len(features))
            return [[row[i] for i in order] for row in rows]
        _check_rows(f"{SPLIT}.data", rows, len(features))
        return rows
    if key == RECORDS or (isinstance(value, list) and value and isinstance(value[0], dict)):
        if not isinstance(value, list):
            raise BodyRefused(f"request refused: {key} must be a list of records", "format")
        rows = []
        for i, record in enumerate(value):
            if not isinstance(record, dict):
                raise BodyRefused(
                    f"request refused: {key}[{i}] is a {type(record).__name__}, expected an "
                    "object keyed by feature name",
                    "format",
                )
            _check_names(f"{key}[{i}]", list(record), features)
            rows.append([record[name] for name in features])
        _check_rows(key, rows, len(features))
        return rows
    if isinstance(value, dict):
        # {"inputs": {"x0": [...], "x1": [...]}}: columns by name.
        _check_names(key, list(value), features)
        columns = [value[name] for name in features]
        if not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1:
            raise BodyRefused(
                f"request refused: {key}: each feature must be a list of the same length "
                "(one value per row)",
                "row_shape",
            )
        rows = [list(row) for row in zip(*columns, strict=True)]
        _check_rows(key, rows, len(features))
        return rows
    _check_rows(key, value, len(features))
    return value


def _check_rows(key: str, rows: Any, width: int) -> None:
    """Refuse anything but a non-empty list of ``width`` numbers per row."""
    if not isinstance(rows, list) or not rows:
        found = "an empty list" if isinstance(rows, list) else f"a {type(rows).__name__}"
        raise BodyRefused(
            f"request refused: {key}: expected a list of rows of {width} numbers, got {found}",
            "row_shape",
        )
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            found = f"{len(row)} values" if isinstance(row, list) else f"a {type(row).__name__}"
            raise BodyRefused(
                f"request refused: {key}: row {i} has {found}, expected {width} (one per feature)",
                "row_shape",
            )
        for j, element in enumerate(row):
            # bool is an int in Python, and no feature is a truth value. NaN (which
            # json.loads reads) passes here: the guard refuses it, naming its position.
            if isinstance(element, bool) or not isinstance(element, int | float):
                raise BodyRefused(
                    f"request refused: {key}: row {i} column {j}: expected a number, got a "
                    f"JSON {_json_type(element)}",
                    "dtype",
                )
            if isinstance(element, int) and abs(element) > _LARGEST_FLOAT:
                raise BodyRefused(
                    f"request refused: {key}: row {i} column {j}: an integer too large for a float",
                    "dtype",
                )


def _json_type(value: Any) -> str:
    return {str: "string", type(None): "null", dict: "object", list: "list", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _leaf_columns(key: str, value: Any, leaves: tuple[str, ...]) -> dict[str, Any]:
    """``{leaf: rows}`` for a dict-of-leaves model; shapes and dtypes are then MLflow's and
    the guard's to check (a leaf may be any rank)."""
    if key == SPLIT:
        if not isinstance(value, dict) or not isinstance(value.get("data"), list):
            raise BodyRefused(
                f"request refused: {SPLIT} must be an object with 'columns' (the leaf names) "
                "and 'data'",
                "format",
            )
        columns = value.get("columns")
        if not isinstance(columns, list):
            raise BodyRefused(
                f"request refused: {SPLIT}.columns must name the leaves {list(leaves)}",
                "columns",
            )
        _check_names(f"{SPLIT}.columns", columns, leaves)
        index = {str(c): i for i, c in enumerate(columns)}
        for i, row in enumerate(value["data"]):
            if not isinstance(row, list) or len(row) != len(leaves):
                raise BodyRefused(
                    f"request refused: {SPLIT}.data: row {i} is not one value per leaf "
                    f"({len(leaves)})",
                    "row_shape",
                )
        return {leaf: [row[index[leaf]] for row in value["data"]] for leaf in leaves}
    if key == RECORDS or (isinstance(value, list) and value and isinstance(value[0], dict)):
        if not isinstance(value, list) or not value:
            raise BodyRefused(f"request refused: {key} must be a non-empty list", "format")
        for i, record in enumerate(value):
            if not isinstance(record, dict):
                raise BodyRefused(
                    f"request refused: {key}[{i}] must be an object keyed by leaf name",
                    "format",
                )
            _check_names(f"{key}[{i}]", list(record), leaves)
        return {leaf: [record[leaf] for record in value] for leaf in leaves}
    if not isinstance(value, dict):
        raise BodyRefused(
            f"request refused: {key}: this model takes a dict of leaves {list(leaves)}, got a "
            f"JSON {_json_type(value)}",
            "format",
        )
    _check_names(key, list(value), leaves)
    return {leaf: value[leaf] for leaf in leaves}


def install() -> None:
    """Wrap MLflow's ``scoring_server.invocations`` (once per process): a request to a
    :class:`~vmapcheck.tracking.serving.VerifiedModel` is :func:`normalize`-d first, and its
    refusal answered as JSON with its status; any other model's request is MLflow's alone.
    """
    from mlflow.pyfunc import scoring_server

    if getattr(scoring_server.invocations, "vmapcheck_gate", False):
        return
    original = scoring_server.invocations

    def invocations(data: Any, content_type: Any, model: Any, input_schema: Any) -> Any:
        rule = _rule_of(model)
        if rule is None:
            return original(data, content_type, model, input_schema)
        try:
            body = normalize(data, content_type, rule)
        except BodyRefused as refused:
            return scoring_server.InvocationsResponse(refused.as_json(), refused.status, JSON_TYPE)
        # MLflow's parser takes a decoded dict as it is (``_decode_json_input``).
        return original(body, JSON_TYPE, model, input_schema)

    # A mark on the function (a function object takes attributes; mypy knows none).
    invocations.vmapcheck_gate = True  # type: ignore[attr-defined]
    scoring_server.invocations = invocations


def _rule_of(model: Any) -> BodyRule | None:
    """The body rule of a loaded pyfunc whose python model is a VerifiedModel, else None."""
    try:
        python_model = model.unwrap_python_model()
    except Exception:  # not a python-model pyfunc: MLflow's own flavor, not ours to judge
        return None
    return getattr(python_model, "body_rule", None)
