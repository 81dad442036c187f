"""Hydra composition, params.yaml, and validation errors that name the key."""

import itertools

import pytest
import yaml

from tests.helpers.config import PACKAGE_CONF, ROOT, compose_config
from vmapcheck.bench.timing.budget import early_stops
from vmapcheck.compose import compose_yaml
from vmapcheck.config import load_config, validate_config
from vmapcheck.errors import ConfigError


def test_committed_params_yaml_is_the_composition_of_the_defaults():
    committed = (ROOT / "params.yaml").read_text(encoding="utf-8")
    assert committed == compose_yaml(ROOT / "conf"), (
        "params.yaml differs from conf/'s defaults: run `make params` and commit it"
    )


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (PACKAGE_CONF / group).glob("*.yaml"))


def test_required_groups_and_options_exist():
    assert {"toy", "mlp"} <= set(_group_options("model"))
    assert {"cpu", "gpu", "tpu"} <= set(_group_options("backend"))
    assert {"f32", "f64", "bf16"} <= set(_group_options("precision"))
    assert {"quick", "full"} <= set(_group_options("bench"))
    assert {"local"} <= set(_group_options("tracking"))
    assert {"default", "images"} <= set(_group_options("guard"))
    assert {"default"} <= set(_group_options("budget"))


# The options a model needs besides the defaults: the resnet's 12 KiB examples outgrow
# the default guard's byte limit for a full batch (conf/guard/images.yaml raises it).
COMPANIONS = {"resnet": ("data=images32", "guard=images")}


@pytest.mark.parametrize(
    "model,precision,bench,backend",
    list(
        itertools.product(
            _group_options("model"),
            _group_options("precision"),
            _group_options("bench"),
            _group_options("backend"),
        )
    ),
)
def test_every_combination_of_options_composes_and_validates(model, precision, bench, backend):
    config = compose_config(
        f"model={model}",
        f"precision={precision}",
        f"bench={bench}",
        f"backend={backend}",
        *COMPANIONS.get(model, ()),
    )
    assert config.model.name == model
    assert config.precision.name == precision
    assert config.data.n_features == config.model.in_features


def _raw():
    return yaml.safe_load(compose_yaml(ROOT / "conf"))


def _error(raw) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    return str(info.value)


def test_unknown_key_is_named():
    raw = _raw()
    raw["bench"]["repeat"] = 10  # typo of "repeats"
    message = _error(raw)
    assert "bench.repeat: unknown key" in message


def test_wrong_type_is_named_with_what_was_found():
    raw = _raw()
    raw["train"]["steps"] = "many"
    message = _error(raw)
    assert "train.steps" in message and "'many'" in message


def test_zero_batch_size_is_refused():
    raw = _raw()
    raw["bench"]["batch_sizes"] = [0, 16]
    message = _error(raw)
    assert "bench.batch_sizes[0]" in message and "greater than 0" in message


def test_unknown_backend_is_refused():
    raw = _raw()
    raw["backend"]["name"] = "quantum"
    message = _error(raw)
    # The options are the shipped files (vmapcheck.config.conf_options).
    shipped = ", ".join(_group_options("backend"))
    assert f"backend.name: expected one of {shipped} (the files of vmapcheck/conf/backend/)" in (
        message
    )
    assert "found 'quantum'" in message


def test_missing_key_is_named():
    raw = _raw()
    del raw["precision"]["tolerance"]["atol"]
    assert "precision.tolerance.atol: required key is missing" in _error(raw)


@pytest.mark.parametrize("group", ["tolerance", "cross_run_tolerance"])
def test_the_tolerance_scale_is_validated_and_named(group):
    raw = _raw()
    assert raw["precision"][group]["scale"] == "terms"  # the default, from conf/precision
    raw["precision"][group]["scale"] = "result"
    message = _error(raw)
    assert f"precision.{group}.scale" in message
    assert "'terms' or 'output'" in message and "found 'result'" in message


def test_every_precision_judges_by_the_terms_and_logs_the_rule():
    from vmapcheck.config import flatten

    for precision in _group_options("precision"):
        config = compose_config(f"precision={precision}")
        assert config.precision.tolerance.scale == "terms", precision
        assert config.precision.cross_run_tolerance.scale == "terms", precision
        assert flatten(config)["precision.tolerance.scale"] == "terms"
    by_output = compose_config("precision.tolerance.scale=output")
    assert by_output.precision.tolerance.scale == "output"


