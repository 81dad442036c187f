"""``vmapcheck <command>``: the project's one command line (``make`` targets call it).

Every command runs on the project in the current folder (``Layout(Path.cwd())``; the
commands that had one take ``--root``), parses its flags and calls one library function
in the module that owns the logic. Those modules are imported only by the command that
needs them, so ``vmapcheck --help`` does not load JAX or MLflow.

This module holds the parser and the dispatch: :data:`COMMANDS` (each command's line, in
``--help``'s order), :func:`build_parser` and :func:`main`. Each command's flags and the
function that runs it live in its group's module, which lists them in its ``VERBS``:
``project`` (init, params, plots), ``checks`` (diagnose, reference, summary, gate),
``benchmark`` (verdict, verdict-paired), ``tracking`` (compare, registry, rollback,
promote, ui, store); ``common`` holds the argparse types they share, ``parser`` the
argparse classes (did you mean, unknown options).

Exit status (docs/errors.md): each command's own (0 success, 1 what it looks for was
found; see each command's help), 2 for a usage error (argparse's one-line message) or a
refusal it reports on stderr as ``<command>: error: ...``, 3 an internal error (one line;
``--debug`` shows its traceback), 130 Ctrl-C, 141 its reader went away (``| head``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vmapcheck import __version__
from vmapcheck.cli import benchmark, checks, project, tracking
from vmapcheck.cli.common import Verbs
from vmapcheck.cli.parser import CommandLine, Parser
from vmapcheck.errors import (
    DEBUG_ENV,
    INTERRUPTED,
    quiet_broken_pipe,
    redact,
    redacted_output,
    user_error,
)
from vmapcheck.layout import Layout
from vmapcheck.versions import require_supported_jax

__all__ = ["COMMANDS", "build_parser", "main"]

DEBUG_HELP = f"show the traceback behind an error (as {DEBUG_ENV}=1 does; docs/errors.md)"


# One line each, for `vmapcheck --help` (in this order) and each command's own help.
COMMANDS = {
    "init": "put the vmapcheck pipeline (dvc.yaml, conf/, params.yaml) into this git repository",
    "diagnose": "localize a divergence in the current outputs (exit 1: found one)",
    "reference": "store the last verified run as the model's reference, or show it",
    "verdict": "is the benchmark slower than a baseline? (exit 1: a regression)",
    "verdict-paired": "time a baseline project and this one in alternating pairs, judge "
    "the pairs (exit 1: a regression)",
    "compare": "logged runs side by side, and the address of their MLflow compare view",
    "registry": "versions of the registered model, which is @verified, their tags",
    "rollback": "move alias verified back to the previous verified version",
    "promote": "move alias verified to a version on purpose (one off the deployment target too)",
    "ui": "MLflow UI over the local store on 127.0.0.1",
    "params": "recompose params.yaml from conf/ (as dvc exp run does)",
    "plots": "write the plots page (dvc plots show, Vega inlined: it draws offline), say where",
    "summary": "print the verdict of the last pipeline run and its MLflow run",
    "gate": "exit 1 when the last run in this workspace failed its check or guard replay "
    "(after `dvc exp run`, which keeps failed runs)",
    "store": "create (init), locate (where), probe the MLflow store, or relink a copied "
    "project's store to its own artifacts",
}

# Each command: the function that runs it and the one that adds its flags, from its group.
VERBS: Verbs = {**project.VERBS, **checks.VERBS, **benchmark.VERBS, **tracking.VERBS}


def build_parser() -> argparse.ArgumentParser:
    """The ``vmapcheck`` parser: one subcommand per entry of :data:`COMMANDS`, in its order."""
    width = max(map(len, COMMANDS)) + 2
    listing = "\n".join(f"  {name:<{width}}{text}" for name, text in COMMANDS.items())
    parser = CommandLine(
        prog="vmapcheck",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check that JAX vmap agrees with the per-example loop and the\n"
        "hand-batched forward, and time each (the pipeline itself: dvc repro).",
        epilog=f"commands:\n{listing}\n\n`vmapcheck <command> --help` describes its flags.",
    )
    parser.add_argument("--version", action="version", version=f"vmapcheck {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(
        dest="command",
        metavar="<command>",
        required=True,
        help="one of the commands below",
        parser_class=Parser,
    )
    for name, text in COMMANDS.items():
        func, add_flags = VERBS[name]
        # No help= here: the epilog lists the commands (argparse would wrap them).
        sub = commands.add_parser(name, description=text[0].upper() + text[1:] + ".")
        sub.set_defaults(func=func)
        add_flags(sub)
        # Also after the command (`vmapcheck compare --debug`); SUPPRESS: absent there, it
        # leaves the top-level flag's value as it is.
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), run the command, return its exit status.

    Every error reaches the user through :func:`vmapcheck.errors.user_error`: one line
    ``<command>: error: ...`` and its exit status (docs/errors.md), no traceback unless
    asked for (``--debug`` or ``VMAPCHECK_DEBUG=1``). A reader that goes away (``| head``)
    ends the command quietly."""
    args = build_parser().parse_args(argv)
    if args.debug:
        os.environ[DEBUG_ENV] = "1"  # the stages and worker processes it starts see it too
    root = getattr(args, "root", None)
    layout = Layout(Path.cwd() if root is None else root)
    try:
        # Every command: most import JAX (directly, or through MLflow and the report).
        require_supported_jax()
        # No message shows a URL's credentials (MLFLOW_TRACKING_URI may hold them).
        with redacted_output():
            code = args.func(args, layout)
            sys.stdout.flush()  # here, where a closed pipe is caught (not at exit)
            return code
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (as the stages do)
        print(f"{args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        return quiet_broken_pipe()
    except Exception as exc:  # a command that does not report its own errors
        shown = user_error(exc)
        if shown is None:
            raise
        code, message = shown
        print(redact(f"{args.command}: error: {message}"), file=sys.stderr)
        return code
