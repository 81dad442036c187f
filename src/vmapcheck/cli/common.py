"""What the command groups of :mod:`vmapcheck.cli` share: the argparse types that check
a value at the door (argparse prints the refusal, ``expected ..., found ...``, exit 2),
the ``--root`` flag, and the types of the command table.

Nothing heavy at module level: ``vmapcheck --help`` loads no NumPy or JAX.
"""

from __future__ import annotations

import argparse
import math
import stat
from collections.abc import Callable
from pathlib import Path

from vmapcheck.layout import Layout

# A command: the parsed args and the project's layout -> its exit status.
Command = Callable[[argparse.Namespace, Layout], int]
# A group's commands by name: the function that runs each and the one that adds its flags.
Verbs = dict[str, tuple[Command, Callable[[argparse.ArgumentParser], None]]]


def number_in(expected: str, low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number above ``low`` and at most ``high`` (below it
    when ``high`` is 1), refused as ``expected, found <text>`` otherwise."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        inside = low < value < high if high == 1 else low < value <= high
        if not inside:
            raise argparse.ArgumentTypeError(f"expected {expected}, found {text!r}")
        return value

    return parse


def whole_number(expected: str, low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``, refused as ``expected, found
    <text>`` otherwise (``--width -5``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {expected}, found {text!r}")
        return value

    return parse


def batch_sizes(text: str) -> list[int]:
    """An argparse type: comma-separated batch sizes (``8,64``), each a whole number of
    rows of at least 1."""
    sizes = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            size = 0
        if size < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated batch sizes of at least 1 row (8,64), found {text!r}"
            )
        sizes.append(size)
    return sizes


def output_file(text: str) -> Path:
    """An argparse type: a path where a file can be written, checked before the command's
    work (``--out reports``, a directory, or ``/proc/x.json`` would be refused only when
    the result is written)."""
    from vmapcheck.io import output_file_problem  # numpy: not for --help

    path = Path(text)
    problem = output_file_problem(path)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return path


def tcp_port(text: str) -> int:
    """A TCP port a user may open: 1024-65535 (argparse prints the refusal, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        expected = f"expected a port number 1024-65535, found {text!r}"
        raise argparse.ArgumentTypeError(expected) from None
    if not 1024 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1024-65535, found {port}")
    return port


def folder(text: str) -> Path:
    """An argparse type: an existing folder (``--root /dev/null`` is refused at once)."""
    path = Path(text)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        found = "nothing there" if isinstance(exc, FileNotFoundError) else exc.strerror or exc
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected the project's folder, found {found}"
        ) from None
    if not stat.S_ISDIR(mode):
        from vmapcheck.io import file_kind  # numpy: not for --help

        raise argparse.ArgumentTypeError(
            f"{text!r}: expected the project's folder, found {file_kind(mode)}"
        )
    return path


def root_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", type=folder, default=None, help="project root (default: the current folder)"
    )