def test_float64_without_x64_is_impossible():
    raw = _raw()
    raw["precision"]["dtype"] = "float64"
    assert "enable_x64" in _error(raw)


def test_feature_count_must_match_the_model():
    raw = _raw()
    raw["data"]["n_features"] = raw["model"]["in_features"] + 1
    assert "data.n_features" in _error(raw)


def test_toy_model_is_fixed():
    raw = yaml.safe_load(compose_yaml(ROOT / "conf", ["model=toy"]))
    raw["model"]["hidden"] = [4]
    assert "model 'toy' is the seed's fixed model" in _error(raw)


def linear_model(in_features: int, out_features: int):
    """A user's model that takes no hidden widths (the factory of the test below)."""
    import jax.numpy as jnp

    from vmapcheck.core.models import Model

    return Model(
        name="linear",
        in_features=in_features,
        out_features=out_features,
        forward_one=lambda params, x: x @ params["W"],
        init=lambda key: {"W": jnp.zeros((in_features, out_features), jnp.float32)},
    )


def test_a_model_that_does_not_use_hidden_may_leave_it_out():
    from vmapcheck.core.models import build_model

    config = compose_config(
        "model=flax_mlp",
        "model.name=linear",
        "model.factory._target_=tests.test_config.linear_model",
        "~model.factory.hidden",
        "~model.hidden",
    )
    assert config.model.hidden is None and config.model.factory == {
        "_target_": "tests.test_config.linear_model",
        "in_features": 8,
        "out_features": 2,
    }
    assert build_model(config.model).in_features == 8
    toy = yaml.safe_load(compose_yaml(ROOT / "conf", ["model=toy", "~model.hidden"]))
    assert validate_config(toy).model.hidden is None  # toy reads none either


def test_the_builtin_mlp_says_it_needs_hidden():
    raw = _raw()
    assert raw["model"]["name"] == "mlp"
    del raw["model"]["hidden"]
    message = _error(raw)
    assert "model.hidden: " in message
    assert "expected the hidden layer widths of the built-in model 'mlp'" in message
    assert "found None" in message
    raw["model"]["hidden"] = None
    assert "model.hidden: " in _error(raw)


def test_the_diabetes_table_fits_the_default_mlp_with_one_output():
    config = compose_config("data=diabetes", "model.out_features=1")
    assert config.data.source == "diabetes" and config.model.name == "mlp"
    assert config.data.quasi_identifiers == {"age": "band10", "sex": "drop"}
    assert config.data.n_features == config.model.in_features == 8
    assert config.data.n_targets == config.model.out_features == 1
    assert config.data.anonymize.join_key is None and config.data.anonymize.group_by is None
    # Without the override, the default mlp's two outputs do not fit the one target.
    raw = yaml.safe_load(compose_yaml(ROOT / "conf", ["data=diabetes"]))
    message = _error(raw)
    assert "data.targets gives 1 targets but model.out_features=2" in message
    raw["data"]["quasi_identifiers"]["age"] = "decile"
    message = _error(raw)
    assert "quasi_identifiers.age: " in message and "'band10'" in message
    assert "found 'decile'" in message


def test_the_documented_diabetes_run_composes():
    """docs/regression-set.md's first run of the default mlp on the diabetes table."""
    import re

    from vmapcheck.check.reference import reference_dir
    from vmapcheck.layout import Layout

    docs = (ROOT / "docs" / "regression-set.md").read_text(encoding="utf-8")
    command = re.search(r"dvc exp run -S data=diabetes[^`]*", docs).group(0)
    overrides = re.findall(r"-S (\S+)", command)
    assert overrides[0] == "data=diabetes" and "model.out_features=1" in overrides
    config = compose_config(*overrides)
    assert config.model.name == "mlp" and config.model.out_features == 1
    assert reference_dir(config, Layout(ROOT)) == ROOT / "data/reference/diabetes/mlp"
    assert config.registry.registered_model != compose_config().registry.registered_model


def test_missing_or_broken_params_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"params\.yaml: not found"):
        load_config(tmp_path / "params.yaml")
    broken = tmp_path / "params.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


