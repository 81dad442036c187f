"""``did_you_mean``: the one "did you mean" of vmapcheck's errors (CLI commands, options
and choices, config groups' options, config keys)."""

from __future__ import annotations

import pytest

from vmapcheck.errors import did_you_mean


@pytest.mark.parametrize(
    ("name", "known", "hint"),
    [
        ("comapre", ["compare", "promote", "params"], " (did you mean compare?)"),
        ("--verison", ["--version", "--help"], " (did you mean --version?)"),
        ("flax_mpl", ["flax_mlp", "flax_cnn", "mlp", "mlp_slow"], " (did you mean flax_mlp?)"),
        ("tolerence", ["tolerance", "dtype", "enable_x64"], " (did you mean tolerance?)"),
        # A different case only.
        ("MLP", ["mlp", "toy"], " (did you mean mlp?)"),
        # Two about as close: both named, none guessed.
        ("digit", ["digits", "digit_tokens", "diabetes"], " (did you mean digits?)"),
        ("--rot", ["--root", "--rots"], " (did you mean --root or --rots?)"),
    ],
)
def test_the_closest_known_name_is_suggested(name, known, hint):
    assert did_you_mean(name, known) == hint


@pytest.mark.parametrize(
    ("name", "known"),
    [
        # Nothing close: no guess.
        ("xyz", ["mlp", "toy"]),
        # The dashes every option shares do not make two options close.
        ("--bogus", ["--out", "--baseline", "--root"]),
        # A known name is no typo.
        ("mlp", ["mlp", "mlp_slow"]),
        ("anything", []),
    ],
)
def test_no_suggestion_when_nothing_is_close(name, known):
    assert did_you_mean(name, known) == ""
