"""`vmapcheck init`: the pipeline definition it writes into a user's git repository, and
this repository's own demo being exactly what it writes (no second copy)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.helpers.config import ROOT
from vmapcheck.errors import ConfigError
from vmapcheck.project.data_choice import resolve_data
from vmapcheck.project.init import BLOCK_START, block_text, plan
from vmapcheck.project.model_choice import resolve_model

# The files of this repository that `vmapcheck init --model mlp` writes.
DEMO = ("--model", "mlp")

# A user's model package, as a user writes it: plain JAX, outside vmapcheck.
USER_MODEL = textwrap.dedent(
    '''
    """A user's linear model."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.models import Model


    def make_model(in_features: int = 5, out_features: int = 2, bug: str = "none") -> Model:
        def init(key):
            return {"W": jax.random.normal(key, (in_features, out_features), jnp.float32)}

        def forward_batch(params, batch):
            y = batch @ params["W"]
            # A knob with a default: the planted mistake normalizes over the batch axis.
            return jax.nn.softmax(y, axis=0) if bug == "softmax" else y

        return Model(
            name="linear",
            in_features=in_features,
            out_features=out_features,
            forward_one=lambda params, x: x @ params["W"],
            forward_batch=forward_batch,
            init=init,
        )


    def not_a_model():
        return 42


    def int_state(in_features: int = 5, out_features: int = 2) -> Model:
        def init(key):
            return {
                "W": jax.random.normal(key, (in_features, out_features), jnp.float32),
                "steps": jnp.zeros((), jnp.int32),
            }

        return Model(
            name="counting",
            in_features=in_features,
            out_features=out_features,
            forward_one=lambda params, x: x @ params["W"],
            init=init,
        )


    def default_dtype(in_features: int = 5, out_features: int = 2) -> Model:
        return Model(
            name="loose",
            in_features=in_features,
            out_features=out_features,
            forward_one=lambda params, x: x @ params["W"],
            init=lambda key: {"W": jax.random.normal(key, (in_features, out_features))},
        )
    '''
)


def _init(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vmapcheck", "init", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def _user_repo(tmp_path: Path) -> Path:
    root = _git_repo(tmp_path / "user")
    (root / "mymodels").mkdir()
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "linear.py").write_text(USER_MODEL)
    return root


def test_this_repository_is_what_init_writes_for_the_demo():
    """The demo's dvc.yaml, conf/config.yaml, params.yaml, ... are init's output, byte for
    byte; its .gitignore and .dvcignore hold init's blocks (`vmapcheck init --model mlp
    --force` writes them again)."""
    planned = plan(ROOT, resolve_model(ROOT, "mlp"), resolve_data(ROOT, "synthetic"))
    for rel, text in planned.files.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, (
            f"{rel} differs from what `vmapcheck init --model mlp` writes: run "
            "`vmapcheck init --model mlp --force` and commit it"
        )
    for rel, rules in planned.blocks.items():
        assert block_text(rules) in (ROOT / rel).read_text(encoding="utf-8"), rel
    dvc_config = (ROOT / ".dvc" / "config").read_text()
    assert "[hydra]\n    enabled = true\n    config_dir = conf\n    config_name = config" in (
        dvc_config
    )
    # `dvc plots show` fills the offline page (Vega inlined), not DVC's CDN page.
    assert "[plots]\n    html_template = plots/offline.html" in dvc_config


def test_init_again_changes_nothing_and_force_refuses_to_drop_an_edit(tmp_path):
    """A second init finds every file as it writes it; an edit of the user's inside
    init's files is refused without --force, refused with --force (its diff shown), and
    then kept (--keep-edits) or replaced (--discard-edits), never dropped silently."""
    root = _git_repo(tmp_path / "empty")
    (root / ".gitignore").write_text("/my-own-rule\n")
    first = _init(root, *DEMO)
    assert first.returncode == 0, first.stderr
    assert "ran `dvc init`" in first.stdout
    assert (root / ".dvc" / "config").is_file() and (root / ".vmapcheck" / "init.json").is_file()
    assert (root / ".gitignore").read_text().startswith("/my-own-rule\n")

    second = _init(root, *DEMO)
    assert second.returncode == 0, second.stderr
    assert "unchanged: " in second.stdout and "wrote:" not in second.stdout

    config = root / "conf" / "config.yaml"
    config.write_text(config.read_text() + "my_key: 1\n")
    dvc_yaml = root / "dvc.yaml"
    dvc_yaml.write_text(
        dvc_yaml.read_text().replace(
            "    cmd: python stages/train.py\n",
            "    cmd: python stages/train.py\n    desc: my own words\n",
        )
    )
    edited = {rel: (root / rel).read_text() for rel in ("conf/config.yaml", "dvc.yaml")}
    plain = _init(root, *DEMO)
    assert plain.returncode == 1
    assert "  conf/config.yaml (edited)" in plain.stderr
    assert "  dvc.yaml stage train (edited)" in plain.stderr and "--force" in plain.stderr

    forced = _init(root, *DEMO, "--force")
    assert forced.returncode == 1
    assert "-my_key: 1" in forced.stderr and "-  desc: my own words" in forced.stderr
    assert "--keep-edits" in forced.stderr and "nothing was written" in forced.stderr
    assert edited == {rel: (root / rel).read_text() for rel in edited}

    kept = _init(root, *DEMO, "--force", "--keep-edits")
    assert kept.returncode == 0, kept.stderr
    assert "kept your edits:\n    conf/config.yaml\n    dvc.yaml stage train" in kept.stdout
    assert edited == {rel: (root / rel).read_text() for rel in edited}

    discarded = _init(root, *DEMO, "--force", "--discard-edits")
    assert discarded.returncode == 0, discarded.stderr
    assert "discarded your edits" in discarded.stdout and "-my_key: 1" in discarded.stdout
    assert "my_key" not in config.read_text() and "my own words" not in dvc_yaml.read_text()
    # The block is replaced, never appended twice; the user's rules stay.
    gitignore = (root / ".gitignore").read_text()
    assert gitignore.count(BLOCK_START) == 1 and "/my-own-rule" in gitignore


# A project of the user's: its own DVC stage reading its own params.
USER_PIPELINE = textwrap.dedent(
    """\
    # My pipeline: this comment stays.
    stages:
      featurize:
        cmd: python featurize.py
        params:
          - lr
          - epochs
        outs:
          - features.txt
    """
)
USER_PARAMS = "# my settings\nlr: 0.01\nepochs: 3\n"


def _project_repo(path: Path, pipeline: str = USER_PIPELINE, params: str = USER_PARAMS) -> Path:
    root = _git_repo(path)
    (root / "dvc.yaml").write_text(pipeline)
    (root / "params.yaml").write_text(params)
    return root


def test_init_joins_a_projects_pipeline_and_keeps_its_params_in_the_composition(tmp_path):
    root = _project_repo(tmp_path / "project")
    done = _init(root, *DEMO)
    assert done.returncode == 0, done.stderr
    assert "joined your pipeline: dvc.yaml keeps your stages featurize" in done.stdout
    assert "your params lr, epochs: conf/project.yaml (moved there from params.yaml)" in (
        done.stdout
    )
    pipeline = (root / "dvc.yaml").read_text()
    assert pipeline.startswith("# My pipeline: this comment stays.\nstages:\n  featurize:")
    stages = yaml.safe_load(pipeline)["stages"]
    assert list(stages)[:2] == ["featurize", "code"] and "track" in stages
    assert stages["featurize"]["params"] == ["lr", "epochs"]
    # The user's params, text and comments, in the file the composition reads first ...
    assert (root / "conf" / "project.yaml").read_text().endswith(USER_PARAMS)
    config = yaml.safe_load((root / "conf" / "config.yaml").read_text())
    assert config["defaults"][0] == "project" and config["project_keys"] == ["lr", "epochs"]
    # ... so params.yaml, which `dvc exp run -S` rebuilds from conf/, keeps them.
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["lr"] == 0.01 and params["epochs"] == 3 and params["precision"]["name"] == "f32"
    from vmapcheck.config import validate_config

    assert validate_config(params).project_keys == ["lr", "epochs"]
    # The same again: nothing changes, the user's file is left alone.
    again = _init(root, *DEMO)
    assert again.returncode == 0 and "unchanged: " in again.stdout, again.stderr
    assert (root / "conf" / "project.yaml").read_text().endswith(USER_PARAMS)


@pytest.mark.parametrize(
    ("pipeline", "params", "expected"),
    [
        (
            USER_PIPELINE.replace("featurize:", "train:"),
            USER_PARAMS,
            "your pipeline has stages named as vmapcheck's (train)",
        ),
        (
            USER_PIPELINE.replace("features.txt", "reports"),
            USER_PARAMS,
            "your stage 'featurize' writes reports, vmapcheck's 'code' reports/code/prepare.json",
        ),
        (USER_PIPELINE, USER_PARAMS + "seed: 3\n", "keys named as vmapcheck's (seed)"),
    ],
)
def test_a_project_colliding_with_vmapcheck_is_refused_naming_what(
    tmp_path, pipeline, params, expected
):
    root = _project_repo(tmp_path / "project", pipeline, params)
    done = _init(root, *DEMO)
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr
    assert (root / "dvc.yaml").read_text() == pipeline
    assert (root / "params.yaml").read_text() == params
    assert not (root / "conf").exists()


def test_a_users_factory_gets_its_model_file_and_its_code_tracked(tmp_path):
    root = _user_repo(tmp_path)
    done = _init(root, "--model", "mymodels.linear:make_model", "--factory-arg", "in_features=6")
    assert done.returncode == 0, done.stderr
    model = yaml.safe_load((root / "conf" / "model" / "linear.yaml").read_text())
    assert model == {
        "name": "linear",
        "in_features": 6,
        "out_features": 2,
        "inputs": None,
        # The widths interpolated: one source of truth for -S model.in_features=...
        "factory": {
            "_target_": "mymodels.linear.make_model",
            # Every knob with a default is written: -S model.factory.bug=... overrides it.
            "bug": "none",
            "in_features": "${model.in_features}",
            "out_features": "${model.out_features}",
        },
    }
    knob = subprocess.run(
        [sys.executable, "-m", "vmapcheck", "params", "model.factory.bug=softmax"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert knob.returncode == 0, knob.stderr
    assert yaml.safe_load((root / "params.yaml").read_text())["model"]["factory"]["bug"] == (
        "softmax"
    )
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for stage in ("train", "forward", "check", "bench"):
        assert "mymodels" in stages[stage]["deps"], stage
    assert not any(
        d.startswith("src/vmapcheck") for s in stages.values() for d in s.get("deps", [])
    )
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["model"]["name"] == "linear" and params["data"]["n_features"] == 6
    assert params["reference"]["required"] is False
    # The deployment target is the user's model, of any layer widths (its own option has
    # none); a shipped option's widths are pinned (the demo's: [32, 32]).
    assert params["registry"]["target"] == {
        "model": "linear",
        "hidden": None,
        "backend": "cpu",
        "precision": "f32",
        "bench": "quick",
    }


def test_a_dict_input_model_writes_its_input_contract(tmp_path):
    root = _git_repo(tmp_path / "towers")
    choice = resolve_model(
        root,
        "vmapcheck.examples.two_tower:make_model",
        name="towers",
        factory_args=["n_body=2", "n_serum=6", "hidden=4", "out_features=1"],
        model_code=["."],
    )
    assert choice.config["in_features"] == 8 and choice.code == (".",)
    body, serum = choice.config["inputs"].values()
    assert (body["shape"], body["dtype"], serum["shape"]) == ([2], "float", [6])
    assert body["meaning"], "the leaf's meaning is carried into the contract"


@pytest.mark.parametrize(
    "args,expected",
    [
        (("--model", "nonsense"), "expected a shipped option (equinox_mlp, flax_cnn"),
        (("--model", "mymodels.linear:not_a_model"), "expected it to return a vmapcheck"),
        (("--model", "mymodels.missing:make_model"), "cannot import 'mymodels.missing'"),
        (("--model", "mymodels.linear:nope"), "has no function 'nope'"),
        (
            ("--model", "mymodels.linear:default_dtype"),
            "init returns float64 leaves when JAX runs in x64 mode (the check stage's float64 "
            "oracle): W; expected float32",
        ),
        (
            ("--model", "mymodels.linear:int_state"),
            "--model mymodels.linear:int_state: model 'counting'",
        ),
        (
            ("--model", "mymodels.linear:make_model", "--factory-arg", "depth=3"),
            "raised TypeError",
        ),
        (("--model", "mymodels.linear:make_model", "--name", "mlp"), "is a shipped model"),
        (("--model", "mymodels.linear:make_model", "--name", "9x"), "--name: expected a letter"),
        (("--model", "mlp", "--data", "nope"), "--data: expected one of csv, diabetes"),
        (
            ("--model", "mlp", "--data", "diabetes", "--data-path", "t.csv"),
            "--data diabetes and --data-path t.csv: name a shipped option or your own table",
        ),
        (("--model", "mymodels.linear:make_model", "--factory-arg", "x"), "expected key=value"),
    ],
)
def test_bad_arguments_are_refused_naming_what_was_expected(tmp_path, args, expected):
    root = _user_repo(tmp_path)
    done = _init(root, *args)
    assert done.returncode == 2
    assert "init: error: " in done.stderr and expected in done.stderr, done.stderr
    assert not (root / "dvc.yaml").exists()


def test_a_token_model_on_the_synthetic_table_is_refused_naming_the_data_that_fits(tmp_path):
    # The synthetic table's columns are real numbers: the transformer's ids would be
    # refused by prepare. init refuses first, and nothing is written.
    root = _git_repo(tmp_path / "tokens")
    done = _init(root, "--model", "flax_transformer")
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith(
        "init: error: --model flax_transformer takes tokens (64,) int32 ids in [0, 17), mask "
        "(64,) bool (0 or 1) (model.inputs), but --data synthetic does not fill them: leaf "
        "'tokens': column x0 expected whole ids in [0, 17)"
    ), message
    assert message.endswith(
        "Fix: --data digit_tokens (its table fits), or a table of your own (--data-path FILE "
        "--features a,b,... --targets y) whose feature columns hold what the leaves take, in "
        "their order"
    ), message
    assert sorted(p.name for p in root.iterdir()) == [".git"]


@pytest.mark.parametrize(
    ("model", "data"),
    [
        ("flax_transformer", "digit_tokens"),  # ids and mask bits: fits
        ("flax_cnn", "digits"),  # float leaves take any number: no table read
        ("mlp", "synthetic"),
    ],
)
def test_data_that_fills_the_models_leaves_is_planned(tmp_path, model, data):
    planned = plan(tmp_path, resolve_model(tmp_path, model), resolve_data(tmp_path, data))
    assert yaml.safe_load(planned.files["params.yaml"])["model"]["name"] == model


@pytest.mark.parametrize(
    ("model", "data", "said", "fix"),
    [
        (
            "flax_transformer",
            "digits",
            "its table has 64 feature columns, the leaves take 128 (model.in_features)",
            "--data digit_tokens (its table fits)",
        ),
        (
            "flax_cnn",
            "diabetes",
            "its table has 8 feature columns, the leaves take 64 (model.in_features)",
            "--data digits or --data images32 or --data synthetic (each fits)",
        ),
    ],
)
def test_a_table_of_another_width_is_refused_naming_the_data_that_fits(
    tmp_path, model, data, said, fix
):
    with pytest.raises(ConfigError) as refused:
        plan(tmp_path, resolve_model(tmp_path, model), resolve_data(tmp_path, data))
    text = str(refused.value)
    assert f"--model {model} takes " in text and f"but --data {data} does not fill" in text
    assert f": {said}. Fix: {fix}, or a table of your own" in text


def test_a_table_of_real_numbers_for_a_token_model_is_refused_without_a_value(tmp_path):
    # --data-path: the user's table is read as prepare will (values never shown).
    header = ",".join([f"t{i}" for i in range(128)] + ["y"])
    rows = [",".join([f"{0.5 + i}" for i in range(128)] + ["1"]) for _ in range(40)]
    (tmp_path / "t.csv").write_text("\n".join([header, *rows]) + "\n")
    data = resolve_data(
        tmp_path, None, table="t.csv", features=",".join(f"t{i}" for i in range(128)), targets="y"
    )
    with pytest.raises(ConfigError) as refused:
        plan(tmp_path, resolve_model(tmp_path, "flax_transformer"), data)
    text = str(refused.value)
    assert "--data t does not fill them: leaf 'tokens': " in text
    assert "column t0 expected whole ids in [0, 17)" in text and "0.5" not in text
    assert text.endswith(
        "Fix: --data digit_tokens (its table fits), or a table of your own (--data-path FILE "
        "--features a,b,... --targets y) whose feature columns hold what the leaves take, in "
        "their order"
    )


def test_a_mistyped_shipped_option_is_refused_with_the_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"found 'flax_mpl' \(did you mean flax_mlp\?\)$"):
        resolve_model(tmp_path, "flax_mpl")
    with pytest.raises(ConfigError, match=r"found 'digts' \(did you mean digits\?\)$"):
        resolve_data(tmp_path, "digts")


def test_outside_a_git_repository_or_below_its_root_init_says_where_to_run_it(tmp_path):
    (tmp_path / "plain").mkdir()
    done = _init(tmp_path / "plain", *DEMO)
    assert done.returncode == 2 and "git init" in done.stderr
    root = _git_repo(tmp_path / "repo")
    (root / "sub").mkdir()
    done = _init(root / "sub", *DEMO)
    assert done.returncode == 2 and "at the repository's root" in done.stderr


def test_model_code_outside_the_repository_must_be_named(tmp_path):
    root = _git_repo(tmp_path / "repo")
    with pytest.raises(ConfigError, match="outside this repository"):
        resolve_model(
            root,
            "vmapcheck.examples.two_tower:make_model",
            name="towers",
            factory_args=["n_body=2", "n_serum=6", "hidden=4", "out_features=1"],
        )


TABLE = "id,email,a,b,c,d,e,y0,y1\n" + "".join(
    f"{i},p{i}@example.org,{i},{i + 1},{i + 2},{i + 3},{i + 4},{i % 3},{i % 5}\n" for i in range(40)
)


def test_a_users_table_is_declared_column_by_column(tmp_path):
    root = _user_repo(tmp_path)
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "patients.csv").write_text(TABLE)
    common = ("--model", "mymodels.linear:make_model", "--data-path", "data/raw/patients.csv")
    undeclared = _init(root, *common, "--features", "a,b,c,d,e", "--targets", "y0,y1")
    assert undeclared.returncode == 2
    assert "in the table, not declared: ['id', 'email']" in undeclared.stderr
    narrow = _init(
        root, *common, "--features", "a,b,c,d", "--targets", "y0,y1", "--identifiers", "id,email,e"
    )
    assert narrow.returncode == 2 and "in_features" in narrow.stderr, narrow.stderr
    assert not (root / "dvc.yaml").exists()

    done = _init(
        root, *common, "--features", "a,b,c,d,e", "--targets", "y0,y1", "--identifiers", "id,email"
    )
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load((root / "conf" / "data" / "patients.yaml").read_text())
    assert (data["source"], data["path"]) == ("csv", "data/raw/patients.csv")
    assert (data["features"], data["targets"]) == (list("abcde"), ["y0", "y1"])
    assert (data["identifiers"], data["quasi_identifiers"]) == (["id", "email"], {})
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["data"]["path"] == "data/raw/patients.csv"
    # Kept out of git by init's .gitignore block (prepare refuses a table git would carry).
    ignored = subprocess.run(["git", "check-ignore", "-q", "data/raw/patients.csv"], cwd=root)
    assert ignored.returncode == 0


def test_a_shipped_model_is_sized_to_the_users_table_and_keeps_its_sizes(tmp_path):
    """--data-path with a shipped model of a flat vector: its in/out features become the
    table's feature/target columns, in a conf/model/<option>.yaml of the project's own
    (it comes before the installed file), so a recomposition keeps them."""
    root = _git_repo(tmp_path / "sized")
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "patients.csv").write_text(TABLE)
    table = ("--data-path", "data/raw/patients.csv", "--identifiers", "id,email,d,e")
    columns = ("--features", "a,b,c", "--targets", "y0,y1")
    refused = _init(root, "--model", "flax_cnn", *table, *columns)
    assert refused.returncode == 2
    assert "--model flax_cnn takes an input contract of 64 feature columns" in refused.stderr
    assert not (root / "dvc.yaml").exists()

    done = _init(root, "--model", "mlp", *table, *columns)
    assert done.returncode == 0, done.stderr
    sized = yaml.safe_load((root / "conf" / "model" / "mlp.yaml").read_text())
    assert (sized["in_features"], sized["out_features"]) == (3, 2)
    # An experiment recomposes params.yaml from conf/: the sizes stay without any -S.
    again = subprocess.run(
        [sys.executable, "-m", "vmapcheck", "params", "precision=f64"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert (params["model"]["in_features"], params["model"]["out_features"]) == (3, 2)
    assert params["precision"]["name"] == "f64"


def test_quasi_identifiers_are_declared_at_init_with_their_policy(tmp_path):
    root = _user_repo(tmp_path)
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "patients.csv").write_text(TABLE)
    common = (
        *("--model", "mymodels.linear:make_model", "--factory-arg", "in_features=4"),
        *("--data-path", "data/raw/patients.csv", "--features", "a,b,c,d"),
        *("--targets", "y0,y1", "--identifiers", "id,email"),
    )
    bad = _init(root, *common, "--quasi-identifiers", "e=decimal")
    assert bad.returncode == 2
    assert "--quasi-identifiers: expected column=policy with a policy of drop, year" in bad.stderr
    assert "found 'e=decimal'" in bad.stderr

    done = _init(root, *common, "--quasi-identifiers", "e=band10")
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load((root / "conf" / "data" / "patients.yaml").read_text())
    assert data["quasi_identifiers"] == {"e": "band10"}
    assert data["features"] == list("abcd")
