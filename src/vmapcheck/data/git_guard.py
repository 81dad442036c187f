"""A raw table inside the repository must be one that git never carries.

A user's table may hold personal data. Inside the repository, git carries a file that is
tracked, and `git commit -a`, `git add -A` or `dvc exp run` (which commits the untracked
files of the workspace into its `refs/exps/...`) carry one that is not ignored. So
`prepare` refuses such a file before reading a row, naming it and the fix. The shipped
synthetic example (fake people) is the one tracked table allowed, and only while its
content is the shipped one.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from vmapcheck.errors import SourceError

# The tracked synthetic example (data/raw/README.md says how it was made) and the sha256
# of its shipped content: a user's rows written over it are refused like any tracked file.
SHIPPED_EXAMPLES = {
    "data/raw/example.csv": "7816fcd648bfadac9c7785e23fa204804f46a3841f3289191140706afbdc90ee",
}


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def refuse_if_git_would_carry(path: Path, root: Path, key: str = "data.path") -> None:
    """Raise SourceError when git carries, or would carry, the raw table at ``path``.

    ``root``: the project folder. Nothing is checked when git is not installed, when
    ``root`` is not in a git work tree (an unpacked archive) or when ``path`` lies outside
    it. ``key``: the config key that named the file, for the message."""
    if shutil.which("git") is None:
        return
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return
    toplevel = Path(top.stdout.strip()).resolve()
    resolved = path.resolve()
    if not resolved.is_relative_to(toplevel):
        return
    relative = resolved.relative_to(toplevel).as_posix()
    tracked = _git(toplevel, "ls-files", "--error-unmatch", "--", relative).returncode == 0
    if tracked:
        shipped = SHIPPED_EXAMPLES.get(relative)
        if shipped is not None and resolved.is_file() and _sha256(resolved) == shipped:
            return
        raise SourceError(
            f"{key}: {relative} is tracked by git, so its rows are in the repository's "
            "history and in every clone and experiment ref. Untrack it with "
            f"`git rm --cached {relative}` (the file stays on disk), keep it under "
            "data/raw/ (ignored by .gitignore) or move it outside the repository, then "
            "run again; if it was ever committed, its rows stay in the history until it "
            "is rewritten."
        )
    ignored = _git(toplevel, "check-ignore", "--quiet", "--", relative)
    if ignored.returncode == 1:
        raise SourceError(
            f"{key}: {relative} is inside the repository and not ignored by git: "
            "`dvc exp run` commits untracked files into its experiment refs "
            "(refs/exps/...), and `git add -A` would stage it, so its rows would enter "
            "git. Put it under data/raw/ (everything there but the shipped example is "
            "ignored), add it to .gitignore, or move it outside the repository."
        )
    if ignored.returncode != 0:
        raise SourceError(
            f"{key}: cannot tell whether git ignores {relative} "
            f"(git check-ignore exited {ignored.returncode}: {ignored.stderr.strip()})"
        )
