"""Raw tables: CSV/Parquet reading refuses every malformed file with file, column and row
named and no personal value shown; the synthetic generator is deterministic from its key;
the diabetes table loads from the installed scikit-learn and goes through prepare."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

from tests.helpers.config import compose_config
from vmapcheck.core.keys import named_keys
from vmapcheck.data.anonymize import anonymize
from vmapcheck.data.builtin import (
    DIABETES_COLUMNS,
    DIABETES_SOURCE,
    SYNTHETIC_IDENTIFIERS,
    SYNTHETIC_QUASI,
    diabetes_raw_table,
    diabetes_schema,
    synthetic_raw_table,
    synthetic_schema,
    write_csv,
)
from vmapcheck.data.regression import SPLITS, load_cases, regression_cases, write_cases
from vmapcheck.data.sources import RawTable, Schema, read_table
from vmapcheck.data.splits import anonymize_policy, load_raw, split_indices, write_splits
from vmapcheck.errors import ConfigError, SourceError

SCHEMA = Schema(
    identifiers=("id", "name"),
    quasi_identifiers={"birth_date": "year"},
    features=("f1", "f2"),
    targets=("y",),
)
HEADER = "id,name,birth_date,f1,f2,y"
# Personal values planted in rows that errors point at: no message may contain them.
SECRET_ID = "C9911223"
SECRET_NAME = "Zelda Quux"
SECRET_DATE = "1961-07-04"
GOOD_ROW = f"{SECRET_ID},{SECRET_NAME},{SECRET_DATE},1.5,-2,0.25"
QUASI = {"birth_date": "year", "postcode": "prefix2"}


def write(tmp_path: Path, text: str, name: str = "table.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, schema: Schema = SCHEMA, delimiter: str = ",") -> str:
    """The SourceError message for ``path``; it must name the file and show no personal value."""
    with pytest.raises(SourceError) as info:
        read_table(path, schema, delimiter=delimiter)
    message = str(info.value)
    assert str(path) in message
    for value in (SECRET_ID, SECRET_NAME, SECRET_DATE, "Zelda", "C9911"):
        assert value not in message
    return message


def test_reads_a_good_csv_in_schema_order(tmp_path):
    # Columns in the file are in another order than the schema; features follow the schema.
    text = f"y,f2,name,id,birth_date,f1\n0.25,-2,{SECRET_NAME},{SECRET_ID},{SECRET_DATE},1.5\n"
    text += "1e-3,  3 ,,C2,,0\n"  # empty identifier and quasi values are allowed
    raw = read_table(write(tmp_path, text), SCHEMA)
    assert raw.features.dtype == np.float32 and raw.features.shape == (2, 2)
    np.testing.assert_array_equal(raw.features, np.array([[1.5, -2], [0, 3]], np.float32))
    np.testing.assert_array_equal(raw.targets, np.array([[0.25], [1e-3]], np.float32))
    assert raw.identifiers["id"].tolist() == [SECRET_ID, "C2"]
    assert raw.identifiers["name"].tolist() == [SECRET_NAME, ""]
    assert raw.quasi_identifiers["birth_date"].tolist() == [SECRET_DATE, ""]
    assert list(raw.identifiers) == ["id", "name"] and raw.n_rows == 2
    # The repr (what a log line or a failed assertion shows) holds no value.
    assert SECRET_NAME not in repr(raw) and SECRET_ID not in repr(raw)


def test_strings_are_not_coerced(tmp_path):
    # "NA", "null", leading zeros, a BOM: kept as text exactly, never turned into NaN or ints.
    text = "\ufeff" + HEADER + "\nNA,null,0001-01-01,1,2,3\n007,None,x,4,5,6\n"
    raw = read_table(write(tmp_path, text), SCHEMA)
    assert raw.identifiers["id"].tolist() == ["NA", "007"]
    assert raw.identifiers["name"].tolist() == ["null", "None"]


def test_missing_file_and_wrong_suffix(tmp_path):
    message = refused(tmp_path / "nope.csv")
    assert "file not found" in message
    message = refused(write(tmp_path, HEADER + "\n", name="table.xlsx"))
    assert "'.xlsx'" in message and ".csv or .parquet" in message


def test_empty_file(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    assert "the file is empty (0 bytes)" in refused(path)
    assert "only blank lines" in refused(write(tmp_path, "\n\n  \n"))


def test_header_but_no_rows(tmp_path):
    assert "has a header but no data rows" in refused(write(tmp_path, HEADER + "\n\n"))


def test_missing_column_is_named_and_found_columns_listed(tmp_path):
    message = refused(write(tmp_path, "id,name,birth_date,f1,y\n" + "a,b,c,1,2\n"))
    assert "missing column 'f2' (feature)" in message
    assert "columns found: 'id', 'name', 'birth_date', 'f1', 'y'" in message


def test_a_file_without_header_is_refused_without_showing_its_first_row(tmp_path):
    message = refused(write(tmp_path, GOOD_ROW + "\n" + GOOD_ROW + "\n"))
    assert "lack a header row" in message


def test_duplicated_column(tmp_path):
    message = refused(write(tmp_path, HEADER + ",f1\n" + GOOD_ROW + ",7\n"))
    assert "column 'f1' appears 2 times in the header (positions 4, 7)" in message


def test_undeclared_column_is_refused(tmp_path):
    message = refused(write(tmp_path, HEADER + ",ssn,notes\n" + GOOD_ROW + ",1,2\n"))
    assert "'ssn' (position 7), 'notes' (position 8) are not declared" in message
    assert "could hold personal data" in message
    assert "data.identifiers" in message and "data.quasi_identifiers" in message


@pytest.mark.parametrize(
    ("file_delimiter", "configured", "named"),
    [(";", ",", "semicolon"), ("\t", ",", "tab"), ("|", ",", "pipe"), (",", ";", "comma")],
)
def test_wrong_delimiter_is_named(tmp_path, file_delimiter, configured, named):
    text = HEADER.replace(",", file_delimiter) + "\n" + GOOD_ROW.replace(",", file_delimiter)
    message = refused(write(tmp_path, text + "\n"), delimiter=configured)
    assert f"seems to use {file_delimiter!r} ({named})" in message
    assert f"data.delimiter is {configured!r}" in message
    # The right delimiter reads the same file.
    assert read_table(tmp_path / "table.csv", SCHEMA, delimiter=file_delimiter).n_rows == 1


def test_a_multi_character_delimiter_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.delimiter"):
        read_table(write(tmp_path, HEADER + "\n" + GOOD_ROW + "\n"), SCHEMA, delimiter=";;")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("abc", "expected a number, found a non-numeric value of 3 characters"),
        ("", "expected a number, found an empty value"),
        ("   ", "expected a number, found an empty value"),
        ("1,5", None),  # quoted below: a decimal comma is not a number
        ("nan", "expected a finite number, found NaN"),
        ("-inf", "expected a finite number, found an infinite value"),
        ("1e39", "within float32 range (about ±3.4e38), found one beyond it"),
    ],
)
def test_bad_feature_value_names_column_row_and_line(tmp_path, value, expected):
    rows = [GOOD_ROW] * 16 + [f'{SECRET_ID},{SECRET_NAME},{SECRET_DATE},1,"{value}",0']
    message = refused(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))
    assert f"{tmp_path / 'table.csv'}: column 'f2', row 17 (line 18): " in message
    assert expected is None or expected in message
    if expected is None:
        assert "found a non-numeric value of 3 characters (it looks like a decimal comma" in message
    assert value.strip() == "" or f"'{value}'" not in message


def test_bad_target_value_and_count_of_bad_rows(tmp_path):
    rows = [GOOD_ROW, f"{SECRET_ID},{SECRET_NAME},{SECRET_DATE},1,2,", "a,b,c,1,2,x"]
    message = refused(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))
    assert "column 'y', row 2 (line 3): expected a number, found an empty value" in message
    assert "(1 more bad value in this column)" in message


def test_line_numbers_follow_blank_lines_and_multi_line_fields(tmp_path):
    # Row 3 starts on line 6: a blank line and a quoted name spanning two lines come first.
    text = (
        f'{HEADER}\n{GOOD_ROW}\n\n1,"Multi\nLine",{SECRET_DATE},1,2,3\n{SECRET_ID},x,y,oops,2,3\n'
    )
    message = refused(write(tmp_path, text))
    assert "column 'f1', row 3 (line 6): expected a number, found a non-numeric value" in message


def test_a_personal_value_in_a_feature_column_is_not_shown(tmp_path):
    # A misplaced column put an e-mail address where a number belongs (row 2, line 3): the
    # error names the file, column, row and line, and shows neither the value nor a part.
    email = "zelda.quux1961@private-mail.example"
    rows = [GOOD_ROW, f"{SECRET_ID},{SECRET_NAME},{SECRET_DATE},{email},2,3"]
    message = refused(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"))
    assert f"{tmp_path / 'table.csv'}: column 'f1', row 2 (line 3): expected a number, " in message
    assert f"found a non-numeric value of {len(email)} characters" in message
    for part in (email, "zelda", "quux", "private-mail", "@"):
        assert part not in message.lower()
    # The same value stored as text in a Parquet column is not shown either.
    path = tmp_path / "table.parquet"
    frame = {"id": [SECRET_ID] * 2, "name": [SECRET_NAME] * 2, "birth_date": [SECRET_DATE] * 2}
    pd.DataFrame({**frame, "f1": ["1", email], "f2": [1.0] * 2, "y": [0.0] * 2}).to_parquet(path)
    message = refused(path)
    assert "column 'f1', row 2: expected a number, found a non-numeric value of" in message
    assert email not in message and "zelda" not in message.lower()


def test_rows_with_the_wrong_number_of_fields(tmp_path):
    message = refused(write(tmp_path, f"{HEADER}\n{GOOD_ROW}\n{SECRET_ID},{SECRET_NAME},1,2\n"))
    assert "row 2 (line 3) has 4 fields, the header has 6" in message
    message = refused(write(tmp_path, f"{HEADER}\n{GOOD_ROW},{SECRET_NAME}\n"))
    assert "row 1 (line 2) has 7 fields" in message


def test_malformed_quoting_and_non_utf8(tmp_path):
    message = refused(write(tmp_path, f'{HEADER}\n{GOOD_ROW}\n"{SECRET_ID}"x,a,b,1,2,3\n'))
    assert "line 3: malformed CSV" in message
    path = tmp_path / "latin1.csv"
    path.write_bytes((HEADER + "\nC1,J\xf6rg,x,1,2,3\n").encode("latin-1"))
    assert "not UTF-8 text" in refused(path)


def test_schema_refuses_a_column_in_two_roles():
    with pytest.raises(ConfigError, match=r"'x' is listed in both data\.features and data\.tar"):
        Schema(identifiers=(), quasi_identifiers={}, features=("x",), targets=("x",))
    with pytest.raises(ConfigError, match=r"'id' is listed in both data\.identifiers and data\.q"):
        Schema(
            identifiers=("id",), quasi_identifiers={"id": "drop"}, features=("a",), targets=("b",)
        )
    with pytest.raises(ConfigError, match=r"'a' is listed twice in data\.features"):
        Schema(identifiers=(), quasi_identifiers={}, features=("a", "a"), targets=("b",))
    with pytest.raises(ConfigError, match=r"data\.features: expected at least one column"):
        Schema(identifiers=("id",), quasi_identifiers={}, features=(), targets=("b",))
    # Lists from a config are accepted and frozen into tuples.
    schema = Schema(identifiers=["id"], quasi_identifiers={}, features=["a"], targets=["b"])
    assert schema.identifiers == ("id",) and schema.columns == ("id", "a", "b")


def test_parquet_read_with_native_types(tmp_path):
    frame = pd.DataFrame(
        {
            "id": [101, 102],  # an integer id column is read as text
            "name": [SECRET_NAME, None],  # null identifier -> ""
            "birth_date": pd.to_datetime([SECRET_DATE, "1990-01-31"]).date,
            "f1": [1.5, 2.5],
            "f2": np.array([3, 4], dtype=np.int64),
            "y": ["0.5", "1"],  # numbers stored as text are parsed like CSV fields
        }
    )
    path = tmp_path / "table.parquet"
    frame.to_parquet(path)
    raw = read_table(path, SCHEMA)
    np.testing.assert_array_equal(raw.features, np.array([[1.5, 3], [2.5, 4]], np.float32))
    np.testing.assert_array_equal(raw.targets, np.array([[0.5], [1]], np.float32))
    assert raw.identifiers["id"].tolist() == ["101", "102"]
    assert raw.identifiers["name"].tolist() == [SECRET_NAME, ""]
    assert raw.quasi_identifiers["birth_date"].tolist() == [SECRET_DATE, "1990-01-31"]


def test_parquet_errors(tmp_path):
    base = {"id": [SECRET_ID] * 3, "name": [SECRET_NAME] * 3, "birth_date": [SECRET_DATE] * 3}
    path = tmp_path / "table.parquet"
    pd.DataFrame({**base, "f1": [1.0, None, 2.0], "f2": [1.0] * 3, "y": [0.0] * 3}).to_parquet(path)
    assert "column 'f1', row 2: expected a number, found an empty value" in refused(path)
    pd.DataFrame({**base, "f1": [1.0, 2, np.inf], "f2": [1.0] * 3, "y": [0.0] * 3}).to_parquet(path)
    assert "column 'f1', row 3: expected a finite number, found an infinite value" in refused(path)
    pd.DataFrame({**base, "f1": [True] * 3, "f2": [1.0] * 3, "y": [0.0] * 3}).to_parquet(path)
    assert "column 'f1': expected a numeric column, found type bool" in refused(path)
    pd.DataFrame({**base, "f1": [1.0] * 3, "y": [0.0] * 3}).to_parquet(path)
    assert "missing column 'f2' (feature)" in refused(path)
    pd.DataFrame({**base, "f1": [1.0] * 3, "f2": ["1", "x", "2"], "y": [0.0] * 3}).to_parquet(path)
    assert "column 'f2', row 2: expected a number, found a non-numeric value of 1 ch" in refused(
        path
    )
    path.write_bytes(b"not parquet at all")
    assert "not a readable Parquet file" in refused(path)


KEY = jax.random.key(0)


@pytest.fixture(scope="module")
def synthetic() -> RawTable:
    return synthetic_raw_table(KEY, 300, 4, 2, 0.1, QUASI)


def test_synthetic_schema():
    schema = synthetic_schema(3, 2, QUASI)
    assert schema.features == ("x0", "x1", "x2") and schema.targets == ("y0", "y1")
    assert schema.identifiers == SYNTHETIC_IDENTIFIERS
    assert tuple(schema.quasi_identifiers) == SYNTHETIC_QUASI
    with pytest.raises(
        ConfigError, match=r"data\.quasi_identifiers: .*unknown 'zip'; missing 'postcode'"
    ):
        synthetic_schema(3, 2, {"birth_date": "year", "zip": "drop"})


def test_synthetic_table_looks_like_a_real_one(synthetic):
    raw = synthetic
    assert raw.features.shape == (300, 4) and raw.features.dtype == np.float32
    assert raw.targets.shape == (300, 2) and raw.targets.dtype == np.float32
    ids = raw.identifiers["id"].tolist()
    assert all(re.fullmatch(r"C\d{7}", v) for v in ids) and len(set(ids)) == 300
    for name, email in zip(raw.identifiers["name"], raw.identifiers["email"], strict=True):
        first, last = name.split(" ")
        assert email.startswith(f"{first.lower()}.{last.lower()}") and "@example." in email
    assert all(re.fullmatch(r"\+1-\d{3}-555-\d{4}", v) for v in raw.identifiers["phone"])
    births = raw.quasi_identifiers["birth_date"].tolist()
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", v) for v in births)
    assert min(births) >= "1940-01-01" and max(births) <= "2005-12-31"
    assert all(re.fullmatch(r"\d{5}", v) for v in raw.quasi_identifiers["postcode"])
    assert len(set(raw.identifiers["name"].tolist())) > 20  # names drawn, not constant


def test_synthetic_table_is_deterministic_from_the_key(synthetic):
    again = synthetic_raw_table(KEY, 300, 4, 2, 0.1, QUASI)
    other = synthetic_raw_table(jax.random.key(1), 300, 4, 2, 0.1, QUASI)
    np.testing.assert_array_equal(again.features, synthetic.features)
    np.testing.assert_array_equal(again.targets, synthetic.targets)
    for column in SYNTHETIC_IDENTIFIERS:
        np.testing.assert_array_equal(again.identifiers[column], synthetic.identifiers[column])
        assert not np.array_equal(other.identifiers[column], synthetic.identifiers[column])
    for column in SYNTHETIC_QUASI:
        np.testing.assert_array_equal(
            again.quasi_identifiers[column], synthetic.quasi_identifiers[column]
        )
    assert not np.array_equal(other.features, synthetic.features)


def test_synthetic_targets_are_the_model_plus_scaled_noise(synthetic):
    # Same key, no noise: same features, and targets differ by noise_std * N(0, 1) only.
    clean = synthetic_raw_table(KEY, 300, 4, 2, 0.0, QUASI)
    np.testing.assert_array_equal(clean.features, synthetic.features)
    residual = synthetic.targets - clean.targets
    assert 0.08 < residual.std() < 0.12 and abs(residual.mean()) < 0.03
    assert np.abs(clean.targets).max() < 4  # tanh(.) @ B / sqrt(2f): bounded, not noise


def test_round_trip_through_csv(tmp_path, synthetic):
    for delimiter in (",", ";"):
        path = tmp_path / f"raw{delimiter == ';'}.csv"
        write_csv(path, synthetic, delimiter=delimiter)
        header = path.read_text(encoding="utf-8").splitlines()[0]
        assert header == delimiter.join(synthetic.schema.columns)
        back = read_table(path, synthetic.schema, delimiter=delimiter)
        np.testing.assert_array_equal(back.features, synthetic.features)
        np.testing.assert_array_equal(back.targets, synthetic.targets)
        for column, values in {**synthetic.identifiers, **synthetic.quasi_identifiers}.items():
            got = {**back.identifiers, **back.quasi_identifiers}[column]
            np.testing.assert_array_equal(got, values)


# ---------------------------------------------------------------------------------------
# The diabetes table scikit-learn ships

DIABETES_FEATURES = ("bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")


@pytest.fixture(scope="module")
def diabetes_config():
    """conf/data/diabetes.yaml with the default mlp, whose out_features must be 1."""
    return compose_config("data=diabetes", "model.out_features=1")


@pytest.fixture(scope="module")
def diabetes(diabetes_config) -> RawTable:
    return load_raw(diabetes_config.data, named_keys(0)["data"], Path("/nonexistent"))


def test_the_diabetes_table_loads_from_the_installed_package_without_network(monkeypatch):
    import socket
    import urllib.request

    def no_network(*args, **kwargs):
        raise AssertionError("the diabetes source reached for the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    schema = diabetes_schema({"age": "band10", "sex": "drop"}, DIABETES_FEATURES, ["progression"])
    raw = diabetes_raw_table(schema)
    assert raw.n_rows == 442 and raw.source == DIABETES_SOURCE
    assert raw.features.shape == (442, 8) and raw.features.dtype == np.float32
    assert raw.targets.shape == (442, 1) and raw.targets.dtype == np.float32
    assert raw.schema.columns == ("age", "sex", *DIABETES_FEATURES, "progression")
    assert raw.identifiers == {} and list(raw.quasi_identifiers) == ["age", "sex"]


def test_the_diabetes_table_is_unscaled_with_real_quasi_identifiers(diabetes):
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    ages = [int(v) for v in diabetes.quasi_identifiers["age"].tolist()]
    assert min(ages) == 19 and max(ages) == 79  # years, not the scaled +-0.1 values
    assert set(diabetes.quasi_identifiers["sex"].tolist()) == {"1", "2"}
    np.testing.assert_array_equal(
        diabetes.quasi_identifiers["age"], bunch.data[:, 0].astype(int).astype(str)
    )
    np.testing.assert_array_equal(diabetes.features, bunch.data[:, 2:].astype(np.float32))
    np.testing.assert_array_equal(diabetes.targets[:, 0], bunch.target.astype(np.float32))
    assert diabetes.targets.min() >= 25 and diabetes.targets.max() <= 346
    assert diabetes.features[:, 0].min() > 15 and diabetes.features[:, 0].max() < 45  # bmi
    assert "59" not in repr(diabetes)  # the repr (a log line) shows no value


def test_diabetes_columns_follow_the_configured_roles_and_order():
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    quasi = {c: "drop" for c in DIABETES_COLUMNS if c not in ("s5", "age", "bmi")}
    raw = diabetes_raw_table(diabetes_schema(quasi, ["s5", "age"], ["bmi"]))
    np.testing.assert_array_equal(raw.features, bunch.data[:, [8, 0]].astype(np.float32))
    np.testing.assert_array_equal(raw.targets[:, 0], bunch.data[:, 2].astype(np.float32))
    assert "progression" in raw.quasi_identifiers


@pytest.mark.parametrize(
    ("quasi", "features", "targets", "expected"),
    [
        (
            {"age": "drop", "sex": "drop"},
            [*DIABETES_FEATURES[:-1], "glucose"],
            ["progression"],
            r"data\.features: expected columns of the diabetes table \(age, sex, .*, "
            r"progression\), found 'glucose'",
        ),
        (
            {"age": "drop", "sex": "drop", "id": "drop"},
            DIABETES_FEATURES,
            ["progression"],
            r"data\.quasi_identifiers: expected columns of the diabetes table .*found 'id'",
        ),
        (
            {"age": "band10"},
            DIABETES_FEATURES,
            ["progression"],
            r"data\.quasi_identifiers, data\.features, data\.targets: expected every column "
            r".* found 'sex' in none; .*'drop'",
        ),
        (
            {"age": "drop", "sex": "drop"},
            DIABETES_FEATURES,
            ["progression", "bmi"],
            r"column 'bmi' is listed in both data\.features and data\.targets",
        ),
        ({"age": "drop", "sex": "drop"}, DIABETES_FEATURES, [], r"data\.targets: expected at"),
    ],
)
def test_a_diabetes_schema_that_does_not_fit_the_table_names_the_key(
    quasi, features, targets, expected
):
    with pytest.raises(ConfigError, match=expected):
        diabetes_schema(quasi, features, targets)


def test_prepare_makes_disjoint_splits_and_cases_from_the_diabetes_table(
    diabetes, diabetes_config, tmp_path
):
    """prepare's steps (vmapcheck.pipeline.prepare.run) on the diabetes table."""
    config = diabetes_config
    assert config.model.name == "mlp" and config.model.in_features == 8 == config.data.n_features
    assert config.model.out_features == 1 == config.data.n_targets
    keys = named_keys(config.seed)
    table = anonymize(diabetes, anonymize_policy(config.data))
    # No identifier and no group_by: each patient (row) is its own record.
    np.testing.assert_array_equal(table.group_ids, np.arange(442))
    assert table.feature_names == DIABETES_FEATURES and table.join_keys is None
    assert set(table.generalized) == {"age.band10"}
    actions = {c["name"]: c["action"] for c in table.columns}
    assert actions["age"].startswith("generalized") and actions["sex"] == "dropped"

    parts = split_indices(keys["split"], table.group_ids, config.data)
    rows = np.concatenate([parts[name] for name in SPLITS])
    assert np.array_equal(np.sort(rows), np.arange(442))  # disjoint, and every row once
    assert {name: parts[name].size for name in SPLITS} == {"train": 310, "val": 66, "test": 66}
    write_splits(tmp_path / "prepared", table, parts)
    with np.load(tmp_path / "prepared" / "test.npz") as test:
        assert set(test.files) == {"features", "targets", "row", "age.band10"}
        assert test["features"].shape == (66, config.model.in_features)
        assert set(test["age.band10"].tolist()) <= set(range(10, 80, 10))

    cases = regression_cases(
        table.features[parts["train"]],
        table.features[parts["test"]],
        table.targets[parts["test"]],
        config.data.standard_batch,
    )
    write_cases(tmp_path / "cases", cases, list(table.feature_names))
    stored = load_cases(tmp_path / "cases")
    assert stored["standard"]["x"].shape == (config.data.standard_batch, 8)
    assert stored["standard"]["y"].shape == (config.data.standard_batch, 1)
    assert "expected 8 features, got 9" in cases["invalid_features"]["expect"]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p.symlink_to(p.name), "expected a file, found a symbolic link loop"),
        (lambda p: __import__("os").mkfifo(p), "(a regular file), found a FIFO (named pipe)"),
        (lambda p: p.symlink_to("/dev/zero"), "(a regular file), found a character device"),
    ],
)
def test_a_table_that_is_a_link_loop_or_a_special_file_is_refused_before_opening(
    tmp_path, make, said
):
    table = tmp_path / "table.csv"
    make(table)
    with pytest.raises(SourceError, match=r"table\.csv") as refused:
        read_table(table, SCHEMA)
    assert said in str(refused.value)
