"""Which vmapcheck code each stage runs, recorded so that DVC reruns what a new one changes.

A user's dvc.yaml cannot list vmapcheck's source files as deps: they are installed
somewhere in a virtual environment, not in the user's repository. Instead the first
stage, ``code`` (always run; imports no JAX), writes one small record per stage,
``reports/code/<stage>.json``: the installed vmapcheck's version and a sha256 of every
library file that stage runs. Each stage lists its own record as a dep, so:

- a new vmapcheck (an upgrade, or an edit in an editable install) reruns exactly the
  stages whose code changed, and no other;
- an unchanged vmapcheck reruns nothing (the records are byte for byte the same).

:data:`STAGE_CODE` is the one place that says which library files a stage runs: files,
or folders taken whole, relative to the package. ``tests/test_stage_code.py`` checks it
against what importing ``vmapcheck.stages.<stage>`` really loads, both ways.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from vmapcheck import __version__
from vmapcheck.config import read_params, validate_config
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.layout import Layout
from vmapcheck.running import mark_running, scrub_credentials

# Every stage loads these: the config, the errors, atomic I/O, the layout, the stage runner.
_SHARED = (
    "__init__.py",
    "config",
    "errors.py",
    "clock.py",
    "versions.py",
    "io.py",
    "pause.py",
    "layout.py",
    "stages/__init__.py",
    "pipeline/__init__.py",
    "pipeline/stage.py",
    "running.py",
)
# The shipped example models (imported only when configured, model=flax_mlp, ...): every
# stage that builds a model lists them, though no default import shows them.
EXAMPLES = "examples"

# The library files (or folders, whole) each stage runs, relative to the vmapcheck package.
# pipeline/ holds one module per stage, so an edit of one stage's body reruns only it;
# check and bench write only the headline figures of report/, not the HTML report; bench
# times (bench/timing) and judges nothing (bench/verdict is track's).
STAGE_CODE: dict[str, tuple[str, ...]] = {
    "prepare": (*_SHARED, "stages/prepare.py", "pipeline/prepare.py", "core", "data"),
    "train": (
        *_SHARED,
        "stages/train.py",
        "pipeline/train.py",
        "params_io.py",
        "core",
        "data",
        "tracking",
        EXAMPLES,
    ),
    "forward": (
        *_SHARED,
        "stages/forward.py",
        "pipeline/forward.py",
        "pipeline/multiprocess.py",
        "params_io.py",
        "provenance.py",
        "core",
        "data",
        "check",
        EXAMPLES,
    ),
    "check": (
        *_SHARED,
        "stages/check.py",
        "pipeline/check.py",
        "params_io.py",
        "provenance.py",
        "core",
        "data",
        "check",
        "report/__init__.py",
        "report/elements.py",
        "report/headline.py",
        EXAMPLES,
    ),
    "bench": (
        *_SHARED,
        "stages/bench.py",
        "pipeline/bench.py",
        "params_io.py",
        "core",
        "data",
        "bench/__init__.py",
        "bench/timing",
        "guard",
        "report/__init__.py",
        "report/headline.py",
        "report/plots.py",
        EXAMPLES,
    ),
    "track": (
        *_SHARED,
        "stages/track.py",
        "pipeline/track.py",
        "params_io.py",
        "provenance.py",
        "core",
        "data",
        "check",
        "bench",
        "report",
        "tracking",
    ),
}

PACKAGE = Path(__file__).resolve().parent.parent


def _files(entry: str) -> list[Path]:
    """The files of one :data:`STAGE_CODE` entry: the file, or a folder's files (bytecode
    caches left out: they are not the code)."""
    path = PACKAGE / entry
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [path]


def stage_record(stage: str) -> dict[str, object]:
    """``{"stage", "vmapcheck", "sha256", "files"}``: the installed vmapcheck's version and
    the sha256 of each library file ``stage`` runs (path relative to the package), with
    one sha256 over them all."""
    files: dict[str, str] = {}
    for entry in STAGE_CODE[stage]:
        for file in _files(entry):
            rel = file.relative_to(PACKAGE).as_posix()
            files[rel] = hashlib.sha256(file.read_bytes()).hexdigest()
    whole = hashlib.sha256()
    for rel, digest in sorted(files.items()):
        whole.update(f"{rel}\0{digest}\0".encode())
    return {
        "stage": stage,
        "vmapcheck": __version__,
        "sha256": whole.hexdigest(),
        "files": dict(sorted(files.items())),
    }


def write_records(layout: Layout) -> dict[str, str]:
    """Write ``reports/code/<stage>.json`` for every stage; return which changed: stage ->
    "new", "changed" or "same". An unchanged record is not rewritten."""
    changes = {}
    for stage in STAGE_CODE:
        path = layout.code_record(stage)
        record = stage_record(stage)
        try:
            old = read_json(path) if path.is_file() else None
        except ArtifactError:  # unreadable: written anew, as a change
            old = {}
        changes[stage] = "new" if old is None else "same" if old == record else "changed"
        if changes[stage] != "same":
            atomic_write_json(path, record)
    return changes


def run(root: Path | None = None) -> int:
    """The ``code`` stage: validate the whole params.yaml, write the records, say which
    stages' code changed (exit 2, nothing written, on an invalid params.yaml)."""
    layout = Layout(Path.cwd() if root is None else root)
    # The first stage of every `dvc repro` (always run), and cheap: a mistyped key
    # (`-S +precision.tolerence.rtol=...`) is refused here, with its "did you mean",
    # before prepare starts any work, not minutes later by the one stage whose params
    # it happens to touch. Refused before the run is marked: no run began.
    scrub_credentials(layout.params_yaml, "code")
    try:
        _, raw = read_params(layout.params_yaml)
        validate_config(raw, source=str(layout.params_yaml))
    except ConfigError as exc:
        print(f"code: error: {exc}", file=sys.stderr)
        return 2
    # The first stage of every run: from here until track ends, a second `dvc exp run`
    # in this workspace is refused before it rewrites params.yaml.
    mark_running(layout)
    changes = write_records(layout)
    # The records are `persist: true` outs (dvc.yaml): DVC leaves the last run's in place
    # rather than deleting them before this stage runs, so "same" is measured against
    # them; without it every run said every stage's code was new.
    new = [stage for stage, change in changes.items() if change == "new"]
    changed = [stage for stage, change in changes.items() if change == "changed"]
    said = [f"new record for {', '.join(new)}"] if new else []
    said += [f"changed code for {', '.join(changed)}"] if changed else []
    print(f"code: vmapcheck {__version__}; {'; '.join(said) or 'no change'}")
    return 0
