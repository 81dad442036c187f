"""The ``vmapcheck`` command line's argparse classes: a "did you mean" for a mistyped
command or choice (:class:`Parser`), and an unknown option refused as such before
argparse parses (:class:`CommandLine`, :func:`unknown_option`), with the closest option.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vmapcheck.errors import did_you_mean


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped command or choice
    (``vmapcheck comapre``). Python 3.14's ``suggest_on_error`` does this; vmapcheck
    supports 3.11."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        # argparse's one place for choices (commands, --order, store's verb).
        choices = action.choices
        if choices is not None and value not in choices:
            hint = did_you_mean(str(value), [str(c) for c in choices])
            if hint:
                listed = ", ".join(map(repr, choices))
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r}{hint} (choose from {listed})"
                )
        super()._check_value(action, value)


class CommandLine(Parser):
    """The top parser: before argparse parses, an unknown option anywhere in the command
    line is refused as such, with the closest option (:func:`unknown_option`), so that
    ``--verison`` is not reported as a missing command, nor ``init --modle`` as a
    missing ``--model``."""

    # typeshed declares parse_known_args as overloads (a namespace given or not): this one
    # signature covers both, which mypy cannot match to the overloads.
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        found = unknown_option(self, argv)
        if found is not None:
            parser, message = found
            parser.error(message)
        return super().parse_known_args(argv, namespace)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s subcommands by name ({} when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _is_option(token: str) -> bool:
    """Whether argparse reads ``token`` as an option (``-5`` and ``-1e-3`` are values)."""
    if not token.startswith("-") or token in ("-", "--"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def unknown_option(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.ArgumentParser, str] | None:
    """The first option in ``argv`` that ``parser`` (or the subcommand ``argv`` names)
    does not take, as (the parser that refuses it, ``unknown option --verison (did you
    mean --version?)``); None when every option is known. A long option is known when it
    starts one of the parser's (argparse takes ``--fil`` for ``--filter``), a short one
    by its first two characters (``-n5``); the value after an option that takes one is
    skipped; nothing after ``--`` or after a mistyped command (argparse refuses that)."""
    options = [o for action in parser._actions for o in action.option_strings]
    valued = {o for action in parser._actions if action.nargs != 0 for o in action.option_strings}
    commands = _subcommands(parser)
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return None
        if _is_option(token):
            head = token.split("=", 1)[0]
            if head.startswith("--"):
                matches = [o for o in options if o.startswith(head)]
                # An ambiguous prefix stays as typed: argparse refuses it, naming both.
                name = matches[0] if len(matches) == 1 else head
                attached = "=" in token
            else:
                name, attached = head[:2], len(token) > 2
                matches = [name] if name in options else []
            if not matches:
                return parser, f"unknown option {head}{did_you_mean(head, options)}"
            if name in valued and not attached:
                i += 1  # its value, whatever it looks like
        elif commands:
            return unknown_option(commands[token], argv[i + 1 :]) if token in commands else None
        i += 1
    return None
