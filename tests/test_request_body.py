"""The served model's HTTP bodies (vmapcheck.tracking.request_body): named columns by name,
anything else refused early with a status and a one-line reason that echoes no value."""

from __future__ import annotations

import json

import pytest

from vmapcheck.tracking.request_body import BodyRefused, BodyRule, normalize

FEATURES = ("x0", "x1", "x2")
FLAT = BodyRule(FEATURES, None, max_batch=4)
LEAVES = BodyRule(None, {"body": 2, "serum": 3}, max_batch=4)
JSON = "application/json"


def body(value: object) -> bytes:
    return json.dumps(value).encode()


def refused(data: bytes | str, rule: BodyRule = FLAT, content_type: str = JSON) -> BodyRefused:
    with pytest.raises(BodyRefused) as caught:
        normalize(data, content_type, rule)
    return caught.value


def test_named_columns_are_taken_by_name_in_any_order():
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    expected = {"inputs": rows}
    split = {"columns": ["x2", "x0", "x1"], "data": [[3.0, 1.0, 2.0], [6.0, 4.0, 5.0]]}
    assert normalize(body({"dataframe_split": split}), JSON, FLAT) == expected
    records = [{"x1": 2.0, "x2": 3.0, "x0": 1.0}, {"x2": 6.0, "x0": 4.0, "x1": 5.0}]
    assert normalize(body({"dataframe_records": records}), JSON, FLAT) == expected
    assert normalize(body({"instances": records}), JSON, FLAT) == expected
    columns = {"x2": [3.0, 6.0], "x1": [2.0, 5.0], "x0": [1.0, 4.0]}
    assert normalize(body({"inputs": columns}), JSON, FLAT) == expected
    # Unnamed: by position, as the signature says.
    assert normalize(body({"inputs": rows}), f"{JSON}; charset=utf-8", FLAT) == expected
    assert normalize(body({"dataframe_split": {"data": rows}}), JSON, FLAT) == expected


def test_a_dict_of_leaves_model_takes_its_leaves_by_name():
    records = [{"serum": [1, 2, 3], "body": [4, 5]}]
    assert normalize(body({"dataframe_records": records}), JSON, LEAVES) == {
        "inputs": {"body": [[4, 5]], "serum": [[1, 2, 3]]}
    }
    assert "missing ['serum']" in refused(body({"inputs": {"body": [[1, 2]]}}), LEAVES).message


@pytest.mark.parametrize(
    ("value", "reason", "says"),
    [
        (
            {"dataframe_split": {"columns": ["x0", "x1", "x3"], "data": [[1, 2, 3]]}},
            "columns",
            "missing ['x2']; unknown ['x3']); expected ['x0', 'x1', 'x2'], in any order",
        ),
        ({"dataframe_records": [{"x0": 1, "x1": 2}]}, "columns", "missing ['x2']"),
        (
            {"dataframe_split": {"columns": ["x0", "x0", "x1"], "data": [[1, 2, 3]]}},
            "columns",
            "repeated ['x0']",
        ),
        ({"inputs": [[1.0, 2.0]]}, "row_shape", "row 0 has 2 values, expected 3"),
        ({"inputs": []}, "row_shape", "got an empty list"),
        ({"inputs": [[1.0, "2", 3.0]]}, "dtype", "column 1: expected a number, got a JSON string"),
        ({"inputs": [[1.0, True, 3.0]]}, "dtype", "got a JSON boolean"),
        ({"inputs": [[1.0, None, 3.0]]}, "dtype", "got a JSON null"),
        ({"inputs": [[1.0, 10**400, 3.0]]}, "dtype", "an integer too large for a float"),
        ({"inputs": [[1, 2, 3]], "dataframe_split": {}}, "format", "expected exactly one of"),
        ({"data": [[1, 2, 3]]}, "format", "expected exactly one of"),
    ],
)
def test_a_body_that_breaks_the_contract_is_refused_naming_what(value, reason, says):
    found = refused(body(value))
    assert (found.reason, found.status) == (reason, 400)
    assert says in found.message and found.message.startswith("request refused: ")


def test_size_type_and_syntax_are_refused_before_parsing():
    huge = refused(b"[" * (50 * 2**20))
    assert (huge.reason, huge.status) == ("body_too_large", 413)
    assert f"the body has {50 * 2**20} bytes" in huge.message
    assert f"({FLAT.max_body_bytes} bytes)" in huge.message
    deep = refused(b"[" * 2000)  # within the size limit, deeper than Python recurses
    assert deep.reason == "not_json"
    csv = refused(b"x0,x1,x2\n1,2,3\n", content_type="text/csv")
    assert (csv.reason, csv.status) == ("content_type", 415)
    assert refused(b"{}", content_type=None).reason == "content_type"
    broken = refused(b'{"inputs": [[1, 2,')
    assert broken.message.startswith("request refused: the body is not JSON: Expecting value")
    assert refused(b'{"inputs": "\xff"}').reason == "not_json"
    assert refused(body([[1, 2, 3]])).reason == "format"
    # The answer is JSON with no stack trace and no value of the request.
    assert set(json.loads(csv.as_json())) == {"error_code", "message", "reason"}
