"""How ``vmapcheck init`` writes into a repository that already holds files.

- **The project's own pipeline is joined, not replaced.** vmapcheck's stages go into the
  project's ``dvc.yaml`` beside its own stages, whose text and comments are kept
  (a round trip through ruamel.yaml, as DVC itself edits dvc.yaml). A stage of the
  project's with one of vmapcheck's names, or an output path both would write, is
  refused, naming it.
- **The project's params are kept in the composition.** With DVC's Hydra composition on,
  ``dvc exp run -S ...`` rebuilds ``params.yaml`` from ``conf/``: the project's own keys
  therefore move, text and comments as they were, to ``conf/project.yaml`` (the project's
  file: init writes it only when it is absent), which ``conf/config.yaml`` composes in and
  lists in ``project_keys`` (:func:`vmapcheck.config.without_project_keys`). A project key
  with the name of one of vmapcheck's is refused.
- **init's manifest** (``.vmapcheck/init.json``, :attr:`vmapcheck.layout.Layout.
  init_manifest`) holds the sha256 of each file and dvc.yaml stage as init wrote it. On
  ``init --force`` a file or stage still as init wrote it is rewritten, and what changed
  is printed as a unified diff; one that was edited since (or that no manifest vouches
  for) is an edit of the user's: init refuses, showing the diff, unless told to keep the
  edits (``--keep-edits``) or to discard them (``--discard-edits``, also shown).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from vmapcheck.errors import ConfigError

# What a change to one of init's files is: new (absent), unchanged, updated (init's own
# text replaced by init's new text), edited (differs from what init wrote: the user's).
NEW, UNCHANGED, UPDATED, EDITED = "new", "unchanged", "updated", "edited"


def digest(text: str) -> str:
    """sha256 of ``text`` (UTF-8), hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stage_digest(stage: Any) -> str:
    """sha256 of a dvc.yaml stage's content (not its comments or layout)."""
    return digest(json.dumps(_plain(stage), sort_keys=True))


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _yaml() -> YAML:
    yaml = YAML()  # round trip: comments, key order and quoting kept
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def load_round_trip(text: str, source: str) -> Any:
    try:
        return _yaml().load(text)
    except Exception as exc:  # ruamel's errors have no common base worth naming
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None


def dump_round_trip(data: Any) -> str:
    out = io.StringIO()
    _yaml().dump(data, out)
    return out.getvalue()


def unified_diff(rel: str, old: str, new: str, old_label: str, new_label: str) -> str:
    """A unified diff of ``old`` -> ``new`` (empty when equal)."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{rel} ({old_label})",
            tofile=f"{rel} ({new_label})",
        )
    )


@dataclass
class Manifest:
    """What init wrote last: rel path -> sha256, and dvc.yaml stage -> sha256."""

    files: dict[str, str] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)
    version: str | None = None

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        """The manifest at ``path``; None when there is none (a project init wrote before
        manifests, or none at all)."""
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                files=dict(raw["files"]), stages=dict(raw["stages"]), version=raw.get("version")
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path}: not init's manifest ({type(exc).__name__}: {exc}); delete it to "
                "treat every file init writes as possibly edited"
            ) from None

    def text(self) -> str:
        return (
            json.dumps(
                {"version": self.version, "files": self.files, "stages": self.stages},
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )


def classify(current: str | None, planned: str, recorded: str | None) -> str:
    """NEW, UNCHANGED, UPDATED or EDITED for one file or stage: ``current`` (None:
    absent) against init's ``planned`` text, ``recorded`` the manifest's sha256 of what
    init last wrote (None: unknown)."""
    if current is None:
        return NEW
    if current == planned:
        return UNCHANGED
    if recorded is not None and digest(current) == recorded:
        return UPDATED
    return EDITED


@dataclass
class JoinedPipeline:
    """vmapcheck's dvc.yaml joined with the project's: the text to write, the project's
    stages kept, and per vmapcheck stage its status and (for updated or edited ones) the
    diff."""

    text: str
    project_stages: list[str]
    statuses: dict[str, str]
    diffs: dict[str, str]


def join_pipeline(
    existing: str | None,
    ours: str,
    recorded: dict[str, str],
    keep_edits: bool,
) -> JoinedPipeline:
    """vmapcheck's dvc.yaml (``ours``, rendered) joined into the project's (``existing``;
    None: there is none, and ours is written as it is).

    The project's stages, top-level keys and comments are kept; vmapcheck's stages take
    their places (or are appended) and its plots are added once. ``recorded``: the
    manifest's stage digests; a vmapcheck stage that differs from both ours and what init
    last wrote was edited: kept when ``keep_edits``, else replaced (the caller refuses
    edits before, unless told to discard them).

    Raises:
        ConfigError: the project's dvc.yaml is no mapping of stages, or one of the
            project's stages writes an output path one of vmapcheck's writes.
    """
    plain_ours = load_round_trip(ours, "vmapcheck's dvc.yaml")
    our_stages = plain_ours["stages"]
    digests = {name: stage_digest(stage) for name, stage in our_stages.items()}
    if existing is None or not existing.strip():
        return JoinedPipeline(ours, [], {n: NEW for n in our_stages}, {})
    doc = load_round_trip(existing, "dvc.yaml")
    if not isinstance(doc, dict) or not isinstance(doc.get("stages", {}), dict):
        raise ConfigError("dvc.yaml: expected a mapping with a `stages:` mapping, found otherwise")
    if "stages" not in doc:
        doc["stages"] = {}
    theirs = doc["stages"]
    project = [name for name in theirs if name not in our_stages]
    taken = [
        name
        for name in our_stages
        if name in theirs and name not in recorded and not _runs_vmapcheck(theirs[name], name)
    ]
    if taken:
        raise ConfigError(
            "vmapcheck init: your pipeline has stages named as vmapcheck's "
            f"({', '.join(taken)}): DVC allows one stage per name in a dvc.yaml; rename "
            "yours (`dvc stage list` shows them), then run init again"
        )
    _refuse_shared_outputs({n: theirs[n] for n in project}, our_stages)
    statuses: dict[str, str] = {}
    diffs: dict[str, str] = {}
    for name, stage in our_stages.items():
        if name not in theirs:
            statuses[name] = NEW
            theirs[name] = stage
            continue
        current = dump_round_trip({name: theirs[name]})
        planned = dump_round_trip({name: stage})
        same = stage_digest(theirs[name]) == digests[name]
        if same:
            statuses[name] = UNCHANGED
            continue
        edited = recorded.get(name) != stage_digest(theirs[name])
        statuses[name] = EDITED if edited else UPDATED
        diffs[name] = unified_diff(
            f"dvc.yaml stage {name}",
            current,
            planned,
            "yours" if edited else "as init wrote it",
            "vmapcheck's",
        )
        if not (edited and keep_edits):
            theirs[name] = stage
    for key, value in plain_ours.items():
        if key == "stages":
            continue
        if key not in doc:
            doc[key] = value
        elif isinstance(doc[key], list) and isinstance(value, list):
            doc[key].extend(v for v in value if _plain(v) not in _plain(doc[key]))
    return JoinedPipeline(dump_round_trip(doc), project, statuses, diffs)


def _runs_vmapcheck(stage: Any, name: str) -> bool:
    """Whether a stage is vmapcheck's (an init before manifests wrote it): its command
    runs vmapcheck's entry point of that name."""
    cmd = str(stage.get("cmd", "")) if isinstance(stage, dict) else ""
    return cmd.strip() in (f"python stages/{name}.py", f"python -m vmapcheck.stages.{name}")


