"""What every stage shares: load the validated config, run the body, report errors clearly."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from vmapcheck import clock
from vmapcheck.config import Config, read_params, validate_config
from vmapcheck.config.load import PARAMS_MAX_BYTES
from vmapcheck.core.distributed import Launch, launched
from vmapcheck.core.runtime import enable_compile_cache
from vmapcheck.errors import (
    INTERRUPTED,
    REFUSED,
    ArtifactError,
    redact,
    redacted_output,
    user_error,
)
from vmapcheck.io import atomic_write_json, read_text_bounded
from vmapcheck.layout import Layout
from vmapcheck.pause import pause_point, set_stage
from vmapcheck.running import (
    OomCount,
    StageParams,
    StageTime,
    clear_running,
    killed_stage,
    oom_kills,
    read_stage_time,
    scrub_credentials,
)

StageBody = Callable[[Config, Layout], int | None]
# The pipeline's last stage (dvc.yaml): when it ends, the run is over.
LAST_STAGE = "track"


def write_stage_time(
    layout: Layout,
    name: str,
    start: float,
    end: float | None,
    exit_code: int | None,
    params: StageParams | None = None,
    oom: OomCount | None = None,
    error: str | None = None,
) -> None:
    """``reports/stages/<name>.json``: ``{"stage", "start", "end", "wall_s",
    "exit_code", "params", "pid", "oom_kills"}`` and, when the stage refused its work,
    ``"error"``; times in seconds since the epoch;
    ``end``/``wall_s``/``exit_code`` None while the stage runs (and for ever when it is
    killed: :func:`killed_stage`); ``params``: what :func:`params_record` made of the
    params.yaml the stage ran with; ``oom_kills``: :func:`oom_kills` when it started;
    ``error``: ``<type>: <message>`` of the error it stopped on (exit 2), what
    ``vmapcheck summary`` shows of a failed stage (:func:`vmapcheck.running.failed_stages`)."""
    record: StageTime = {
        "stage": name,
        "start": start,
        "end": end,
        "wall_s": None if end is None else round(end - start, 3),
        "exit_code": exit_code,
        "params": params,
        "pid": os.getpid(),
        "oom_kills": oom,
    }
    if error is not None:
        # Never a URL's credentials (a tracking store's error names its URI): the record
        # is a DVC output, cached and shared like the others.
        record["error"] = redact(error)
    atomic_write_json(layout.stage_time(name), record)


def text_sha256(text: str) -> str:
    """sha256 of a params.yaml text as a stage read it (UTF-8), hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def declared_params(layout: Layout) -> dict[str, list[str]]:
    """Each dvc.yaml stage's params keys of params.yaml (dotted, as dvc.yaml lists them);
    empty when there is no readable dvc.yaml (a stage run outside a pipeline)."""
    try:
        # Bounded and type-checked: a dvc.yaml that is a FIFO would block every stage.
        text = read_text_bounded(layout.dvc_yaml, PARAMS_MAX_BYTES, "a dvc.yaml")
        stages = (yaml.safe_load(text) or {})["stages"]
    except (
        OSError,
        ValueError,
        RecursionError,
        ArtifactError,
        yaml.YAMLError,
        KeyError,
        TypeError,
    ):
        return {}
    declared: dict[str, list[str]] = {}
    for stage_name, stage in stages.items() if isinstance(stages, dict) else ():
        keys: list[str] = []
        for entry in (stage or {}).get("params", []) or []:
            if isinstance(entry, str):
                keys.append(entry)
            elif isinstance(entry, dict):
                keys += [k for k in entry.get(layout.params_yaml.name) or [] if isinstance(k, str)]
        declared[str(stage_name)] = keys
    return declared


def _value_at(raw: dict[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def leaf_digests(raw: dict[str, Any], keys: list[str]) -> dict[str, str]:
    """``{dotted leaf: sha256 of its value}`` for every leaf under ``keys`` of params.yaml
    ``raw`` (a key whose value is not a mapping is its own leaf): what lets track name
    ``train.steps``, not only ``train``, when a stage ran with other values."""
    found: dict[str, str] = {}

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict) and node:
            for part, child in node.items():
                walk(child, f"{key}.{part}")
        else:
            # 16 hex digits tell a changed value apart; the record (written at the stage's
            # start, on a disk that may be nearly full) stays small with many leaves.
            found[key] = _digest(node)[:16]

    for key in keys:
        walk(_value_at(raw, key), key)
    return found


def params_record(layout: Layout, name: str, text: str, raw: dict[str, Any]) -> StageParams:
    """What a stage records of the params.yaml it ran with (``text``, parsed ``raw``):
    ``{"keys": its own dvc.yaml params keys, "sha256": {key: sha256 of its value} for
    every key any stage declares, "file_sha256": of the whole text}``. track compares
    each stage's keys with its own record (:func:`settings_changed`): a run whose
    params.yaml was rewritten under it (a second ``dvc exp run`` in the same workspace)
    is never logged as one run."""
    declared = declared_params(layout)
    every = sorted({key for keys in declared.values() for key in keys})
    return {
        "keys": declared.get(name, []),
        "sha256": {key: _digest(_value_at(raw, key)) for key in every},
        # Its own keys' leaves: named when its outputs no longer match params.yaml.
        "leaves": leaf_digests(raw, declared.get(name, [])),
        "file_sha256": text_sha256(text),
    }


def stage_params(stages: Mapping[str, StageTime], name: str) -> StageParams | None:
    """What stage ``name`` recorded of its params.yaml (None: no record of it, or one
    written before stages kept their params)."""
    record = stages.get(name)
    return record.get("params") if record else None


def settings_changed(stages: Mapping[str, StageTime], own: str) -> dict[str, list[str]]:
    """Per stage, the params keys it ran with other values of than stage ``own`` (track)
    read: empty when the whole run saw one params.yaml (a stage DVC skipped kept its
    record, whose keys DVC found unchanged). Records without params (written before
    stages kept them) are not compared."""
    mine = stage_params(stages, own)
    digests = (mine.get("sha256") if mine else None) or {}
    changed: dict[str, list[str]] = {}
    for name, record in stages.items():
        theirs = record.get("params") if name != own else None
        if not theirs or not digests:
            continue
        keys = [k for k in theirs.get("keys", []) if theirs["sha256"].get(k) != digests.get(k)]
        if keys:
            changed[name] = keys
    return changed


def read_stage_times(layout: Layout) -> dict[str, StageTime]:
    """Every ``reports/stages/<stage>.json`` there is, by stage name, oldest start first.
    A stage whose record is missing (outputs from before stages were timed) is left out.

    Raises:
        ArtifactError: a record is not JSON or lacks its ``start``.
    """
    records: dict[str, StageTime] = {}
    folder = layout.stage_times
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        records[path.stem] = read_stage_time(path)
    return dict(sorted(records.items(), key=lambda item: item[1]["start"]))


def _key_reuse(error: BaseException) -> bool:
    """Whether ``error`` is JAX's KeyReuseError. Only a stage that imported JAX can raise
    it, so the stages that run no JAX (code, track) never load JAX (1.6 s) for this."""
    errors = sys.modules.get("jax.errors")
    return errors is not None and isinstance(error, errors.KeyReuseError)


def run_stage(
    name: str, body: StageBody, root: Path | None = None, compile_cache: bool = False
) -> int:
    """Validate params.yaml, run ``body(config, Layout(root))``; return its exit code.

    ``root``: the project root (None: the working directory, where DVC runs each
    stage's cmd). The body returns an exit code (None = 0). A :class:`VmapcheckError`
    prints ``<stage>: error: <message>`` and returns 2; Ctrl-C prints one line and
    returns :data:`INTERRUPTED`; an OSError, a decode, recursion, overflow or memory
    error prints one line and returns 2, anything else (a bug) one line and 3
    (:func:`vmapcheck.errors.user_error`; ``VMAPCHECK_DEBUG=1`` shows its traceback); a
    ``sys.exit`` from user code is refused as such (2).
    ``compile_cache``: JAX keeps and reuses its compiled programs in the project's
    ``.jax_cache/`` (:func:`vmapcheck.core.runtime.enable_compile_cache`);
    stages/<name>.py turn it on for prepare, train, forward and check (not ``bench``,
    which times its compiles).

    Once the config is valid, the stage's wall time goes to ``reports/stages/<name>.json``
    (:func:`write_stage_time`): written when the body starts (no end yet: ``track`` reads
    its own start there) and again when it ends, whatever the outcome (``exit_code`` None:
    it raised). A refused config writes nothing: the stage did no work.
    """
    # No line the stage prints shows a URL's credentials (MLFLOW_TRACKING_URI may hold them).
    with redacted_output():
        return _run_stage(name, body, root, compile_cache)


# The signals that end a stage "politely" (a person, a job scheduler, a time limit, a
# closed terminal), not the out-of-memory killer's SIGKILL: with Python's default action
# the stage would die at once, leaving a record with no end, which reads as a SIGKILL.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The exit code of a stage stopped by SIGTERM: 128 + 15, as a shell reports it.
TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """One of :data:`ENDING_SIGNALS` arrived: raised in the stage's main thread, so its
    record gets its end and the summary says "terminated"."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def _ending_signals_end_the_stage():
    """Each of :data:`ENDING_SIGNALS` raises :class:`Terminated` in the stage while it
    runs; the previous handlers afterwards. Only the main thread may set a handler:
    elsewhere, nothing."""
    try:
        previous = {sig: signal.signal(sig, _raise_terminated) for sig in ENDING_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_stage(name: str, body: StageBody, root: Path | None, compile_cache: bool) -> int:
    with _ending_signals_end_the_stage():
        return _run_stage_body(name, body, root, compile_cache)


def _run_stage_body(name: str, body: StageBody, root: Path | None, compile_cache: bool) -> int:
    layout = Layout(Path.cwd() if root is None else root)
    # One of a group of processes (backend.processes, vmapcheck.pipeline.multiprocess):
    # its messages say which process it is. In a local group the launcher, the stage's
    # own process, keeps the stage's record; a cluster's process keeps its own, on its
    # host (docs/multiprocess.md).
    member: Launch | None = None
    recorded = True
    shown = name
    set_stage(name)
    start = clock.now()
    timed = False
    code: int | None = None
    error: str | None = None
    params: StageParams | None = None
    model_name: str | None = None
    try:
        member = launched()  # its variables refused here, by name, as a config's are
        shown = name if member is None else f"{name} ({member.label()})"
        recorded = member is None or member.coordinator is None
        scrub_credentials(layout.params_yaml, name)
        text, raw = read_params(layout.params_yaml)
        config = validate_config(raw, source=str(layout.params_yaml))
        model_name = config.model.name
        params = params_record(layout, name, text, raw)
        oom = oom_kills()
        # This stage's previous run, if the system killed it (its record has no end):
        # said once, before its record is replaced.
        previous = layout.stage_time(name)
        if previous.is_file() and recorded:
            with contextlib.suppress(ArtifactError):
                killed = killed_stage(read_stage_time(previous))
                if killed is not None:
                    print(f"{name}: note: its previous run: {killed}", file=sys.stderr)
        if recorded:
            write_stage_time(layout, name, start, None, None, params, oom)
            timed = True
        pause_point("start")
        # In a group too: JAX writes cache entries from process 0 alone, under a file lock
        # (jax._src.compiler._cache_write, lru_cache), and every process reads them.
        if compile_cache:
            enable_compile_cache(layout.compile_cache)
        code = body(config, layout) or 0
        pause_point("end")
        return code
    except SystemExit as exc:
        # Only user code exits mid-stage (a model factory calling sys.exit): the stage
        # did not finish, whatever status it exited with, and says so.
        message = (
            f"the stage's code called sys.exit({exc.code!r}) before the stage finished "
            "(the model's factory, init or forward?): nothing it should write was written; "
            "user code must raise an exception, not exit"
        )
        print(f"{shown}: error: {message}", file=sys.stderr)
        error = f"SystemExit: {message}"
        code = REFUSED
        return code
    except Exception as exc:
        if not _key_reuse(exc):
            # The one place every entry point shows errors (the model named: its code
            # may be what raised).
            said = user_error(exc, model_name)
            if said is None:
                raise
            code, message = said
            print(f"{shown}: error: {message}", file=sys.stderr)
            # Kept in its record: DVC's own last line says only that the stage failed.
            error = f"{type(exc).__name__}: {message}"
            return code
        first_line = str(exc).splitlines()[0]
        # The params leaves that share the key, when train could name them.
        shared_by = getattr(exc, "shared_by", None)
        where = f"; {shared_by}" if shared_by else ""
        message = (
            f"a PRNG key was used twice ({first_line}){where}; each subkey "
            "of the key stream (vmapcheck.core.keys) must feed exactly one random operation"
        )
        print(f"{shown}: error: {message}", file=sys.stderr)
        error = f"{type(exc).__name__}: {message}"
        code = 2
        return code
    except KeyboardInterrupt:
        # Ctrl-C (dvc repro passes it on to the stage): one line, not a traceback. Every
        # output is written atomically, so none is left half-written.
        message = (
            "interrupted (Ctrl-C); no output of this stage is half-written, and `dvc repro` "
            "runs it again"
        )
        print(f"{shown}: {message}", file=sys.stderr)
        # Kept in its record too: `vmapcheck summary` lists how the stage ended.
        error = f"Interrupted: {message}"
        code = INTERRUPTED
        return code
    except Terminated as ended:
        sig = signal.Signals(ended.signum).name
        message = (
            f"terminated ({sig}: sent by a person, a job scheduler, a time limit or a closed "
            "terminal, not the out-of-memory killer); no output of this stage is "
            "half-written, and `dvc repro` runs it again"
        )
        print(f"{shown}: {message}", file=sys.stderr)
        error = f"Terminated: {message}"
        code = 128 + ended.signum
        return code
    finally:
        if timed:
            write_stage_time(layout, name, start, clock.now(), code, params, oom, error)
        if name == LAST_STAGE:
            # The run is over, whatever its outcome: another may compose params.yaml.
            clear_running(layout)
