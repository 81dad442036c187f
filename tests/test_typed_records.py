"""The records stages exchange are typed (issue 36): check_details.json, the forward
record and bench_details.json are written from their TypedDicts and read back against
them at every level they type, a missing key named by its path from the top."""

from __future__ import annotations

import json

import pytest

from tests.helpers.config import ROOT
from vmapcheck.bench.records import BenchDetails, read_bench_details
from vmapcheck.check.schema import CheckDetails, read_check_details, read_record
from vmapcheck.errors import ArtifactError
from vmapcheck.io import missing_keys
from vmapcheck.layout import Layout

DEMO = Layout(ROOT)


def test_the_demo_run_reads_back_into_its_types():
    check = read_check_details(DEMO.check_details)
    assert missing_keys(check, CheckDetails) == []
    assert read_record(DEMO.record)["cases"]
    bench = read_bench_details(DEMO.bench_details)
    assert missing_keys(bench, BenchDetails) == []


def _edited(tmp_path, source, edit):
    data = json.loads(source.read_text())
    edit(data)
    path = tmp_path / source.name
    path.write_text(json.dumps(data))
    return path


def test_a_key_missing_deep_in_check_details_is_named_by_its_path(tmp_path):
    def drop(data):
        del data["cases"]["standard"]["pairs"]
        del data["negative"]["invalid_nan"]["paths"]
        data["reference"] = "ok"  # an object expected

    path = _edited(tmp_path, DEMO.check_details, drop)
    with pytest.raises(ArtifactError) as caught:
        read_check_details(path)
    message = str(caught.value)
    assert str(path) in message and "rerun `dvc repro`" in message
    named = (
        "cases.standard.pairs",
        "negative.invalid_nan.paths",
        "reference (expected an object, found str)",
    )
    for where in named:
        assert where in message


def test_a_latency_cell_without_its_median_is_named(tmp_path):
    path = _edited(
        tmp_path, DEMO.bench_details, lambda d: d["latency_ms"]["vmap_jit"]["b1"].pop("p50")
    )
    with pytest.raises(ArtifactError, match=r"missing latency_ms\.vmap_jit\.b1\.p50"):
        read_bench_details(path)


def test_a_report_older_than_an_optional_key_still_reads(tmp_path):
    """Keys added later (a case's rules, the composition, the budget) are NotRequired."""

    def older(data):
        data.pop("composition", None)
        data.pop("budget", None)
        for case in data["cases"].values():
            case.pop("rules", None)
            case.pop("bound_ratio", None)

    read_check_details(_edited(tmp_path, DEMO.check_details, older))
