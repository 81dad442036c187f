"""tests/helpers/wait.py: polls() waits with backoff and gives up with what it waited for."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.helpers.wait import polls


def test_polls_backs_off_and_gives_up_naming_what_and_the_detail() -> None:
    looks: list[float] = []
    with pytest.raises(AssertionError, match=r"the file not within 0.3 s:\nlog tail"):
        for waited in polls("the file", 0.3, first_s=0.01, most_s=0.08, detail=lambda: "log tail"):
            looks.append(waited)
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    # Each gap at least the pause asked for (0.01, 0.02, 0.04, then 0.08 each):
    # a sleep never returns early, however late a loaded machine wakes it.
    asked = [min(0.01 * 2**i, 0.08) for i in range(len(gaps))]
    assert len(looks) >= 2 and all(gap >= want for gap, want in zip(gaps, asked, strict=True))


def test_polls_ends_when_the_caller_breaks_out() -> None:
    started = time.monotonic()
    for n, _ in enumerate(polls("three looks", first_s=0.001)):
        if n == 2:
            break
    assert time.monotonic() - started < 60  # not the hang limit
