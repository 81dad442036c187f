"""The plots page that draws offline: ``dvc plots show`` with Vega inlined, not from a CDN.

``dvc plots show`` fills an HTML template. DVC's default (dvc_render's ``PAGE_HTML``) loads
vega, vega-lite and vega-embed from a CDN through its ``{scripts}`` placeholder: without
the network that page is blank, and says nothing. DVC takes another template from
``--html-template PATH`` or from ``plots.html_template`` in ``.dvc/config`` (a path
relative to ``.dvc/``). Only ``{plot_divs}`` is required there; ``{scripts}`` and
``{refresh_tag}`` are filled where present.

vmapcheck's template (``.dvc/plots/offline.html``, written by ``vmapcheck init``, which
also sets ``plots.html_template``) has no ``{scripts}``: it carries the three builds
inline, from the pinned npm packages of ``vega/bundle.json`` beside this module (version,
the tarball's sha512, each file's sha256; ``scripts/fetch-vega`` fetches them again), so
the page DVC writes is one self-contained file that draws in a browser with no network.
Each file's sha256 is checked whenever the template is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.layout import Layout

# .dvc/config's key, and its value: relative to .dvc/, as DVC resolves it (Layout.plots_page).
HTML_TEMPLATE_KEY = "plots.html_template"
HTML_TEMPLATE_VALUE = "plots/offline.html"
# Where `dvc plots show` writes its page by default (init's .gitignore block ignores it).
DEFAULT_OUT = "dvc_plots"
FETCH_COMMAND = "`make vega-bundle` (scripts/fetch-vega)"
# A script or stylesheet the page would fetch from elsewhere: none may remain.
_REMOTE = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.I)


@dataclass(frozen=True)
class Script:
    """One pinned build: npm package ``name@version``, file ``member`` of its tarball."""

    name: str
    version: str
    license: str
    member: str
    sha256: str
    text: str


def _bundle_dir():
    return files("vmapcheck.project") / "vega"


def bundle() -> list[Script]:
    """The three builds, in the order the page loads them, each checked against its sha256.

    Raises:
        ConfigError: the manifest or a file is missing, or a file's sha256 differs from
            its pin (naming the file and the command that fetches it again).
    """
    folder = _bundle_dir()
    manifest_path = folder / "bundle.json"
    if not manifest_path.is_file():
        raise ConfigError(
            f"the offline plots page's manifest is missing: {manifest_path} (a broken "
            "install: reinstall vmapcheck)"
        )
    scripts = []
    for package in json.loads(manifest_path.read_text(encoding="utf-8"))["packages"]:
        path = folder / package["script"]
        spec = f"{package['name']}@{package['version']}"
        if not path.is_file():
            raise ConfigError(
                f"the offline plots page's {spec} build is missing: {path}. In a checkout of "
                f"vmapcheck, {FETCH_COMMAND} fetches it from the pinned npm package; an "
                "installed vmapcheck ships it (reinstall it)"
            )
        data = path.read_bytes()
        if (digest := hashlib.sha256(data).hexdigest()) != package["sha256"]:
            raise ConfigError(
                f"the offline plots page's {spec} build {path} has sha256 {digest}, pinned "
                f"{package['sha256']} (vega/bundle.json): fetch it again with {FETCH_COMMAND}"
            )
        text = data.decode("utf-8")
        # Inlined in a <script> element: a closing tag inside would end it early.
        if "</script" in text.lower():
            raise ConfigError(f"{path}: holds '</script', which cannot be inlined in a page")
        scripts.append(
            Script(
                name=package["name"],
                version=package["version"],
                license=package["license"],
                member=package["member"],
                sha256=package["sha256"],
                text=text,
            )
        )
    return scripts


def bundle_line(scripts: list[Script]) -> str:
    """``vega 5.33.1, vega-lite 5.23.0 and vega-embed 6.29.0``: said in the page."""
    names = [f"{s.name} {s.version}" for s in scripts]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def page_template() -> str:
    """The HTML template ``dvc plots show`` fills: DVC's placeholders ``{refresh_tag}`` and
    ``{plot_divs}``, the bundle inline, a note in the page where a plot fails to draw."""
    from vmapcheck import __version__

    layout = Layout(Path())
    scripts = bundle()
    env = Environment(
        loader=PackageLoader("vmapcheck.project", "templates"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # the scripts are inlined as they are
    )
    pngs = [
        path.relative_to(layout.root).as_posix()
        for path in (layout.latency_png, layout.speedup_png)
    ]
    return env.get_template("plots_page.html.j2").render(
        version=__version__, scripts=scripts, bundle_line=bundle_line(scripts), pngs=pngs
    )


def remote_resources(page: str) -> list[str]:
    """The ``<script src>`` / ``<link href>`` tags of ``page`` that point off the machine."""
    return [m.group(0) for m in _REMOTE.finditer(page)]


def write_template(layout: Layout) -> Path:
    """Write ``.dvc/plots/offline.html`` and set ``plots.html_template`` in ``.dvc/config``."""
    from vmapcheck.io import atomic_write_text

    atomic_write_text(layout.plots_page, page_template())
    _dvc(layout.root, "config", HTML_TEMPLATE_KEY, HTML_TEMPLATE_VALUE)
    return layout.plots_page


def _dvc(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A command that promises no network sends DVC's usage analytics nowhere either.
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    if done.returncode != 0:
        raise ConfigError(f"`dvc {' '.join(args)}` failed: {done.stderr.strip() or done.stdout}")
    return done


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def run_plots(layout: Layout, out: str | None = None, write: bool = False) -> int:
    """``vmapcheck plots``: ``dvc plots show`` with the offline template; print the page.

    With ``write``, (re)write the template and the DVC setting first.

    Raises:
        ConfigError: the template is missing (naming it and the command that writes it),
            the bundle is missing or altered, or ``dvc plots show`` failed.
        ArtifactError: there is no plot data yet, or the page DVC wrote would still load
            something from the network.
    """
    root = layout.root
    template = layout.plots_page
    rel = template.relative_to(root).as_posix()
    if write:
        write_template(layout)
        print(f"wrote {rel} and set {HTML_TEMPLATE_KEY} = {HTML_TEMPLATE_VALUE} in .dvc/config")
    if not template.is_file():
        raise ConfigError(
            f"the offline plots page template is missing: {rel}. `vmapcheck plots "
            "--write-template` writes it (and sets it in .dvc/config); `vmapcheck init` "
            "writes it too"
        )
    if template.read_text(encoding="utf-8") != page_template():
        print(
            f"note: {rel} is not the page this vmapcheck writes (another version, or edited); "
            "`vmapcheck plots --write-template` writes it again"
        )
    if not layout.plots.is_dir():
        raise ArtifactError(
            f"no plot data: {layout.plots.relative_to(root).as_posix()} does not exist yet; "
            "the bench stage writes it (`dvc repro bench`, or `make demo`)"
        )
    out_dir = (root / (out or DEFAULT_OUT)).resolve()
    page = out_dir / "index.html"
    # DVC writes no page when it loaded no plot: an old one must not pass for this run's.
    page.unlink(missing_ok=True)
    done = _dvc(root, "plots", "show", "--html-template", str(template), "-o", str(out_dir))
    if not page.is_file():
        raise ArtifactError(
            f"`dvc plots show` wrote no page ({page}):\n{done.stdout.strip()}\n"
            f"{done.stderr.strip()}"
        )
    text = page.read_text(encoding="utf-8")
    remote = remote_resources(text)
    if remote:
        raise ArtifactError(f"{page} would load from the network: {'; '.join(remote)}")
    for line in done.stderr.strip().splitlines():
        print(f"dvc: {line}", file=sys.stderr)
    # What DVC put in: a Vega plot is its `<div id = "...">` (dvc_render's VegaRenderer.DIV),
    # with `var spec = {};` where it loaded no data; an image plot an <img> the template
    # itself does not hold.
    vega = text.count('<div id = "') - text.count("var spec = {};")
    images = text.count("<img src=") - template.read_text(encoding="utf-8").count("<img src=")
    if vega + images == 0:
        raise ArtifactError(
            f"`dvc plots show` drew no plot into {page}: the files dvc.yaml's plots name are "
            f"missing or empty under {layout.plots.relative_to(root).as_posix()} (the bench "
            "stage writes them: `dvc repro bench`)"
        )
    counted = f"{_count(vega, 'Vega plot')}, {_count(images, 'image')}"
    print(f"plots page ({counted}; draws offline, no network needed): {page}")
    pngs = [p for p in (layout.latency_png, layout.speedup_png) if p.is_file()]
    if pngs:
        print("the same figures as PNG: " + ", ".join(p.relative_to(root).as_posix() for p in pngs))
    return 0
