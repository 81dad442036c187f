"""``vmapcheck <command>``: the project's one command line (``make`` targets call it).

Every command runs on the project in the current folder (``Layout(Path.cwd())``; the
commands that had one take ``--root``), parses its flags here and calls one library
function in the module that owns the logic. Those modules are imported only by the
command that needs them, so ``vmapcheck --help`` does not load JAX or MLflow.

Exit status (docs/errors.md): each command's own (0 success, 1 what it looks for was
found; see each command's help), 2 for a usage error (argparse's one-line message) or a
refusal it reports on stderr as ``<command>: error: ...``, 3 an internal error (one line;
``--debug`` shows its traceback), 130 Ctrl-C, 141 its reader went away (``| head``).
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vmapcheck import __version__
from vmapcheck.errors import (
    DEBUG_ENV,
    INTERRUPTED,
    did_you_mean,
    quiet_broken_pipe,
    redact,
    redacted_output,
    user_error,
)
from vmapcheck.layout import Layout
from vmapcheck.versions import require_supported_jax

# Kept here so --help needs no heavy import; tests/test_cli.py checks they match the
# modules' own constants.
LAST_VERIFIED = "last-verified"  # vmapcheck.tracking.baselines.LAST_VERIFIED
COMPARE_DEFAULT_N = 10  # vmapcheck.tracking.runs.DEFAULT_N
DIAGNOSIS_ON_DEMAND = "diagnosis-on-demand.json"  # under reports/
PAIRED_ROUNDS = 40  # vmapcheck.bench.verdict.paired.DEFAULT_ROUNDS
PAIRED_SAMPLES = 10  # vmapcheck.bench.verdict.paired.DEFAULT_SAMPLES
PAIRED_PROCESSES = 3  # vmapcheck.bench.verdict.paired.DEFAULT_PROCESSES
DEBUG_HELP = f"show the traceback behind an error (as {DEBUG_ENV}=1 does; docs/errors.md)"

Command = Callable[[argparse.Namespace, Layout], int]


# --- the commands: parsed args + the project's layout -> exit status ----------------------


def _diagnose(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.check.diagnosis import on_demand

    out = layout.report(DIAGNOSIS_ON_DEMAND) if args.out is None else layout.root / args.out
    return on_demand(layout, out)


def _reference(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.check import reference

    if args.verb == "make":
        return reference.run_make(layout, args.reason)
    return reference.run_show(layout)


def _number_in(expected: str, low: float, high: float) -> Callable[[str], float]:
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


def _whole_number(expected: str, low: int) -> Callable[[str], int]:
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


def _batch_sizes(text: str) -> list[int]:
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


def _output_file(text: str) -> Path:
    """An argparse type: a path where a file can be written, checked before the command's
    work (``--out reports``, a directory, or ``/proc/x.json`` would be refused only when
    the result is written)."""
    from vmapcheck.io import output_file_problem  # numpy: not for --help

    path = Path(text)
    problem = output_file_problem(path)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return path


def _verdict(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.baselines import run_verdict

    return run_verdict(
        layout,
        args.baseline,
        args.current,
        args.factor,
        args.alpha,
        args.out,
        require_same=args.require_same or (),
    )


def _verdict_paired(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.bench.verdict.paired import run_verdict_paired

    return run_verdict_paired(
        args.current_project or layout.root,
        args.baseline_project,
        args.paths.split(",") if args.paths else None,
        args.batch_sizes,
        args.rounds,
        args.samples,
        args.factor,
        args.alpha,
        args.out,
        args.baseline_python,
        args.current_python,
        require_same=args.require_same or (),
        order=args.order,
        processes=args.processes,
        share=args.share,
        looks=args.looks,
    )


def _compare(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.runs import run_compare

    return run_compare(layout, args.n, args.filter, args.experiment, args.all, args.width)


def _registry(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.registry_commands import run_show

    return run_show(layout, args.model)


def _rollback(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.registry_commands import run_rollback

    return run_rollback(layout, args.model)


def _promote(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.registry_commands import run_promote

    return run_promote(layout, args.model, args.version, args.run)


def _ui(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.ui import run_ui

    return run_ui(layout, args.port)


def _port(text: str) -> int:
    """A TCP port a user may open: 1024-65535 (argparse prints the refusal, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        expected = f"expected a port number 1024-65535, found {text!r}"
        raise argparse.ArgumentTypeError(expected) from None
    if not 1024 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1024-65535, found {port}")
    return port


def _params(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.compose import run_params

    return run_params(layout, args.overrides)


def _init(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.project.init import run_init

    return run_init(
        layout.root,
        args.model,
        data=args.data,
        name=args.name,
        factory_args=args.factory_arg or [],
        model_code=args.model_code or [],
        force=args.force,
        keep_edits=args.keep_edits,
        discard_edits=args.discard_edits,
        table={
            "table": args.data_path,
            "features": args.features,
            "targets": args.targets,
            "identifiers": args.identifiers,
            "quasi_identifiers": args.quasi_identifiers,
            "name": args.data_name,
        },
    )


def _plots(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.project.plots_page import run_plots

    return run_plots(layout, args.out, write=args.write_template)


def _summary(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.review import run_summary

    return run_summary(layout, args.repro_status)


def _gate(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.pipeline.gate import run_gate

    return run_gate(layout, stage=False)


def _store(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.store import run_store

    return run_store(layout, args.verb)


# --- the parser ------------------------------------------------------------------------


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


def _folder(text: str) -> Path:
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


def _root_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", type=_folder, default=None, help="project root (default: the current folder)"
    )


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


def _init_flags(init: argparse.ArgumentParser) -> None:
    init.add_argument(
        "--model",
        required=True,
        help="your factory as package.module:function (it returns a vmapcheck Model), or a "
        "shipped option (mlp, toy, flax_mlp, ...)",
    )
    init.add_argument("--data", default=None, help="a shipped data option (default: synthetic)")
    _init_table_flags(init)
    init.add_argument("--name", help="your model's name (default: the name its Model gives)")
    init.add_argument(
        "--factory-arg",
        action="append",
        metavar="KEY=VALUE",
        help="an argument of your factory, the value read as YAML (repeatable)",
    )
    init.add_argument(
        "--model-code",
        action="append",
        metavar="PATH",
        help="a file or folder of your model's code for DVC to track (repeatable; default: "
        "the factory's top-level package)",
    )
    _init_rewrite_flags(init)
    _root_flag(init)


def _init_table_flags(init: argparse.ArgumentParser) -> None:
    """init's flags for a table of the user's own (``--data-path`` and its columns)."""
    init.add_argument(
        "--data-path",
        "--path",
        help="your own table (.csv or .parquet), instead of --data: declare every column "
        "with --features, --targets, --identifiers and --quasi-identifiers",
    )
    init.add_argument("--features", help="with --data-path: the feature columns, in order (a,b,c)")
    init.add_argument("--targets", help="with --data-path: the target columns, in order")
    init.add_argument(
        "--identifiers", help="with --data-path: direct identifiers (dropped before any write)"
    )
    init.add_argument(
        "--quasi-identifiers",
        help="with --data-path: quasi-identifier columns and how each is generalized, "
        "column=policy,... (policies: year, decade, band10, prefix1-3, drop)",
    )
    init.add_argument(
        "--data-name", help="with --data-path: the data option's name (default: the file's stem)"
    )


def _init_rewrite_flags(init: argparse.ArgumentParser) -> None:
    """init's flags for a project it has set up before (``--force`` and what to do with edits)."""
    init.add_argument(
        "--force",
        action="store_true",
        help="rewrite init's own files that exist (each change printed as a diff); "
        "an edit of yours is refused unless --keep-edits or --discard-edits",
    )
    edits = init.add_mutually_exclusive_group()
    edits.add_argument(
        "--keep-edits",
        action="store_true",
        help="with --force: keep your edits of init's files and stages, rewrite the rest",
    )
    edits.add_argument(
        "--discard-edits",
        action="store_true",
        help="with --force: replace your edits of init's files with vmapcheck's (diffs printed)",
    )


def _diagnose_flags(diagnose: argparse.ArgumentParser) -> None:
    diagnose.add_argument(
        "--out",
        type=_output_file,
        default=None,
        help="where to write the report (its summary goes beside it as .txt); the check "
        "stage's own diagnosis is reports/diagnosis.json",
    )


def _reference_verbs(reference: argparse.ArgumentParser) -> None:
    verbs = reference.add_subparsers(dest="verb", required=True)
    make = verbs.add_parser("make", help="store the current verified run as the reference")
    make.add_argument("--reason", required=True, help="why the reference changes (recorded)")
    verbs.add_parser("show", help="print the reference's metadata")


def _verdict_flags(verdict: argparse.ArgumentParser) -> None:
    verdict.add_argument(
        "--baseline",
        required=True,
        help=f"a bench_details.json, an MLflow run id, or {LAST_VERIFIED!r} (the newest "
        "verified run other than the one judged; none: says so, exit 0)",
    )
    verdict.add_argument(
        "--current",
        default=None,
        help="the run to judge: a bench_details.json or an MLflow run id",
    )
    _regression_flags(verdict)
    verdict.add_argument("--out", type=_output_file, help="also write the verdict as JSON here")
    verdict.add_argument(
        "--require-same",
        action="append",
        choices=("jax_version", "jaxlib_version", "model"),  # bench.baseline.OPTIONAL_KEYS
        help="also refuse to compare runs that differ in this (repeatable; e.g. "
        "jax_version and jaxlib_version for a same-version comparison)",
    )
    _root_flag(verdict)


def _verdict_paired_flags(paired: argparse.ArgumentParser) -> None:
    paired.add_argument(
        "--baseline-project",
        type=Path,
        required=True,
        help="the baseline's project folder after `dvc repro train` (e.g. a git worktree "
        "of another revision); its own src/ and .venv are used when present",
    )
    paired.add_argument(
        "--current-project", type=Path, help="the current side (default: this project)"
    )
    paired.add_argument(
        "--paths", help="comma-separated paths to time (default: the single-device jit paths)"
    )
    paired.add_argument(
        "--batch-sizes", type=_batch_sizes, help="comma-separated rows (default: bench.batch_sizes)"
    )
    _paired_schedule_flags(paired)
    _regression_flags(paired)
    paired.add_argument(
        "--out",
        type=_output_file,
        help="the JSON report (default: reports/perf_verdict_paired.json)",
    )
    paired.add_argument("--baseline-python", help="the baseline worker's interpreter")
    paired.add_argument("--current-python", help="the current worker's interpreter")
    paired.add_argument(
        "--require-same",
        action="append",
        choices=("jax_version", "jaxlib_version", "model"),  # bench.baseline.OPTIONAL_KEYS
        help="refuse to compare sides that differ in this (repeatable)",
    )
    paired.add_argument(
        "--order",
        choices=("blocks", "interleaved"),  # vmapcheck.bench.verdict.worker.BLOCKS, INTERLEAVED
        default="blocks",
        help="within a round: each cell's samples back to back (blocks), or the bench "
        "stage's passes over the cells (interleaved)",
    )
    _root_flag(paired)


def _regression_flags(parser: argparse.ArgumentParser) -> None:
    """``--factor`` and ``--alpha``, the regression rule's settings, as ``verdict`` and
    ``verdict-paired`` both take them (range-checked at the door)."""
    parser.add_argument(
        "--factor",
        type=_number_in("a factor above 1 and at most 10 (as bench.regression.factor)", 1.0, 10.0),
        help="default: bench.regression.factor",
    )
    parser.add_argument(
        "--alpha",
        type=_number_in("a significance level between 0 and 1 (as bench.regression.alpha)", 0, 1),
        help="default: bench.regression.alpha",
    )


def _paired_schedule_flags(paired: argparse.ArgumentParser) -> None:
    """verdict-paired's flags for how much is timed and by how many processes."""
    paired.add_argument(
        "--rounds", type=int, default=PAIRED_ROUNDS, help="rounds per side (pairs = rounds)"
    )
    paired.add_argument(
        "--samples", type=int, default=PAIRED_SAMPLES, help="samples per cell and round"
    )
    paired.add_argument(
        "--looks",
        type=int,
        help="looks of the group-sequential test: a cell decided at a look is timed no more "
        "(default: bench.early_stop.paired_looks; 1: every pair)",
    )
    paired.add_argument(
        "--processes",
        type=int,
        default=PAIRED_PROCESSES,
        help="process pairs, taking turns pair by pair (a majority must agree)",
    )
    paired.add_argument(
        "--no-share",
        dest="share",
        action="store_false",
        help="one process a side even where both sides could share one (same code, "
        "interpreter, backend and precision)",
    )


def _compare_flags(compare: argparse.ArgumentParser) -> None:
    compare.add_argument(
        "-n",
        type=_whole_number("a count of runs of at least 0", 0),
        default=COMPARE_DEFAULT_N,
        help="how many runs (newest first)",
    )
    compare.add_argument(
        "--filter", default="", help="an MLflow search filter, e.g. \"tags.model = 'mlp'\""
    )
    scope = compare.add_mutually_exclusive_group()
    scope.add_argument("--experiment", help="only this experiment (exact name)")
    scope.add_argument("--all", action="store_true", help="every experiment in the store")
    _root_flag(compare)
    compare.add_argument(
        "--width",
        type=_whole_number("a width of at least 1 column", 1),
        help="fit the table into this many columns (default: the terminal's width)",
    )


def _model_flag(parser: argparse.ArgumentParser) -> None:
    """``--model`` of the registry commands (registry, rollback, promote)."""
    parser.add_argument(
        "--model", help="registered model (default: registry.registered_model in params.yaml)"
    )


def _promote_flags(promote: argparse.ArgumentParser) -> None:
    _model_flag(promote)
    chosen = promote.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--version", help="the version's number (`vmapcheck registry` lists them)")
    chosen.add_argument("--run", help="the MLflow run id whose registered version to promote")


def _ui_flags(ui: argparse.ArgumentParser) -> None:
    ui.add_argument(
        "--port",
        type=_port,
        default=5000,
        help="the TCP port on 127.0.0.1 (1024-65535; default 5000)",
    )


def _params_flags(params: argparse.ArgumentParser) -> None:
    params.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=toy")


def _plots_flags(plots: argparse.ArgumentParser) -> None:
    plots.add_argument(
        "-o", "--out", default=None, help="the page's folder (default: dvc_plots, as DVC's)"
    )
    plots.add_argument(
        "--write-template",
        action="store_true",
        help="first (re)write .dvc/plots/offline.html from this vmapcheck's pinned Vega "
        "bundle and set plots.html_template in .dvc/config (a project from before them)",
    )
    _root_flag(plots)


def _summary_flags(summary: argparse.ArgumentParser) -> None:
    summary.add_argument(
        "--repro-status", type=int, default=0, help="exit status of the dvc repro that just ran"
    )


def _store_flags(store: argparse.ArgumentParser) -> None:
    store.add_argument(
        "verb",
        choices=["init", "where", "probe", "relink"],
        help="init: create (or migrate) the store and the experiment, e.g. before a sweep; "
        "where: print the store and artifact location; probe: check a server answers; "
        "relink: point a copied or moved project's store at its own artifact folder "
        "(tracking.artifact_root), after a backup",
    )
    _root_flag(store)


# Each command: the function that runs it and the one that adds its flags.
VERBS: dict[str, tuple[Command, Callable[[argparse.ArgumentParser], None]]] = {
    "init": (_init, _init_flags),
    "diagnose": (_diagnose, _diagnose_flags),
    "reference": (_reference, _reference_verbs),
    "verdict": (_verdict, _verdict_flags),
    "verdict-paired": (_verdict_paired, _verdict_paired_flags),
    "compare": (_compare, _compare_flags),
    "registry": (_registry, _model_flag),
    "rollback": (_rollback, _model_flag),
    "promote": (_promote, _promote_flags),
    "ui": (_ui, _ui_flags),
    "params": (_params, _params_flags),
    "plots": (_plots, _plots_flags),
    "summary": (_summary, _summary_flags),
    "gate": (_gate, _root_flag),
    "store": (_store, _store_flags),
}


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
