"""End to end: nothing personal leaves `prepare`, and a bad user file leaves nothing behind.

A CSV with canary values planted in every identifier and quasi-identifier column goes
through the real pipeline (join key pseudonymized with a secret from the environment);
then every file under data/ (but the raw input), reports/, the MLflow store, its
artifacts and DVC's cache is searched for the canaries and the secret.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.helpers.project import (
    FAST_REPLAY_REQUESTS,
    FAST_RUN,
    commit_all,
    compose_params,
    copy_project,
    planted,
    run,
)
from vmapcheck.data.anonymize import find_canaries
from vmapcheck.data.builtin import synthetic_raw_table, write_csv
from vmapcheck.guard.replay import REQUEST_CANARY

pytestmark = pytest.mark.e2e

SECRET = "e2e-secret-7d1f0c9a5b3e"
CANARIES = {
    "id": "CANARY-ID-31337",
    "name": "Zyzzogeton Canarius",
    "email": "zyzzogeton.canarius@example.invalid",
    "phone": "+1-202-555-0137",
    "birth_date": "1901-02-03",
    # Letters in every canary: a digits-only one (a postcode like 97999) turns up by
    # chance inside benchmark figures (0.0297999...) and would be a false alarm.
    "postcode": "QZ7K9",
}
CSV_OVERRIDES = [
    # Plant guard.REQUEST_CANARY in every request the bench replays through the guard.
    "guard.replay.plant_canary=true",
    "data=csv",
    "data.path=data/raw/canary.csv",
    "data.anonymize.join_key=id",
    "data.standard_batch=8",
    *FAST_RUN,
]


def compose(project: Path, *overrides: str) -> None:
    compose_params(project, *CSV_OVERRIDES, *overrides)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    dest = copy_project(tmp_path_factory.mktemp("privacy") / "repo")
    raw = synthetic_raw_table(
        jax.random.key(7), 240, 8, 2, 0.1, {"birth_date": "year", "postcode": "prefix2"}
    )
    # Every tenth row is the canary person; the same id makes it one record.
    for column, value in CANARIES.items():
        table = raw.identifiers if column in raw.identifiers else raw.quasi_identifiers
        values = table[column].astype(object)  # fixed-width strings would truncate
        values[::10] = value
        table[column] = values.astype(str)
    write_csv(dest / "data" / "raw" / "canary.csv", raw)
    compose(dest)
    commit_all(dest)
    return dest


def _scanned(project: Path) -> list[Path]:
    places = [p for p in (project / "data").iterdir() if p.name != "raw"]
    places += [
        project / "reports",
        project / "mlflow.db",
        project / "mlartifacts",
        project / ".dvc" / "cache",
    ]
    return [p for p in places if p.exists()]


def _files(places: list[Path]) -> list[Path]:
    """Every file under ``places``, but the project's own source code that the registered
    model packages (``.../artifacts/code/``): it defines the request canary itself."""
    return [
        f
        for p in places
        for f in ([p] if p.is_file() else p.rglob("*"))
        if f.is_file() and not _is_packaged_code(f)
    ]


def _is_packaged_code(path: Path) -> bool:
    parts = path.parts
    return any(parts[i : i + 2] == ("artifacts", "code") for i in range(len(parts) - 1))


def test_no_canary_or_secret_reaches_any_output(project):
    result = run(project, "dvc", "repro", env={"VMAPCHECK_PSEUDONYM_SECRET": SECRET})
    assert "id: pseudonymized (HMAC-SHA256)" in result.stdout
    assert (project / "mlflow.db").exists() and (project / "reports" / "track.json").exists()
    # The canaries are really in the input the pipeline read...
    assert len(find_canaries([project / "data" / "raw"], CANARIES.values())) == len(CANARIES)
    # ...and in nothing it wrote.
    assert find_canaries(_files(_scanned(project)), [*CANARIES.values(), SECRET]) == []
    # Nor does any value of a request served by the guard: as text (any rounding of the
    # float32 value starts so) or as the float32 itself.
    assert find_canaries(_files(_scanned(project)), ["123456.7"]) == []
    float32 = np.float32(REQUEST_CANARY).tobytes()
    hits = [p for p in _files(_scanned(project)) if float32 in p.read_bytes()]
    assert hits == []
    replay = json.loads((project / "reports" / "bench_details.json").read_text())["replay"]
    assert replay["requests"] == FAST_REPLAY_REQUESTS and replay["figures"]["passed"] == 1.0
    manifest = (project / "data" / "prepared" / "manifest.json").read_text()
    assert '"action": "dropped"' in manifest and "VMAPCHECK_PSEUDONYM_SECRET" in manifest


def test_a_file_missing_a_feature_column_stops_prepare_and_leaves_no_outputs(project):
    source = (project / "data" / "raw" / "canary.csv").read_text().splitlines()
    header = source[0].split(",")
    drop = header.index("x3")
    broken = [",".join(v for i, v in enumerate(line.split(",")) if i != drop) for line in source]
    (project / "data" / "raw" / "broken.csv").write_text("\n".join(broken) + "\n")
    compose(project, "data.path=data/raw/broken.csv")
    try:
        result = run(
            project, "dvc", "repro", check=False, env={"VMAPCHECK_PSEUDONYM_SECRET": SECRET}
        )
    finally:
        compose(project)
        (project / "data" / "raw" / "broken.csv").unlink()
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "prepare: error:" in output and "'x3'" in output and "broken.csv" in output
    assert not (project / "data" / "prepared").exists()
    assert not (project / "data" / "cases").exists()
    assert not list((project / "data").glob(".prepared*")) and not list(
        (project / "data").glob(".cases*")
    )


def test_a_leaky_variant_is_caught_by_the_same_scan(project):
    # Keep the join key's raw values instead of pseudonyms: a deliberate leak.
    with planted(
        project / "src" / "vmapcheck" / "data" / "anonymize.py",
        "join_keys = _pseudonyms(raw.identifiers[column], policy.secret_env, environ)",
        "join_keys = raw.identifiers[column].astype(str)",
    ):
        run(project, "dvc", "repro", check=False, env={"VMAPCHECK_PSEUDONYM_SECRET": SECRET})
        hits = find_canaries(_files(_scanned(project)), CANARIES.values())
    assert {canary for _, canary in hits} == {CANARIES["id"]}
    assert any("prepared" in str(path) for path, _ in hits)
