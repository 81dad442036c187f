"""Anonymization drops, pseudonymizes and generalizes as configured, never leaks a raw
value or the secret, and the canary scanner finds raw values wherever they hide."""

from __future__ import annotations

import gzip
import hashlib
import hmac
import io
import sqlite3
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vmapcheck.data.anonymize import (
    QUASI_POLICIES,
    AnonymizationError,
    AnonymizedTable,
    AnonymizePolicy,
    anonymize,
    find_canaries,
    validate_policy,
)
from vmapcheck.data.sources import RawTable, Schema
from vmapcheck.errors import ArtifactError, ConfigError

SECRET = "s3cret-for-tests-0123456789"
OTHER_SECRET = "another-secret-abcdefghijkl"
ENV = {"VMAPCHECK_TEST_SECRET": SECRET}
POLICY = AnonymizePolicy(join_key="email", secret_env="VMAPCHECK_TEST_SECRET", group_by="id")


def strs(*values: str) -> np.ndarray:
    return np.asarray(values, dtype=np.str_)


def make_raw(
    identifiers: dict[str, np.ndarray],
    quasi: dict[str, tuple[str, np.ndarray]],
    n_features: int = 2,
) -> RawTable:
    """A RawTable built by hand: quasi maps column -> (policy, values)."""
    n = len(next(iter(identifiers.values())))
    schema = Schema(
        identifiers=tuple(identifiers),
        quasi_identifiers={c: policy for c, (policy, _) in quasi.items()},
        features=tuple(f"x{j}" for j in range(n_features)),
        targets=("y",),
    )
    rng = np.random.default_rng(0)
    return RawTable(
        features=rng.normal(size=(n, n_features)).astype(np.float32),
        targets=rng.normal(size=(n, 1)).astype(np.float32),
        identifiers=identifiers,
        quasi_identifiers={c: values for c, (_, values) in quasi.items()},
        schema=schema,
        source="data/raw/people.csv",
    )


@pytest.fixture
def raw() -> RawTable:
    return make_raw(
        {
            "id": strs("C1", "C2", "C1", "C3", "", ""),
            "name": strs("Ann Lee", "Bo Chu", "Ann Lee", "Cy Dee", "Di Eng", "Ed Fox"),
            "email": strs("ann@x.org", "bo@x.org", "ann@x.org", "cy@x.org", "", "ed@x.org"),
        },
        {
            "birth_date": ("year", strs(*["1987-02-11", "1990-12-31", "1987-02-11"] * 2)),
            "signup": ("decade", strs(*["1987-06-01", "2001-01-01", "1979-12-31"] * 2)),
            "postcode": ("prefix2", strs("12345", "67890", "12399", "", "55555", "67000")),
            "phone_area": ("drop", strs("555", "556", "557", "558", "559", "560")),
        },
    )


def all_outputs(table: AnonymizedTable) -> dict[str, np.ndarray]:
    """Everything anonymize returns, as arrays (the manifest as a JSON-ish string array)."""
    arrays = {
        "features": table.features,
        "targets": table.targets,
        "feature_names": np.asarray(table.feature_names),
        "target_names": np.asarray(table.target_names),
        "group_ids": table.group_ids,
        "columns": np.asarray([repr(entry) for entry in table.columns]),
        "repr": np.asarray([repr(table)]),
        **{f"generalized.{k}": v for k, v in table.generalized.items()},
    }
    if table.join_keys is not None:
        arrays["join_keys"] = table.join_keys
    return arrays