def _outs(stage: Any) -> list[str]:
    found = []
    for out in stage.get("outs", []) or []:
        found.append(next(iter(out)) if isinstance(out, dict) else str(out))
    return [path.rstrip("/") for path in found]


def _refuse_shared_outputs(project: dict[str, Any], ours: dict[str, Any]) -> None:
    """Refuse a project stage whose output is, contains or lies in one of vmapcheck's."""
    mine = {path: name for name, stage in ours.items() for path in _outs(stage)}
    clashes = []
    for name, stage in project.items():
        for path in _outs(stage):
            for our_path, our_stage in mine.items():
                if (
                    path == our_path
                    or path.startswith(our_path + "/")
                    or our_path.startswith(path + "/")
                ):
                    clashes.append(
                        f"your stage {name!r} writes {path}, vmapcheck's {our_stage!r} {our_path}"
                    )
    if clashes:
        raise ConfigError(
            "vmapcheck init: these outputs of your pipeline overlap vmapcheck's (DVC refuses "
            "two stages writing one path); move yours elsewhere:\n  " + "\n  ".join(clashes)
        )


def project_params(existing: str | None, vmapcheck_keys: set[str]) -> tuple[str, list[str]] | None:
    """The project's own params from its ``params.yaml`` text: (the text for
    conf/project.yaml, its top-level keys); None when it holds none (absent, empty, or only
    vmapcheck's keys as init composed them).

    Raises:
        ConfigError: params.yaml is no mapping, or mixes the project's keys with keys of
            vmapcheck's names (they would collide in the one composed file).
    """
    if existing is None or not existing.strip():
        return None
    doc = load_round_trip(existing, "params.yaml")
    if not isinstance(doc, dict):
        raise ConfigError(
            # The plain type's name (list, str), not ruamel's round-trip class.
            f"params.yaml: expected a mapping at the top level, found {type(_plain(doc)).__name__}"
        )
    listed = set(doc.get("project_keys") or [])
    keys = [str(k) for k in doc if k not in vmapcheck_keys and k != "project_keys"]
    if not keys or (listed and set(keys) <= listed):
        # Composed by vmapcheck already: its project keys come from conf/project.yaml.
        return None
    clash = sorted(k for k in doc if k in vmapcheck_keys and k != "project_keys")
    if clash:
        raise ConfigError(
            "vmapcheck init: params.yaml holds your keys "
            f"{', '.join(keys)} and keys named as vmapcheck's ({', '.join(clash)}): "
            "vmapcheck composes its settings into params.yaml under those names; rename "
            "yours (and the stages that read them), then run init again"
        )
    return existing, keys
