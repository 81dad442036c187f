"""The options the installed vmapcheck ships for a config group (conf/<group>/*.yaml),
and the form of a name ``vmapcheck init`` gives a model or a table of the user's own."""

from __future__ import annotations

import re
from importlib.resources import files

# A model's or a table's name: it names conf/<group>/<name>.yaml, data/reference/<name>/
# and the MLflow runs.
OPTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def shipped_options(group: str) -> list[str]:
    """The names of the options vmapcheck ships for config group ``group``, sorted."""
    folder = files("vmapcheck.conf") / group
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )
