"""The commands that set up a project and write its files: ``init`` (the pipeline into
a git repository), ``params`` (params.yaml recomposed from conf/) and ``plots`` (the
plots page)."""

from __future__ import annotations

import argparse

from vmapcheck.cli.common import Verbs, root_flag
from vmapcheck.layout import Layout


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


def _params(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.compose import run_params

    return run_params(layout, args.overrides)


def _plots(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.project.plots_page import run_plots

    return run_plots(layout, args.out, write=args.write_template)


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
    root_flag(init)


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
    root_flag(plots)


VERBS: Verbs = {
    "init": (_init, _init_flags),
    "params": (_params, _params_flags),
    "plots": (_plots, _plots_flags),
}
