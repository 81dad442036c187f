"""How ``vmapcheck init`` writes into a repository that already holds files
(:mod:`vmapcheck.project.merge`): each file or stage classified against what init last
wrote, and the project's own params kept apart from vmapcheck's. tests/test_init.py runs
init itself on such repositories."""

from __future__ import annotations

import pytest

from vmapcheck.errors import ConfigError
from vmapcheck.project.merge import (
    EDITED,
    NEW,
    UNCHANGED,
    UPDATED,
    classify,
    digest,
    load_round_trip,
    project_params,
    stage_digest,
)

OURS = {"model", "data", "precision", "project_keys"}


@pytest.mark.parametrize(
    ("current", "recorded", "expected"),
    [
        (None, None, NEW),  # absent
        ("planned\n", None, UNCHANGED),  # already init's new text
        ("old\n", digest("old\n"), UPDATED),  # init's own old text: rewritten
        ("mine\n", digest("old\n"), EDITED),  # edited since init wrote it
        ("mine\n", None, EDITED),  # no manifest vouches for it: the user's
    ],
)
def test_a_file_is_classified_against_what_init_last_wrote(current, recorded, expected):
    assert classify(current, "planned\n", recorded) == expected


def test_a_stage_digest_ignores_comments_and_layout():
    one = load_round_trip("cmd: python x.py  # run it\ndeps: [x.py]\n", "dvc.yaml")
    two = load_round_trip("deps:\n  - x.py\ncmd: python x.py\n", "dvc.yaml")
    other = load_round_trip("cmd: python y.py\ndeps: [x.py]\n", "dvc.yaml")
    assert stage_digest(one) == stage_digest(two) != stage_digest(other)


def test_the_projects_own_params_are_kept_with_their_comments():
    text = "# my learning rate\nlr: 0.1\nlayers: [4, 4]\n"
    assert project_params(text, OURS) == (text, ["lr", "layers"])


@pytest.mark.parametrize(
    "text",
    [
        None,  # absent
        "  \n",  # empty
        "model: {name: mlp}\ndata: {}\n",  # only vmapcheck's keys
        "model: {}\nlr: 0.1\nproject_keys: [lr]\n",  # composed by vmapcheck already
    ],
)
def test_params_holding_none_of_the_projects_own_give_none(text):
    assert project_params(text, OURS) is None


def test_a_project_key_named_as_vmapchecks_is_refused_naming_both():
    with pytest.raises(
        ConfigError, match=r"holds your keys lr and keys named as vmapcheck's \(model\)"
    ):
        project_params("lr: 0.1\nmodel: mine\n", OURS)


def test_params_that_are_no_mapping_are_refused_naming_what_was_found():
    with pytest.raises(
        ConfigError, match=r"params\.yaml: expected a mapping at the top level, found list"
    ):
        project_params("- 1\n- 2\n", OURS)
