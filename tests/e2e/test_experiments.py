"""End to end: experiments with -S overrides (`dvc exp run`) in a temporary copy.

Another model, another precision and the plugged-in models (flax, equinox) each run the
whole pipeline as a DVC experiment from the committed project, in file order, as a user
would. A copy of its own, apart from tests/e2e/test_pipeline.py's: the two files run
side by side on two test workers. Nothing is mocked.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.helpers.project import FAST_RUN, committed_project, dvc_up_to_date, run

pytestmark = pytest.mark.e2e

TINY = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]


def mlflow_client(project: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")


def _details(project: Path) -> dict:
    return json.loads((project / "reports" / "check_details.json").read_text())


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return committed_project(tmp_path_factory.mktemp("vmapcheck-exp") / "repo", *TINY)


def test_exp_run_with_overrides_appears_in_exp_show(project):
    tiny = [arg for override in TINY for arg in ("-S", override)]
    run(project, "dvc", "exp", "run", "-n", "toy-exp", "-S", "model=toy", *tiny)
    params = (project / "params.yaml").read_text()
    assert "name: toy" in params and "in_features: 3" in params
    run(project, "dvc", "exp", "run", "-n", "f64-exp", "-S", "precision=f64", *tiny)
    table = run(project, "dvc", "exp", "show", "--csv").stdout
    rows = {row["Experiment"]: row for row in csv.DictReader(io.StringIO(table))}
    assert {"toy-exp", "f64-exp"} <= set(rows)
    for name in ("toy-exp", "f64-exp"):
        # The metrics are readable for each experiment (committed, not just cached).
        assert rows[name]["passed"] == "True" and rows[name]["n_failures"] == "0", rows[name]
    assert rows["f64-exp"]["precision.dtype"] == "float64"
    # The workspace holds the last experiment (f64): compared with the float32 reference.
    reference = _details(project)["reference"]
    assert reference["made_with"]["dtype"] == "float32"
    assert reference["compared_with"]["dtype"] == "float64" and reference["passed"]
    assert rows["toy-exp"]["model.in_features"] == "3"
    client = mlflow_client(project)
    # One experiment for every model (tracking.experiment), told apart by the tag model.
    runs = client.search_runs([client.get_experiment_by_name("vmapcheck").experiment_id])
    names = {r.data.tags["precision"] + "/" + r.data.tags["model"] for r in runs}
    assert {"f32/toy", "f64/mlp"} <= names
    # DVC names each experiment's stages (DVC_EXP_NAME): the run carries the name.
    exp_names = {r.data.tags.get("dvc_exp_name") for r in runs}
    assert {"toy-exp", "f64-exp"} <= exp_names


@pytest.mark.parametrize(
    "model,direct", [("flax_mlp", True), ("equinox_mlp", False)], ids=["flax", "equinox"]
)
def test_a_plugged_in_model_runs_the_whole_pipeline(project, model, direct):
    pytest.importorskip(model.split("_")[0])
    tiny = [arg for override in TINY for arg in ("-S", override)]
    run(project, "dvc", "exp", "run", "-n", f"{model}-exp", "-S", f"model={model}", *tiny)
    details = _details(project)
    assert details["passed"], details["failures"]
    assert details["reference"]["status"] == "ok" and details["reference"]["passed"]
    assert details["gradients"]["passed"]
    if direct:
        assert details["not_provided"] == {}
    else:  # reported as not provided, never faked
        assert set(details["not_provided"]) == {"direct_eager", "direct_jit"}
        assert "direct_jit" not in details["cases"]["standard"]["contract"]
    track = json.loads((project / "reports" / "track.json").read_text())
    run_ = mlflow_client(project).get_run(track["run_id"])
    tags = run_.data.tags
    assert tags["model"] == model and tags["verdict"] == "passed"
    assert tags["contract.features"] == ",".join(f"x{i}" for i in range(8))
    assert tags["contract.batched_forward"] == str(direct).lower()
    artifacts = {a.path for a in mlflow_client(project).list_artifacts(track["run_id"])}
    assert "contract.json" in artifacts


def test_a_dict_input_model_from_the_docs_runs_end_to_end_and_its_code_is_a_dependency(project):
    # docs/own-model.md's two-tower model (vmapcheck/examples/two_tower.py): one example is
    # {"body": (2,), "serum": (6,)}, on the bundled diabetes table.
    fast = [arg for override in ("data.standard_batch=8", *FAST_RUN) for arg in ("-S", override)]
    run(project, "dvc", "exp", "run", "-n", "two-tower-exp", "-S", "model=two_tower",
        "-S", "data=diabetes", *fast)  # fmt: skip
    details = _details(project)
    assert details["passed"], details["failures"]
    assert details["reference"]["status"] == "ok" and details["reference"]["passed"]
    assert details["cases"]["standard"]["shape"] == {"body": [8, 2], "serum": [8, 6]}
    negative = details["negative"]
    for name in ("invalid_body_dtype", "invalid_serum_nan", "invalid_missing_leaf"):
        assert negative[name]["passed"], negative[name]
    contract = json.loads((project / "data" / "params" / "contract.json").read_text())
    assert [leaf["leaf"] for leaf in contract["inputs"]["leaves"]] == ["body", "serum"]
    track = json.loads((project / "reports" / "track.json").read_text())
    assert mlflow_client(project).get_run(track["run_id"]).data.tags["verdict"] == "passed"
    # A shipped example is code of every stage that runs a model: once the code stage
    # has recorded an edit of it, they are stale, and prepare and track are not.
    with (project / "src" / "vmapcheck" / "examples" / "two_tower.py").open("a") as module:
        module.write("\n# an edit\n")
    run(project, "dvc", "repro", "--single-item", "code")
    stale = dvc_up_to_date(project)
    assert set(stale) == {"train", "forward", "check", "bench"}, stale
