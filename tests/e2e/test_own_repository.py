"""vmapcheck as a user gets it: a wheel installed into a fresh virtual environment, used in
an empty git repository that holds only the user's own model package.

Nothing of this checkout is on the path there: the stages, the config groups and the
HTML template come from the installed wheel. The model is written here, not one of the
shipped examples. Its first `dvc repro` passes, logs an MLflow run and writes the HTML
report; then a planted batching mistake in its hand-batched forward fails the check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.chromium import OFFLINE, render
from tests.helpers.config import ROOT
from tests.helpers.project import FAST_RUN, copy_project
from tests.helpers.wait import COMMAND_HANG_S

pytestmark = pytest.mark.e2e

# The user's model: one example is a flat vector (in_features,); class probabilities out.
# forward_batch is the same model written by hand for a batch (batch axis 0).
MODEL = textwrap.dedent(
    '''
    """Class probabilities from a small tanh network (the user's own model)."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.models import Model


    def make_model(in_features: int = 6, hidden: int = 16, out_features: int = 3) -> Model:
        def init(key):
            k1, k2 = jax.random.split(key)
            return {
                "hidden": {
                    "W": jax.random.normal(k1, (in_features, hidden), jnp.float32) * 0.4,
                    "b": jnp.zeros((hidden,), jnp.float32),
                },
                "head": {
                    "W": jax.random.normal(k2, (hidden, out_features), jnp.float32) * 0.25,
                    "b": jnp.zeros((out_features,), jnp.float32),
                },
            }

        def forward_one(params, x):  # (in_features,) -> (out_features,)
            h = jnp.tanh(x @ params["hidden"]["W"] + params["hidden"]["b"])
            return jax.nn.softmax(h @ params["head"]["W"] + params["head"]["b"], axis=-1)

        def forward_batch(params, batch):  # (n, in_features) -> (n, out_features)
            h = jnp.tanh(batch @ params["hidden"]["W"] + params["hidden"]["b"])
            return jax.nn.softmax(h @ params["head"]["W"] + params["head"]["b"], axis=-1)

        return Model(
            name="tanh_classifier",
            in_features=in_features,
            out_features=out_features,
            forward_one=forward_one,
            forward_batch=forward_batch,
            init=init,
            description="softmax(tanh(x W1 + b1) W2 + b2): class probabilities",
        )
    '''
)
# The user's own unit test: the batching_check fixture comes with the wheel (a pytest11
# entry point), nothing to configure.
USER_TEST = textwrap.dedent(
    """
    import jax
    import numpy as np

    from userpkg.classifier import make_model


    def test_batching(batching_check):
        model = make_model()
        params = model.init(jax.random.key(0))
        examples = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
        report = batching_check(model, params, examples)
        assert report.passed and report.worst_bound_ratio < 1
    """
)
# The mistake: the batched softmax normalizes over the batch axis instead of the classes.
CORRECT = 'jax.nn.softmax(h @ params["head"]["W"] + params["head"]["b"], axis=-1)\n\n'
PLANTED = 'jax.nn.softmax(h @ params["head"]["W"] + params["head"]["b"], axis=0)\n\n'


class UserRepository:
    """An empty git repository with a fresh venv holding only the wheel and its deps."""

    def __init__(self, root: Path, venv: Path) -> None:
        self.root, self.venv = root, venv
        self.env = {
            "PATH": f"{venv / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", str(root)),
            "DVC_NO_ANALYTICS": "1",
            "PYTHONUNBUFFERED": "1",
            "GIT_AUTHOR_NAME": "user",
            "GIT_AUTHOR_EMAIL": "user@vmapcheck.invalid",
            "GIT_COMMITTER_NAME": "user",
            "GIT_COMMITTER_EMAIL": "user@vmapcheck.invalid",
        }
        self.timings: dict[str, float] = {}

    def run(self, *args: str, check: bool = True, label: str | None = None):
        start = time.monotonic()
        done = subprocess.run(
            list(args),
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_HANG_S,
        )
        if label:
            self.timings[label] = time.monotonic() - start
        if check and done.returncode != 0:
            raise AssertionError(f"{args} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done


def _build_wheel(dest: Path) -> Path:
    """The wheel of this checkout's tracked files, built without network or isolation."""
    source = copy_project(dest / "source")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dest / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = (dest / "dist").glob("vmapcheck-*.whl")
    return wheel


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory) -> UserRepository:
    base = tmp_path_factory.mktemp("own-repository")
    start = time.monotonic()
    wheel = _build_wheel(base)
    built = time.monotonic() - start
    venv = base / "venv"
    root = base / "user-project"
    root.mkdir()
    repo = UserRepository(root, venv)
    repo.timings["wheel build"] = built
    # uv (a dev dependency) makes the venv and installs the wheel as `pip install` would:
    # the wheel's declared dependencies resolved from the index, nothing of this checkout's
    # .venv. The lock pins every transitive version, as `make setup` installs them; the
    # [pytest] extra: the user's unit tests run the Python API through pytest. uv links
    # the packages from its cache: seconds where pip took about a minute of every run.
    # Bytecode is not compiled at install (29 CPU s for every package): the user's
    # commands run without PYTHONDONTWRITEBYTECODE (UserRepository.env), so the first
    # process to import a module writes its bytecode, for the modules used (6 CPU s).
    # The installer runs in this process's environment (the machine's certificates and
    # proxy settings reach the index), the user's commands in the repository's own below.
    uv = str(Path(sys.executable).parent / "uv")
    start = time.monotonic()
    for command in (
        [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
         "--constraint", str(ROOT / "requirements.lock"), f"{wheel}[pytest]"],
    ):  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_HANG_S)
        assert done.returncode == 0, f"{command} exited {done.returncode}\n{done.stderr}"
    repo.timings["wheel install"] = time.monotonic() - start
    repo.run("git", "init", "-q")
    (root / "userpkg").mkdir()
    (root / "userpkg" / "__init__.py").write_text('"""The user\'s models."""\n')
    (root / "userpkg" / "classifier.py").write_text(MODEL)
    (root / "tests").mkdir()
    (root / "tests" / "test_batching.py").write_text(USER_TEST)
    repo.run("git", "add", "-A")
    repo.run("git", "commit", "-qm", "my model")
    return repo


def test_init_then_dvc_repro_passes_logs_a_run_and_writes_the_report(user_repo):
    repo = user_repo
    init = repo.run("vmapcheck", "init", "--model", "userpkg.classifier:make_model", label="init")
    assert "ran `dvc init`" in init.stdout and "userpkg" in init.stdout
    # Nothing of the checkout is importable: the stages come from the installed wheel.
    where = repo.run("python", "-c", "import vmapcheck; print(vmapcheck.__file__)").stdout
    assert str(repo.venv) in where and str(ROOT) not in where
    repo.run("vmapcheck", "params", *FAST_RUN)
    repo.run("git", "add", "-A")
    repo.run("git", "commit", "-qm", "vmapcheck init")

    repro = repo.run("dvc", "repro", label="first dvc repro")
    summary = repo.run("vmapcheck", "summary").stdout
    assert summary.startswith("verdict: PASSED"), summary
    assert "no reference yet for model tanh_classifier" in summary
    assert "vmapcheck reference make" in summary
    assert "Running stage 'code'" in repro.stdout
    assert (repo.root / "reports" / "report.html").stat().st_size > 10_000
    # The plots page, with the Vega builds the wheel ships inlined: drawn with no network
    # (tests/test_offline_plots.py tests it in detail).
    plots = repo.run("vmapcheck", "plots").stdout
    page = (repo.root / "dvc_plots" / "index.html").resolve()
    assert str(page) in plots, plots
    drawn = render(page, page.parent, height=1600, chromium_args=OFFLINE)
    # dvc.yaml's two Vega plots: latency and speed-up against batch size.
    assert drawn["dom"].count('data-plot="drawn"') == 2, drawn["dom"][-3000:]

    runs = repo.run(
        "python",
        "-c",
        "import mlflow; mlflow.set_tracking_uri('sqlite:///mlflow.db'); "
        "r = mlflow.search_runs(search_all_experiments=True); "
        "print(len(r), r['tags.verdict'].iloc[0], r['tags.model'].iloc[0])",
    ).stdout.split()
    assert runs == ["1", "passed", "tanh_classifier"], runs

    # The same model from the user's own pytest suite, through the Python API.
    unit = repo.run("python", "-m", "pytest", "-q", "tests", label="user's pytest (API)")
    assert "1 passed" in unit.stdout, unit.stdout

    # Unchanged: nothing reruns but the code stage, whose records are unchanged.
    again = repo.run("dvc", "repro")
    assert "Stage 'forward' didn't change, skipping" in again.stdout, again.stdout
    print("timings (s):", {k: round(v, 1) for k, v in repo.timings.items()})


def test_a_planted_batching_mistake_fails_the_check(user_repo):
    repo = user_repo
    source = repo.root / "userpkg" / "classifier.py"
    text = source.read_text()
    assert text.count(CORRECT) == 2, "expected forward_one's and forward_batch's softmax"
    head, tail = text.rsplit(CORRECT, 1)
    source.write_text(head + PLANTED + tail)

    unit = repo.run("python", "-m", "pytest", "-q", "tests", check=False)
    assert unit.returncode == 1, unit.stdout
    assert "BatchingCheckError: verdict: FAILED" in unit.stdout, unit.stdout
    assert "first diverging pair: examples/loop_eager-vs-direct_eager" in unit.stdout
    print("the planted mistake in the user's pytest:\n" + unit.stdout[-3000:])

    failed = repo.run("dvc", "repro", check=False)
    assert failed.returncode != 0
    summary = repo.run("vmapcheck", "summary", check=False).stdout
    assert summary.startswith("verdict: FAILED"), summary
    assert "direct_eager" in summary and "direct_jit" in summary, summary
    print("the planted mistake's verdict:\n" + summary)
    # The failed run was logged before the exit.
    verdicts = repo.run(
        "python",
        "-c",
        "import mlflow; mlflow.set_tracking_uri('sqlite:///mlflow.db'); "
        "r = mlflow.search_runs(search_all_experiments=True); print(*sorted(r['tags.verdict']))",
    ).stdout.split()
    assert verdicts == ["failed", "passed"], verdicts


# A project of the user's own before vmapcheck: one DVC stage reading its own params.
THEIR_PIPELINE = textwrap.dedent(
    """\
    # Our features: this comment stays.
    stages:
      featurize:
        cmd: python featurize.py
        deps:
          - featurize.py
        params:
          - lr
          - epochs
        outs:
          - features.txt
    """
)
THEIR_PARAMS = "# our training settings\nlr: 0.01\nepochs: 3\n"
FEATURIZE = textwrap.dedent(
    """\
    import yaml

    params = yaml.safe_load(open("params.yaml"))
    open("features.txt", "w").write(f"lr={params['lr']} epochs={params['epochs']}\\n")
    """
)


def test_init_joins_a_repository_with_its_own_pipeline_and_params(user_repo, tmp_path):
    """The wheel's init in a DVC project of the user's: `dvc repro` runs both pipelines,
    `dvc exp run -S precision=f64` keeps the user's params, `dvc exp run featurize` still
    works, and `init --force` keeps the user's stage and prints what it changed."""
    repo = UserRepository(tmp_path / "their-project", user_repo.venv)
    repo.root.mkdir()
    repo.run("git", "init", "-q")
    (repo.root / "dvc.yaml").write_text(THEIR_PIPELINE)
    (repo.root / "params.yaml").write_text(THEIR_PARAMS)
    (repo.root / "featurize.py").write_text(FEATURIZE)
    repo.run("dvc", "init", "-q")
    repo.run("git", "add", "-A")
    repo.run("git", "commit", "-qm", "our pipeline")

    init = repo.run("vmapcheck", "init", "--model", "mlp", label="init (join)")
    assert "joined your pipeline: dvc.yaml keeps your stages featurize" in init.stdout
    assert "your params lr, epochs: conf/project.yaml" in init.stdout
    # The short run every e2e pipeline uses: this test is about the two pipelines side by
    # side, not the bench (at the shipped defaults this test took 104 s, its dearest).
    repo.run("vmapcheck", "params", *FAST_RUN)
    repo.run("git", "add", "-A")
    repo.run("git", "commit", "-qm", "vmapcheck init")

    repro = repo.run("dvc", "repro", label="dvc repro (both pipelines)")
    assert "Running stage 'featurize'" in repro.stdout and "Running stage 'track'" in repro.stdout
    assert (repo.root / "features.txt").read_text() == "lr=0.01 epochs=3\n"
    assert repo.run("vmapcheck", "summary").stdout.startswith("verdict: PASSED")
    repo.run("git", "add", "-A")
    repo.run("git", "commit", "-qm", "first run")

    # DVC composes params.yaml from conf/ and these overrides alone: FAST_RUN again.
    fast = [arg for override in FAST_RUN for arg in ("-S", override)]
    f64 = repo.run(
        "dvc", "exp", "run", "-S", "precision=f64", *fast, label="dvc exp run -S precision=f64"
    )
    assert "float64" in f64.stdout, f64.stdout
    params = yaml.safe_load((repo.root / "params.yaml").read_text())
    assert (params["lr"], params["epochs"], params["precision"]["name"]) == (0.01, 3, "f64")

    featurize = repo.run("dvc", "exp", "run", "featurize", "-S", "lr=0.5")
    assert "Running stage 'featurize'" in featurize.stdout, featurize.stdout
    assert (repo.root / "features.txt").read_text() == "lr=0.5 epochs=3\n"

    # An upgrade's init --force: the user's stage and comment stay; init's own files
    # as it wrote them are unchanged, an edit of the user's in them is shown, then kept.
    repo.run("git", "checkout", "-q", "--", ".")
    config = repo.root / "conf" / "config.yaml"
    config.write_text(config.read_text() + "# ours\n")
    refused = repo.run("vmapcheck", "init", "--model", "mlp", "--force", check=False)
    assert refused.returncode == 1 and "-# ours" in refused.stderr, refused.stderr
    kept = repo.run("vmapcheck", "init", "--model", "mlp", "--force", "--keep-edits")
    assert "kept your edits:\n    conf/config.yaml" in kept.stdout, kept.stdout
    assert "dvc.yaml keeps your stages featurize" in kept.stdout
    pipeline = (repo.root / "dvc.yaml").read_text()
    assert pipeline.startswith("# Our features: this comment stays.\nstages:\n  featurize:")
    assert config.read_text().endswith("# ours\n")
    print("timings (s):", {k: round(v, 1) for k, v in repo.timings.items()})
