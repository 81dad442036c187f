"""A forward that samples through the whole pipeline, in-process (marker ``stages``).

The MC dropout example (``model=mc_dropout``, ``Model(stochastic=True)``) runs prepare,
train, forward, check, bench and track: every stage gives each row its own key, and the
correct model passes with the float64 oracle "not judged". The same model with the
shared-key bug planted (``model.factory.shared_key=true``: ``forward_batch`` draws every
row from ``keys[0]``) fails the check, saying that the rows share their randomness.
"""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import (
    STAGES,
    inputs_repository,
    judge_planted,
    run_stage,
    write_params,
)
from tests.helpers.project import FAST_RUN, commit_all
from vmapcheck.check.rules import SHARED_RANDOMNESS
from vmapcheck.check.schema import read_check_details, read_record
from vmapcheck.layout import Layout

pytestmark = pytest.mark.stages

MODEL = ("model=mc_dropout", "data.n_rows=240", "data.standard_batch=8")


@pytest.fixture(scope="module")
def correct(tmp_path_factory) -> tuple[Layout, dict[str, int]]:
    root = tmp_path_factory.mktemp("mc_dropout")
    inputs_repository(root)
    write_params(root, *MODEL, "backend.num_devices=2", *FAST_RUN)
    commit_all(root, "mc_dropout inputs")
    codes = {name: run_stage(root, name) for name in STAGES}
    return Layout(root), codes


def test_every_stage_runs_a_stochastic_model(correct):
    _, codes = correct
    assert codes == dict.fromkeys(STAGES, 0)


def test_the_correct_sampler_passes_and_the_oracle_is_not_judged(correct):
    layout, _ = correct
    details = read_check_details(layout.check_details)
    assert details["passed"], details["failures"]
    # Its masks are drawn in float32: the float64 oracle repeats them and judges it.
    assert details["oracle"] == "float64 (CPU)"
    assert all(r["passed"] for r in details["cases"]["standard"]["oracle"].values())
    rules = details["cases"]["duplicate_rows"]["rules"]
    assert set(rules) == {"copies_differ"} and rules["copies_differ"]["passed"]
    record = read_record(layout.record)
    assert record["keys"]["stream"] == "forward"


def test_the_shared_key_bug_fails_saying_the_rows_share_their_randomness(tmp_path):
    layout = judge_planted(tmp_path / "shared", *MODEL, "model.factory.shared_key=true")
    details = read_check_details(layout.check_details)
    assert not details["passed"]
    shared = [f for f in details["failures"] if SHARED_RANDOMNESS in f]
    assert shared and all(f.startswith("duplicate_rows/direct_") for f in shared), shared
    # The oracle gives row i its own key, as the loop does: it also names direct.
    assert any(f.startswith("standard/direct_jit vs float64 oracle") for f in details["failures"])
