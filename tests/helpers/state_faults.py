"""The shipped Haiku ConvNet (vmapcheck.examples.haiku_cnn) with its state left undeclared:
the user's mistake of issue 24, as a factory a config can name
(``model.factory._target_=tests.helpers.state_faults.make_model``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vmapcheck.core.models import Model


def make_model(**kwargs: Any) -> Model:
    """``vmapcheck.examples.haiku_cnn.make_model(**kwargs)`` without ``state_leaves``: its
    Haiku state (int32 counters included) folded into the params, nothing declared."""
    from vmapcheck.examples.haiku_cnn import make_model as make_haiku

    return replace(make_haiku(**kwargs), state_leaves=())