def test_identifiers_dropped_except_the_join_key(raw):
    table = anonymize(raw, POLICY, ENV)
    entries = {e["name"]: e for e in table.columns}
    assert [e["name"] for e in table.columns] == [
        "id", "name", "email", "birth_date", "signup", "postcode", "phone_area", "x0", "x1", "y",
    ]  # fmt: skip
    dropped = {"name": "id", "role": "identifier", "action": "dropped", "dtype": "none"}
    assert entries["id"] == dropped
    assert entries["name"]["action"] == "dropped"
    assert entries["email"] == {
        "name": "email",
        "role": "identifier",
        "action": "pseudonymized (HMAC-SHA256)",
        "dtype": "<U64",
    }
    assert entries["x0"] == {"name": "x0", "role": "feature", "action": "kept", "dtype": "float32"}
    assert entries["y"]["role"] == "target"
    for entry in table.columns:
        assert set(entry) == {"name", "role", "action", "dtype"}
    np.testing.assert_array_equal(table.features, raw.features)
    np.testing.assert_array_equal(table.targets, raw.targets)
    assert table.feature_names == ("x0", "x1") and table.target_names == ("y",)


def test_pseudonyms_are_keyed_hmacs_stable_and_joinable(raw):
    table = anonymize(raw, POLICY, ENV)
    keys = table.join_keys
    assert keys is not None and keys.dtype == np.dtype("<U64") and keys.shape == (6,)
    expected = hmac.new(SECRET.encode(), b"ann@x.org", hashlib.sha256).hexdigest()
    assert keys[0] == keys[2] == expected  # equal values, equal pseudonyms: the join works
    assert len(set(keys[[0, 1, 3, 5]].tolist())) == 4
    assert keys[4] == ""  # an empty raw value has no key, rather than a shared one
    np.testing.assert_array_equal(anonymize(raw, POLICY, ENV).join_keys, keys)
    other = anonymize(raw, POLICY, {"VMAPCHECK_TEST_SECRET": OTHER_SECRET}).join_keys
    assert other is not None and not set(other[[0, 1, 3, 5]].tolist()) & set(keys.tolist())
    # A plain (unkeyed) hash of the value is not what is published.
    assert hashlib.sha256(b"ann@x.org").hexdigest() not in keys.tolist()


def test_secret_is_nowhere_in_the_output(raw, tmp_path):
    table = anonymize(raw, POLICY, ENV)
    for name, array in all_outputs(table).items():
        if array.dtype.kind == "U":
            assert not any(SECRET in v for v in array.ravel().tolist()), name
    np.savez(tmp_path / "out.npz", **all_outputs(table))
    assert find_canaries([tmp_path], [SECRET, SECRET[:16]]) == []


def test_no_join_key_drops_every_identifier(raw):
    policy = AnonymizePolicy(join_key=None, secret_env="UNSET_VARIABLE", group_by=None)
    table = anonymize(raw, policy, {})  # no secret needed, none read
    assert table.join_keys is None
    assert [e["action"] for e in table.columns if e["role"] == "identifier"] == ["dropped"] * 3
    np.testing.assert_array_equal(table.group_ids, np.arange(6))


@pytest.mark.parametrize(
    ("environ", "state"),
    [({}, "is not set"), ({"VMAPCHECK_TEST_SECRET": "too-short-123"}, "shorter than 16")],
)
def test_missing_or_short_secret_is_refused(raw, environ, state):
    with pytest.raises(AnonymizationError) as info:
        anonymize(raw, POLICY, environ)
    message = str(info.value)
    assert "VMAPCHECK_TEST_SECRET" in message and state in message
    assert "too-short-123" not in message


def test_group_ids_follow_the_group_column(raw):
    table = anonymize(raw, POLICY, ENV)
    # ids C1, C2, C1, C3, "", "": dense in order of first appearance; empty ids stand alone.
    np.testing.assert_array_equal(table.group_ids, [0, 1, 0, 2, 3, 4])
    assert table.group_ids.dtype == np.int64
    by_email = anonymize(raw, AnonymizePolicy(None, "X", group_by="email"), {}).group_ids
    np.testing.assert_array_equal(by_email, [0, 1, 0, 2, 3, 4])