@pytest.mark.parametrize(
    "key,value,expected",
    [
        (
            "buckets",
            [1, 8, 8, 64],
            "guard.buckets must be strictly increasing, found [1, 8, 8, 64]",
        ),
        ("buckets", [0, 8], "guard.buckets[0]: Input should be greater than 0"),
        ("buckets", [], "guard.buckets: List should have at least 1 item"),
        ("max_batch", 2048, "guard.max_batch=2048 exceeds the largest bucket"),
        ("latency_edges_ms", [1.0, 0.5], "guard.latency_edges_ms must be strictly increasing"),
        ("max_request_bytes", 1000, "guard.max_request_bytes=1000 is below one valid request"),
        ("bucket", [1], "guard.bucket: unknown key"),
    ],
)
def test_impossible_guard_settings_are_named(key, value, expected):
    raw = _raw()
    raw["guard"][key] = value
    assert expected in _error(raw)


def test_the_guard_replay_is_validated():
    raw = _raw()
    raw["guard"]["replay"]["unbucketed_requests"] = raw["guard"]["replay"]["n_requests"] + 1
    assert "guard.replay.unbucketed_requests" in _error(raw)
    raw = _raw()
    raw["guard"]["replay"]["invalid_share"] = 1.0
    assert "guard.replay.invalid_share: Input should be less than 1" in _error(raw)
    raw = _raw()
    raw["guard"]["replay"]["plant_canary"] = "yes"
    assert "guard.replay.plant_canary" in _error(raw)


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("experiment_per_model", "yes", "tracking.experiment_per_model: Input should be a valid"),
        ("experiment", "my runs", "tracking.experiment: String should match pattern"),
        ("experiment", "x' or name LIKE '%", "tracking.experiment: String should match pattern"),
        ("experiment", "", "tracking.experiment: String should match pattern"),
    ],
)
def test_the_experiment_naming_is_validated(key, value, expected):
    raw = _raw()
    raw["tracking"][key] = value
    assert expected in _error(raw)
    del raw["tracking"][key]
    assert f"tracking.{key}: required key is missing" in _error(raw)


def test_one_experiment_for_all_or_one_per_model():
    from vmapcheck.tracking.store import experiment_name

    assert experiment_name(compose_config("model=toy")) == "vmapcheck"
    assert experiment_name(compose_config("model=mlp")) == "vmapcheck"
    own = compose_config("model=toy", "tracking.experiment_per_model=true")
    assert experiment_name(own) == "vmapcheck-toy"


def _composed_error(*overrides: str) -> str:
    """The ConfigError of params.yaml as ``dvc exp run -S <overrides>`` composes it."""
    return _error(yaml.safe_load(compose_yaml(ROOT / "conf", list(overrides))))


@pytest.mark.parametrize("group", ["tolerance", "cross_run_tolerance"])
@pytest.mark.parametrize("key,value", [("rtol", "inf"), ("atol", "inf"), ("rtol", "nan")])
def test_every_tolerance_must_be_finite(group, key, value):
    # rtol=inf used to pass, then every check failed with "|a-b|=0 > ... = nan".
    message = _composed_error(f"precision.{group}.{key}={value}")
    assert f"precision.{group}.{key}: Input should be a finite number, found {value}" in message


@pytest.mark.parametrize(
    "uri,expected",
    [
        (
            "ftp://127.0.0.1/x",
            "tracking.tracking_uri: expected sqlite:///<path> (tracking=local) or the http:// "
            "or https:// URL of an MLflow tracking server (tracking=server), not scheme 'ftp', "
            "found 'ftp://127.0.0.1/x'",
        ),
        (
            "/some/folder",
            "tracking.tracking_uri: a folder or file is MLflow's file store (in maintenance "
            "mode, not supported here): use sqlite:///<path>/mlflow.db, e.g. "
            "sqlite:////some/folder/mlflow.db, found '/some/folder'",
        ),
        ("file:///srv/runs", "e.g. sqlite:////srv/runs/mlflow.db, found 'file:///srv/runs'"),
        ("mlruns", "e.g. sqlite:///mlruns/mlflow.db, found 'mlruns'"),
        ("postgresql://h/db", "not scheme 'postgresql'"),
        ("sqlite:///", "tracking.tracking_uri: expected sqlite:///<path to a .db file>"),
    ],
)
def test_a_tracking_uri_mlflow_cannot_use_here_is_refused_naming_the_key(uri, expected):
    assert expected in _composed_error(f"tracking.tracking_uri={uri}")


