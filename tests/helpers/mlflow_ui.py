"""``mlflow ui`` on 127.0.0.1 and headless Chromium over it, for the tests that read
runs where users read them (tests/test_mlflow_review.py).

:func:`serving` starts the UI over a store in a session of its own and stops it (and
only the workers it started) afterwards; :func:`browse` opens a URL in headless
Chromium, keeps a screenshot and returns the text the app rendered.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.chromium import find_chromium
from tests.helpers.servers import wait_until_ok
from tests.helpers.wait import HANG_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(uri: str, cwd: Path) -> Iterator[str]:
    """``mlflow ui`` over store ``uri`` on 127.0.0.1 (a free port); its base URL. Its
    output goes to ``cwd/mlflow-ui.log``. Stopped after."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = cwd / "mlflow-ui.log"
    with log.open("wb") as out:
        # A session of its own: stopping it stops the workers it starts, and only them.
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("mlflow")),
                "ui",
                "--backend-store-uri",
                uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                # One browser reads it: one worker, not MLflow's four (each imports
                # MLflow's server, seconds of CPU on a two-core machine).
                "--workers",
                "1",
            ],
            cwd=cwd,
            # No background job workers: this UI only reads (they also slow its start).
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # A fixed 120 s could pass before the UI answered on a loaded machine: poll with
        # backoff until it answers, exits, or only a hang explains the wait.
        wait_until_ok(process, f"{base}/health", HANG_S, log)
        yield base
    finally:
        # Ctrl-C, as a user stops it (its workers ignore SIGTERM for a while).
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def vmapcheck_ui(root: Path) -> Iterator[tuple[str, str]]:
    """``vmapcheck ui --port P`` (what ``make ui`` runs) in project ``root`` on a free port,
    its output into ``root/vmapcheck-ui.log``: (its base URL, what it printed once it
    answers). Stopped after, with its workers."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = root / "vmapcheck-ui.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("vmapcheck")), "ui", "--port", str(port)],
            cwd=root,
            # One worker, not MLflow's four (mlflow ui reads MLFLOW_WORKERS): one browser.
            # The project's own store, as `make ui` finds it (no MLFLOW_TRACKING_URI).
            env={
                **{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
                "MLFLOW_WORKERS": "1",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # A fixed 120 s could pass before the UI answered on a loaded machine: poll with
        # backoff until it answers, exits, or only a hang explains the wait.
        wait_until_ok(process, f"{base}/health", HANG_S, log)
        yield base, log.read_text()
    finally:
        if process.poll() is None:  # (gone already: it failed to start, said above)
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def browse(url: str, out: Path, name: str, window: str = "1920,1200") -> str:
    """Open ``url`` in headless Chromium: a screenshot ``out/<name>.png`` of a ``window``
    (width,height) and the text the page showed once the app rendered (the DOM's text,
    tags and scripts left out)."""
    browser = find_chromium()
    assert browser is not None, "no headless Chromium: run scripts/ensure-chromium"
    out.mkdir(parents=True, exist_ok=True)
    common = [
        browser,
        "--headless",
        "--no-sandbox",  # tests may run as root (CI containers)
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--window-size={window}",
        # Run the app until its requests to the server are answered and it rendered.
        "--virtual-time-budget=30000",
    ]
    shot = out / f"{name}.png"
    for args in (
        [f"--user-data-dir={out / 'profile-shot'}", f"--screenshot={shot}", url],
        [f"--user-data-dir={out / 'profile-dom'}", "--dump-dom", url],
    ):
        result = subprocess.run(
            [*common, *args], capture_output=True, text=True, timeout=HANG_S, check=False
        )
        assert result.returncode == 0, result.stderr[-3000:]
    for profile in ("profile-shot", "profile-dom"):
        shutil.rmtree(out / profile, ignore_errors=True)
    print(f"screenshot: {shot}")
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", result.stdout, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))
