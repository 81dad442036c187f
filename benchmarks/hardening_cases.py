"""Issue 15's "What fell short" cases, rerun against the current code; a Markdown table.

Each case is a real call: a library function, a stage body through ``run_stage`` (as
stages/<name>.py calls it), the ``vmapcheck`` command line, real MLflow sqlite stores and
real processes. Nothing is mocked. A row is PASS when the call ends in a clear refusal (the
project's own error, naming the key, leaf, file or line, and no data value) or serves
correctly; FAIL otherwise (a raw exception, a silent acceptance, a misleading message).

    PYTHONPATH=src .venv/bin/python benchmarks/hardening_cases.py          # the quick cases
    PYTHONPATH=src .venv/bin/python benchmarks/hardening_cases.py --slow   # + the dvc ones

``--slow`` adds the cases that need DVC on a temporary copy of the project (a queued
experiment without ``store init``; the committed dvc.lock against a fresh run of prepare
and train), several minutes on two cores. It also prints how many hypothesis examples
tests/test_properties.py runs in ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers
# Two emulated CPU devices, as the tests and conf/backend/cpu.yaml have them.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from vmapcheck.compose import compose_yaml  # noqa: E402
from vmapcheck.errors import VmapcheckError  # noqa: E402

# Planted in inputs where a message could echo one; no message may hold it.
MARKER = 123456.789
MARKER_TEXT = "123456.7"


@dataclass
class Row:
    group: str
    case: str
    happened: str
    passed: bool


def first(text: str, limit: int = 160) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    line = line.replace("|", "\\|")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def refused(
    call: Callable[[], object],
    names: tuple[str, ...],
    served: Callable[[object], bool] | None = None,
) -> tuple[str, bool]:
    """Run ``call``: PASS when it raises the project's error whose message holds every
    one of ``names`` and no planted value, or returns something ``served`` accepts."""
    try:
        result = call()
    except VmapcheckError as exc:
        message = str(exc)
        ok = all(n in message for n in names) and MARKER_TEXT not in message
        return f"{type(exc).__name__}: {first(message)}", ok
    except Exception as exc:
        return f"raw {type(exc).__name__}: {first(exc)}", False
    if served is not None and served(result):
        return "served correctly", True
    return f"accepted (returned {type(result).__name__})", False


def stage_refuses(
    stage: str, overrides: list[str], names: tuple[str, ...], body: Callable | None = None
) -> tuple[str, bool]:
    """Stage ``stage`` (``body`` instead of its own, if given) on a temporary root whose
    params.yaml is composed with ``overrides`` (as ``dvc exp run -S``): PASS when it exits
    2, its error naming ``names``. A refused config must write nothing; a body that
    fails writes only the stage's time record (reports/stages/, as run_stage does)."""
    import importlib

    from vmapcheck.pipeline.stage import run_stage

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "params.yaml").write_text(compose_yaml(ROOT / "conf", overrides))
        main = body or importlib.import_module(f"vmapcheck.pipeline.{stage}").run
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = run_stage(stage, main, root)
        except Exception as exc:
            return f"raw {type(exc).__name__}: {first(exc)}", False
        written = sorted(
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and p != root / "params.yaml"
        )
        if body is not None:
            written = [w for w in written if not w.startswith("reports/stages/")]
        text = err.getvalue()
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    # The error line, and the key's own line under "invalid configuration in ...".
    shown = " / ".join(lines[:2]) if lines else f"exit {code}, nothing on stderr"
    ok = code == 2 and all(n in text for n in names) and not written
    ok = ok and "Traceback" not in text and MARKER_TEXT not in text
    return f"exit {code}: {first(shown, 200)}", ok


# --- the cases --------------------------------------------------------------------------


def mlp(in_features: int = 8, hidden: list[int] | None = None):
    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model

    model = build_model(
        ModelConfig(name="mlp", in_features=in_features, hidden=hidden or [8], out_features=2)
    )
    return model, model.init(jax.random.key(0))


