"""The commands over the MLflow store: ``compare`` (logged runs side by side), the
registry's ``registry``, ``rollback`` and ``promote``, ``ui`` and ``store``."""

from __future__ import annotations

import argparse

from vmapcheck.cli.common import Verbs, root_flag, tcp_port, whole_number
from vmapcheck.layout import Layout

# Kept here so --help needs no heavy import; tests/test_cli.py checks it matches.
COMPARE_DEFAULT_N = 10  # vmapcheck.tracking.runs.DEFAULT_N


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


def _store(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.store import run_store

    return run_store(layout, args.verb)


def _compare_flags(compare: argparse.ArgumentParser) -> None:
    compare.add_argument(
        "-n",
        type=whole_number("a count of runs of at least 0", 0),
        default=COMPARE_DEFAULT_N,
        help="how many runs (newest first)",
    )
    compare.add_argument(
        "--filter", default="", help="an MLflow search filter, e.g. \"tags.model = 'mlp'\""
    )
    scope = compare.add_mutually_exclusive_group()
    scope.add_argument("--experiment", help="only this experiment (exact name)")
    scope.add_argument("--all", action="store_true", help="every experiment in the store")
    root_flag(compare)
    compare.add_argument(
        "--width",
        type=whole_number("a width of at least 1 column", 1),
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
        type=tcp_port,
        default=5000,
        help="the TCP port on 127.0.0.1 (1024-65535; default 5000)",
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
    root_flag(store)


VERBS: Verbs = {
    "compare": (_compare, _compare_flags),
    "registry": (_registry, _model_flag),
    "rollback": (_rollback, _model_flag),
    "promote": (_promote, _promote_flags),
    "ui": (_ui, _ui_flags),
    "store": (_store, _store_flags),
}