def test_the_stores_mlflow_supports_here_are_accepted():
    assert compose_config("tracking.tracking_uri=sqlite:////tmp/x/m.db").tracking.name == "local"
    server = compose_config("tracking=server", "tracking.tracking_uri=https://mlflow.example")
    assert server.tracking.tracking_uri == "https://mlflow.example"
    # A server URL still needs tracking=server (the check it had before).
    assert "use tracking=server" in _composed_error("tracking.tracking_uri=http://h:5000")


@pytest.mark.parametrize("data", ["synthetic", "digits"])
def test_a_split_that_does_not_sum_to_one_names_the_key_of_params_yaml(data):
    message = _composed_error(f"data={data}", "data.split.train=0.9")
    # Not data.synthetic.split (pydantic's union tag), and no stray ", found a mapping".
    assert message.splitlines()[1] == "  data.split: split fractions must sum to 1, found 1.2"


def test_a_message_of_our_own_validators_ends_without_the_section_found():
    message = _composed_error("guard.max_batch=2048")
    assert message.splitlines()[1].startswith("  guard: guard.max_batch=2048 exceeds")
    assert "Value error" not in message and "found a mapping" not in message


@pytest.mark.parametrize("stage", ["prepare", "train", "forward", "check", "bench", "track"])
def test_every_stage_refuses_an_unknown_key_at_its_start(stage, tmp_path, capsys):
    """`-S +foo=1`: whichever stage DVC runs first refuses it before doing any work."""
    from tests.helpers.inprocess import run_stage

    (tmp_path / "params.yaml").write_text(compose_yaml(ROOT / "conf", ["+foo=1"]))
    assert run_stage(tmp_path, stage) == 2
    err = capsys.readouterr().err
    assert f"{stage}: error: invalid configuration in " in err
    assert "  foo: unknown key (found value 1)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["data.source=xyz"],
            "  data.source: expected one of 'synthetic', 'csv', 'diabetes', 'digits', "
            "'digit_tokens', found 'xyz'",
        ),
        (["~data.source"], "  data.source: required key is missing"),
    ],
)
def test_the_kind_of_table_is_named_by_its_key_not_the_section(overrides, expected):
    # pydantic reports a tagged union's tag on the whole section, whose input is a mapping.
    message = _composed_error(*overrides)
    assert message.splitlines()[1:] == [expected]
    assert "found a mapping" not in message


def test_a_long_value_found_is_cut_and_a_mapping_named_by_its_kind():
    raw = _raw()
    raw["bench"]["batch_sizes"] = list(range(-1, 5000))
    raw["extra_section"] = {"a": {"b": 1}}
    message = _error(raw)
    assert "  extra_section: unknown key (found a mapping)" in message
    [line] = [x for x in message.splitlines() if x.startswith("  bench.batch_sizes[0]")]
    assert line.endswith("found -1")
    assert len(max(message.splitlines(), key=len)) < 200


def test_a_top_level_that_is_no_mapping_names_its_type():
    assert _error([1, 2]) == "params.yaml: expected a mapping at the top level, found list"