def test_generalization(raw):
    table = anonymize(raw, POLICY, ENV)
    assert set(table.generalized) == {"birth_date.year", "signup.decade", "postcode.prefix2"}
    years = table.generalized["birth_date.year"]
    assert years.dtype == np.int32 and years.tolist() == [1987, 1990, 1987] * 2
    decades = table.generalized["signup.decade"]
    assert decades.dtype == np.int32 and decades.tolist() == [1980, 2000, 1970] * 2
    prefixes = table.generalized["postcode.prefix2"]
    assert prefixes.dtype == np.dtype("<U2")
    assert prefixes.tolist() == ["12", "67", "12", "", "55", "67"]
    actions = {e["name"]: (e["action"], e["dtype"]) for e in table.columns}
    assert actions["birth_date"] == ("generalized to year", "int32")
    assert actions["signup"] == ("generalized to decade", "int32")
    assert actions["postcode"] == ("generalized to first 2 characters", "<U2")
    assert actions["phone_area"] == ("dropped", "none")


@pytest.mark.parametrize("bad", ["1987/02/11", "", "1987-02-30", "19870211", "87-02-11"])
def test_unparsable_date_names_column_and_row_not_value(bad):
    dates = strs("1990-01-01", "1991-01-01", bad, bad)
    raw = make_raw({"id": strs("a", "b", "c", "d")}, {"born": ("decade", dates)})
    with pytest.raises(AnonymizationError) as info:
        anonymize(raw, AnonymizePolicy(None, "X", None), {})
    message = str(info.value)
    assert "data/raw/people.csv: column 'born', row 3: expected an ISO date" in message
    assert "(2 rows in all)" in message and "data.quasi_identifiers.born" in message
    assert not bad or bad not in message


def test_a_whole_number_is_generalized_to_its_band_of_ten():
    ages = strs("59", "48", "7", "0", "-1", "100", "0059", "50")
    raw = make_raw({"id": strs(*"abcdefgh")}, {"age": ("band10", ages)})
    table = anonymize(raw, AnonymizePolicy(None, "X", None), {})
    bands = table.generalized["age.band10"]
    assert bands.dtype == np.int32 and bands.tolist() == [50, 40, 0, 0, -10, 100, 50, 50]
    entry = next(e for e in table.columns if e["name"] == "age")
    assert entry == {
        "name": "age",
        "role": "quasi_identifier",
        "action": "generalized to band of 10 (its lower bound)",
        "dtype": "int32",
    }


@pytest.mark.parametrize("bad", ["59.5", "", " 59", "fifty", "1e2", "1234567890"])
def test_band10_refuses_what_is_not_a_whole_number_without_showing_it(bad):
    raw = make_raw({"id": strs("a", "b", "c")}, {"age": ("band10", strs("41", bad, bad))})
    with pytest.raises(AnonymizationError) as info:
        anonymize(raw, AnonymizePolicy(None, "X", None), {})
    message = str(info.value)
    assert "column 'age', row 2: expected a whole number for policy 'band10'" in message
    assert "(2 rows in all)" in message and "data.quasi_identifiers.age" in message
    assert not bad.strip() or bad not in message


def test_a_date_policy_given_ages_points_at_band10():
    raw = make_raw({"id": strs("a", "b")}, {"age": ("decade", strs("59", "48"))})
    with pytest.raises(AnonymizationError, match=r"expected an ISO date.*takes policy 'band10'"):
        anonymize(raw, AnonymizePolicy(None, "X", None), {})