def guard_config():
    from tests.helpers.config import compose_config

    return compose_config().guard.model_copy(update={"precompile": False})


def case_half_logged_run() -> tuple[str, bool]:
    """SIGKILL a track after its run row exists; the next track on another state."""
    from mlflow.tracking import MlflowClient

    from vmapcheck.tracking.attempts import settle_earlier_attempts
    from vmapcheck.tracking.baselines import last_verified_run
    from vmapcheck.tracking.runs import compare_rows, select_runs
    from vmapcheck.tracking.sqlite_store import create_sqlite_store
    from vmapcheck.tracking.store import PIPELINE_KEY_TAG, mark_complete, owner_tags

    tags = {"verdict": "passed", "model": "mlp", "backend": "cpu", "precision": "f32"}
    killed_track = (
        "import json, sys, time\n"
        "from mlflow.tracking import MlflowClient\n"
        "from vmapcheck.tracking.store import owner_tags\n"
        "c = MlflowClient(tracking_uri=sys.argv[1])\n"
        "r = c.create_run(sys.argv[2], run_name='killed', tags={**json.loads(sys.argv[3]), "
        "**owner_tags()})\n"
        "print(r.info.run_id, flush=True)\n"
        "time.sleep(600)\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        create_sqlite_store(uri)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.create_experiment("vmapcheck", artifact_location=Path(tmp).as_uri())
        good = client.create_run(
            experiment, run_name="good", tags={**tags, PIPELINE_KEY_TAG: "a", **owner_tags()}
        ).info.run_id
        mark_complete(uri, good)
        child = subprocess.Popen(
            # Its tags as log_run sets them when it creates the run: pipeline_key too.
            [
                sys.executable,
                "-c",
                killed_track,
                uri,
                experiment,
                json.dumps({**tags, PIPELINE_KEY_TAG: "c"}),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
        killed = child.stdout.readline().strip()
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        wanted = {k: tags[k] for k in ("model", "backend", "precision")}
        baseline_before = last_verified_run(uri, "vmapcheck", wanted)
        with contextlib.redirect_stdout(io.StringIO()):
            settle_earlier_attempts(uri, "b")  # the next track, on another state
        status = client.get_run(killed).info.status
        rows, _ = compare_rows(select_runs(uri, n=10, prefix="vmapcheck").runs)
        shown = {r["run"]: r["verdict"] for r in rows}
        baseline = last_verified_run(uri, "vmapcheck", wanted)
    ok = baseline_before == good == baseline and status == "FAILED" and shown["killed"] == "failed"
    return (
        f"baseline = the complete run; the killed run marked {status}; compare shows it "
        f"'{shown['killed']}'",
        ok,
    )


def case_paths_in_axes() -> tuple[str, bool]:
    from vmapcheck.core.forms import batched_forward

    model, params = mlp()
    return refused(lambda: batched_forward(model, params, in_axes=0), ("in_axes", "int 0"))


def case_ragged() -> tuple[str, bool]:
    from vmapcheck.core.contract import InputSpec

    ragged = [[1.0] * 8, [1.0, MARKER]]
    return refused(
        lambda: InputSpec.vector(8).validate_batch(ragged, jnp.float32), ("ragged list",)
    )


def case_guard_wrong_leaf() -> tuple[str, bool]:
    from vmapcheck.guard.predictor import Guard

    model, params = mlp()
    wrong = jax.tree.map(lambda leaf: leaf, params)
    wrong["layers"][0]["W"] = jnp.zeros((9, 8), jnp.float32)
    return refused(lambda: Guard(model, wrong, jnp.float32, guard_config()), ("layers[0].W",))


def case_guard_dtype(dtype) -> Callable[[], tuple[str, bool]]:
    def case() -> tuple[str, bool]:
        from vmapcheck.guard.predictor import Guard

        model, params = mlp()
        return refused(lambda: Guard(model, params, dtype, guard_config()), ("Guard dtype",))

    return case


def case_masked() -> tuple[str, bool]:
    from vmapcheck.guard.predictor import Guard

    model, params = mlp()
    guard = Guard(model, params, jnp.float32, guard_config())
    request = np.ma.masked_all((3, 8), np.float32)
    return refused(lambda: guard.predict(request), ("masked array",))


def case_nan_params() -> tuple[str, bool]:
    from vmapcheck.params_io import load_model_params, save_params

    model, params = mlp()
    params = jax.device_get(params)
    params["layers"][1]["b"] = np.array([0.0, np.nan], np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        save_params(Path(tmp), params, {"model": "mlp"})
        return refused(
            lambda: load_model_params(model, Path(tmp)), ("layers[1].b", "params.safetensors")
        )


def case_csv_line() -> tuple[str, bool]:
    from vmapcheck.data.sources import Schema, read_table

    schema = Schema(
        identifiers=("id", "name"),
        quasi_identifiers={"birth_date": "year"},
        features=("f1", "f2"),
        targets=("y",),
    )
    lines = ["id,name,birth_date,f1,f2,y"] + [
        f"C{i},Name {i},1961-07-04,1.5,-2,0.25" for i in range(2, 421)
    ]
    data = [line.encode() for line in lines]
    data[399] = data[399].replace(b"Name", b"N\xffme")  # file line 400
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table.csv"
        path.write_bytes(b"\n".join(data) + b"\n")
        return refused(lambda: read_table(path, schema), (str(path), "line 400"))


def case_server_died() -> tuple[str, bool]:
    from mlflow.tracking import MlflowClient

    from tests.helpers.config import compose_config
    from tests.helpers.servers import free_port
    from vmapcheck.config import TrackingConfig
    from vmapcheck.tracking.server import apply_http_settings, reaching

    dead = f"http://127.0.0.1:{free_port()}"
    settings = TrackingConfig.model_validate(
        compose_config().tracking.model_dump()
        | {
            "name": "server",
            "tracking_uri": dead,
            "artifact_root": None,
            "http_max_retries": 0,
            "http_timeout_s": 2,
        }
    )
    apply_http_settings(settings)

    def call() -> None:
        with reaching(dead, settings):
            MlflowClient(dead).search_experiments()

    happened, ok = refused(call, (dead, "Connection refused"))
    return happened, ok and "Failed to est)" not in happened


def case_rollback_missing_store() -> tuple[str, bool]:
    from vmapcheck import cli

    with tempfile.TemporaryDirectory() as tmp:
        missing = Path(tmp) / "nowhere" / "mlflow.db"
        (Path(tmp) / "params.yaml").write_text(
            compose_yaml(ROOT / "conf", [f"tracking.tracking_uri=sqlite:///{missing}"])
        )
        err, here = io.StringIO(), Path.cwd()
        env = {k: os.environ.pop(k) for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT") if k in os.environ}
        os.chdir(tmp)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = cli.main(["rollback"])
        finally:
            os.chdir(here)
            os.environ.update(env)
        created = missing.parent.exists()
    text = err.getvalue()
    ok = code == 2 and str(missing) in text and not created and "Traceback" not in text
    return f"exit {code}: {first(text)}" + ("; store created" if created else ""), ok


def case_key_reuse() -> tuple[str, bool]:
    from dataclasses import replace

    from vmapcheck.core.keys import named_keys
    from vmapcheck.pipeline.train import _init

    model, _ = mlp()

    def init_reusing_one_key(key):
        return {
            "layers": [
                {"W": jax.random.normal(key, (8, 8)), "b": jnp.zeros((8,))},
                {"W": jax.random.normal(key, (8, 2)), "b": jnp.zeros((2,))},
            ]
        }

    reusing = replace(model, init=init_reusing_one_key)

    def body(config, layout):
        with jax.debug_key_reuse(True):
            _init(reusing, named_keys(config.seed)["init"], config.seed)

    return stage_refuses("train", [], ("layers[1].W", "layers[0].W"), body=body)


def case_dvc_lock(project: Path) -> tuple[str, bool]:
    """prepare and train rerun (forced) on a fresh copy: every locked dependency and
    output keeps its hash (the stage time records, reports/stages/, differ by nature)."""
    from tests.helpers.project import run

    before = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    done = run(project, "dvc", "repro", "--force", "train", check=False)
    if done.returncode != 0:
        return f"dvc repro train exit {done.returncode}: {first(done.stderr)}", False
    after = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    changed = []
    for stage in ("prepare", "train"):
        for kind in ("deps", "outs"):
            old = {e["path"]: e.get("md5") for e in before[stage].get(kind, [])}
            new = {e["path"]: e.get("md5") for e in after[stage].get(kind, [])}
            changed += [
                f"{stage} {kind[:-1]} {path}"
                for path in sorted(set(old) | set(new))
                if old.get(path) != new.get(path) and not path.startswith("reports/stages/")
            ]
    if not changed:
        return "every locked hash of prepare and train reproduced", True
    return "locked hash differs: " + ", ".join(changed), False


def case_queued_without_store_init(project: Path) -> tuple[str, bool]:
    """`dvc exp run --queue` + `dvc queue start` on a project with no store yet: the
    store lands in the project, the Default experiment's artifact location and the report
    path track prints exist once the queue's temporary copy is gone."""
    from mlflow.tracking import MlflowClient

    from tests.helpers.project import FAST_RUN, run

    overrides = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]
    run(project, "dvc", "exp", "run", "--queue", *[a for o in overrides for a in ("-S", o)])
    run(project, "dvc", "queue", "start", "-j", "1")
    deadline = time.monotonic() + 1800
    status = ""
    while time.monotonic() < deadline:
        status = run(project, "dvc", "queue", "status", check=False).stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(10)
    task = status.split("\n")[1].split()
    logs = run(project, "dvc", "queue", "logs", task[1], check=False).stdout
    if "Success" not in status:
        errors = [x for x in logs.splitlines() if "error" in x.lower()]
        return f"queued run {task[-1]}: {first(errors[0] if errors else logs)}", False
    db = project / "mlflow.db"
    if not db.exists():
        return "no store in the project after the queued run", False
    default = MlflowClient(tracking_uri=f"sqlite:///{db}").get_experiment("0")
    where = default.artifact_location if default is not None else "none"
    # MLflow makes the folder when something is logged there: judged by where it points.
    lost = "/.dvc/tmp/" in where
    # The report line track printed: it must name no path in the queue's temp copy.
    shown = [x.split("HTML report: ", 1)[1] for x in logs.splitlines() if "HTML report: " in x]
    in_copy = [x for x in shown if "/.dvc/tmp/" in x]
    happened = (
        f"Default experiment artifacts at {where}"
        + (" (in the deleted temp copy)" if lost else "")
        + f"; track printed: HTML report: {shown[0] if shown else 'nothing'}"
        + (" (in the deleted temp copy)" if in_copy else "")
    )
    return happened, bool(shown) and not lost and not in_copy


def slow_cases(rows: list[Row]) -> None:
    from tests.helpers.project import committed_project

    with tempfile.TemporaryDirectory() as tmp:
        project = committed_project(Path(tmp) / "lock")
        rows.append(Row("smaller", "committed dvc.lock is current", *case_dvc_lock(project)))
    with tempfile.TemporaryDirectory() as tmp:
        project = committed_project(Path(tmp) / "queue")
        rows.append(
            Row(
                "smaller", "queued run without store init", *case_queued_without_store_init(project)
            )
        )


def hypothesis_examples() -> str:
    """How many examples tests/test_properties.py asks for in `make test` (its profile)."""
    import tests.test_properties as suite

    counts = {}
    for name in dir(suite):
        test = getattr(suite, name)
        if name.startswith("test_") and getattr(test, "is_hypothesis_test", False):
            counts[name] = test._hypothesis_internal_use_settings.max_examples
    lines = [
        f"hypothesis: {len(counts)} properties in tests/test_properties.py, at most "
        f"{sum(counts.values())} examples in all per `make test` (profile "
        f"'vmapcheck-properties': max_examples={suite.MAX_EXAMPLES} each unless the test sets "
        f"its own, seed {suite.SEED}, database tests/hypothesis-db; "
        f"{suite.HUNT}=N raises it)"
    ]
    lines += [f"  {n}: {c}" for n, c in sorted(counts.items())]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", action="store_true", help="add the DVC cases (minutes)")
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")

    cases: list[tuple[str, str, Callable[[], tuple[str, bool]]]] = [
        ("trusted", "half-logged run (SIGKILLed track)", case_half_logged_run),
        (
            "traceback",
            "-S tracking.tracking_uri=ftp://127.0.0.1/x",
            lambda: stage_refuses(
                "prepare", ["tracking.tracking_uri=ftp://127.0.0.1/x"], ("tracking.tracking_uri",)
            ),
        ),
        (
            "traceback",
            "-S tracking.tracking_uri=/some/folder",
            lambda: stage_refuses(
                "prepare",
                ["tracking.tracking_uri=/some/folder"],
                ("tracking.tracking_uri", "sqlite:///"),
            ),
        ),
        ("traceback", "batched_forward(model, params, in_axes=0)", case_paths_in_axes),
        ("traceback", "validate_batch of a ragged list", case_ragged),
        ("traceback", "Guard over params with a wrong-shape leaf", case_guard_wrong_leaf),
        ("silent", "Guard(..., jnp.int32)", case_guard_dtype(jnp.int32)),
        ("silent", "Guard(..., jnp.float64), x64 off", case_guard_dtype(jnp.float64)),
        ("silent", "fully masked np.ma request to the guard", case_masked),
        (
            "late",
            "-S precision.tolerance.rtol=inf",
            lambda: stage_refuses(
                "prepare", ["precision.tolerance.rtol=inf"], ("precision.tolerance.rtol",)
            ),
        ),
        ("late", "NaN in a params leaf, loaded", case_nan_params),
        ("smaller", "non-UTF-8 byte on CSV line 400", case_csv_line),
        ("smaller", "server died mid-call: whole cause", case_server_died),
        (
            "smaller",
            "config error ends without ', found a mapping'",
            lambda: stage_refuses("prepare", ["guard.max_batch=2048"], ("guard.max_batch",)),
        ),
        (
            "smaller",
            "-S data.split.train=0.9 named data.split",
            lambda: stage_refuses("prepare", ["data.split.train=0.9"], ("  data.split: split",)),
        ),
        ("smaller", "vmapcheck rollback, nonexistent sqlite URI", case_rollback_missing_store),
        ("smaller", "key reused by object in a plug-in's init", case_key_reuse),
        (
            "smaller",
            "+foo=1 refused by the first stage",
            lambda: stage_refuses("prepare", ["+foo=1"], ("foo: unknown key",)),
        ),
    ]
    rows = []
    for group, name, case in cases:
        happened, passed = case()
        if name.startswith("config error"):
            passed = passed and "found a mapping" not in happened
        if name.startswith("-S data.split"):
            passed = passed and "data.synthetic" not in happened
        rows.append(Row(group, name, happened, passed))
        print(f"{'PASS' if passed else 'FAIL'}  {name}", file=sys.stderr, flush=True)
    if args.slow:
        slow_cases(rows)
    print("| group | case | what happened | result |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r.group} | {r.case} | {r.happened} | {'PASS' if r.passed else 'FAIL'} |")
    failed = sum(not r.passed for r in rows)
    print(f"\n{len(rows) - failed}/{len(rows)} PASS" + ("" if args.slow else " (without --slow)"))
    print()
    print(hypothesis_examples())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
