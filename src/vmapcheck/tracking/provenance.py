"""Where a run comes from: the project's git state."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_state(root: Path) -> dict[str, str]:
    """Commit and dirty flag of the project, or 'unknown' outside a git checkout.

    Dirty: a tracked or new file differs from the commit, ``dvc.lock`` aside. The
    pipeline rewrites dvc.lock itself as its stages finish (the benchmark's outputs differ
    on every machine), so counting it would mark every run dirty; its digest is logged
    apart (tag ``dvc_lock_sha256``).
    """
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)dvc.lock"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return {"git_commit": commit, "git_dirty": str(bool(dirty)).lower()}
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