def test_the_diabetes_table_has_age_generalized_and_sex_dropped_in_the_manifest():
    """conf/data/diabetes.yaml: scikit-learn's real patients, age and sex quasi-identifiers."""
    from tests.helpers.config import compose_config
    from vmapcheck.data.splits import anonymize_policy, load_raw

    config = compose_config("data=diabetes", "model.out_features=1").data
    raw = load_raw(config, None, None)  # the diabetes source needs no key and no file
    table = anonymize(raw, anonymize_policy(config), {})
    manifest = {e["name"]: e for e in table.columns}
    assert list(manifest) == list(raw.schema.columns)
    assert manifest["age"] == {
        "name": "age",
        "role": "quasi_identifier",
        "action": "generalized to band of 10 (its lower bound)",
        "dtype": "int32",
    }
    assert manifest["sex"] == {
        "name": "sex",
        "role": "quasi_identifier",
        "action": "dropped",
        "dtype": "none",
    }
    assert {e["role"] for n, e in manifest.items() if n not in ("age", "sex")} == {
        "feature",
        "target",
    }
    # Outputs hold the band, never the age; sex is nowhere.
    assert set(table.generalized) == {"age.band10"}
    ages = raw.quasi_identifiers["age"].astype(np.int32)
    np.testing.assert_array_equal(table.generalized["age.band10"], ages // 10 * 10)
    assert table.join_keys is None and len(table.feature_names) == 8
    np.testing.assert_array_equal(table.features, raw.features)


def test_a_prefix_that_keeps_the_whole_value_is_refused():
    raw = make_raw({"id": strs("a", "b")}, {"zip": ("prefix3", strs("12345", "N1"))})
    with pytest.raises(AnonymizationError) as info:
        anonymize(raw, AnonymizePolicy(None, "X", None), {})
    message = str(info.value)
    assert "column 'zip', row 2: policy 'prefix3'" in message and "whole value" in message
    assert "N1" not in message


@pytest.mark.parametrize(
    ("policy", "quasi", "match"),
    [
        (AnonymizePolicy("birth", "X", None), "year", r"data\.anonymize\.join_key: .*'birth'"),
        (AnonymizePolicy(None, "X", "x0"), "year", r"data\.anonymize\.group_by: .*'x0'"),
        (AnonymizePolicy("id", "", None), "year", r"data\.anonymize\.secret_env"),
        (AnonymizePolicy(None, "X", None), "month", r"data\.quasi_identifiers\.birth: .*'month'"),
        (AnonymizePolicy(None, "X", None), "prefix4", r"data\.quasi_identifiers\.birth"),
    ],
)
def test_policy_is_validated_against_the_schema(policy, quasi, match):
    raw = make_raw({"id": strs("a")}, {"birth": (quasi, strs("1990-01-01"))})
    with pytest.raises(ConfigError, match=match):
        validate_policy(raw.schema, policy)
    with pytest.raises(ConfigError, match=match):
        anonymize(raw, policy, ENV)


def test_every_listed_policy_is_accepted():
    for level in QUASI_POLICIES:
        value = "59" if level == "band10" else "1990-01-01"
        raw = make_raw({"id": strs("a")}, {"q": (level, strs(value))})
        table = anonymize(raw, AnonymizePolicy(None, "X", None), {})
        assert set(table.generalized) == (set() if level == "drop" else {f"q.{level}"})


# ---------------------------------------------------------------------------------------
# The canary scanner

CANARY = "CANARY-7f3e-Zyxwv"


def test_find_canaries_in_a_text_file_and_not_in_clean_files(tmp_path):
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "a.json").write_text('{"rows": 3}', encoding="utf-8")
    np.savez(tmp_path / "clean" / "b.npz", x=np.arange(5), s=strs("harmless"))
    (tmp_path / "leak").mkdir()
    (tmp_path / "leak" / "deep").mkdir()
    leak = tmp_path / "leak" / "deep" / "log.txt"
    leak.write_text(f"row 3: {CANARY}\n", encoding="utf-8")
    assert find_canaries([tmp_path / "clean"], [CANARY]) == []
    assert find_canaries([tmp_path], [CANARY, "absent"]) == [(leak, CANARY)]
    assert find_canaries([leak], [CANARY, CANARY]) == [(leak, CANARY)]  # reported once


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_find_canaries_in_an_npz_string_array(tmp_path, save):
    path = tmp_path / "arrays.npz"
    save(path, names=strs("someone", CANARY), x=np.ones(3))
    if save is np.savez_compressed:
        # Compressed: the raw bytes do not hold it, so only the member scan can find it.
        data = path.read_bytes()
        assert CANARY.encode("utf-8") not in data and CANARY.encode("utf-32-le") not in data
    else:
        assert CANARY.encode("utf-32-le") in path.read_bytes()  # numpy's '<U' layout
    assert find_canaries([path], [CANARY]) == [(path, CANARY)]