def test_the_first_stage_always_runs_and_refuses_a_mistyped_key_with_a_suggestion(tmp_path, capsys):
    """Any edit of params.yaml (`-S +precision.tolerence.rtol=1e-5`, declared by no
    stage) is validated whole by the code stage: the first, always run (no stage
    depends on params.yaml as a whole), it refuses the key with the one it was meant to
    be, before prepare and before the run is marked; the e2e
    test_an_unknown_key_is_refused_by_the_first_stage_before_prepare runs it in DVC."""
    from vmapcheck.project.code import run

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert next(iter(stages)) == "code" and stages["code"]["always_changed"] is True
    assert not [name for name, s in stages.items() if "params.yaml" in s.get("deps", [])]
    (tmp_path / "params.yaml").write_text(
        compose_yaml(ROOT / "conf", ["+precision.tolerence.rtol=1e-5"])
    )
    assert run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "code: error: invalid configuration in " in err
    assert (
        "  precision.tolerence: unknown key (found a mapping) "
        "(did you mean precision.tolerance?)" in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


@pytest.mark.parametrize(
    "key,meant",
    [
        ("seedd", "seed"),
        ("data.splitt", "data.split"),
        ("tracking.tracking_urii", "tracking.tracking_uri"),
        ("bench.early_stop.paired_look", "bench.early_stop.paired_looks"),
    ],
)
def test_an_unknown_key_names_the_closest_known_key_at_its_level(key, meant):
    from vmapcheck.config.load import known_keys

    raw = _raw()
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = 1
    assert meant in known_keys(key, raw)
    assert f"  {key}: unknown key (found value 1) (did you mean {meant}?)" in _error(raw)


def test_a_key_like_no_known_one_gets_no_suggestion():
    raw = _raw()
    raw["precision"]["zzzz"] = 1
    line = next(x for x in _error(raw).splitlines() if "zzzz" in x)
    assert line == "  precision.zzzz: unknown key (found value 1)"


@pytest.mark.parametrize(
    "override,expected",
    [
        ("model.nonexistent=1", "model.nonexistent: unknown key; model's keys: name, "),
        ("model=nope", "model=nope: no model option is named nope; the options: "),
        ("model.in_features=[1", "no viable alternative at input"),
    ],
)
def test_an_override_hydra_cannot_apply_is_a_config_error_naming_it(override, expected):
    # `vmapcheck params <override>` used to end in Hydra's traceback.
    with pytest.raises(ConfigError) as info:
        compose_yaml(ROOT / "conf", [override])
    assert str(info.value).startswith(f"overrides [{override!r}]: ")
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "min_rounds",
            11,
            "bench.early_stop.min_rounds: Input should be less than or equal to 10, found 11",
        ),
        (
            "min_rounds",
            1,
            "bench.early_stop.min_rounds: Input should be greater than or equal to 2, found 1",
        ),
        ("ci_target", 0.0, "bench.early_stop.ci_target: Input should be greater than 0, found 0.0"),
        (
            "time_budget_s",
            -5,
            "bench.early_stop.time_budget_s: Input should be greater than 0, found -5",
        ),
        (
            "paired_looks",
            0,
            "bench.early_stop.paired_looks: Input should be greater than or equal to 1, found 0",
        ),
        ("look", 4, "bench.early_stop.look: unknown key (found value 4)"),
    ],
)
def test_early_stop_settings_are_validated_and_named(key, value, expected):
    raw = _raw()
    raw["bench"]["early_stop"][key] = value
    assert expected in _error(raw)


def test_early_stop_without_a_budget_and_its_absence():
    raw = _raw()
    raw["bench"]["early_stop"]["time_budget_s"] = None
    assert validate_config(raw).bench.early_stop.time_budget_s is None
    del raw["bench"]["early_stop"]
    assert "bench.early_stop: required key is missing" in _error(raw)


def test_min_rounds_beyond_the_rounds_of_few_repeats_is_valid_and_takes_every_round():
    """``-S bench.repeats=6`` alone is a valid run of six rounds, none stopped early
    (vmapcheck.bench.timing.budget.early_stops never stops before min_rounds), rather than an
    error that asks for a second override."""
    raw = _raw()
    raw["bench"]["repeats"] = 6  # six rounds of one sample
    raw["bench"]["early_stop"]["min_rounds"] = 8
    raw["bench"]["early_stop"]["time_budget_s"] = 1e-6  # spent at once
    bench = validate_config(raw).bench
    medians = {"cell": [1.0] * 5}
    assert early_stops(medians, {"cell": 1.0}, 5, 6, 10.0, bench.early_stop, 0.95) == {}


def test_the_projects_own_keys_are_left_to_it_and_never_shadow_vmapchecks():
    """project_keys (written by init when it joins a project): those top-level keys are
    the project's, not validated; an unknown key elsewhere is still refused, with the hint."""
    raw = _raw()
    raw["lr"], raw["project_keys"] = 0.01, ["lr"]
    assert validate_config(raw).project_keys == ["lr"]
    raw["epochs"] = 3
    message = _error(raw)
    assert "  epochs: unknown key (found value 3) (a key of your project's own" in message
    assert "list it in project_keys, conf/config.yaml" in message
    raw = _raw()
    raw["project_keys"] = ["seed"]
    assert "project_keys: seed is vmapcheck's own key" in _error(raw)
    raw["project_keys"] = "lr"
    assert "project_keys: expected a list of the project's own top-level keys" in _error(raw)


