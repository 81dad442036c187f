"""An acceptance corpus of batching bugs that people reported in public (issue 42, item 1).

Each entry is one reported bug of the JAX ecosystem (jax, flax, equinox, Keras,
transformers' Flax models, ...), written as a tiny vmapcheck model twice: with the bug,
and with the fix its thread published. ``tests/test_real_bugs.py`` checks both with
``vmapcheck.testing.check_batching`` and ``docs/real-bugs.md`` holds the table.

A model is written per example (``forward_one``: one example, no batch axis) and, where
the bug lives there, by hand for a batch (``forward_batch``: batch axis 0), as a user
writes them (docs/own-model.md). Every model is a few rows and a few features, so the
whole corpus checks in seconds per entry.

Two kinds of entry need features a vmapcheck older than issue 42 lacks (``requires``):
``"stochastic"`` (a forward that takes one PRNG key per example) and ``"gradients"``
(the API checks finite loss and gradients). :func:`feature_present` says whether the
installed vmapcheck has them; the test skips an entry where it does not (a wheel of
another version checked against this corpus).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# (model, params, examples), the arguments of check_batching.
Case = tuple[Any, Any, Any]

# The kinds of batching bug the corpus must cover (issue 42, item 1): one module each.
KINDS = (
    "statistics over the batch",
    "masks and padding",
    "randomness under vmap",
    "cond/select under vmap",
    "scatter/gather batching rules",
    "linear algebra batched vs unbatched",
    "reduction order",
    "dtype promotion",
)

# The kinds of finding a failure belongs to (issue 42, item 2).
FINDING_KINDS = ("batching", "numerical", "model", "contract")


def _has_stochastic() -> bool:
    from vmapcheck.core.models import Model

    return "stochastic" in {f.name for f in dataclasses.fields(Model)}


def _has_gradients() -> bool:
    from vmapcheck.testing import check_batching

    return "gradients" in inspect.signature(check_batching).parameters


# A feature an entry may need -> whether the installed vmapcheck has it.
FEATURES: dict[str, Callable[[], bool]] = {
    "stochastic": _has_stochastic,
    "gradients": _has_gradients,
}


def feature_present(name: str) -> bool:
    """Whether the installed vmapcheck has the feature ``name`` (a key of FEATURES)."""
    return FEATURES[name]()


@dataclass(frozen=True)
class Source:
    """Where the bug was reported: a public thread, and how it was resolved."""

    repo: str  # "owner/name" on GitHub
    number: int  # the issue or pull request number
    title: str  # the thread's title, as it reads there
    fixed_by: str  # one line: what the maintainers said, or the change that fixed it
    url: str = ""  # https://github.com/<repo>/issues/<number> (filled in when empty)

    def __post_init__(self) -> None:
        expected = f"https://github.com/{self.repo}/issues/{self.number}"
        if not self.url:
            object.__setattr__(self, "url", expected)
        if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", self.url):
            raise ValueError(f"source url: expected a GitHub issue or PR URL, found {self.url!r}")
        if f"/{self.repo}/" not in self.url or not self.url.endswith(f"/{self.number}"):
            raise ValueError(f"source url {self.url!r} does not name {self.repo} #{self.number}")


@dataclass(frozen=True)
class CaughtBy:
    """The check that must catch the bug: its finding kind and a substring of its line."""

    kind: str  # one of FINDING_KINDS
    line: str  # a substring of one of report.failures, e.g. "outputs depend on batch"

    def __post_init__(self) -> None:
        if self.kind not in FINDING_KINDS:
            raise ValueError(
                f"caught_by.kind: expected one of {FINDING_KINDS}, found {self.kind!r}"
            )
        if not self.line:
            raise ValueError("caught_by.line: expected a non-empty substring of a failure line")


@dataclass(frozen=True)
class RealBug:
    """One reported bug: its source, and the model with the bug and with the fix.

    ``bug()`` and ``fix()`` each return ``(model, params, examples)`` for
    ``check_batching(model, params, examples, **check_kwargs)``; examples carry the
    batch on axis 0 and hold the rows that show the bug.
    """

    name: str
    kind: str  # one of KINDS
    source: Source
    what: str  # one sentence: the bug in the user's words
    bug: Callable[[], Case]
    fix: Callable[[], Case]
    caught_by: CaughtBy
    check_kwargs: Mapping[str, Any] = field(default_factory=dict)
    fix_may_fail: tuple[str, ...] = ()  # finding kinds the published fix may fail with
    requires: tuple[str, ...] = ()  # keys of FEATURES the entry needs

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind: expected one of {KINDS}, found {self.kind!r}")
        for kind in self.fix_may_fail:
            if kind not in FINDING_KINDS:
                raise ValueError(
                    f"{self.name}: fix_may_fail: expected kinds from {FINDING_KINDS}, "
                    f"found {kind!r}"
                )
        for feature in self.requires:
            if feature not in FEATURES:
                raise ValueError(
                    f"{self.name}: requires: expected features from {sorted(FEATURES)}, "
                    f"found {feature!r}"
                )

    def missing(self) -> tuple[str, ...]:
        """The required features the installed vmapcheck lacks (empty: runnable now)."""
        return tuple(name for name in self.requires if not feature_present(name))


def _registry() -> dict[str, RealBug]:
    from tests.real_bugs import (
        cond_select,
        dtypes,
        indexing,
        linalg,
        masks,
        randomness,
        reduction,
        statistics,
    )

    entries: dict[str, RealBug] = {}
    for module in (statistics, masks, randomness, cond_select, indexing, linalg, reduction, dtypes):
        for bug in module.BUGS:
            if bug.name in entries:
                raise ValueError(f"real bug {bug.name!r} is registered twice")
            entries[bug.name] = bug
    missing = set(KINDS) - {bug.kind for bug in entries.values()}
    if missing:
        raise ValueError(f"the corpus covers no bug of kind(s) {sorted(missing)}")
    return entries


REAL_BUGS: dict[str, RealBug] = _registry()
