"""Where a run comes from: the project's git state."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

import yaml

# The lock DVC rewrites as each stage finishes: the pipeline's own bookkeeping.
DVC_LOCK = "dvc.lock"


def pipeline_outputs(root: Path) -> set[str]:
    """What the pipeline itself writes, as paths relative to ``root``: dvc.lock, every
    stage's outs and metrics in dvc.yaml, and the ``.gitignore`` DVC keeps beside each
    (none when dvc.yaml cannot be read: then every change counts as a person's)."""
    written = {DVC_LOCK}
    try:
        stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return written
    for stage in stages.values() if isinstance(stages, dict) else []:
        for entry in [*stage.get("outs", []), *stage.get("metrics", [])]:
            path = entry if isinstance(entry, str) else next(iter(entry))
            written.add(str(PurePosixPath(path)))
            written.add(str(PurePosixPath(path).parent / ".gitignore"))
    return written


def _is_output(path: str, outputs: set[str]) -> bool:
    return any(path == out or path.startswith(f"{out}/") for out in outputs)


def _git(root: Path, *args: str) -> str:
    """``git <args>``'s output, run in ``root``; CalledProcessError when git refuses."""
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def git_state(root: Path) -> dict[str, str]:
    """Commit, dirty flag and the outputs the pipeline rewrote, or 'unknown' outside a
    git checkout.

    ``git_dirty``: a tracked file differs from the commit, or a file git would carry is
    new, other than what the pipeline writes itself (:func:`pipeline_outputs`): so it
    says whether the sources and config a run was made from are the commit's. A run from
    an untouched clone is clean, although its stages rewrote dvc.lock and the metrics
    kept in git (the benchmark's figures differ on every machine).
    ``git_outputs_rewritten``: those pipeline outputs that differ from the commit,
    comma-separated ("" for none), e.g. ``dvc.lock,reports/bench.json``.
    """
    try:
        commit = _git(root, "rev-parse", "HEAD").strip()
        # -z: paths as they are (no quoting); one entry per file, untracked ones listed
        # file by file, so a new file inside an output folder is recognized as one.
        status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ".")
        prefix = _git(root, "rev-parse", "--show-prefix").strip()
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": "unknown", "git_dirty": "unknown", "git_outputs_rewritten": ""}
    outputs = pipeline_outputs(root)
    changed, entries = [], status.split("\0")
    while entries:
        entry = entries.pop(0)
        if not entry:
            continue
        code, path = entry[:2], entry[3:]
        if "R" in code or "C" in code:
            entries.pop(0)  # a rename's or copy's source path follows it
        # Paths are relative to the repository's top; the project may be a subfolder.
        changed.append(path.removeprefix(prefix))
    rewritten = sorted(p for p in changed if _is_output(p, outputs))
    dirty = any(not _is_output(p, outputs) for p in changed)
    return {
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "git_outputs_rewritten": ",".join(rewritten),
    }
