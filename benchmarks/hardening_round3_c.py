"""Issue 45, round three, part c: the served model, credentials, signals, clocks, disk
full, and params.yaml edited while a stage ran. One row per input, through
benchmarks/hardening_battery.py's ``record`` and helpers (nothing mocked: the registered
model of the base project served by MLflow's own scoring function in process and by a real
``mlflow models serve``; real ``dvc exp run -S``; stages in processes of their own sent real
signals; runs filed in the base project's real store with the clock the code reads set
behind; small tmpfs mounts over real folders, or a file size limit in a child process).

    PYTHONPATH=src .venv/bin/python benchmarks/hardening_round3_c.py --base /tmp/b \
        [--only served-http,clock]

Groups: served-http, served-load, credentials, signals, clock, disk-full, params-edit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Called from hardening_battery.py run as a script: its rows are __main__'s, so that module
# is the one imported here (not a second copy with a list of rows of its own).
_main = sys.modules.get("__main__")
if Path(getattr(_main, "__file__", "") or "").name == "hardening_battery.py":
    sys.modules.setdefault("hardening_battery", _main)  # type: ignore[arg-type]
import hardening_battery as hb  # noqa: E402
import numpy as np  # noqa: E402
from hardening_battery import (  # noqa: E402
    SECRET,
    Outcome,
    cli,
    copy_of,
    loss_check,
    proc,
    record,
    stage,
)

MODEL = "vmapcheck-mlp"
JSON = "application/json"


# --- served model: HTTP bodies through MLflow's scoring function ---------------------------


def _loaded(root: Path) -> tuple[object, list[str]]:
    """The base project's @verified loaded with MLflow, and the contract's feature names."""
    import mlflow

    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@verified")
    python_model = model.unwrap_python_model()
    return model, list(python_model.body_rule.features)


def served_http_cases(root: Path) -> None:
    # This checkout's serving code, not the copy packaged with the base project's model
    # (MLflow puts the model's code/ first on sys.path when it loads it).
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc import scoring_server

    import vmapcheck.tracking.request_body
    import vmapcheck.tracking.serving  # noqa: F401

    try:
        model, features = _loaded(root)
    except Exception as exc:
        failed = exc
        record("served-http", "load @verified", "serve", lambda: Outcome(None, "", "", failed))
        return
    schema = model.metadata.get_input_schema()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, len(features))).astype(np.float32)
    expected = model.predict(x)

    def invoke(body: bytes | str | object, content_type: str | None = JSON, check=True):
        def call() -> Outcome:
            data = body if isinstance(body, bytes | str) else json.dumps(body)
            try:
                answer = scoring_server.invocations(data, content_type, model, schema)
            except MlflowException as exc:
                # What the server's app does with it (scoring_server.init's handler).
                answer = scoring_server.InvocationsResponse(
                    exc.serialize_as_json(), exc.get_http_status_code(), JSON
                )
            text = answer.response
            if answer.status == 200:
                got = np.asarray(json.loads(text)["predictions"], np.float32)
                if check and not np.allclose(got, expected[: len(got)], rtol=1e-5, atol=1e-6):
                    return Outcome(1, "", f"HTTP 200 with a wrong prediction {got.shape}")
                return Outcome(0, f"HTTP 200 {got.shape}", "")
            try:
                said = json.loads(text)
            except ValueError:
                return Outcome(2, "", f"HTTP {answer.status}: {text}")
            if "stack_trace" in said:
                return Outcome(
                    None, "", "", RuntimeError(f"HTTP {answer.status} carries a stack_trace")
                )
            return Outcome(2, "", f"HTTP {answer.status}: {said.get('message')}")

        return call

    rev = features[::-1]
    rows = x.tolist()
    perm = list(rng.permutation(len(features)))
    serve = [
        ("inputs, rows in the contract's order", {"inputs": rows}),
        ("instances, rows", {"instances": rows}),
        (
            "dataframe_split, columns named in order",
            {"dataframe_split": {"columns": features, "data": rows}},
        ),
        (
            "dataframe_split, columns reversed",
            {"dataframe_split": {"columns": rev, "data": x[:, ::-1].tolist()}},
        ),
        (
            "dataframe_split, columns shuffled",
            {
                "dataframe_split": {
                    "columns": [features[i] for i in perm],
                    "data": x[:, perm].tolist(),
                }
            },
        ),
        ("dataframe_split, no columns (by position)", {"dataframe_split": {"data": rows}}),
        (
            "dataframe_records keyed by name",
            {"dataframe_records": [dict(zip(features, r, strict=True)) for r in rows]},
        ),
        (
            "dataframe_records, keys reversed",
            {"dataframe_records": [dict(zip(rev, r[::-1], strict=True)) for r in rows]},
        ),
        (
            "instances as records keyed by name",
            {"instances": [dict(zip(rev, r[::-1], strict=True)) for r in rows]},
        ),
        (
            "inputs as columns by name",
            {"inputs": {f: x[:, i].tolist() for i, f in reversed(list(enumerate(features)))}},
        ),
        ("one row", {"inputs": rows[:1]}),
        ("integers in a row", {"inputs": [[int(v) for v in rows[0]]]}),
    ]
    for what, body in serve:
        check = what != "integers in a row"
        record("served-http", f"POST {what}", "serve", invoke(body, check=check))
    missing = dict(zip(features, rows[0], strict=True))
    missing.pop(features[0])
    renamed = dict(missing, **{features[0] + "_typo": 1.0})
    extra = dict(zip(features, rows[0], strict=True), extra=1.0)
    refuse = [
        ("a 50 MB body of '['", b"[" * (50 * 2**20), JSON, ("52428800 bytes", "guard.max_batch")),
        (
            "a 51 MB valid JSON body",
            json.dumps({"inputs": [[0.0] * len(features)] * 300_000}).encode(),
            JSON,
            ("guard.max_batch",),
        ),
        ("a 2,000-deep '[' body", b"[" * 2000, JSON, ("nests too deep",)),
        ("a text/csv body", "x0,x1\n1,2\n", "text/csv", ("Content-Type",)),
        ("a parquet content type", b"PAR1", "application/vnd.apache.parquet", ("Content-Type",)),
        ("no content type", b"{}", None, ("Content-Type",)),
        ("text/plain", b"{}", "text/plain", ("Content-Type",)),
        ("malformed JSON", b'{"inputs": [[1, 2,', JSON, ("not JSON",)),
        ("not UTF-8", b'{"inputs": "\xff"}', JSON, ("UTF-8",)),
        ("a JSON list", json.dumps(rows), JSON, ("expected an object",)),
        ("a JSON string", json.dumps("x"), JSON, ("expected an object",)),
        ("no known key", {"data": rows}, JSON, ("expected exactly one of",)),
        ("two keys", {"inputs": rows, "instances": rows}, JSON, ("expected exactly one of",)),
        ("records missing a column", {"dataframe_records": [missing]}, JSON, (features[0],)),
        (
            "records with a misspelled column",
            {"dataframe_records": [renamed]},
            JSON,
            (features[0] + "_typo",),
        ),
        ("records with an extra column", {"dataframe_records": [extra]}, JSON, ("extra",)),
        (
            "split with a repeated column",
            {"dataframe_split": {"columns": [features[0]] * len(features), "data": rows}},
            JSON,
            ("repeated",),
        ),
        (
            "split with unknown columns",
            {"dataframe_split": {"columns": [f"c{i}" for i in range(len(features))], "data": rows}},
            JSON,
            ("missing",),
        ),
        (
            "split columns not a list",
            {"dataframe_split": {"columns": "x0", "data": rows}},
            JSON,
            ("columns",),
        ),
        ("split without data", {"dataframe_split": {"columns": features}}, JSON, ("'data'",)),
        ("a row one value short", {"inputs": [rows[0][:-1]]}, JSON, ("row 0",)),
        ("a row one value long", {"inputs": [rows[0] + [1.0]]}, JSON, ("row 0",)),
        ("ragged rows", {"inputs": [rows[0], rows[1][:3]]}, JSON, ("row 1",)),
        ("a string value", {"inputs": [["a"] * len(features)]}, JSON, ("string",)),
        ("a null value", {"inputs": [[None] * len(features)]}, JSON, ("null",)),
        ("a boolean value", {"inputs": [[True] * len(features)]}, JSON, ("boolean",)),
        ("a nested list value", {"inputs": [[[1.0]] * len(features)]}, JSON, ("list",)),
        ("an empty batch", {"inputs": []}, JSON, ("empty",)),
        ("a flat vector, not rows", {"inputs": rows[0]}, JSON, ("row 0",)),
        (
            "an integer beyond float range",
            {"inputs": [[10**400, *rows[0][1:]]]},
            JSON,
            ("too large",),
        ),
        ("NaN in a row", json.dumps({"inputs": [[float("nan"), *rows[0][1:]]]}), JSON, ("finite",)),
        (
            "Infinity in a row",
            json.dumps({"inputs": [[float("inf"), *rows[0][1:]]]}),
            JSON,
            ("finite",),
        ),
        (
            "more rows than guard.max_batch",
            {"inputs": [rows[0]] * 5000},
            JSON,
            ("guard.max_batch",),
        ),
    ]
    for what, body, content_type, names in refuse:
        record("served-http", f"POST {what}", "refuse", invoke(body, content_type), names=names)


# --- served model: a real `mlflow models serve` --------------------------------------------


@contextlib.contextmanager
def model_server(root: Path, model_uri: str, log: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    from tests.helpers.servers import free_port, start_in_group

    port = free_port()
    command = [
        str(Path(sys.executable).parent / "mlflow"),
        "models",
        "serve",
        "-m",
        model_uri,
        "--env-manager",
        "local",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    server = start_in_group(command, root, env, log)
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        if server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


def _post(url: str, data: bytes, content_type: str = JSON) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{url}/invocations", data=data, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def served_process_cases(root: Path, tmp: Path) -> None:
    from tests.helpers.servers import wait_until_ok

    _, features = _loaded(root)
    x = np.random.default_rng(1).normal(size=(3, len(features))).astype(np.float32)
    log = tmp / "serve.log"
    with model_server(root, f"models:/{MODEL}@verified", log) as (server, url):
        try:
            wait_until_ok(server, f"{url}/ping", 300, log)
        except Exception as exc:
            failed = exc
            record(
                "served-load",
                "mlflow models serve @verified",
                "serve",
                lambda: Outcome(None, "", "", failed),
            )
            return
        _, plain = _post(url, json.dumps({"inputs": x.tolist()}).encode())
        expected = np.asarray(json.loads(plain)["predictions"], np.float32)

        def post(
            data: bytes, content_type: str = JSON, serve: bool = False
        ) -> Callable[[], Outcome]:
            def call() -> Outcome:
                started = time.monotonic()
                status, text = _post(url, data, content_type)
                took = time.monotonic() - started
                if status == 200:
                    got = np.asarray(json.loads(text)["predictions"], np.float32)
                    ok = np.allclose(got, expected, rtol=1e-5, atol=1e-6)
                    return Outcome(
                        0 if ok else 1,
                        f"HTTP 200 in {took:.1f} s",
                        "" if ok else "a wrong prediction",
                    )
                if "stack_trace" in text or status >= 500:
                    return Outcome(None, "", "", RuntimeError(f"HTTP {status}: {text[:200]}"))
                return Outcome(
                    2, "", f"HTTP {status} in {took:.1f} s: {json.loads(text)['message']}"
                )

            return call

        rev = features[::-1]
        bodies = [
            (
                "dataframe_split, columns reversed",
                {"dataframe_split": {"columns": rev, "data": x[:, ::-1].tolist()}},
                "serve",
                (),
            ),
            (
                "dataframe_records keyed by name",
                {"dataframe_records": [dict(zip(rev, r[::-1], strict=True)) for r in x.tolist()]},
                "serve",
                (),
            ),
            ("a 50 MB body of '['", b"[" * (50 * 2**20), "refuse", ("52428800 bytes",)),
            (
                "a text/csv body",
                ",".join(features).encode() + b"\n" + b"1," * (len(features) - 1) + b"1\n",
                "refuse",
                ("Content-Type",),
            ),
            (
                "records with a misspelled column",
                {
                    "dataframe_records": [
                        dict(zip([*features[:-1], "zz"], x[0].tolist(), strict=True))
                    ]
                },
                "refuse",
                ("zz",),
            ),
            ("a row one value short", {"inputs": [x[0, :-1].tolist()]}, "refuse", ("row 0",)),
        ]
        for what, body, expect, names in bodies:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            content_type = "text/csv" if "csv" in what else JSON
            record(
                "served-load",
                f"mlflow models serve: POST {what}",
                expect,
                post(data, content_type),
                names=names,
            )


def served_tamper_cases(root: Path, tmp: Path) -> None:
    """A changed file of @verified, served with `mlflow models serve`: one line, no
    traceback, exit non-zero."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.db'}"
    source = (
        MlflowClient(tracking_uri=uri, registry_uri=uri)
        .get_model_version_by_alias(MODEL, "verified")
        .source
    )
    # The version's own folder (an absolute path the copied store keeps: the base's; each
    # file is put back as it was after its row).
    from urllib.parse import urlparse

    folder = Path(urlparse(source).path)
    if not (folder / "MLmodel").is_file():
        record(
            "served-load",
            "find @verified's files",
            "serve",
            lambda: Outcome(None, "", "", RuntimeError(f"no MLmodel in {source}")),
        )
        return
    for relative, change in [
        ("artifacts/params/params.safetensors", "flip a byte"),
        ("artifacts/params/contract.json", "flip a byte"),
        ("artifacts/params/manifest.json", "flip a byte"),
        ("artifacts/serving.json", "flip a byte"),
        ("artifacts/params/params.safetensors", "delete"),
    ]:
        path = folder / relative
        saved = path.read_bytes()

        seen: dict[str, int | bool] = {}

        def call(path=path, saved=saved, change=change, seen=seen) -> Outcome:
            try:
                if change == "delete":
                    path.unlink()
                else:
                    data = bytearray(saved)
                    data[len(data) // 2] ^= 0x01
                    path.write_bytes(bytes(data))
                log = tmp / f"tamper-{path.name}-{change[:3]}.log"
                with model_server(root, f"models:/{MODEL}@verified", log) as (server, _):
                    try:
                        server.wait(timeout=180)
                    except subprocess.TimeoutExpired:
                        return Outcome(0, "", "the server started (no refusal in 180 s)")
                # Progress bars (\r) are not lines.
                text = log.read_text(errors="replace").replace("\r", "")
                lines = [
                    ln
                    for ln in text.split("\n")
                    if ln.strip() and not ln.startswith("Downloading artifacts")
                ]
                ours = [ln for ln in lines if ln.startswith("vmapcheck: the model was not served")]
                tracebacks = text.count("Traceback (most recent call last)")
                # MLflow's launcher (mlflow/pyfunc/backend.py, `serve`) raises its own
                # Exception, with a traceback, whenever uvicorn exits non-zero: no model can
                # change that except by exiting 0, which would tell scripts it was served.
                launcher = "returned non zero return code" in (lines or [""])[-1]
                if not ours or tracebacks > (1 if launcher else 0):
                    return Outcome(
                        None, "", "", RuntimeError(f"{len(lines)} lines, {tracebacks} traceback(s)")
                    )
                seen["lines"], seen["launcher"] = len(lines), launcher
                shown = ours[0]
                return Outcome(server.returncode or 1, "", shown)
            finally:
                path.write_bytes(saved)

        row = record(
            "served-load",
            f"mlflow models serve a @verified whose {relative} was changed ({change})",
            "refuse",
            call,
            names=(relative.split("/")[-1], "not served"),
        )
        if seen.get("launcher"):
            row.note = (
                f"{seen['lines']} lines in all: vmapcheck's one line, then the traceback "
                "MLflow's `serve` launcher prints for any non-zero exit of uvicorn (85 lines "
                "around the refusal before)"
            )


# --- credentials ---------------------------------------------------------------------------


CREDENTIAL_OVERRIDES = [
    f"tracking.tracking_uri=http://alice:{SECRET}@127.0.0.1:9",
    f"tracking.tracking_uri=https://alice:{SECRET}@mlflow.example.com",
    f"tracking.tracking_uri=http://{SECRET}@127.0.0.1:5000",
    f"tracking.tracking_uri='http://127.0.0.1:5000/?token={SECRET}'",
    f"tracking.tracking_uri='http://127.0.0.1:5000/?access_token={SECRET}&x=1'",
    f"tracking.tracking_uri='https://h.example/#api_key={SECRET}'",
    f"tracking.artifact_root=s3://AKIA:{SECRET}@bucket/runs",
    f"tracking.artifact_root='s3://bucket/runs?X-Amz-Signature={SECRET}'",
    f"tracking.tracking_uri=postgresql://u:{SECRET}@db/mlflow",
    f"tracking.tracking_uri=sqlite:///{SECRET}.db",  # a path, not a credential: composes
]


def credential_cases(base: Path, tmp: Path) -> None:
    root = copy_of(base, tmp / "cred")
    params = root / "params.yaml"
    original = params.read_text()

    def composed(override: str) -> Callable[[], Outcome]:
        def call() -> Outcome:
            params.write_text(original)
            result = cli(root, "params", *hb.TINY, override)
            if SECRET in params.read_text() and "sqlite" not in override:
                return Outcome(0, "", "the secret is in params.yaml")
            return result

        return call

    for override in CREDENTIAL_OVERRIDES:
        if "sqlite" in override:
            # A file name that happens to hold the planted word is no credential.
            continue
        shown = override.replace(SECRET, "***")
        record(
            "credentials",
            f"vmapcheck params {shown}",
            "refuse",
            composed(override),
            names=("a credential given in a setting",),
        )
    params.write_text(original)
    for override in CREDENTIAL_OVERRIDES[:3] + CREDENTIAL_OVERRIDES[6:7]:

        def exp_run(override=override) -> Outcome:
            params.write_text(original)
            done = proc(root, "dvc", "exp", "run", "-S", override, timeout=300)
            if SECRET in params.read_text():
                return Outcome(0, done.out, "the secret stayed in params.yaml")
            return done

        record(
            "credentials",
            f"dvc exp run -S {override.split('=', 1)[0]}=<credential URL>",
            "refuse",
            exp_run,
            names=("a credential given in a setting",),
        )
    # `-S seed=5` replaces the resolver: the first stage scrubs the file, then refuses.
    for override in CREDENTIAL_OVERRIDES[:2] + CREDENTIAL_OVERRIDES[3:4]:

        def bypass(override=override) -> Outcome:
            params.write_text(original)
            done = proc(root, "dvc", "exp", "run", "-S", "seed=5", "-S", override, timeout=600)
            if SECRET in params.read_text():
                return Outcome(0, done.out, "the secret stayed in params.yaml")
            return done

        record(
            "credentials",
            f"dvc exp run -S seed=5 -S {override.split('=', 1)[0]}=<credential URL>",
            "refuse",
            bypass,
            names=("replaced by ***",),
        )
    # A params.yaml that holds one already (an older vmapcheck, a hand edit): each stage
    # scrubs it before it refuses.
    for name in ("prepare", "train", "check"):

        def planted(name=name) -> Outcome:
            params.write_text(
                original.replace(
                    "tracking_uri: sqlite:///mlflow.db", f"tracking_uri: http://al:{SECRET}@h:9"
                )
            )
            result = stage(root, name)
            if SECRET in params.read_text():
                return Outcome(0, result.out, "the secret stayed in params.yaml")
            return result

        record(
            "credentials",
            f"stage {name} with a password in params.yaml's tracking_uri",
            "refuse",
            planted,
            names=("replaced by ***", "tracking.tracking_uri"),
        )
    params.write_text(original)


# --- signals -------------------------------------------------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_cases(base: Path, tmp: Path) -> None:
    from vmapcheck.pause import PAUSE_AT, PAUSE_FILE

    root = copy_of(base, tmp / "signals")
    env = {PAUSE_FILE: str(root / "paused.json")}

    def sent(name: str, sig: signal.Signals, at: str) -> Callable[[], Outcome]:
        def call() -> Outcome:
            from tests.helpers.project import project_env

            paused = root / "paused.json"
            paused.unlink(missing_ok=True)
            run_env = {**project_env(root), **env, PAUSE_AT: f"{name}:{at}#1"}
            child = subprocess.Popen(
                [sys.executable, f"stages/{name}.py"],
                cwd=root,
                env=run_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                # Ctrl-C as a terminal's foreground job gets it: a battery started in the
                # background (`nohup ... &`) ignores SIGINT, its children inherit that, and
                # Python then never raises KeyboardInterrupt (the stage waited 120 s).
                preexec_fn=_default_sigint,
            )
            deadline = time.monotonic() + 300
            while not paused.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if child.poll() is not None:
                out, err = child.communicate()
                return Outcome(
                    0, out, f"{name} ended ({child.returncode}) before {at}: {err[-200:]}"
                )
            child.send_signal(sig)
            out, err = child.communicate(timeout=120)
            said = cli(root, "summary", "--repro-status", str(child.returncode % 256))
            lines = [ln for ln in said.out.splitlines() if f"stage {name}" in ln]
            summary = lines[0] if lines else "(summary names no stage)"
            text = f"exit {child.returncode}; {first(err)}; summary: {summary}"
            if sig != signal.SIGKILL and (
                "memory" in summary.replace("out-of-memory killer", "") or "SIGKILL" in summary
            ):
                return Outcome(2, "", f"said to be out of memory: {text}")
            recovered = stage(root, name)
            if recovered.code != 0:
                return Outcome(0, "", f"the next run of {name} failed: {recovered.err[-200:]}")
            return Outcome(child.returncode, "", text + "; its next run recovered")

        return call

    cases = [
        ("prepare", signal.SIGTERM, "start", "terminated (SIGTERM"),
        ("train", signal.SIGTERM, "start", "terminated (SIGTERM"),
        ("forward", signal.SIGTERM, "start", "terminated (SIGTERM"),
        ("check", signal.SIGTERM, "start", "terminated (SIGTERM"),
        ("bench", signal.SIGTERM, "start", "terminated (SIGTERM"),
        ("train", signal.SIGTERM, "end", "terminated (SIGTERM"),
        ("train", signal.SIGHUP, "start", "terminated (SIGHUP"),
        ("check", signal.SIGHUP, "start", "terminated (SIGHUP"),
        ("train", signal.SIGINT, "start", "interrupted (Ctrl-C)"),
        ("train", signal.SIGKILL, "start", "killed before it finished"),
    ]
    for name, sig, at, says in cases:
        record(
            "signals",
            f"{sig.name} to stage {name} at {at}",
            "refuse",
            sent(name, sig, at),
            names=(says,),
        )


def first(text: str) -> str:
    return hb.first_line(text)


def new_state(root: Path, why: str) -> None:
    """A state track has not logged: a line more in requirements.lock, a dep of track
    alone (its pipeline key hashes track's deps and params values, not comments)."""
    from tests.helpers.project import commit_all

    lock = root / "requirements.lock"
    lock.write_text(lock.read_text() + f"# a state for {why}\n")
    commit_all(root, f"a new state for {why}")


# --- clocks --------------------------------------------------------------------------------


def clock_cases(base: Path, tmp: Path) -> None:
    from mlflow.tracking import MlflowClient

    from vmapcheck import clock as system_clock
    from vmapcheck.tracking import clock
    from vmapcheck.tracking.runs import select_runs

    root = copy_of(base, tmp / "clock")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("vmapcheck") or client.search_experiments()[0]
    real = system_clock.now

    def filed(offset_s: float) -> Callable[[], Outcome]:
        def call() -> Outcome:
            system_clock.now = lambda: real() + offset_s
            try:
                err = hb.io.StringIO()
                with contextlib.redirect_stderr(err):
                    start, tags = clock.checked_start_ms(client, None)
                run = client.create_run(experiment.experiment_id, start_time=start, tags=tags)
                client.set_terminated(run.info.run_id)
            finally:
                system_clock.now = real
            newest = select_runs(uri, n=2, experiment=experiment.name).runs
            if newest[0].info.run_id != run.info.run_id:
                return Outcome(
                    0, "", f"compare -n 2 leaves the new run out (clock {offset_s:+.0f} s)"
                )
            said = err.getvalue().strip()
            if offset_s < 0 and not said:
                # Right only when the clock is still after the newest run (the "serve" row).
                return Outcome(0, "", "listed first, no warning: still after the newest run")
            return Outcome(2 if said else 0, "listed first", said)

        return call

    # Behind by less than the time since the newest run: the order holds, nothing to say.
    record("clock", "a run filed with the clock a second behind", "serve", filed(-1))
    for offset, label in [
        (-365 * 86400, "a year behind"),
        (-30 * 86400, "a month behind"),
        (-86400, "a day behind"),
        (-3600, "an hour behind"),
        (-40 * 365 * 86400, "at 1986"),
    ]:
        record(
            "clock",
            f"a run filed with the clock {label}",
            "refuse",
            filed(offset),
            names=("the clock reads", "system clock is behind"),
        )
    record("clock", "a run filed with the clock right again", "serve", filed(5))

    # The whole track stage, in process, with the clock a year behind (stage times too).
    def track_behind() -> Outcome:

        new_state(root, "the clock")
        system_clock.now = lambda: real() - 365 * 86400
        try:
            for name in ("check", "track"):
                result = stage(root, name)
                if result.code != 0:
                    return Outcome(result.code, result.out, result.err)
        finally:
            system_clock.now = real
        logged = json.loads((root / "reports" / "track.json").read_text())["run_id"]
        # compare's own selection (tracking.runs.select_runs), newest first.
        newest = select_runs(uri, n=1).runs[0].info.run_id
        said = Outcome(0, f"newest: {newest[:8]}", "")
        if newest != logged:
            return Outcome(0, said.out, f"compare -n 1 shows {newest[:8]}, not run {logged[:8]}")
        warned = [ln for ln in result.err.splitlines() if "the clock reads" in ln]
        return Outcome(
            2 if warned else 0, said.out, (warned or ["no warning"])[0] + "; compare -n 1 shows it"
        )

    record(
        "clock",
        "check + track with the clock a year behind, then compare -n 1",
        "refuse",
        track_behind,
        names=("the clock reads",),
    )


# --- disk full -----------------------------------------------------------------------------


@contextlib.contextmanager
def tiny_disk(folder: Path) -> Iterator[Path]:
    """``folder`` as a tmpfs holding its contents and only ~8 kB more (mount needs root, as
    tests/helpers/fault_injection.small_disk); on exit the contents go back."""
    folder.mkdir(parents=True, exist_ok=True)
    used = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    saved = folder.with_name(folder.name + ".before-tmpfs")
    shutil.copytree(folder, saved, symlinks=True)
    size_kb = used // 1024 + 64 + 4 * len(list(folder.rglob("*")))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        shutil.rmtree(saved)
        raise RuntimeError(f"cannot mount a tmpfs on {folder}: {mounted.stderr.strip()}")
    try:
        shutil.copytree(saved, folder, dirs_exist_ok=True, symlinks=True)
        from tests.helpers.fault_injection import fill

        filler = fill(folder, 2048)
        yield filler
    finally:
        with contextlib.suppress(OSError):
            (folder / ".filler").unlink()
        kept = folder.with_name(folder.name + ".on-tmpfs")
        shutil.copytree(folder, kept, symlinks=True)
        subprocess.run(["umount", "-l", str(folder)], check=True)
        shutil.rmtree(folder)
        kept.rename(folder)
        shutil.rmtree(saved)


def disk_cases(base: Path, tmp: Path) -> None:

    root = copy_of(base, tmp / "disk")
    db = root / "mlflow.db"

    def full(name: str, folder: str, new: bool = False) -> Callable[[], Outcome]:
        def call() -> Outcome:
            if new:
                new_state(root, folder)
            where = root / folder
            if folder == "mlartifacts":
                # Where the store's experiment keeps them: an absolute path, which the copied
                # store keeps (the base project's folder; the tmpfs gives its files back).
                from urllib.parse import urlparse

                from mlflow.tracking import MlflowClient

                client = MlflowClient(tracking_uri=f"sqlite:///{db}")
                experiment = client.get_experiment_by_name("vmapcheck")
                location = (experiment or client.search_experiments()[0]).artifact_location
                where = Path(urlparse(location).path)
            with tiny_disk(where):
                failed = stage(root, name)
            if failed.raised is not None:
                return failed
            if failed.code == 0:
                return Outcome(0, failed.out, f"{name} succeeded on a full {folder}")
            recovered = stage(root, name)
            if recovered.code != 0:
                return Outcome(0, "", f"the next {name} failed: {first(recovered.err)}")
            return Outcome(failed.code, failed.out, failed.err.strip() + " [next run recovered]")

        return call

    for name, folder, names, new in [
        ("prepare", "data", ("data/prepared", "free in"), False),
        ("train", "data", ("data/params", "free in"), False),
        ("forward", "data", ("data/forward", "free in"), False),
        ("train", "reports/stages", ("reports/stages", "free in"), False),
        ("check", "reports", ("reports", "free in"), False),
        ("bench", "reports", ("reports", "free in"), False),
        # The output folder itself a mount point: it cannot be swapped by a rename.
        ("prepare", "data/prepared", ("data/prepared", "busy"), False),
        ("track", "mlartifacts", ("mlartifacts", "free in"), True),
        # Refused before track logs (the room DVC will need is known): no "free in" there.
        ("track", ".dvc/cache", (".dvc/cache", "MB free", "DVC cache"), True),
    ]:
        record(
            "disk-full",
            f"stage {name} with {folder}/ full (tmpfs)",
            "refuse",
            full(name, folder, new),
            names=names,
            loss=loss_check(db),
        )

    # A file size limit (RLIMIT_FSIZE, EFBIG): what any user can make, no mount.
    def limited(name: str, limit: int) -> Callable[[], Outcome]:
        def call() -> Outcome:
            from tests.helpers.project import project_env

            code = (
                "import resource, signal, runpy, sys\n"
                "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
                f"sys.argv = ['stages/{name}.py']\n"
                f"runpy.run_path('stages/{name}.py', run_name='__main__')\n"
            )
            done = subprocess.run(
                [sys.executable, "-c", code],
                cwd=root,
                env=project_env(root),
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode == 0:
                return Outcome(0, done.stdout, f"{name} succeeded under ulimit -f {limit}")
            recovered = stage(root, name)
            if recovered.code != 0:
                return Outcome(0, "", f"the next {name} failed: {first(recovered.err)}")
            return Outcome(done.returncode, done.stdout, done.stderr + " [next run recovered]")

        return call

    for name, limit in [("prepare", 2048), ("train", 2048), ("check", 4096), ("bench", 4096)]:
        record(
            "disk-full",
            f"stage {name} under a file size limit of {limit} bytes (EFBIG)",
            "refuse",
            limited(name, limit),
            names=("ulimit -f", "free in"),
            loss=loss_check(db),
        )


# --- params.yaml edited while a stage ran -----------------------------------------------------


def params_edit_cases(base: Path, tmp: Path) -> None:
    """params.yaml edited after train ran and DVC locked the new value (`dvc commit`, as
    DVC does when train ends): the next `dvc repro` must not register it."""
    import yaml

    edits = [
        ("train.steps", 1),
        ("train.learning_rate", 2.0),
        ("train.batch_size", 2),
        ("train.eval_every", 5),
        ("train.optimizer", "sgd"),
    ]
    for key, change in edits:
        root = copy_of(base, tmp / f"edit-{key}")

        def call(root=root, key=key, change=change) -> Outcome:
            from tests.helpers.project import commit_all

            params = root / "params.yaml"
            raw = yaml.safe_load(params.read_text())
            group, leaf = key.split(".")
            if leaf not in raw[group]:
                return Outcome(None, "", "", KeyError(key))
            old = raw[group][leaf]
            if isinstance(change, str):
                raw[group][leaf] = change
            else:
                raw[group][leaf] = old + change if isinstance(change, int) else old * change
            text = params.read_text()
            params.write_text(
                text.replace(f"  {leaf}: {old}\n", f"  {leaf}: {raw[group][leaf]}\n", 1)
            )
            locked = proc(root, "dvc", "commit", "--force", "train")
            if locked.code != 0:
                return Outcome(None, "", "", RuntimeError(f"dvc commit: {locked.err[-300:]}"))
            commit_all(root, "edited while train ran")
            before = loss_check(root / "mlflow.db")
            done = proc(root, "dvc", "repro", timeout=1200)
            if before() is not None:
                return Outcome(0, done.out, before())
            return done

        record(
            "params-edit",
            f"{key} edited while train ran, locked by DVC, then dvc repro",
            "refuse",
            call,
            names=(key, "dvc.lock recorded the new values"),
        )


def params_control_case(base: Path, tmp: Path) -> None:
    """Nothing edited: the same `dvc repro` is not refused (no false alarm)."""
    root = copy_of(base, tmp / "edit-none")

    def call() -> Outcome:
        from tests.helpers.project import commit_all

        commit_all(root, "as built")
        new_state(root, "a control run")
        return proc(root, "dvc", "repro", timeout=1200)

    record(
        "params-edit", "nothing edited, a new state, then dvc repro (no false alarm)", "serve", call
    )


# --- the group -----------------------------------------------------------------------------


GROUPS: dict[str, Callable[[Path, Path], None]] = {
    "served-http": lambda base, tmp: served_http_cases(copy_of(base, tmp / "served-http")),
    "served-load": lambda base, tmp: (
        served_process_cases(copy_of(base, tmp / "served-proc"), tmp),
        served_tamper_cases(copy_of(base, tmp / "served-tamper"), tmp),
    ),
    "credentials": credential_cases,
    "signals": signal_cases,
    "clock": clock_cases,
    "disk-full": disk_cases,
    "params-edit": lambda base, tmp: (
        params_edit_cases(base, tmp),
        params_control_case(base, tmp),
    ),
}


def cases(base: Path, tmp: Path, only: set[str] | None = None) -> None:
    """Every group of part c (or those in ``only``), each on its own copy of ``base``."""
    import traceback

    for group, run_group in GROUPS.items():
        if only and group not in only:
            continue
        try:
            run_group(base, tmp)
        except Exception:  # the battery's own failure: said, the other groups go on
            traceback.print_exc()
            print(f"battery: group {group} stopped early (above)", file=sys.stderr)


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="a built base project's parent")
    parser.add_argument("--only", default="", help="comma-separated groups")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_platforms", "cpu")
    base = args.base / "base"
    if not (base / "reports" / "track.json").exists():
        base = hb.base_project(args.base)
    with tempfile.TemporaryDirectory(prefix="round3c-") as tmp:
        cases(base, Path(tmp), set(filter(None, args.only.split(","))))
    counts: dict[str, dict[str, int]] = {}
    for row in hb.ROWS:
        counts.setdefault(row.group, {}).setdefault(row.outcome, 0)
        counts[row.group][row.outcome] += 1
    print(json.dumps(counts, indent=1))
    if args.json:
        from dataclasses import asdict

        args.json.write_text(json.dumps([asdict(r) for r in hb.ROWS], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
