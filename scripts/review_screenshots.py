"""Screenshots of every review surface, for docs/img/ (issue 43, "Must show").

In a vmapcheck project (a fresh ``vmapcheck init`` project, or this repository after
``make demo``), this makes three pipeline runs with ``dvc exp run``: two that pass and one
that fails (by default the MC dropout example with its shared-key bug planted:
``model.factory.shared_key=true``). The failed run is kept as an experiment (the ``gate``
stage exits 0 inside ``dvc exp run``); then ``dvc repro`` in the workspace, which holds the
failed run, and ``vmapcheck gate`` must both exit non-zero on it (``gate.txt``). A project
made before the gate stage keeps no failed experiment: the script goes on either way.

Then it serves the project's MLflow store with ``vmapcheck ui`` (as ``make ui`` does) on
127.0.0.1 and opens in headless Chromium every URL that vmapcheck printed: the experiment's
runs table (``vmapcheck ui``), each run's page (``track``: "open the run: ..."), the
model version each passing run registered ("registry: open the version: ...") and the
compare view of the three runs (``vmapcheck compare``). It also shoots the HTML report of
the failed run, ``dvc plots show`` and ``dvc plots diff`` of the three runs. The server is
stopped at the end, whatever happened.

Usage (from the project's root, with the project's environment, which has dvc, mlflow
and vmapcheck)::

    .venv/bin/python scripts/review_screenshots.py OUT_DIR [--project DIR]
        [--pass-a "-S x=y ..."] [--pass-b ...] [--fail ...] [--skip-runs]

``OUT_DIR`` receives the PNGs, the text each page showed (``<name>.txt``, for checking
what the PNG holds) and ``printed.txt`` (what each command printed). A URL whose page
says MLflow's "does not exist", or that carries ``***``, is reported and makes the exit
status 1. CPU-heavy: three pipeline runs.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# The runs: (experiment name, dvc exp run -S overrides). The failing one is last, so that
# the workspace (reports/report.html) holds its outputs at the end.
DEFAULT_RUNS = {
    "review-pass-mlp": "",
    "review-pass-mc-dropout": "-S model=mc_dropout",
    "review-fail-shared-key": "-S model=mc_dropout -S model.factory.shared_key=true",
}
# What an MLflow page says when the URL names something that is not there.
BROKEN = ("does not exist", "Page not found", "***")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")
# The URLs vmapcheck prints (tracking.ui): after "vmapcheck ui, then " for a local store.
RUN_URL = re.compile(r"open the run: (?:vmapcheck ui, then )?(\S+)")
VERSION_URL = re.compile(r"registry: open the version: (?:vmapcheck ui, then )?(\S+)")
COMPARE_URL = re.compile(r"side by side in the MLflow UI: (?:vmapcheck ui, then )?(\S+)")
ANY_URL = re.compile(r"(https?://\S+/#/\S+)")
DEFAULT_PORT = "http://127.0.0.1:5000"  # the base track and compare print for `vmapcheck ui`


def chromium() -> str:
    """A headless Chromium (scripts/ensure-chromium installs one)."""
    for name in (os.environ.get("CHROMIUM", ""), *CHROMIUM_NAMES):
        if name and shutil.which(name):
            return str(shutil.which(name))
    sys.exit("review_screenshots: no Chromium on PATH: run scripts/ensure-chromium")


def run(cmd: list[str], cwd: Path, log: list[str], check: bool = False) -> str:
    """Run ``cmd`` in ``cwd``; its output (stdout and stderr) is returned and logged."""
    print(f"$ {shlex.join(cmd)}", flush=True)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    log.append(f"$ {shlex.join(cmd)}  (exit {done.returncode})\n{out}")
    if check and done.returncode != 0:
        sys.exit(f"review_screenshots: {cmd[0]} exited {done.returncode}:\n{out[-3000:]}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shoot(url: str, out: Path, name: str, window: str) -> str:
    """``out/<name>.png`` of ``url`` in a ``window`` (width,height); the text it showed."""
    browser = chromium()
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--window-size={window}",
        "--virtual-time-budget=30000",  # until the app's requests are answered
    ]
    png = out / f"{name}.png"
    dom = ""
    for args in (
        [f"--user-data-dir={out / '.profile-shot'}", f"--screenshot={png}", url],
        [f"--user-data-dir={out / '.profile-dom'}", "--dump-dom", url],
    ):
        done = subprocess.run(
            [*common, *args], capture_output=True, text=True, timeout=300, check=False
        )
        if done.returncode != 0:
            print(f"  chromium failed on {url}: {done.stderr[-500:]}")
        dom = done.stdout
    for profile in (".profile-shot", ".profile-dom"):
        shutil.rmtree(out / profile, ignore_errors=True)
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))
    (out / f"{name}.txt").write_text(f"{url}\n\n{text}\n")
    print(f"  {png} ({png.stat().st_size if png.exists() else 0} bytes)")
    return text


def compress(out: Path) -> None:
    """64-colour PNGs (small for git), where Pillow is installed."""
    try:
        from PIL import Image
    except ImportError:
        return
    for png in out.glob("*.png"):
        with Image.open(png) as image:
            small = image.convert("RGB").quantize(colors=64)
        small.save(png, optimize=True)


class UI:
    """``vmapcheck ui --port P`` in the project, in a session of its own; stopped by
    :meth:`stop` (Ctrl-C to its process group, then SIGKILL after 30 s)."""

    def __init__(self, project: Path, port: int, log_file: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log_file = log_file
        env = {
            **os.environ,
            "MLFLOW_WORKERS": "1",  # one browser reads it: not MLflow's four workers
        }
        with log_file.open("wb") as out:
            self.process = subprocess.Popen(
                [vmapcheck_cli(), "ui", "--port", str(port)],
                cwd=project,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"review_screenshots: vmapcheck ui did not start:\n{self.printed()}")
            time.sleep(1)

    def printed(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def vmapcheck_cli() -> str:
    """The vmapcheck command of this interpreter's environment (else the one on PATH)."""
    here = Path(sys.executable).with_name("vmapcheck")
    return str(here) if here.exists() else "vmapcheck"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder for the PNGs")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="default: here")
    for option, name in zip(("--pass-a", "--pass-b", "--fail"), DEFAULT_RUNS, strict=True):
        parser.add_argument(
            option,
            dest=name.replace("-", "_"),
            default=DEFAULT_RUNS[name],
            help=f"the dvc exp run options of experiment {name} "
            f"(default: {DEFAULT_RUNS[name] or 'none'!r})",
        )
    parser.add_argument(
        "--skip-runs", action="store_true", help="only the screenshots, of the runs logged"
    )
    args = parser.parse_args(argv)
    project, out = args.project.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The environment's own dvc and vmapcheck first (the project's .venv/bin).
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    log: list[str] = []
    problems: list[str] = []
    run_urls: dict[str, str] = {}
    version_urls: dict[str, str] = {}  # the passing runs': each registers a version
    names = list(DEFAULT_RUNS)
    if not args.skip_runs:
        for name in names:
            overrides = shlex.split(getattr(args, name.replace("-", "_")))
            text = run(["dvc", "exp", "run", "-n", name, "--force", *overrides], project, log)
            found = RUN_URL.findall(text)
            if VERSION_URL.findall(text):
                version_urls[name] = VERSION_URL.findall(text)[-1]
            if found:
                run_urls[name] = found[-1]
            else:
                problems.append(f"{name}: dvc exp run printed no 'open the run:' line")
        (out / "exp-show.txt").write_text(
            run(["dvc", "exp", "show", "--no-pager", "--md"], project, log)
        )
        # The gate: the workspace holds the failed run; both must exit non-zero.
        gate_log: list[str] = []
        run(["dvc", "repro"], project, gate_log)
        run([vmapcheck_cli(), "gate"], project, gate_log)
        (out / "gate.txt").write_text("\n".join(gate_log))
        log += gate_log
        for command, entry in zip(("dvc repro", "vmapcheck gate"), gate_log, strict=True):
            if "(exit 0)" in entry.splitlines()[0]:
                problems.append(f"{command} exited 0 on the failed run")
    compare_text = run([vmapcheck_cli(), "compare", "-n", "3", "--width", "220"], project, log)
    (out / "compare.txt").write_text(compare_text)
    compare_urls = COMPARE_URL.findall(compare_text)
    if not compare_urls:
        problems.append("vmapcheck compare printed no compare-view address")

    ui = UI(project, free_port(), out / "ui.log")
    try:
        ui_urls = ANY_URL.findall(ui.printed())
        if not ui_urls:
            problems.append(f"vmapcheck ui printed no address:\n{ui.printed()}")
        pages = [(f"mlflow-runs-list{'' if i == 0 else i}", u) for i, u in enumerate(ui_urls)]
        pages += [(f"mlflow-run-{name.removeprefix('review-')}", u) for name, u in run_urls.items()]
        pages += [("mlflow-compare-3-runs", u) for u in compare_urls[-1:]]
        pages += [
            (f"mlflow-version-{name.removeprefix('review-')}", u)
            for name, u in version_urls.items()
        ]
        for name, url in pages:
            if "***" in url:
                problems.append(f"{name}: the printed URL carries '***': {url}")
            local = url.replace(DEFAULT_PORT, ui.base)  # the port this server listens on
            window = "2600,1100" if "runs-list" in name else "1400,2200"
            text = shoot(local, out, name, window)
            shown = [word for word in BROKEN if word in text]
            if shown or len(text) < 200:
                problems.append(f"{name}: {url} showed {shown or 'an empty page'}")
    finally:
        ui.stop()

    report = project / "reports" / "report.html"
    if report.exists():
        shoot(report.as_uri(), out, "report-failed-run", "1280,2400")
    else:
        problems.append(f"no {report}")
    plots = out / ".plots-show"
    run(["dvc", "plots", "show", "--out", str(plots)], project, log)
    if (plots / "index.html").exists():
        shoot((plots / "index.html").as_uri(), out, "dvc-plots-show", "1400,3000")
    else:
        problems.append("dvc plots show wrote no index.html")
    listed = run(["dvc", "exp", "ls", "--name-only"], project, log).split()
    kept = [n for n in names if n in listed]
    diff = out / ".plots-diff"
    # The experiments DVC kept, and the workspace (the last run: the failing one).
    run(["dvc", "plots", "diff", *kept, "--out", str(diff)], project, log)
    if (diff / "index.html").exists():
        shoot((diff / "index.html").as_uri(), out, "dvc-plots-diff", "1400,3000")
    else:
        problems.append("dvc plots diff wrote no index.html")
    for folder in (plots, diff):
        shutil.rmtree(folder, ignore_errors=True)
    compress(out)
    (out / "printed.txt").write_text("\n".join(log))
    for problem in problems:
        print(f"review_screenshots: {problem}", file=sys.stderr)
    print(f"screenshots in {out}: {', '.join(sorted(p.name for p in out.glob('*.png')))}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
