"""What issue 34's battery (benchmarks/hardening_battery.py) found, each now refused in one
line naming the key or file, what was expected and what was found: library functions
called directly, on real files and real sqlite stores."""

from __future__ import annotations

import io
import sqlite3
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.servers import free_port
from vmapcheck import cli
from vmapcheck.config import validate_config
from vmapcheck.errors import ArtifactError, ConfigError, Redacting, redact
from vmapcheck.io import atomic_save_npz, load_npz, read_json_object
from vmapcheck.tracking.sqlite_store import sqlite_problem


@pytest.mark.parametrize("cut", ["half", "empty", "text"])
def test_an_npz_cut_short_or_not_an_npz_is_refused_naming_the_file(tmp_path, cut):
    path = tmp_path / "composition.npz"
    atomic_save_npz(path, {"x": np.arange(1000.0)})
    data = path.read_bytes()
    path.write_bytes({"half": data[: len(data) // 2], "empty": b"", "text": b"no\n"}[cut])
    with pytest.raises(ArtifactError, match=f"{path}: not a whole .npz file") as caught:
        load_npz(path)
    assert "`dvc repro`" in str(caught.value)
    assert not isinstance(caught.value, zipfile.BadZipFile)


def test_a_json_report_that_is_not_an_object_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("[1, 2, 3]\n")
    with pytest.raises(ArtifactError, match=f"{path}: expected a JSON object, found a list"):
        read_json_object(path)
    path.write_text('{"other": 1}\n')
    with pytest.raises(ArtifactError, match=f"{path}: expected the keys features"):
        read_json_object(path, ("features",))
    assert read_json_object(path) == {"other": 1}


def test_a_baseline_that_names_nothing_is_refused_before_any_work():
    raw = compose_config().model_dump(mode="json")
    for fine in ("last-verified", "a" * 32, "reports/bench_details.json", None):
        raw["bench"]["regression"]["baseline"] = fine
        validate_config(raw)
    raw["bench"]["regression"]["baseline"] = "nosuch-run"
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    message = str(caught.value)
    assert "bench.regression.baseline: expected last-verified, an MLflow run id" in message
    assert "found 'nosuch-run'" in message


def test_a_secret_pasted_for_secret_env_is_not_shown():
    raw = compose_config().model_dump(mode="json")
    raw["data"]["anonymize"]["secret_env"] = "hunter2-the-secret!"
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    message = str(caught.value)
    assert "data.anonymize.secret_env:" in message and "not shown" in message
    assert "hunter2" not in message


def test_a_folder_or_another_programs_database_is_not_taken_for_a_store(tmp_path):
    folder = tmp_path / "mlflow.db"
    folder.mkdir()
    assert "is a folder" in sqlite_problem(folder, write=False)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE customers (name TEXT)")
    problem = sqlite_problem(other, write=False)
    assert "another program's SQLite database (tables customers" in problem
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert sqlite_problem(empty) is None  # a new store: MLflow makes its tables there


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [("--factor", "-1", "a factor above 1"), ("--alpha", "7", "a significance level")],
)
def test_verdict_refuses_a_factor_or_alpha_out_of_range_at_once(capsys, flag, value, expected):
    with pytest.raises(SystemExit) as exited:
        cli.main(["verdict", "--baseline", "last-verified", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected {expected}" in err and f"found '{value}'" in err


def test_no_message_shows_a_urls_password():
    assert redact("from http://user:pw@host:5000/api") == "from http://***@host:5000/api"
    assert (
        redact("sqlite:///a/b.db and https://tok@x.io") == "sqlite:///a/b.db and https://***@x.io"
    )
    out = io.StringIO()
    Redacting(out).write("postgresql://me:secret@db/mlflow failed")
    assert out.getvalue() == "postgresql://***@db/mlflow failed"


def test_compare_against_a_server_given_with_a_password_does_not_show_it(
    tmp_path, monkeypatch, capsys
):
    """The supported way to give credentials (MLFLOW_TRACKING_URI), the server down: the
    error names the server without them."""
    from tests.helpers.inprocess import write_params

    write_params(
        tmp_path, "tracking=server", "tracking.http_max_retries=0", "tracking.http_timeout_s=2"
    )
    port = free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:pa55word@127.0.0.1:{port}")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["compare"])
    captured = capsys.readouterr()
    assert code == 2
    assert "pa55word" not in captured.err + captured.out
    assert f"http://***@127.0.0.1:{port}" in captured.err or f"127.0.0.1:{port}" in captured.err


def test_redacting_keeps_the_streams_other_attributes():
    stream = Redacting(sys.__stderr__)
    assert stream.fileno() == sys.__stderr__.fileno()
    assert Path(__file__).is_file()


def test_a_token_in_the_tracking_urls_query_is_refused_and_not_shown():
    raw = compose_config().model_dump(mode="json")
    raw["tracking"] |= {"name": "server", "tracking_uri": "http://127.0.0.1:5000/?token=hunter2"}
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    message = str(caught.value)
    assert "tracking.tracking_uri: expected a URL without a query or fragment" in message
    assert "MLFLOW_TRACKING_TOKEN" in message and "hunter2" not in message
    # Elsewhere in a message, a query parameter named like a credential is masked.
    assert redact("GET http://h/x?api_key=abc&page=2") == "GET http://h/x?api_key=***&page=2"


HALF_WRITTEN = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size=1")  # spill the transaction's pages into the file
db.execute("BEGIN")
db.executemany("INSERT INTO runs VALUES (?)", ((str(i) * 50,) for i in range(20000)))
print("inside", flush=True)
time.sleep(600)
"""


def test_a_store_left_with_a_hot_journal_is_recovered_not_called_corrupt(tmp_path):
    """A write cut short (here a process SIGKILLed inside its transaction, as a full disk
    or a kill leaves it) leaves a hot journal: the store is whole once SQLite rolls it
    back, which a read-only look cannot do."""
    import signal
    import subprocess

    path = tmp_path / "mlflow.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
        db.execute("INSERT INTO runs VALUES ('kept')")
    writer = subprocess.Popen(
        [sys.executable, "-c", HALF_WRITTEN, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "inside"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0
    assert sqlite_problem(path) is None
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT run_uuid FROM runs").fetchall() == [("kept",)]


def test_a_reference_dir_outside_the_project_is_named_whole(tmp_path):
    from vmapcheck.check.reference import shown_reference_dir
    from vmapcheck.layout import Layout

    config = compose_config()
    inside = config.model_copy(
        update={"reference": config.reference.model_copy(update={"dir": "data/reference"})}
    )
    outside = config.model_copy(
        update={"reference": config.reference.model_copy(update={"dir": "/nonexistent"})}
    )
    layout = Layout(tmp_path)
    assert shown_reference_dir(inside, layout) == Path("data/reference") / config.model.name
    assert shown_reference_dir(outside, layout) == Path("/nonexistent") / config.model.name


def test_a_store_another_process_holds_locked_is_said_to_be_locked_not_corrupt(tmp_path):
    path = tmp_path / "mlflow.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
    holder = sqlite3.connect(path, timeout=0.1)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        problem = sqlite_problem(path, write=False)
    finally:
        holder.rollback()
        holder.close()
    assert problem is not None and "is locked by another process writing it" in problem
    assert "restore it" not in problem


def test_a_learning_rate_no_step_survives_is_refused_at_the_door():
    raw = compose_config().model_dump(mode="json")
    raw["train"]["learning_rate"] = 1e300
    with pytest.raises(ConfigError, match=r"train\.learning_rate: Input should be less than"):
        validate_config(raw)


def test_params_without_conf_says_so(tmp_path):
    from vmapcheck.compose import run_params
    from vmapcheck.layout import Layout

    with pytest.raises(ConfigError, match=r"conf: not found; `vmapcheck params` composes"):
        run_params(Layout(tmp_path), ["train.steps=3"])
    assert not (tmp_path / "params.yaml").exists()


def test_the_health_probe_sends_a_urls_credentials_as_basic_auth():
    """MLFLOW_TRACKING_URI=http://user:pw@host: the probe reaches the host (urllib alone
    takes `user:pw@host` for the host name: "name or service not known")."""
    import base64
    import http.server
    import threading

    from vmapcheck.tracking.server import health

    seen: list[str | None] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert health(f"http://me:p%40ss@127.0.0.1:{port}", 5) is None
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Basic " + base64.b64encode(b"me:p@ss").decode()]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("u?token=t&page=2", "u?token=***&page=2"),
        ("u?key=k", "u?key=***"),
        (
            "https://s3/x?X-Amz-Signature=a&X-Amz-Credential=b",
            "https://s3/x?X-Amz-Signature=***&X-Amz-Credential=***",
        ),
        ("u?AccessKeyId=a&client_secret=b", "u?AccessKeyId=***&client_secret=***"),
        ("u?access_token=a#id_token=b", "u?access_token=***#id_token=***"),
        ("u?password=p&sig=s", "u?password=***&sig=***"),
        # Not credentials: a saved view's name, a word that merely holds "key".
        ("u?viewStateShareKey=vmapcheck-summary", "u?viewStateShareKey=vmapcheck-summary"),
        ("u?monkey=1&keyboard=2", "u?monkey=1&keyboard=2"),
    ],
)
def test_only_credentials_are_masked_in_a_query(text, shown):
    assert redact(text) == shown


def test_the_printed_mlflow_links_survive_the_credential_filter():
    """Every line is printed through redact: the runs-table view's share key
    (``viewStateShareKey``) was masked as ``***``, and MLflow opened another page."""
    from vmapcheck.tracking.ui import compare_url, experiment_url, model_version_url, run_url

    base = "http://127.0.0.1:5000"
    urls = [
        experiment_url(base, "1"),
        run_url(base, "1", "abc"),
        compare_url(base, [("1", "abc"), ("1", "def")]),
        model_version_url(base, "token-model", 3),  # a name is not a credential
    ]
    assert "viewStateShareKey=vmapcheck-summary" in urls[0]
    for url in urls:
        assert redact(url) == url
