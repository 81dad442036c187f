"""Issue 45, part b: the store, the registry and tracking, each kind made for real.

Every class of input of issue 45's "nothing silently wrong in the store and registry",
several variants each, one row per input (hardening_battery's ``record``): the store
file a symlink loop or a dangling symlink; a store path that does not exist or is an
in-memory database; an artifact root that cannot be written or is not where the
experiment keeps its artifacts; ``mlartifacts`` a file at ``track``; the experiment
deleted in MLflow; registry names that match nothing; ``vmapcheck ui`` on a taken port;
an alias naming a missing version; a store stamped by a newer MLflow; a copied project;
the DVC cache full when ``track`` would move ``@verified``.

Besides the message, a row is ``silent`` when the fault left a trace it must not: a
store or folder created where none was asked for, a file named ``:memory:``, artifacts
written into the original project's folder, ``@verified`` moved, a run of a passing
check shown FAILED, a store's schema stamp changed.

    PYTHONPATH=src .venv/bin/python benchmarks/hardening_round3_b.py [--base DIR]

runs only these cases (on a base project made by ``dvc repro``, or the one in ``DIR/base``)
and prints the rows and the counts per class; ``hardening_battery.py`` runs them as its
group ``store3``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Run from hardening_battery.py (its __main__): record into that module's ROWS, not into a
# second copy of it that importing it by name would make.
_main = sys.modules.get("__main__")
if getattr(_main, "__file__", "").endswith("hardening_battery.py"):
    sys.modules.setdefault("hardening_battery", _main)  # type: ignore[arg-type]

from hardening_battery import (  # noqa: E402
    MLFLOW_URI_ENV,
    ROOT,
    ROWS,
    Outcome,
    base_project,
    cli,
    compose,
    copy_of,
    loss_check,
    proc,
    record,
    stage,
    track_after_train,
)

from tests.helpers.servers import free_port  # noqa: E402

DB = "mlflow.db"
MODEL = "vmapcheck-mlp"  # the base project's registry.registered_model
# The verbs that open the store, each on every broken store path.
STORE_VERBS: tuple[tuple[str, ...], ...] = (
    ("store", "probe"),
    ("registry",),
    ("compare",),
    ("rollback",),
    ("promote", "--version", "1"),
)


def _new_state(root: Path) -> None:
    """params.yaml holds a new value of a key track logs (tracking.http_timeout_s, which
    changes nothing for a local store): track logs a new run rather than finding this
    state's run logged already (a comment would not do: the state is the values)."""
    params = root / "params.yaml"
    text = params.read_text()
    new = f"http_timeout_s: {100 + len(ROWS) % 400}"
    params.write_text(re.sub(r"http_timeout_s: \d+", new, text, count=1))


def _alias(db: Path, name: str = MODEL) -> str | None:
    """The version ``verified`` names in the store file ``db`` (read with sqlite)."""
    with sqlite3.connect(db) as con:
        row = con.execute(
            "SELECT version FROM registered_model_aliases WHERE name = ? AND alias = 'verified'",
            (name,),
        ).fetchone()
    return None if row is None else str(row[0])


def _runs(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT run_uuid, status FROM runs").fetchall()


def _files(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder)) if folder.is_dir() else 0


def _own_copy(base: Path, dest: Path) -> Path:
    """A copy of ``base`` whose store names its own artifacts (``store relink``): a plain
    copy is a copied project, refused by track for that before any other fault."""
    root = copy_of(base, dest)
    done = cli(root, "store", "relink")
    if done.code != 0:
        raise RuntimeError(f"store relink of {root} failed: {done.err}")
    return root


def _also(result: Outcome, trace: str | None) -> Outcome:
    """``result``, turned into an acceptance (exit 0) that says ``trace`` when the fault
    left one: the judge then calls the row silent."""
    if trace:
        result.err += f" [left behind: {trace}]"
        result.code = 0
    return result


