"""``did_you_mean``: the one "did you mean" of vmapcheck's errors (CLI commands, options
and choices, config groups' options, config keys)."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.config import ROOT
from vmapcheck.compose import compose_yaml, run_params
from vmapcheck.errors import ConfigError, did_you_mean
from vmapcheck.layout import Layout


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


# --- config groups' options and config keys, as `vmapcheck params` composes them --------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model=flax_mpl"],
            "model=flax_mpl: no model option is named flax_mpl (did you mean "
            "flax_mlp?); the options: ",
        ),
        (["bench=fulll"], "bench=fulll: no bench option is named fulll (did you mean full?)"),
        # Hydra's advice here is a "+" prefix, which the stages then refuse: not repeated.
        (
            ["precision.tolerence.rtol=1e-5"],
            "precision.tolerence: unknown key (did you mean tolerance?); precision's keys: ",
        ),
        (["modle=toy"], "modle: unknown key (did you mean model?); the top-level keys: "),
        # The keys of the option chosen by another override of the same command line.
        (
            ["model=flax_transformer", "model.factory.d_modl=16"],
            "model.factory.d_modl: unknown key (did you mean d_model?)",
        ),
    ],
)
def test_a_mistyped_option_or_key_is_named_with_the_closest(overrides, message):
    with pytest.raises(ConfigError) as refused:
        compose_yaml(ROOT / "conf", overrides)
    text = str(refused.value)
    assert text.startswith(f"overrides {overrides}: {message}"), text
    assert "+precision" not in text


def test_a_refusal_that_is_no_typo_keeps_hydras_message():
    with pytest.raises(ConfigError, match="Multiple values for model"):
        compose_yaml(ROOT / "conf", ["+model=toy"])


def test_params_refuses_a_key_added_with_a_plus_and_leaves_params_yaml_as_it_was(tmp_path):
    """Hydra's advice for a mistyped key is a "+": the key then composes, and every stage
    would refuse it. `vmapcheck params` refuses it before writing."""
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "params.yaml").write_text("as it was\n")
    with pytest.raises(ConfigError) as refused:
        run_params(Layout(tmp_path), ["+precision.tolerence.rtol=1e-5"])
    assert "precision.tolerence: unknown key" in str(refused.value)
    assert (tmp_path / "params.yaml").read_text() == "as it was\n"
    run_params(Layout(tmp_path), ["precision.tolerance.rtol=1e-5"])
    assert "rtol: 1.0e-05" in (tmp_path / "params.yaml").read_text()