def test_a_tracking_uri_with_credentials_is_refused_without_showing_them():
    raw = _raw()
    raw["tracking"]["tracking_uri"] = "http://alice:s3cret@127.0.0.1:5000"
    message = _error(raw)
    assert "tracking.tracking_uri: a user or password in the URL" in message
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in message
    assert "s3cret" not in message and "alice" not in message
    assert "found 'http://***@127.0.0.1:5000'" in message


@pytest.mark.parametrize("key", ["tolerance", "cross_run_tolerance"])
@pytest.mark.parametrize("which", ["rtol", "atol"])
def test_a_tolerance_too_loose_to_detect_a_mistake_is_refused(key, which):
    """`-S precision.tolerance.rtol=1e300` used to pass every mistake (and overflow)."""
    raw = _raw()
    raw["precision"][key][which] = 1e300
    message = _error(raw)
    assert f"precision.{key}.{which}: Input should be less than or equal to 0.1" in message
    raw["precision"][key][which] = 0.1
    validate_config(raw)


# --- issue 45: values that passed validation and failed (or misled) after the work ------


def test_a_seed_past_32_bits_is_refused_naming_the_key_and_its_range():
    with pytest.raises(ConfigError, match=r"seed: expected an integer from 0 to 4294967295"):
        compose_config("seed=18446744073709551616")
    with pytest.raises(ConfigError, match=r"guard\.replay\.seed: expected an integer from 0"):
        compose_config("guard.replay.seed=4294967296")
    assert compose_config("seed=4294967295").seed == 2**32 - 1


def test_a_learning_rate_below_float32s_smallest_normal_is_refused():
    import numpy as np

    from vmapcheck.config.run import MIN_LEARNING_RATE

    assert float(np.finfo(np.float32).tiny) == MIN_LEARNING_RATE
    for rate in ("1e-320", "1e-39"):
        with pytest.raises(
            ConfigError, match=r"train\.learning_rate: expected at least float32's smallest normal"
        ):
            compose_config(f"train.learning_rate={rate}")
    assert compose_config("train.learning_rate=1e-30").train.learning_rate == 1e-30


def test_an_experiment_name_past_mlflows_limit_is_refused_at_validation():
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH as MLFLOWS

    from vmapcheck.config.tracking import MAX_EXPERIMENT_NAME_LENGTH

    assert MAX_EXPERIMENT_NAME_LENGTH == MLFLOWS
    with pytest.raises(ConfigError, match=r"tracking\.experiment: String should have at most 500"):
        compose_config("tracking.experiment=" + "e" * 5000)
    with pytest.raises(ConfigError, match=r"expected at most 500 characters \(MLflow's limit\)"):
        compose_config("tracking.experiment=" + "e" * 498, "tracking.experiment_per_model=true")


def test_an_absurd_warm_up_is_refused_and_an_integer_past_int64_is_named():
    from vmapcheck.config.bench import MAX_WARMUP

    with pytest.raises(
        ConfigError, match=rf"bench\.warmup: Input should be less than or equal to {MAX_WARMUP}"
    ):
        compose_config("bench.warmup=1000000000")
    with pytest.raises(ConfigError, match=r"train\.steps: expected an integer within int64"):
        compose_config("train.steps=18446744073709551616")


def test_conf_files_hydra_would_block_on_or_skip_are_refused_by_name(tmp_path):
    import os
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    config = conf / "config.yaml"
    text = config.read_text()
    config.write_text(text + "\nbad: [1, 2\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: line \d+, column 1: expected valid YAML"):
        compose_yaml(conf)
    config.unlink()
    os.mkfifo(config)
    with pytest.raises(ConfigError, match=r"config\.yaml: expected a config file .* found a FIFO"):
        compose_yaml(conf)
    config.unlink()
    config.write_bytes(text.encode() + b"# caf\xe9\n")
    with pytest.raises(
        ConfigError, match=r"config\.yaml: expected UTF-8 text, found the byte 0xe9"
    ):
        compose_yaml(conf)