def _run_ui(root: Path, *args: str) -> Outcome:
    """``vmapcheck ui`` in its own process (a UI that starts replaces the process it runs
    in): bounded, and the UI stopped when it started after all."""
    from tests.helpers.project import project_env

    # This checkout's code (a base project kept from an earlier run has its own copy); not
    # this process's MLflow URIs (hardening_battery.proc says why).
    env = {k: v for k, v in project_env(root).items() if k not in MLFLOW_URI_ENV}
    env["PYTHONPATH"] = str(ROOT / "src")
    # A session of its own: a UI that starts is `mlflow ui`, whose server (uvicorn and its
    # workers) must be stopped with it, not left running after the battery.
    child = subprocess.Popen(
        [sys.executable, "-m", "vmapcheck", "ui", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=60)
        return Outcome(child.returncode, out, err)
    except subprocess.TimeoutExpired:
        return Outcome(0, "", "the UI started and ran for 60 s (not refused)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()


# --- 1. the store file a symlink --------------------------------------------------------


def symlink_cases(base: Path, tmp: Path) -> None:
    links: list[tuple[str, Callable[[Path], str]]] = [
        ("mlflow.db a symlink loop (to itself)", lambda r: DB),
        ("mlflow.db a symlink loop (a -> b -> a)", lambda r: (
            (r / "other.db").symlink_to(r / DB), str(r / "other.db"))[1]),
        ("mlflow.db a dangling symlink (folder missing)", lambda r: "/nonexistent/x/mlflow.db"),
        ("mlflow.db a dangling symlink (file missing)", lambda r: str(r / "gone" / "m.db")),
        ("mlflow.db a dangling relative symlink", lambda r: "moved-away.db"),
    ]  # fmt: skip
    for what, target_of in links:
        for args in (*STORE_VERBS, ("store", "init")):
            root = copy_of(base, tmp / f"link-{len(ROWS)}")
            (root / DB).unlink()
            if what.endswith("(file missing)"):
                (root / "gone").mkdir()
            (root / DB).symlink_to(target_of(root))

            def call(root=root, args=args) -> Outcome:
                result = cli(root, *args)
                made = [
                    p
                    for p in (Path("/nonexistent"), root / "gone" / "m.db", root / "moved-away.db")
                    if p.exists()
                ]
                return _also(result, f"created {made[0]}" if made else None)

            record("store3", f"{what}; vmapcheck {' '.join(args)}", "refuse", call,
                   names=("symlink",))  # fmt: skip
        root = copy_of(base, tmp / f"link-track-{len(ROWS)}")
        _new_state(root)
        (root / DB).unlink()
        if what.endswith("(file missing)"):
            (root / "gone").mkdir()
        (root / DB).symlink_to(target_of(root))
        record("store3", f"{what}; stage track", "refuse",
               lambda root=root: _also(stage(root, "track"), "created gone/m.db"
                                       if (root / "gone" / "m.db").exists() else None),
               names=("symlink",))  # fmt: skip
        root = copy_of(base, tmp / f"link-ui-{len(ROWS)}")
        (root / DB).unlink()
        (root / DB).symlink_to(target_of(root))
        # On a free port: another process on this machine (a test run) may hold 5000.
        record("store3", f"{what}; vmapcheck ui", "refuse",
               lambda root=root: _run_ui(root, "--port", str(free_port())),
               names=("symlink",))  # fmt: skip


# --- 2. a store URI that names no store to create ---------------------------------------


def uri_cases(base: Path, tmp: Path) -> None:
    uris = [
        ("sqlite:///:memory:", "tracking.tracking_uri"),
        ("sqlite://", "tracking.tracking_uri"),
        ("sqlite:", "tracking.tracking_uri"),
        ("'sqlite:///:memory:?cache=shared'", "tracking.tracking_uri"),
        ("'sqlite:///file:x?mode=memory'", "tracking.tracking_uri"),
        ("sqlite:////nonexistent/store/mlflow.db", "/nonexistent/store"),
        ("sqlite:///typo-folder/mlflow.db", "typo-folder"),
        ("sqlite:///a/b/c/mlflow.db", "mlflow.db"),
        ("sqlite:///reports/check.json/mlflow.db", "not a folder"),
    ]
    for uri, name in uris:
        for target in ("track", "store probe", "registry", "compare"):
            root = copy_of(base, tmp / f"uri-{len(ROWS)}")
            _new_state(root)

            def call(root=root, uri=uri, target=target) -> Outcome:
                try:
                    compose(root, f"tracking.tracking_uri={uri}")
                except Exception as exc:  # Hydra's own refusal of the override
                    return Outcome(1, "", f"composition refused: {type(exc).__name__}")
                result = (
                    track_after_train(root) if target == "track" else cli(root, *target.split())
                )
                made = [
                    p
                    for p in (Path("/nonexistent"), root / ":memory:", root / "typo-folder",
                              root / "a", root / "file:x")
                    if p.exists()
                ]  # fmt: skip
                return _also(result, f"created {made[0]}" if made else None)

            record("store3", f"tracking_uri={uri}; {target}", "refuse", call, names=(name,))
    # The same through MLFLOW_TRACKING_URI (not validated with the config).
    for uri, name in (("sqlite:///:memory:", "MLFLOW_TRACKING_URI"),
                      ("sqlite:////nonexistent/env/mlflow.db", "/nonexistent/env")):  # fmt: skip
        for target in ("track", "registry"):
            root = copy_of(base, tmp / f"uri-env-{len(ROWS)}")
            _new_state(root)
            env = {"MLFLOW_TRACKING_URI": uri}

            def call(root=root, target=target, env=env) -> Outcome:
                result = stage(root, "track", env) if target == "track" else cli(
                    root, target, env=env)  # fmt: skip
                made = [p for p in (Path("/nonexistent"), root / ":memory:") if p.exists()]
                return _also(result, f"created {made[0]}" if made else None)

            record("store3", f"MLFLOW_TRACKING_URI={uri}; {target}", "refuse", call,
                   names=(name,))  # fmt: skip
    # Asked for: `store init` makes a store in a new folder (and a fresh project's first
    # track makes its default store).
    root = copy_of(base, tmp / "uri-init")
    compose(root, "tracking.tracking_uri=sqlite:///stores/new/mlflow.db")
    record("store3", "tracking_uri in a new folder; vmapcheck store init (asked)", "serve",
           lambda: cli(root, "store", "init"))  # fmt: skip
    # Not relinked: its store is deleted.
    root = copy_of(base, tmp / "uri-fresh", relink=False)
    (root / DB).unlink()
    shutil.rmtree(root / "mlartifacts")
    _new_state(root)
    record("store3", "no store yet (a fresh project); stage track makes the default one",
           "serve", lambda: stage(root, "track"))  # fmt: skip


# --- 3. the artifact root ---------------------------------------------------------------


def artifact_cases(base: Path, tmp: Path) -> None:
    elsewhere = tmp / "elsewhere-artifacts"
    elsewhere.mkdir()
    roots = [
        ("/proc/nope", "/proc/nope"),
        ("/nonexistent/artifacts", "/nonexistent/artifacts"),
        ("reports/check.json", "tracking.artifact_root"),
        (str(elsewhere), "tracking.artifact_root"),
        ("other-artifacts", "tracking.artifact_root"),
        ("mlartifacts/sub", "tracking.artifact_root"),
    ]
    for value, name in roots:
        root = _own_copy(base, tmp / f"art-{len(ROWS)}")
        _new_state(root)
        before = _files(root / "mlartifacts")

        def call(root=root, value=value, before=before) -> Outcome:
            compose(root, f"tracking.artifact_root={value}")
            result = stage(root, "track")
            grew = _files(root / "mlartifacts") - before
            return _also(result, f"{grew} files written to the old root" if grew else None)

        record("store3", f"tracking.artifact_root={value}; stage track", "refuse", call,
               names=(name,))  # fmt: skip
    # A new experiment (another tracking.experiment) with an artifact root that cannot be
    # written: refused before the experiment or a run is made.
    for value in ("/proc/nope", "/nonexistent/a/b", "reports/check.json"):
        root = _own_copy(base, tmp / f"art-new-{len(ROWS)}")
        _new_state(root)

        def call(root=root, value=value) -> Outcome:
            compose(root, f"tracking.artifact_root={value}", "tracking.experiment=fresh")
            result = stage(root, "track")
            with sqlite3.connect(root / DB) as con:
                made = con.execute("SELECT COUNT(*) FROM experiments WHERE name='fresh'").fetchone()
            return _also(result, "experiment 'fresh' created" if made[0] else None)

        record("store3", f"artifact_root={value}, a new experiment; stage track", "refuse", call,
               names=("tracking.artifact_root",))  # fmt: skip


# --- 4. at track: the artifact folder, the experiment -----------------------------------


def _no_false_failure(db: Path) -> Callable[[], str | None]:
    """After the fault: no run left FAILED without a tag saying why (``compare`` would
    show a passing check as failed)."""
    known = {run for run, _ in _runs(db)}

    def check() -> str | None:
        with sqlite3.connect(db) as con:
            rows = con.execute(
                "SELECT run_uuid FROM runs WHERE status = 'FAILED' AND run_uuid NOT IN "
                "(SELECT run_uuid FROM tags WHERE key IN ('vmapcheck.log_failed', "
                "'vmapcheck.abandoned'))"
            ).fetchall()
        new = [r for (r,) in rows if r not in known]
        return f"run {new[0]} FAILED with no reason tagged" if new else None

    return check


def track_cases(base: Path, tmp: Path) -> None:
    damages: list[tuple[str, Callable[[Path], None], str]] = [
        ("mlartifacts a file", lambda r: (shutil.rmtree(r / "mlartifacts"),
                                          (r / "mlartifacts").write_text("x")), "mlartifacts"),
        ("mlartifacts an empty file", lambda r: (shutil.rmtree(r / "mlartifacts"),
                                                 (r / "mlartifacts").write_bytes(b"")),
         "mlartifacts"),
        ("mlartifacts a symlink loop", lambda r: (shutil.rmtree(r / "mlartifacts"),
                                                  (r / "mlartifacts").symlink_to("mlartifacts")),
         "mlartifacts"),
        ("mlartifacts a symlink to a file", lambda r: (shutil.rmtree(r / "mlartifacts"),
                                                       (r / "mlartifacts").symlink_to("dvc.yaml")),
         "mlartifacts"),
        ("mlartifacts a dangling symlink", lambda r: (
            shutil.rmtree(r / "mlartifacts"), (r / "mlartifacts").symlink_to(r / "gone")),
         "mlartifacts"),
        ("mlartifacts a symlink to /proc", lambda r: (shutil.rmtree(r / "mlartifacts"),
                                                      (r / "mlartifacts").symlink_to("/proc")),
         "mlartifacts"),
    ]  # fmt: skip
    for what, damage, name in damages:
        root = _own_copy(base, tmp / f"trk-{len(ROWS)}")
        _new_state(root)
        damage(root)
        record("store3", f"{what}; stage track", "refuse", lambda root=root: stage(root, "track"),
               names=(name,), loss=_no_false_failure(root / DB))  # fmt: skip
    # After such a failure: compare shows no run of a passing check as "failed".
    root = _own_copy(base, tmp / "trk-compare")
    _new_state(root)
    shutil.rmtree(root / "mlartifacts")
    (root / "mlartifacts").write_text("x")
    stage(root, "track")
    record("store3", "mlartifacts a file, after track; vmapcheck compare", "serve",
           lambda: _compare_without_false_failure(root))  # fmt: skip
    # The experiment soft-deleted in MLflow (its trash), and variants.
    for what, per_model in (("the experiment deleted", False),
                            ("the per-model experiment deleted", True)):  # fmt: skip
        for target in ("track", "store init"):
            root = _own_copy(base, tmp / f"trk-del-{len(ROWS)}")
            _new_state(root)
            if per_model:
                compose(root, "tracking.experiment_per_model=true")
            name = "vmapcheck-mlp" if per_model else "vmapcheck"
            _delete_experiment(root, name)

            def call(root=root, target=target) -> Outcome:
                if target == "track":
                    return stage(root, "track")
                return cli(root, *target.split())

            record("store3", f"{what}; {target}", "refuse", call,
                   names=(name, "mlflow experiments restore"))  # fmt: skip
    # Restored the way the message says: track logs again.
    root = _own_copy(base, tmp / "trk-restored")
    _new_state(root)
    experiment_id = _delete_experiment(root, "vmapcheck")
    record("store3", "the experiment deleted, then restored as told; stage track", "serve",
           lambda: (proc(root, sys.executable, "-m", "mlflow", "experiments", "restore",
                         "--experiment-id", experiment_id,
                         env={"MLFLOW_TRACKING_URI": f"sqlite:///{root / DB}"}),
                    stage(root, "track"))[1])  # fmt: skip


def _delete_experiment(root: Path, name: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / DB}")
    found = client.get_experiment_by_name(name)
    experiment_id = (
        found.experiment_id
        if found is not None
        else client.create_experiment(name, (root / "mlartifacts").resolve().as_uri())
    )
    client.delete_experiment(experiment_id)
    return experiment_id


def _compare_without_false_failure(root: Path) -> Outcome:
    result = cli(root, "compare")
    lines = [ln for ln in result.out.splitlines() if " FAILED " in f" {ln} "]
    if lines:  # the base run passed; a run whose logging failed is no failed check
        return Outcome(1, result.out, f"compare lists a run as FAILED: {lines[0]}")
    return result


# --- 5. registry names ------------------------------------------------------------------


def name_cases(base: Path, tmp: Path) -> None:
    names = ["", " ", "nosuch", "vmapcheck-mlp ", "a b", "-", "../x", "VMAPCHECK-MLP"]
    for name in names:
        for args in (("promote", "--model", name, "--version", "1"),
                     ("rollback", "--model", name), ("registry", "--model", name)):  # fmt: skip
            root = copy_of(base, tmp / f"name-{len(ROWS)}")
            before = _alias(root / DB)

            def call(root=root, args=args, before=before) -> Outcome:
                result = cli(root, *args)
                now = _alias(root / DB)
                return _also(result, f"@verified moved {before} -> {now}" if now != before
                             else None)  # fmt: skip

            shown = " ".join(repr(a) if not a.strip() or " " in a else a for a in args)
            named = "--model" if not name.strip() else name.strip()
            record("store3", f"vmapcheck {shown}", "refuse", call, names=(named,))


# --- 6. vmapcheck ui on a taken port ----------------------------------------------------


def ui_cases(base: Path, tmp: Path) -> None:
    root = copy_of(base, tmp / "ui")
    for what, host in (("127.0.0.1", "127.0.0.1"), ("0.0.0.0 (every address)", "0.0.0.0")):
        holder = socket.socket()
        holder.bind((host, 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        try:
            record("store3", f"vmapcheck ui --port <taken on {what}>", "refuse",
                   lambda port=port: _run_ui(root, "--port", str(port)),
                   names=(str(port),))  # fmt: skip
        finally:
            holder.close()
    # A port held by a connected, not listening, socket pair is free for a server: served
    # (the UI started, and was stopped after a few seconds).
    record("store3", "vmapcheck ui --port 1023 (privileged)", "refuse",
           lambda: _run_ui(root, "--port", "1023"), names=("1023",))  # fmt: skip


# --- 7. an alias naming a missing version ------------------------------------------------


def alias_cases(base: Path, tmp: Path) -> None:
    for number in ("99", "0", "2"):
        for args, expect in ((("registry",), "serve"), (("rollback",), "refuse"),
                             (("promote", "--version", "1"), "serve")):  # fmt: skip
            root = copy_of(base, tmp / f"alias-{len(ROWS)}")
            with sqlite3.connect(root / DB) as con:
                con.execute(
                    "UPDATE registered_model_aliases SET version = ? WHERE alias = 'verified'",
                    (int(number),),
                )

            def call(root=root, args=args, number=number) -> Outcome:
                result = cli(root, *args)
                said = f"version {number}"
                if said not in result.text or "not in the store" not in result.text:
                    return Outcome(0, result.out, f"not reported ({said!r}): {result.err}")
                return result

            record("store3", f"@verified -> missing version {number}; vmapcheck {' '.join(args)}",
                   expect, call, names=(number,))  # fmt: skip


# --- 8. a store made by a newer MLflow --------------------------------------------------


def schema_cases(base: Path, tmp: Path) -> None:
    for revision in ("ffffffffffff", "0123456789ab", "zz-not-hex"):
        for args in (("store", "probe"), ("store", "init"), ("registry",), ("compare",),
                     ("promote", "--version", "1"), ("track",)):  # fmt: skip
            root = copy_of(base, tmp / f"schema-{len(ROWS)}")
            _new_state(root)
            with sqlite3.connect(root / DB) as con:
                con.execute("UPDATE alembic_version SET version_num = ?", (revision,))

            # The copy's relink (copy_of) made a backup already: only one made by the
            # call itself would mean the store was about to be changed.
            before = set(root.glob(f"{DB}.bak-*"))

            def call(root=root, args=args, revision=revision, before=before) -> Outcome:
                result = stage(root, "track") if args == ("track",) else cli(root, *args)
                with sqlite3.connect(root / DB) as con:
                    now = con.execute("SELECT version_num FROM alembic_version").fetchone()[0]
                backups = sorted(set(root.glob(f"{DB}.bak-*")) - before)
                trace = f"schema stamp changed to {now}" if now != revision else None
                return _also(result, trace or (f"backup {backups[0].name} made" if backups
                                               else None))  # fmt: skip

            record("store3", f"store stamped {revision} (a newer MLflow); {' '.join(args)}",
                   "refuse", call, names=(revision, "newer MLflow"),
                   loss=loss_check(root / DB))  # fmt: skip


# --- 9. a copied or moved project -------------------------------------------------------


def copy_cases(base: Path, tmp: Path) -> None:
    # The base project's store names base/mlartifacts: a copy of it is a copied project.
    # A moved one: a copy relinked to itself, then moved (its old folder gone).
    for what in ("copied", "moved"):
        root = tmp / f"copy-{what}"
        if what == "copied":
            copy_of(base, root, relink=False)
        else:
            first = copy_of(base, tmp / "copy-before-move", relink=False)
            cli(first, "store", "relink")
            shutil.move(first, root)
        _new_state(root)
        before = _files(base / "mlartifacts")

        def track_in_copy(root=root, before=before) -> Outcome:
            result = stage(root, "track")
            grew = _files(base / "mlartifacts") - before
            return _also(result, f"{grew} files written into the original's mlartifacts"
                         if grew else None)  # fmt: skip

        record("store3", f"a {what} project; stage track", "refuse", track_in_copy,
               names=("store relink",))  # fmt: skip
        record("store3", f"a {what} project; vmapcheck registry (finds its versions)", "serve",
               lambda root=root: cli(root, "registry"))  # fmt: skip
        record("store3", f"a {what} project; vmapcheck store where", "serve",
               lambda root=root: cli(root, "store", "where"))  # fmt: skip
        record("store3", f"a {what} project; vmapcheck store relink", "serve",
               lambda root=root: cli(root, "store", "relink"))  # fmt: skip
        record("store3", f"a {what} project, relinked; vmapcheck store relink again", "serve",
               lambda root=root: cli(root, "store", "relink"))  # fmt: skip
        record("store3", f"a {what} project, relinked; stage track", "serve",
               lambda root=root, before=before: _also(
                   stage(root, "track"),
                   "written into the original's mlartifacts"
                   if _files(base / "mlartifacts") != before else None))  # fmt: skip
        record("store3", f"a {what} project, relinked; load models:/{MODEL}@verified", "serve",
               lambda root=root: _load_verified(root))  # fmt: skip


def _load_verified(root: Path) -> Outcome:
    code = (
        "import sys, mlflow\n"
        f"mlflow.set_tracking_uri('sqlite:///{root / DB}')\n"
        f"m = mlflow.pyfunc.load_model('models:/{MODEL}@verified')\n"
        "print('loaded', m.metadata.model_uuid)\n"
    )
    return proc(root, sys.executable, "-c", code, timeout=300)


# --- 10. the DVC cache full when track would move @verified ------------------------------


def cache_cases(base: Path, tmp: Path) -> None:
    """A real full disk: a small tmpfs as the DVC cache (``cache.dir``); needs root."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return
    for size in ("16m", "32m"):
        root = _own_copy(base, tmp / f"cache-{len(ROWS)}")
        mount = tmp / f"cache-mnt-{len(ROWS)}"
        mount.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True).returncode != 0:  # fmt: skip
            return
        try:
            fill = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
            try:  # to the last block (unbuffered: nothing left to flush on close)
                while True:
                    os.write(fill, b"\0" * 4096)
            except OSError:
                pass
            finally:
                os.close(fill)
            (root / ".dvc" / "config.local").write_text(f"[cache]\n    dir = {mount}\n")
            # A new registered model: this passing run registers version 1 of it, whose
            # alias move must wait for room in the cache.
            compose(root, "registry.registered_model=cachefull-model")
            before = _alias(root / DB, "cachefull-model")

            def call(root=root, before=before) -> Outcome:
                result = stage(root, "track")
                now = _alias(root / DB, "cachefull-model")
                if now != before:
                    return _also(result, f"@verified moved to {now} with the DVC cache full")
                if result.code != 0 and "DVC cache" in result.err:
                    return result  # refused before any work (track's refuse_full_cache)
                if "NOT moved" not in result.out:
                    return Outcome(0, result.out, "neither refused nor the alias move deferred")
                return Outcome(1, result.out, result.err + "\n" + result.out.splitlines()[-1])

            # Refused before any work when the cache has no room at track's start; the
            # alias move deferred when room ran out during it (both name the DVC cache).
            record("store3", f"DVC cache full (tmpfs {size}); stage track", "refuse", call,
                   names=("DVC cache",))  # fmt: skip
            (mount / "filler").unlink()
            record("store3", f"DVC cache freed (tmpfs {size}); stage track moves the alias",
                   "serve", lambda root=root: _moved(root))  # fmt: skip
        finally:
            subprocess.run(["umount", str(mount)], capture_output=True)


def _moved(root: Path) -> Outcome:
    result = stage(root, "track")
    if _alias(root / DB, "cachefull-model") is None:
        return Outcome(1, result.out, "the pending alias move was not made")
    return result


def cases(base: Path, tmp: Path) -> None:
    """Every case of this file, on copies of ``base`` in ``tmp``."""
    for group in (symlink_cases, uri_cases, artifact_cases, track_cases, name_cases,
                  ui_cases, alias_cases, schema_cases, copy_cases, cache_cases):  # fmt: skip
        try:
            group(base, tmp)
        except Exception:  # the battery's own failure: said, the other groups go on
            import traceback

            traceback.print_exc()
            print(f"round3_b: {group.__name__} stopped early (above)", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="reuse DIR/base when it is there")
    parser.add_argument("--only", default="", help="comma-separated case functions")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_platforms", "cpu")
    with tempfile.TemporaryDirectory(prefix="round3b-") as name:
        tmp = Path(name)
        if args.base is not None and (args.base / "base" / "reports" / "track.json").exists():
            base = args.base / "base"
        else:
            base = base_project(args.base or tmp)
        if args.only:
            for fn in args.only.split(","):
                globals()[fn](base, tmp)
        else:
            cases(base, tmp)
    counts = Counter(r.outcome for r in ROWS)
    for row in ROWS:
        if row.outcome != "clean":
            print(f"{row.outcome:9s} {row.done}  ->  {row.shown}")
    print(f"{len(ROWS)} rows: {dict(counts)}")
    return 0 if counts["clean"] + counts["late"] == len(ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
