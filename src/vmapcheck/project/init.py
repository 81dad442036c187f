"""``vmapcheck init``: put the vmapcheck pipeline into any git repository.

It writes, relative to the repository's root (the current folder):

- ``dvc.yaml``: the stages, each ``python -m vmapcheck.stages.<stage>`` from the
  installed vmapcheck; your model's code is a dep of every stage that runs the model,
  vmapcheck's code is recorded per stage by the ``code`` stage (:mod:`.code`);
- ``conf/config.yaml``: the defaults (your model, the data), with the shipped config
  groups of the installed vmapcheck on Hydra's search path;
- ``conf/model/<name>.yaml`` for a model of your own (``--model pkg.module:factory``):
  its widths and input contract, read from the ``Model`` your factory returns;
- ``params.yaml``: the composition of ``conf/`` (what ``dvc exp run -S`` rewrites);
- ``.dvc/plots/loglog.json`` and ``speedup.json`` (the plots' templates: a colour per
  series from the registry, a panel per revision), ``.dvc/plots/offline.html`` (the page
  ``dvc plots show`` fills, Vega inlined: it draws offline; :mod:`.plots_page`),
  ``data/raw/README.md`` and
  ``data/reference/README.md`` (the folders the stages read), ``VMAPCHECK.md`` (next steps);
- a block of ``.gitignore`` rules that keep raw data, the MLflow store and every output
  DVC caches (:func:`cached_outputs_rules`) out of git, and ``__pycache__/`` in
  ``.dvcignore``.

It runs ``dvc init`` when the repository is not a DVC repository yet, and turns on DVC's
Hydra composition (``dvc config hydra.enabled true``) and names the offline plots page
(``dvc config plots.html_template plots/offline.html``).

In a project with a pipeline and params of its own, it joins them
(:mod:`vmapcheck.project.merge`): its stages go beside the project's in ``dvc.yaml``, and
the project's params move to ``conf/project.yaml``, composed into ``params.yaml``. It
writes ``.vmapcheck/init.json``, the sha256 of what it wrote; run again, it rewrites
(with ``force``) only its own files still as it wrote them, printing each diff, and
refuses an edit of the user's unless told to keep or to discard it. Nothing is written
when it refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, PackageLoader, StrictUndefined

from vmapcheck import __version__
from vmapcheck.compose import compose_yaml
from vmapcheck.config import CONFIG_KEYS, Config, validate_config
from vmapcheck.errors import ConfigError
from vmapcheck.io import atomic_write_text
from vmapcheck.layout import Layout
from vmapcheck.project.code import STAGE_CODE
from vmapcheck.project.data_choice import DataChoice, resolve_data, sized_to_table
from vmapcheck.project.data_fit import refuse_unfit_data
from vmapcheck.project.merge import (
    EDITED,
    NEW,
    UNCHANGED,
    UPDATED,
    Manifest,
    classify,
    digest,
    join_pipeline,
    load_round_trip,
    project_params,
    stage_digest,
    unified_diff,
)
from vmapcheck.project.model_choice import ModelChoice, resolve_model, target_hidden
from vmapcheck.project.plots_page import HTML_TEMPLATE_KEY, HTML_TEMPLATE_VALUE, page_template

# The lines init owns in .gitignore (and .dvcignore), between these markers.
BLOCK_START = "# >>> vmapcheck (written by `vmapcheck init`)"
BLOCK_END = "# <<< vmapcheck"
GITIGNORE_RULES = (
    "# Raw inputs may hold personal data: nothing put under data/raw/ enters git, nor the",
    "# refs `dvc exp run` commits untracked files into. Only its README is tracked.",
    "/data/raw/*",
    "!/data/raw/README.md",
    "# The embedded MLflow store, its lock and backups (tracking.tracking_uri in conf/).",
    "/mlflow.db",
    "/mlflow.db.lock",
    "/mlflow.db.bak-*",
    "/mlartifacts/",
    "/mlruns/",
    "# JAX's compilation cache, `dvc plots show` output, `vmapcheck diagnose` output.",
    "/.jax_cache/",
    "/dvc_plots/",
    "/reports/diagnosis-on-demand.*",
)
DVCIGNORE_RULES = (
    "# Python's bytecode cache, beside the model code the stages depend on: not code.",
    "__pycache__/",
)
# The DVC settings the pipeline needs: `dvc exp run -S` composes params.yaml from conf/;
# `dvc plots show` fills the offline page (Vega inlined), not DVC's, which loads it from a CDN.
DVC_SETTINGS = {
    "hydra.enabled": "true",
    "hydra.config_dir": "conf",
    "hydra.config_name": "config",
    HTML_TEMPLATE_KEY: HTML_TEMPLATE_VALUE,
}


def cached_outputs_rules(dvc_yaml: str) -> tuple[str, ...]:
    """``.gitignore`` rules for every output of the pipeline ``dvc_yaml`` (its text) that
    lives in DVC's cache (outs, metrics and plots without ``cache: false``), each anchored
    at the root (``/reports/report.html``), after a comment saying why.

    DVC writes its own ignore entries only when a stage succeeds: after a failed run its
    new outputs were untracked, so a ``git add -A`` took them into git and the next
    ``dvc repro`` stopped on "output ... is already tracked by SCM". Ignored up front,
    they never are (DVC then writes no entries of its own: they are ignored already)."""
    stages = (yaml.safe_load(dvc_yaml) or {}).get("stages") or {}
    paths: list[str] = []
    for stage in stages.values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or []:
                path, options = (
                    next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
                )
                if (options or {}).get("cache", True) and f"/{path}" not in paths:
                    paths.append(f"/{path}")
    return (
        "# DVC's cached outputs (dvc.yaml): ignored before any stage runs, as DVC ignores",
        "# them only once a stage succeeds (a failed run's would be taken by `git add -A`).",
        *paths,
    )


@dataclass
class Plan:
    """What init will write: path (relative to the root) -> text, and block edits."""

    files: dict[str, str] = field(default_factory=dict)
    blocks: dict[str, tuple[str, ...]] = field(default_factory=dict)


# The shipped Vega-Lite template's placeholders for its colour scale (templates/loglog.json).
SERIES_ANCHOR, COLOURS_ANCHOR = '"<VMAPCHECK_SERIES>"', '"<VMAPCHECK_COLOURS>"'


# A grey dashed rule at y = 1 (a ratio's "as fast"): an interval across it is no
# measurable difference. Its own colour, not a series'.
UNITY_RULE = {
    "mark": {"type": "rule", "strokeDash": [4, 4], "color": "grey"},
    # Across the whole panel (not a rule per point: the spec's x is every layer's).
    "encoding": {
        "y": {"datum": 1},
        "x": {"value": 0},
        "x2": {"value": "width"},
        "color": {"value": "grey"},
    },
}


def plots_template(series: list[str], colours: list[str], *, unity: bool = False) -> str:
    """The shipped log-log Vega-Lite template (templates/loglog.json) for a plot of
    ``series`` (CSV file names without ``.csv``), its colour scale fixed to that domain
    and ``colours`` (:func:`vmapcheck.core.paths.series_colours`): a series has the
    same colour in every run and revision, whichever series a run has. ``unity``: a
    rule at y = 1 (:data:`UNITY_RULE`), for ratios.

    Raises:
        RuntimeError: the shipped template lacks a placeholder (the two must change together).
    """
    text = (files("vmapcheck.project") / "templates" / "loglog.json").read_text("utf-8")
    for anchor in (SERIES_ANCHOR, COLOURS_ANCHOR):
        if text.count(anchor) != 1:
            raise RuntimeError(f"templates/loglog.json: expected {anchor} once, to fill")
    text = text.replace(SERIES_ANCHOR, json.dumps(series)).replace(
        COLOURS_ANCHOR, json.dumps(colours)
    )
    if not unity:
        return text
    template = json.loads(text)
    template["spec"]["layer"].append(UNITY_RULE)
    return json.dumps(template, indent=2) + "\n"


def _render(template: str, **values: Any) -> str:
    env = Environment(
        loader=PackageLoader("vmapcheck.project", "templates"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # YAML and Markdown, not HTML
    )
    return env.get_template(template).render(version=__version__, **values)


def _yaml_file(header: str, content: dict[str, Any]) -> str:
    """A config file init writes: comment lines, then ``content`` in its own key order."""
    return header + yaml.safe_dump(content, sort_keys=False)


@dataclass(frozen=True)
class ProjectParams:
    """The params of the project init joins: its top-level keys, and the text of
    conf/project.yaml to write (None: that file exists already, and is the project's)."""

    keys: list[str]
    text: str | None = None


def project_params_of(root: Path) -> ProjectParams | None:
    """The project's own params: from its params.yaml when it holds keys that are not
    vmapcheck's (moved to conf/project.yaml, text and comments as they are), else from
    conf/project.yaml when an earlier init wrote it; None when the project has none.

    Raises:
        ConfigError: the two disagree about a key's presence, or a key of the project's
            has one of vmapcheck's names (:func:`vmapcheck.project.merge.project_params`).
    """
    layout = Layout(root)
    ours = set(Config.model_fields)
    existing = (
        layout.params_yaml.read_text(encoding="utf-8") if layout.params_yaml.is_file() else None
    )
    found = project_params(existing, ours)
    if layout.project_params.is_file():
        text = layout.project_params.read_text(encoding="utf-8")
        doc = yaml.safe_load(text) or {}
        if not isinstance(doc, dict):
            raise ConfigError(f"{layout.project_params}: expected a mapping of your params")
        keys = [str(k) for k in doc]
        clash = sorted(set(keys) & ours)
        if clash:
            raise ConfigError(
                f"{layout.project_params}: {', '.join(clash)} is one of vmapcheck's keys: "
                "rename yours (and the stages that read it)"
            )
        if found is not None and set(found[1]) - set(keys):
            raise ConfigError(
                f"params.yaml holds {', '.join(sorted(set(found[1]) - set(keys)))}, which "
                f"{layout.project_params} lacks: `dvc exp run -S` would drop it; add it there"
            )
        return ProjectParams(keys=keys) if keys else None
    if found is None:
        return None
    text, keys = found
    header = (
        "# Your project's own params, moved here from params.yaml by `vmapcheck init`:\n"
        "# `dvc exp run -S` composes params.yaml from conf/ (DVC's Hydra composition),\n"
        "# this file included, so edit them here. Yours: vmapcheck never rewrites it.\n"
    )
    return ProjectParams(keys=keys, text=header + text)


def plan(
    root: Path, model: ModelChoice, data: DataChoice, project: ProjectParams | None = None
) -> Plan:
    """Every file init writes for ``model`` and ``data`` (paths relative to ``root``, named
    by :class:`~vmapcheck.layout.Layout`), and the ignore-file blocks. ``project``: the
    params of the project it joins (composed into params.yaml)."""
    layout = Layout(root)

    def rel(path: Path) -> str:
        return path.relative_to(root).as_posix()

    # The registries the plots' series come from (they load JAX: only here).
    from vmapcheck.core.paths import SPEEDUPS, batch_paths, series_colours

    out = Plan()
    lock = rel(layout.requirements_lock) if layout.requirements_lock.is_file() else None
    raw = rel(layout.raw)
    out.files[rel(layout.dvc_yaml)] = _render(
        "dvc.yaml.j2",
        stages=list(STAGE_CODE),
        config_keys=list(CONFIG_KEYS),
        model_code=list(model.code),
        data_deps=[raw] + ([data.dep] if data.dep and not data.dep.startswith(f"{raw}/") else []),
        lock_file=lock,
        # The plots' series, one per registry entry (a new path needs no edit here).
        bench_paths=batch_paths(),
        speedups=[speedup.name for speedup in SPEEDUPS],
    )
    for stage in ("code", *STAGE_CODE, "gate"):
        out.files[rel(layout.stage_entry(stage))] = _render("stage_entry.py.j2", stage=stage)
    out.files[rel(layout.config_yaml)] = _render(
        "config.yaml.j2",
        model=model.name,
        data=data.name,
        hidden=target_hidden(model),
        project_keys=project.keys if project else [],
    )
    if project is not None and project.text is not None:
        out.files[rel(layout.project_params)] = project.text
    if model.config is not None:
        out.files[rel(layout.conf_option("model", model.name))] = _yaml_file(
            "# Your model, written by `vmapcheck init` from what its factory returned. The\n"
            "# stages build it with model.factory (Hydra instantiate: its keys are the\n"
            "# factory's arguments). Widths and input leaves must match what it builds.\n",
            model.config,
        )
    sized = sized_to_table(model, data)
    # sized is None where data.config is (a shipped data option): nothing to size.
    if sized is not None and data.config is not None:
        features, targets = len(data.config["features"]), len(data.config["targets"])
        out.files[rel(layout.conf_option("model", model.name))] = _yaml_file(
            f"# The shipped {model.name!r} option, sized by `vmapcheck init` to your table:\n"
            f"# {features} feature column(s) in, {targets} target column(s) out. It comes\n"
            "# before the installed vmapcheck's file of that name, so `dvc exp run` keeps\n"
            "# these sizes; `-S model.<key>=...` still overrides any of them.\n",
            sized,
        )
    if data.config is not None:
        out.files[rel(layout.conf_option("data", data.name))] = _yaml_file(
            "# Your table, written by `vmapcheck init --data-path`: every column in exactly one\n"
            "# role (identifiers are dropped or pseudonymized before anything is written).\n"
            "# The other keys are the shipped csv option's (vmapcheck docs: regression-set.md).\n",
            data.config,
        )
    # The plots' templates: one per plot, its colour scale's domain the plot's series and
    # its range their colours, from the registry (the PNGs and the HTML report use them).
    colours = series_colours()
    for target, series, unity in (
        (layout.plots_template, [p.name for p in batch_paths()], False),
        (layout.speedup_template, [s.name for s in SPEEDUPS], True),
    ):
        out.files[rel(target)] = plots_template(
            series, [colours[name] for name in series], unity=unity
        )
    out.files[rel(layout.plots_page)] = page_template()
    out.files[rel(layout.raw_readme)] = _render("data_raw_README.md.j2")
    # params.yaml: composed from the conf/ planned above, as `dvc exp run` will; the
    # reference folder is where its reference.dir says.
    params = _compose_planned(out, layout, model.name, data.name)
    reference_root = root / yaml.safe_load(params)["reference"]["dir"]
    out.files[rel(reference_root / "README.md")] = _render("data_reference_README.md.j2")
    out.files[rel(layout.next_steps)] = _render(
        "VMAPCHECK.md.j2", model=model.name, own_model=model.config is not None, data=data.name
    )
    out.blocks[".gitignore"] = GITIGNORE_RULES + cached_outputs_rules(
        out.files[rel(layout.dvc_yaml)]
    )
    out.blocks[".dvcignore"] = DVCIGNORE_RULES
    out.files[rel(layout.params_yaml)] = params
    # What init wrote, for the next init to tell its own files from the user's edits
    # (params.yaml is DVC's to recompose, conf/project.yaml the project's: neither).
    ours = {
        path: digest(text)
        for path, text in out.files.items()
        if path not in (rel(layout.params_yaml), rel(layout.project_params))
    }
    ours.update({f"{path}#block": digest(block_text(rules)) for path, rules in out.blocks.items()})
    stages = load_round_trip(out.files[rel(layout.dvc_yaml)], "dvc.yaml")["stages"]
    out.files[rel(layout.init_manifest)] = Manifest(
        files=ours,
        stages={name: stage_digest(stage) for name, stage in stages.items()},
        version=__version__,
    ).text()
    return out


def _compose_planned(out: Plan, layout: Layout, model: str, data: str) -> str:
    """Compose params.yaml from the planned conf/ files, and the project's own
    conf/project.yaml where it exists (in a scratch folder: nothing is written before
    every check passed), and refuse data that does not fill the model's input leaves."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        conf = Path(scratch) / "conf"
        project = layout.project_params
        if project.is_file():
            conf.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(project, conf / project.name)
        for rel, text in out.files.items():
            if rel.startswith("conf/"):
                (Path(scratch) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(scratch) / rel).write_text(text, encoding="utf-8")
        text = compose_yaml(conf)
        # Data that does not fill the model's input leaves (too few columns, real numbers
        # for token ids) is refused with the data options that fit ...
        refuse_unfit_data(conf, text, layout.root, model, data)
    # ... and the rest now, naming the key, rather than by the first stage.
    validate_config(yaml.safe_load(text))
    return text


def block_text(rules: tuple[str, ...]) -> str:
    return "\n".join([BLOCK_START, *rules, BLOCK_END]) + "\n"


def _with_block(existing: str, rules: tuple[str, ...]) -> str:
    """``existing`` with init's block replaced, or appended when it has none."""
    block = block_text(rules)
    if BLOCK_START in existing and BLOCK_END in existing:
        before, rest = existing.split(BLOCK_START, 1)
        after = rest.split(BLOCK_END, 1)[1].lstrip("\n")
        return before + block + after
    sep = "" if not existing or existing.endswith("\n") else "\n"
    return existing + sep + ("\n" if existing else "") + block


# A diff longer than this many lines is cut when printed (the HTML page is 1 MB).
DIFF_LINES_SHOWN = 40


@dataclass
class Review:
    """What init would change: per item (a file, a dvc.yaml stage, an ignore-file block)
    its status (:data:`vmapcheck.project.merge.NEW` ...), the diffs of updated and edited
    items, the text each file gets (a file absent from ``texts`` is left as it is), and
    the project's own stages kept in dvc.yaml."""

    statuses: dict[str, str] = field(default_factory=dict)
    diffs: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    project_stages: list[str] = field(default_factory=list)

    def having(self, status: str) -> list[str]:
        return [item for item, s in self.statuses.items() if s == status]


def _block_of(text: str) -> str | None:
    if BLOCK_START not in text or BLOCK_END not in text:
        return None
    inner = text.split(BLOCK_START, 1)[1].split(BLOCK_END, 1)[0]
    return BLOCK_START + inner + BLOCK_END + "\n"


def review(
    root: Path, planned: Plan, manifest: Manifest, keep_edits: bool, joining: bool = False
) -> Review:
    """Each planned file, dvc.yaml stage and block against what the repository holds and
    what init last wrote (``manifest``); ``keep_edits``: the texts leave the user's edits
    as they are (else they take vmapcheck's). ``joining``: the project's params.yaml is
    being moved to conf/project.yaml (its values stay in the params.yaml init writes)."""
    layout = Layout(root)
    out = Review()

    def note(item: str, status: str, current: str | None, new: str, rel: str) -> None:
        out.statuses[item] = status
        if status in (UPDATED, EDITED):
            old_label = "yours" if status == EDITED else "as init wrote it"
            out.diffs[item] = unified_diff(rel, current or "", new, old_label, "vmapcheck's")

    special = {"dvc.yaml", "params.yaml", layout.init_manifest.relative_to(root).as_posix()}
    for rel, text in planned.files.items():
        path = root / rel
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if rel in special:
            continue
        status = classify(current, text, manifest.files.get(rel))
        note(rel, status, current, text, rel)
        if not (status == EDITED and keep_edits):
            out.texts[rel] = text
    # params.yaml: DVC recomposes it from conf/ at every `dvc exp run -S`; only a value of
    # the project's own keys that conf/project.yaml does not hold would be lost.
    params_text = planned.files["params.yaml"]
    current = (
        layout.params_yaml.read_text(encoding="utf-8") if layout.params_yaml.is_file() else None
    )
    if current is None or current == params_text:
        status = NEW if current is None else UNCHANGED
    else:
        mine, theirs = yaml.safe_load(params_text) or {}, yaml.safe_load(current) or {}
        keys = mine.get("project_keys") or []
        status = EDITED if any(mine.get(k) != theirs.get(k) for k in keys) else UPDATED
        if status == UPDATED and joining:
            # The project's own params.yaml, its values kept in the composition: written
            # anew, nothing of it lost (its text is conf/project.yaml now).
            status = NEW
    note("params.yaml", status, current, params_text, "params.yaml")
    if not (status == EDITED and keep_edits):
        out.texts["params.yaml"] = params_text
    # dvc.yaml: vmapcheck's stages, joined with the project's.
    ours = planned.files["dvc.yaml"]
    current = layout.dvc_yaml.read_text(encoding="utf-8") if layout.dvc_yaml.is_file() else None
    joined = join_pipeline(current, ours, manifest.stages, keep_edits)
    out.project_stages = joined.project_stages
    for name, status in joined.statuses.items():
        item = f"dvc.yaml stage {name}"
        out.statuses[item] = status
        if name in joined.diffs:
            out.diffs[item] = joined.diffs[name]
    kept_stage = keep_edits and EDITED in joined.statuses.values()
    if current is not None and not joined.project_stages and EDITED not in joined.statuses.values():
        # Every stage as init wrote it: a difference left is in the comments or layout.
        status = classify(current, ours, manifest.files.get("dvc.yaml"))
        if status == EDITED:
            note("dvc.yaml", EDITED, current, ours, "dvc.yaml")
            kept_stage = kept_stage or keep_edits
    out.texts["dvc.yaml"] = joined.text if joined.project_stages or kept_stage else ours
    for rel, rules in planned.blocks.items():
        path = root / rel
        whole = path.read_text(encoding="utf-8") if path.is_file() else ""
        block, wanted = _block_of(whole), block_text(rules)
        status = classify(block, wanted, manifest.files.get(f"{rel}#block"))
        note(f"{rel} (vmapcheck block)", status, block, wanted, rel)
        if not (status == EDITED and keep_edits):
            out.texts[rel] = _with_block(whole, rules)
    manifest_rel = layout.init_manifest.relative_to(root).as_posix()
    out.texts[manifest_rel] = planned.files[manifest_rel]
    return out


def _shown(diff: str) -> str:
    lines = diff.splitlines()
    if len(lines) <= DIFF_LINES_SHOWN:
        return diff.rstrip("\n")
    return "\n".join(
        [*lines[:DIFF_LINES_SHOWN], f"... ({len(lines) - DIFF_LINES_SHOWN} more lines)"]
    )


def _git_root(root: Path) -> Path:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise ConfigError("vmapcheck init needs git on PATH, and found none") from None
    if done.returncode != 0:
        raise ConfigError(
            f"{root} is not inside a git repository: run `git init` first (DVC and the "
            "provenance of each run need git)"
        )
    top = Path(done.stdout.strip()).resolve()
    if top != root.resolve():
        raise ConfigError(f"run vmapcheck init at the repository's root ({top}), not in {root}")
    return top


def _dvc(root: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ConfigError(f"`dvc {' '.join(args)}` failed: {done.stderr.strip() or done.stdout}")


def run_init(
    root: Path,
    model: str,
    data: str | None = None,
    name: str | None = None,
    factory_args: list[str] | None = None,
    model_code: list[str] | None = None,
    force: bool = False,
    table: dict[str, str | None] | None = None,
    keep_edits: bool = False,
    discard_edits: bool = False,
) -> int:
    """``vmapcheck init``: check everything, then write (see the module docstring and
    :mod:`vmapcheck.project.merge`).

    Returns 0, or 1 when it would rewrite a file that exists and ``force`` is not set, or
    would drop an edit of the user's and neither ``keep_edits`` nor ``discard_edits`` is
    set (each named, diffs shown, nothing written).

    Raises:
        ConfigError: not a git repository's root, an unknown option, a model that cannot
            be built (:func:`resolve_model`), a project pipeline or params that collide
            with vmapcheck's.
    """
    if keep_edits and discard_edits:
        raise ConfigError("vmapcheck init: --keep-edits and --discard-edits exclude each other")
    root = _git_root(root)
    layout = Layout(root)
    choice = resolve_model(root, model, name, factory_args, model_code)
    data_choice = resolve_data(root, data, **(table or {}))
    project = project_params_of(root)
    planned = plan(root, choice, data_choice, project)
    manifest = Manifest.read(layout.init_manifest) or Manifest()
    joining = project is not None and project.text is not None
    found = review(root, planned, manifest, keep_edits, joining)
    edited, updated = found.having(EDITED), found.having(UPDATED)
    if (edited or updated) and not force:
        print(
            "vmapcheck init: refusing to rewrite what exists (run again with --force to "
            "rewrite init's own files; an edit of yours is then refused unless "
            "--keep-edits or --discard-edits):\n"
            + "\n".join(f"  {item} ({found.statuses[item]})" for item in edited + updated),
            file=sys.stderr,
        )
        return 1
    if edited and not (keep_edits or discard_edits):
        print(
            "vmapcheck init: these differ from what init wrote, edits of yours that "
            "--force would drop:\n"
            + "\n".join(f"  {item}" for item in edited)
            + "\n"
            + "\n".join(_shown(found.diffs[item]) for item in edited if found.diffs.get(item))
            + "\nrun again with --keep-edits to keep them (init rewrites only the rest), or "
            "--discard-edits to replace them with vmapcheck's; nothing was written",
            file=sys.stderr,
        )
        return 1
    said = []
    if not (root / ".dvc").is_dir():
        _dvc(root, "init", "--quiet")
        said.append("ran `dvc init`: this repository was not a DVC repository")
    for key, value in DVC_SETTINGS.items():
        _dvc(root, "config", key, value)
    said.append(f"DVC settings: {', '.join(f'{k}={v}' for k, v in DVC_SETTINGS.items())}")
    if found.project_stages:
        said.append(
            f"joined your pipeline: dvc.yaml keeps your stages {', '.join(found.project_stages)}"
        )
    if project is not None:
        moved = " (moved there from params.yaml)" if project.text is not None else ""
        said.append(
            f"your params {', '.join(project.keys)}: conf/project.yaml{moved}, composed into "
            "params.yaml (project_keys in conf/config.yaml)"
        )
    for rel, text in found.texts.items():
        atomic_write_text(root / rel, text)
    print(f"vmapcheck init: vmapcheck {__version__}, model {choice.name}, data {data_choice.name}")
    for line in said:
        print(f"  {line}")
    for status, title in ((NEW, "wrote"), (UPDATED, "updated (init's own text, rewritten)")):
        items = found.having(status)
        if items:
            print(f"  {title}:\n" + "\n".join(f"    {item}" for item in items))
    if found.having(UNCHANGED):
        print(f"  unchanged: {len(found.having(UNCHANGED))} files, stages and blocks")
    if edited:
        title = (
            "kept your edits" if keep_edits else "discarded your edits (replaced by vmapcheck's)"
        )
        print(f"  {title}:\n" + "\n".join(f"    {item}" for item in edited))
    for item in updated + ([] if keep_edits else edited):
        if found.diffs.get(item):
            print(_shown(found.diffs[item]))
    if choice.code:
        print(f"  your model's code, a dep of the stages that run it: {', '.join(choice.code)}")
    print("next: `dvc repro`, then read VMAPCHECK.md")
    return 0