def test_find_canaries_in_an_sqlite_database(tmp_path):
    path = tmp_path / "store.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, tag TEXT)")
        db.execute("INSERT INTO runs (tag) VALUES (?)", (f"user={CANARY}",))
    db.close()
    assert find_canaries([path], [CANARY]) == [(path, CANARY)]
    clean = tmp_path / "clean.db"
    with sqlite3.connect(clean) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, tag TEXT)")
        db.execute("INSERT INTO runs (tag) VALUES ('nothing here')")
    db.close()
    assert find_canaries([clean], [CANARY]) == []


def test_find_canaries_in_gzip_and_parquet(tmp_path):
    (tmp_path / "log.gz").write_bytes(gzip.compress(f"x {CANARY} y".encode() * 50))
    # No statistics: Parquet would otherwise keep the min/max value uncompressed in its footer.
    table = pa.table({"who": [CANARY] * 50})
    pq.write_table(table, tmp_path / "t.parquet", compression="gzip", write_statistics=False)
    # Both compressed: only decompressing (gzip) or reading the columns (Parquet) finds it.
    for name in ("log.gz", "t.parquet"):
        assert CANARY.encode() not in (tmp_path / name).read_bytes()
    assert find_canaries([tmp_path], [CANARY]) == [
        (tmp_path / "log.gz", CANARY),
        (tmp_path / "t.parquet", CANARY),
    ]


def test_find_canaries_refuses_a_vacuous_scan(tmp_path):
    with pytest.raises(ArtifactError, match="not found; nothing to scan"):
        find_canaries([tmp_path / "missing"], [CANARY])
    with pytest.raises(ValueError, match="empty canary"):
        find_canaries([tmp_path], [""])


def test_leaky_variant_proves_the_scan_is_not_vacuous(tmp_path):
    # Every identifier and quasi-identifier value is a distinct canary.
    n = 4
    identifiers = {c: strs(*(f"CANARY-{c}-{i}" for i in range(n))) for c in ("id", "name", "email")}
    raw = make_raw(
        identifiers,
        {
            "birth_date": ("year", strs(*(f"19{60 + i}-0{i + 1}-1{i}" for i in range(n)))),
            "postcode": ("prefix2", strs(*(f"CANARY-postcode-{i}" for i in range(n)))),
            "region": ("drop", strs(*(f"CANARY-region-{i}" for i in range(n)))),
        },
    )
    canaries = [v for values in raw.identifiers.values() for v in values.tolist()]
    canaries += [v for values in raw.quasi_identifiers.values() for v in values.tolist()]
    assert len(set(canaries)) == 6 * n
    table = anonymize(raw, AnonymizePolicy("email", "VMAPCHECK_TEST_SECRET", "id"), ENV)
    safe = tmp_path / "anonymized"
    safe.mkdir()
    np.savez(safe / "table.npz", **all_outputs(table))
    np.savez_compressed(safe / "table_compressed.npz", **all_outputs(table))
    (safe / "manifest.txt").write_text(repr(table.columns), encoding="utf-8")
    assert find_canaries([safe], canaries) == []

    leaky = tmp_path / "leaky"
    leaky.mkdir()
    np.savez(leaky / "raw.npz", **raw.identifiers, **raw.quasi_identifiers)
    hits = find_canaries([leaky], canaries)
    assert sorted(c for _, c in hits) == sorted(canaries)


def test_find_canaries_in_nested_and_damaged_archives(tmp_path):
    inner = io.BytesIO()
    np.savez_compressed(inner, names=strs(CANARY))
    with zipfile.ZipFile(tmp_path / "bundle.zip", "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("run/arrays.npz", inner.getvalue())
    # Looks like gzip but is not: still scanned as raw bytes, and the scan does not crash.
    fake = tmp_path / "fake.gz"
    fake.write_bytes(b"\x1f\x8b" + b"garbage " + CANARY.encode("utf-32-le"))
    assert find_canaries([tmp_path], [CANARY]) == [
        (tmp_path / "bundle.zip", CANARY),
        (fake, CANARY),
    ]
