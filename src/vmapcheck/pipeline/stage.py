"""What every stage shares: load the validated config, run the body, report errors clearly."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from jax.errors import KeyReuseError

from vmapcheck.config import Config, load_config
from vmapcheck.errors import VmapcheckError
from vmapcheck.layout import Layout

StageBody = Callable[[Config, Layout], int | None]


def run_stage(name: str, body: StageBody, root: Path | None = None) -> int:
    """Validate params.yaml, run ``body(config, Layout(root))``; return its exit code.

    ``root``: the project root (None: the working directory, where DVC runs each
    stage's cmd). The body returns an exit code (None = 0). A :class:`VmapcheckError`
    prints ``<stage>: error: <message>`` and returns 2; anything else is a bug and
    keeps its traceback.
    """
    layout = Layout(Path.cwd() if root is None else root)
    try:
        return body(load_config(layout.params_yaml), layout) or 0
    except VmapcheckError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyReuseError as exc:
        first_line = str(exc).splitlines()[0]
        # The params leaves that share the key, when train could name them.
        shared_by = getattr(exc, "shared_by", None)
        where = f"; {shared_by}" if shared_by else ""
        print(
            f"{name}: error: a PRNG key was used twice ({first_line}){where}; each subkey "
            "of the key stream (vmapcheck.core.keys) must feed exactly one random operation",
            file=sys.stderr,
        )
        return 2
