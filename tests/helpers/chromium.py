"""Open an HTML file in headless Chromium: a screenshot and what the browser rendered.

`make test` installs the browser first (scripts/ensure-chromium). The page is opened as
a copy with one probe script added at the end: once the page has loaded, it records
what the browser itself saw (each image decoded and its size, the verdict banner's text,
size and colour, any resource fetched from outside the page) into a ``<pre
id="render-probe">`` that ``--dump-dom`` then prints. The screenshot is of the report as
written, without the probe.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers.wait import HANG_S

CANDIDATES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")

PROBE = """<script>
window.addEventListener("load", () => {
  const verdict = document.getElementById("verdict");
  const box = verdict ? verdict.getBoundingClientRect() : null;
  const probe = {
    images: [...document.images].map((img) => ({
      id: img.id,
      complete: img.complete,
      natural_width: img.naturalWidth,
      natural_height: img.naturalHeight,
      shown_width: img.getBoundingClientRect().width,
      src_scheme: img.src.split(":")[0],
    })),
    verdict: verdict && {
      text: verdict.innerText,
      width: box.width,
      height: box.height,
      background: getComputedStyle(verdict).backgroundColor,
    },
    fetched: performance.getEntriesByType("resource").map((entry) => entry.name),
    title: document.title,
  };
  const out = document.createElement("pre");
  out.id = "render-probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>"""


def find_chromium() -> str | None:
    """The browser named by $CHROMIUM, else the first of CANDIDATES on PATH."""
    for name in (os.environ.get("CHROMIUM", ""), *CANDIDATES):
        if name and (found := shutil.which(name)):
            return found
    return None


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        browser,
        "--headless",
        # Tests may run as root (CI containers), where Chromium's sandbox cannot start.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        # Run the page until it is idle (load event, images decoded) before dumping.
        "--virtual-time-budget=10000",
        *args,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=HANG_S
    )  # only a hang: Chromium starts slowly under load
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


# Chromium with no network: every host name fails to resolve, and anything that would
# still go out is sent to a proxy on a closed local port. A page that needs a CDN stays
# blank under these flags, as it does on a machine without a network.
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9")


def render(
    page: Path,
    out: Path,
    width: int = 1280,
    height: int = 4000,
    chromium_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Screenshot ``page`` to ``out/report.png``; return the probe's findings and the DOM.
    ``chromium_args`` go to both runs of the browser (e.g. :data:`OFFLINE`).

    Returns {"probe": {...} as recorded in the browser, "dom": the serialized DOM,
    "screenshot": Path}. Raises AssertionError naming the missing browser or its error.
    """
    browser = find_chromium()
    if browser is None:
        raise AssertionError(
            "no headless Chromium found (looked for $CHROMIUM, "
            + ", ".join(CANDIDATES)
            + "): run `make test` (it runs scripts/ensure-chromium) or install the "
            "'chromium' package"
        )
    out.mkdir(parents=True, exist_ok=True)
    screenshot = out / "report.png"
    _chromium(
        browser,
        out / "profile-shot",
        f"--window-size={width},{height}",
        *chromium_args,
        f"--screenshot={screenshot}",
        page.resolve().as_uri(),
    )
    text = page.read_text(encoding="utf-8")
    # Before the page's own closing tag, the last one: an inlined script (Vega's HTML
    # export) may hold the string "</body>" too.
    head, body_end, tail = text.rpartition("</body>")
    assert body_end, "the page has no </body>"
    probed = out / f"probed-{page.name}"
    probed.write_text(head + PROBE + body_end + tail, encoding="utf-8")
    dom = _chromium(
        browser,
        out / "profile-dom",
        f"--window-size={width},{height}",
        *chromium_args,
        "--dump-dom",
        probed.resolve().as_uri(),
    ).stdout
    start = dom.find('<pre id="render-probe">')
    assert start >= 0, "the probe did not run: the page never finished loading"
    end = dom.index("</pre>", start)
    probe = json.loads(html.unescape(dom[start + len('<pre id="render-probe">') : end]))
    for profile in ("profile-shot", "profile-dom"):
        shutil.rmtree(out / profile, ignore_errors=True)
    return {"probe": probe, "dom": dom, "screenshot": screenshot}


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; AssertionError if it is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR", "PNG without IHDR first"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
