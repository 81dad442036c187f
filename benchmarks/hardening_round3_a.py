"""Issue 45, part a: one boundary for every entry point, and bounds before work.

The kinds of input of issue 45's groups "CLI values", "config files", "data", "model
factories", the bounds ("bounded before work") and the API's paths, several variants
each, run for real on copies of the battery's base project (hardening_battery.py: its
``record``/``judge`` classes, its ``cli``/``stage``/``proc`` runners). Each row's group
is its class of input:

- ``boundary``: an OSError, a decode error, a recursion error at a CLI verb, and a closed
  pipe (``vmapcheck registry | head -2``);
- ``cli-value``: a flag's value refused at the door (``compare --width -5``, ``--out`` a
  directory or /proc before the work, ``--root /dev/null``);
- ``params-file``: params.yaml (and conf/) that is not a readable, bounded YAML file,
  at a stage and at a CLI verb;
- ``config-value``: settings out of range that used to pass validation (a seed past
  2**32, a learning rate below float32's smallest normal, an experiment name past
  MLflow's limit, an absurd warm-up count);
- ``data-file``: the CSV of ``data=csv`` a symlink loop, a FIFO, a device, ...;
- ``factory``: a user's model factory whose code raises, exits or uses
  ``jax.pure_callback`` without ``vmap_method``;
- ``api``: the Python API on too many rows, fewer than two paths, bad arguments.

    PYTHONPATH=src .venv/bin/python benchmarks/hardening_round3_a.py --base /tmp/b

runs these cases alone (the battery's main runs them as its group ``round3_a``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hardening_battery as hb
from hardening_battery import ROWS, Outcome, cli, copy_of, proc, record, stage

VMAPCHECK = Path(sys.executable).with_name("vmapcheck")
# Running as root, a file with mode 000 is still readable: such a row can only be served.
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


# --- how a file is spoiled ---------------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dir(path: Path) -> None:
    path.mkdir()


def _link(target: str) -> Callable[[Path], None]:
    return lambda path: path.symlink_to(target)


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def _noperm(text: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(text)
        path.chmod(0)

    return make


@contextlib.contextmanager
def spoiled(path: Path, make: Callable[[Path], None]) -> Iterator[None]:
    """``path`` replaced by what ``make`` creates there (a FIFO, a folder, a link, ...)
    inside the block; the original back after it."""
    keep = path.with_name(path.name + ".kept")
    had = path.exists() or path.is_symlink()
    if had:
        os.replace(path, keep)
    try:
        make(path)
        yield
    finally:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if had:
            os.replace(keep, path)


DEEP_LIST = b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"
DEEP_MAP = b"a: " + b"{a: " * 100_000 + b"1" + b"}" * 100_000 + b"\n"
DEEP_JSON_LIST = b"[" * 100_000 + b"]" * 100_000
DEEP_JSON_MAP = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000

# (what, how it is made, expect): a params.yaml that is not a small readable YAML file.
PARAMS_FILES: list[tuple[str, Callable[[Path], None], str]] = [
    ("a latin-1 byte (caf\\xe9)", _bytes(b"seed: 0\nmodel:\n  name: caf\xe9\n"), "refuse"),
    ("a UTF-16 file with its BOM", _bytes("seed: 0\n".encode("utf-16")), "refuse"),
    ("a NUL byte", _bytes(b"seed: 0\x00\n"), "refuse"),
    ("a directory", _dir, "refuse"),
    ("nested 100,000 deep (a list)", _bytes(DEEP_LIST), "refuse"),
    ("nested 100,000 deep (a mapping)", _bytes(DEEP_MAP), "refuse"),
    ("a symlink to /dev/zero", _link("/dev/zero"), "refuse"),
    ("a symlink to /dev/urandom", _link("/dev/urandom"), "refuse"),
    ("a FIFO (named pipe)", _fifo, "refuse"),
    ("a symlink loop", _loop, "refuse"),
    ("a dangling symlink", _link("/nonexistent/params.yaml"), "refuse"),
    ("a symlink to a directory", _link("/tmp"), "refuse"),
    ("8 MB of comments", _bytes(b"#" * 8 * 2**20), "refuse"),
    ("unreadable (chmod 000)", _noperm(b"seed: 0\n"), "any" if ROOT_USER else "refuse"),
]


def params_file_cases(base: Path, tmp: Path) -> None:
    work = copy_of(base, tmp / "r3a-params")
    params = work / "params.yaml"
    for what, make, expect in PARAMS_FILES:
        # The readers of params.yaml: every stage (prepare first), the verbs of the store.
        for where in ("stage prepare", "vmapcheck registry", "vmapcheck compare"):

            def call(make=make, where=where) -> Outcome:
                with spoiled(params, make):
                    if where == "stage prepare":
                        return stage(work, "prepare")
                    return cli(work, where.split()[1])

            record("params-file", f"params.yaml {what}; {where}", expect, call, names=("params",))
    # conf/ that Hydra cannot read, read by `vmapcheck params`.
    conf = work / "conf" / "config.yaml"
    model_conf = work / "conf" / "model" / "broken.yaml"
    text = conf.read_bytes()
    conf_cases: list[tuple[str, Path, Callable[[Path], None], tuple[str, ...]]] = [
        ("conf/config.yaml with an unclosed [", conf, _bytes(text + b"\nbad: [1, 2\n"), ()),
        ("conf/config.yaml with an unclosed {", conf, _bytes(text + b"\nbad: {a: 1\n"), ()),
        ("conf/config.yaml with a tab indent", conf, _bytes(text + b"\nbad:\n\t- 1\n"), ()),
        ("conf/config.yaml with a latin-1 byte", conf, _bytes(text + b"\n# caf\xe9\n"), ()),
        ("conf/config.yaml a FIFO", conf, _fifo, ()),
        ("conf/config.yaml a directory", conf, _dir, ()),
        ("conf/config.yaml a symlink loop", conf, _loop, ()),
        ("conf/config.yaml a symlink to /dev/zero", conf, _link("/dev/zero"), ()),
        ("conf/model/broken.yaml with an unclosed [ (model=broken)", model_conf,
         _bytes(b"name: broken\nhidden: [1,\n"), ("broken.yaml",)),
    ]  # fmt: skip
    for what, path, make, names in conf_cases:
        overrides = ("model=broken",) if "model=broken" in what else ()

        def call(path=path, make=make, overrides=overrides) -> Outcome:
            path.parent.mkdir(exist_ok=True)
            before = params.read_bytes()
            with spoiled(path, make):
                result = cli(work, "params", *overrides)
            if params.read_bytes() != before:
                result.err += " (params.yaml rewritten anyway)"
                result.code = 0
                params.write_bytes(before)
            return result

        record("params-file", f"vmapcheck params, {what}", "refuse", call,
               names=names or ("config.yaml",))  # fmt: skip


# --- 2. CLI values --------------------------------------------------------------------


def cli_value_cases(base: Path, tmp: Path) -> None:
    work = copy_of(base, tmp / "r3a-cli")
    deep = tmp / "r3a-json"
    deep.mkdir()
    (deep / "deep_list.json").write_bytes(DEEP_JSON_LIST)
    (deep / "deep_map.json").write_bytes(DEEP_JSON_MAP)
    (deep / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    (deep / "folder.json").mkdir()
    os.mkfifo(deep / "fifo.json")
    (deep / "zero.json").symlink_to("/dev/zero")
    (deep / "loop.json").symlink_to("loop.json")
    (deep / "a_file").write_text("x")
    baseline = str(work / "reports" / "bench_details.json")
    cases: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
        ("compare --width -5", ("compare", "--width", "-5"), "refuse", ("--width",)),
        ("compare --width 0", ("compare", "--width", "0"), "refuse", ("--width",)),
        ("compare --width abc", ("compare", "--width", "abc"), "refuse", ("--width",)),
        ("compare --width 1e3", ("compare", "--width", "1e3"), "refuse", ("--width",)),
        ("compare -n abc", ("compare", "-n", "abc"), "refuse", ("-n",)),
        ("compare -n -1", ("compare", "-n", "-1"), "refuse", ("-n",)),
        ("compare --width 40 (fine)", ("compare", "--width", "40"), "serve", ()),
        ("verdict-paired --batch-sizes abc",
         ("verdict-paired", "--baseline-project", str(work), "--batch-sizes", "abc"),
         "refuse", ("--batch-sizes",)),
        ("verdict-paired --batch-sizes 8,,16",
         ("verdict-paired", "--baseline-project", str(work), "--batch-sizes", "8,,16"),
         "refuse", ("--batch-sizes",)),
        ("verdict-paired --batch-sizes 0",
         ("verdict-paired", "--baseline-project", str(work), "--batch-sizes", "0"),
         "refuse", ("--batch-sizes",)),
        ("verdict-paired --batch-sizes -8",
         ("verdict-paired", "--baseline-project", str(work), "--batch-sizes=-8"),
         "refuse", ("--batch-sizes",)),
        ("verdict-paired --batch-sizes 1.5",
         ("verdict-paired", "--baseline-project", str(work), "--batch-sizes", "1.5"),
         "refuse", ("--batch-sizes",)),
        ("verdict-paired --factor nan",
         ("verdict-paired", "--baseline-project", str(work), "--factor", "nan"),
         "refuse", ("--factor",)),
        ("verdict-paired --factor inf",
         ("verdict-paired", "--baseline-project", str(work), "--factor", "inf"),
         "refuse", ("--factor",)),
        ("verdict-paired --alpha nan",
         ("verdict-paired", "--baseline-project", str(work), "--alpha", "nan"),
         "refuse", ("--alpha",)),
        ("verdict-paired --out /proc/x.json",
         ("verdict-paired", "--baseline-project", str(work), "--out", "/proc/x.json"),
         "refuse", ("/proc/x.json",)),
        ("diagnose --out /proc/x.json", ("diagnose", "--out", "/proc/x.json"), "refuse",
         ("/proc/x.json",)),
        ("diagnose --out reports (a directory)", ("diagnose", "--out", "reports"), "refuse",
         ("reports",)),
        ("diagnose --out /dev/null (a device)", ("diagnose", "--out", "/dev/null"), "refuse",
         ("/dev/null",)),
        ("diagnose --out under a file", ("diagnose", "--out", str(deep / "a_file" / "x.json")),
         "refuse", ("a_file",)),
        ("diagnose --out /sys/x.json", ("diagnose", "--out", "/sys/x.json"), "refuse",
         ("/sys/x.json",)),
        ("verdict --out /proc/y.json", ("verdict", "--baseline", baseline, "--out",
                                        "/proc/y.json"), "refuse", ("/proc/y.json",)),
        ("verdict --out reports (a directory)", ("verdict", "--baseline", baseline, "--out",
                                                 "reports"), "refuse", ("reports",)),
        ("verdict --out a FIFO", ("verdict", "--baseline", baseline, "--out",
                                  str(deep / "fifo.json")), "refuse", ("fifo.json",)),
        ("store --root /dev/null probe", ("store", "--root", "/dev/null", "probe"), "refuse",
         ("/dev/null",)),
        ("store --root params.yaml where", ("store", "--root", "params.yaml", "where"),
         "refuse", ("params.yaml",)),
        ("compare --root /dev/zero", ("compare", "--root", "/dev/zero"), "refuse",
         ("/dev/zero",)),
        ("plots --root a symlink loop", ("plots", "--root", str(deep / "loop.json")),
         "refuse", ("loop.json",)),
        ("gate --root a FIFO", ("gate", "--root", str(deep / "fifo.json")), "refuse",
         ("fifo.json",)),
        ("verdict --baseline a 100,000-deep JSON list",
         ("verdict", "--baseline", str(deep / "deep_list.json")), "refuse", ("deep_list.json",)),
        ("verdict --baseline a 100,000-deep JSON object",
         ("verdict", "--baseline", str(deep / "deep_map.json")), "refuse", ("deep_map.json",)),
        ("verdict --baseline a latin-1 JSON", ("verdict", "--baseline", str(deep / "latin1.json")),
         "refuse", ("latin1.json",)),
        ("verdict --baseline a directory", ("verdict", "--baseline", str(deep / "folder.json")),
         "refuse", ("folder.json",)),
        ("verdict --baseline a FIFO", ("verdict", "--baseline", str(deep / "fifo.json")),
         "refuse", ("fifo.json",)),
        ("verdict --baseline /dev/zero", ("verdict", "--baseline", str(deep / "zero.json")),
         "refuse", ("zero.json",)),
        ("verdict --baseline a symlink loop", ("verdict", "--baseline", str(deep / "loop.json")),
         "refuse", ("loop.json",)),
        ("verdict --current a 100,000-deep JSON", ("verdict", "--baseline", baseline,
                                                   "--current", str(deep / "deep_list.json")),
         "refuse", ("deep_list.json",)),
    ]  # fmt: skip
    for what, args, expect, names in cases:
        record("cli-value", f"vmapcheck {what}", expect, lambda a=args: cli(work, *a), names=names)


# --- 1. the boundary: OS errors at the verbs, a closed pipe --------------------------------


def boundary_cases(base: Path, tmp: Path) -> None:
    work = copy_of(base, tmp / "r3a-boundary")
    reports = work / "reports"
    # The report each verb reads.
    reads = {
        "summary": reports / "check_details.json",
        "diagnose": reports / "check_details.json",
        "gate": reports / "check.json",
        "gate ": reports / "bench_details.json",
        "verdict --baseline last-verified": reports / "bench_details.json",
    }
    # A report a verb reads, spoiled; the verbs that read it.
    spoils: list[tuple[str, Callable[[Path], None]]] = [
        ("a FIFO", _fifo),
        ("a directory", _dir),
        ("a symlink loop", _loop),
        ("a symlink to /dev/zero", _link("/dev/zero")),
        ("nested 100,000 deep", _bytes(DEEP_JSON_LIST)),
        ("a latin-1 byte", _bytes(b'{"passed": "caf\xe9"}')),
    ]
    for what, make in spoils:
        for verb, path in reads.items():

            def call(make=make, verb=verb, path=path) -> Outcome:
                with spoiled(path, make):
                    return cli(work, *verb.split())

            record("boundary", f"vmapcheck {verb.strip()}, reports/{path.name} {what}", "refuse",
                   call, names=(path.name,))  # fmt: skip
    # The store file spoiled (part b owns the store; here: the verbs stay one line).
    db = work / "mlflow.db"
    for what, make in (("a directory", _dir), ("a FIFO", _fifo)):
        for verb in ("registry", "compare"):

            def call(make=make, verb=verb) -> Outcome:
                with spoiled(db, make):
                    return cli(work, verb)

            record("boundary", f"vmapcheck {verb}, mlflow.db {what}", "refuse", call,
                   names=("mlflow.db",))  # fmt: skip
    # A stage's input array file spoiled: refused by name, never blocked on.
    train_npz = work / "data" / "prepared" / "train.npz"
    for what, make in spoils[:4]:

        def staged(make=make) -> Outcome:
            with spoiled(train_npz, make):
                return stage(work, "train")

        record("boundary", f"stage train, data/prepared/train.npz {what}", "refuse", staged,
               names=("train.npz",))  # fmt: skip
    # dvc.yaml spoiled: a stage reads it for its params record; it must not block there.
    for what, make in spoils[:4]:

        def declared(make=make) -> Outcome:
            with spoiled(work / "dvc.yaml", make):
                return stage(work, "prepare")

        record("boundary", f"stage prepare, dvc.yaml {what}", "any", declared)
    # A reader that goes away: quiet, as Unix tools end (no traceback, no error line).
    for verb in ("registry", "compare", "store where", "summary", "--help"):

        def piped(verb=verb) -> Outcome:
            done = proc(work, "bash", "-c",
                        f"{VMAPCHECK} {verb} | head -c 20 >/dev/null; echo ${{PIPESTATUS[0]}}",
                        timeout=300)  # fmt: skip
            status = int(done.out.strip().splitlines()[-1]) if done.out.strip() else -1
            # Quiet: exit 0 or 141 (SIGPIPE's), and nothing on stderr but MLflow's log.
            said = [ln for ln in done.err.splitlines() if ln and not ln.startswith("20")]
            ok = status in (0, 141) and not said
            return Outcome(0 if ok else 1, "", "\n".join(said) or f"exit {status}")

        record("boundary", f"vmapcheck {verb} | head -c 20", "serve", piped)


# --- 3. config values out of range -------------------------------------------------------

CONFIG_VALUES: list[tuple[str, str, str]] = [
    ("seed=18446744073709551616", "seed", "refuse"),
    ("seed=4294967296", "seed", "refuse"),
    ("seed=99999999999999999999999999999999", "seed", "refuse"),
    ("seed=4294967295", "seed", "any"),
    ("guard.replay.seed=18446744073709551616", "guard.replay.seed", "refuse"),
    ("train.learning_rate=1e-320", "train.learning_rate", "refuse"),
    ("train.learning_rate=5e-324", "train.learning_rate", "refuse"),
    ("train.learning_rate=1e-39", "train.learning_rate", "refuse"),
    ("train.learning_rate=1e-400", "train.learning_rate", "refuse"),  # YAML: 0.0
    ("train.learning_rate=1e-30", "train.learning_rate", "any"),
    ("tracking.experiment=" + "e" * 5000, "tracking.experiment", "refuse"),
    ("tracking.experiment=" + "e" * 501, "tracking.experiment", "refuse"),
    ("tracking.experiment=" + "e" * 500, "tracking.experiment", "any"),
    ("bench.warmup=1000000000", "bench.warmup", "refuse"),
    ("bench.warmup=101", "bench.warmup", "refuse"),
    ("bench.warmup=100", "bench.warmup", "any"),
    ("data.n_rows=1e400", "data.n_rows", "refuse"),
    ("data.n_rows=18446744073709551616", "data.n_rows", "refuse"),
    ("bench.repeats=18446744073709551616", "bench.repeats", "refuse"),
    ("bench.batch_sizes=[18446744073709551616]", "bench.batch_sizes", "refuse"),
    ("model.hidden=[18446744073709551616]", "model.hidden", "refuse"),
    ("train.steps=18446744073709551616", "train.steps", "refuse"),
]


def config_value_cases(base: Path, tmp: Path) -> None:
    """Composed as `dvc exp run -S` does; the first stage (prepare: it validates the
    whole config) runs. Refused there is refused at the door."""
    for override, name, expect in CONFIG_VALUES:
        root = tmp / f"r3a-config-{len(ROWS)}"
        root.mkdir()

        def call(root=root, override=override) -> Outcome:
            try:
                hb.compose(root, override)
            except Exception as exc:  # what `dvc exp run -S` shows: Hydra's own error
                return Outcome(1, "", f"composition refused: {type(exc).__name__}: {exc}")
            return stage(root, "prepare")

        shown = override if len(override) < 60 else override[:40] + f"... ({len(override)} ch)"
        record("config-value", f"-S {shown}; stage prepare", expect, call, names=(name,))
    # With experiment_per_model the name MLflow gets is <experiment>-<model.name>.
    root = tmp / f"r3a-config-{len(ROWS)}"
    root.mkdir()

    def per_model() -> Outcome:
        hb.compose(root, "tracking.experiment=" + "e" * 498, "tracking.experiment_per_model=true")
        return stage(root, "prepare")

    record("config-value", "-S tracking.experiment=<498 ch> experiment_per_model=true",
           "refuse", per_model, names=("tracking.experiment",))  # fmt: skip


# --- 4. data files ---------------------------------------------------------------------


def data_file_cases(base: Path, tmp: Path) -> None:
    example = (hb.ROOT / "data" / "raw" / "example.csv").read_bytes()
    spoils: list[tuple[str, Callable[[Path], None], str]] = [
        ("a symlink loop", _loop, "refuse"),
        ("a FIFO", _fifo, "refuse"),
        ("a directory", _dir, "refuse"),
        ("a symlink to /dev/zero", _link("/dev/zero"), "refuse"),
        ("a dangling symlink", _link("/nonexistent/table.csv"), "refuse"),
        ("unreadable (chmod 000)", _noperm(example), "any" if ROOT_USER else "refuse"),
        ("a symlink to a folder", _link("/tmp"), "refuse"),
    ]
    for what, make, expect in spoils:
        root = tmp / f"r3a-csv-{len(ROWS)}"
        root.mkdir()
        table = root / "table.csv"

        def call(root=root, table=table, make=make) -> Outcome:
            hb.compose(root, "data=csv", f"data.path={table}", tiny=tuple(hb.FAST_RUN))
            make(table)
            try:
                return stage(root, "prepare")
            finally:
                if not table.is_symlink() and table.is_file():
                    table.chmod(0o644)

        record("data-file", f"CSV {what}; stage prepare", expect, call, names=("table.csv",))


# --- 5. model factories ------------------------------------------------------------------

FACTORY_MODULE = """
import sys

import jax
import numpy as np

from vmapcheck.core.models import Model, mlp_forward_batch, mlp_forward_one, mlp_init


def _model(**kw):
    widths = [kw.pop("in_features"), *kw.pop("hidden"), kw.pop("out_features")]
    base = dict(name="userbad", in_features=widths[0], out_features=widths[-1],
                forward_one=mlp_forward_one, forward_batch=mlp_forward_batch,
                init=lambda key: mlp_init(key, widths))
    return Model(**{**base, **kw})


def init_raises(**kw):
    def init(key):
        raise ValueError("the init of this model is broken")
    return _model(init=init, **kw)


def init_recurses(**kw):
    def init(key):
        return init(key)
    return _model(init=init, **kw)


def init_exits(**kw):
    def init(key):
        sys.exit(0)
    return _model(init=init, **kw)


def init_key_error(**kw):
    def init(key):
        return {}["weights"]
    return _model(init=init, **kw)


def factory_exits_0(**kw):
    sys.exit(0)


def factory_exits_3(**kw):
    sys.exit(3)


def factory_raises(**kw):
    raise RuntimeError("the factory cannot build it")


def callback_forward(**kw):
    def one(params, x, tap=None):
        return jax.pure_callback(
            lambda a: np.asarray(a)[:2] * 2, jax.ShapeDtypeStruct((2,), x.dtype), x
        )
    return _model(forward_one=one, forward_batch=None, **kw)


def forward_raises(**kw):
    def one(params, x, tap=None):
        raise ZeroDivisionError("the forward divides by zero")
    return _model(forward_one=one, forward_batch=None, **kw)


def forward_exits(**kw):
    def one(params, x, tap=None):
        sys.exit(0)
    return _model(forward_one=one, forward_batch=None, **kw)
"""

# (factory, the stage that meets it, what the refusal must name)
FACTORIES: list[tuple[str, str, tuple[str, ...]]] = [
    ("init_raises", "train", ("userbad", "init")),
    ("init_recurses", "train", ()),
    ("init_exits", "train", ("sys.exit",)),
    ("init_key_error", "train", ("userbad", "init")),
    ("factory_exits_0", "train", ("factory", "sys.exit")),
    ("factory_exits_3", "train", ("factory", "sys.exit")),
    ("factory_raises", "train", ("factory",)),
    ("callback_forward", "train", ("vmap_method",)),
    ("forward_raises", "train", ("userbad",)),
    ("forward_exits", "train", ("sys.exit",)),
]


def factory_cases(base: Path, tmp: Path) -> None:
    work = copy_of(base, tmp / "r3a-factory")
    kept = (work / "params.yaml").read_text()
    for i, (factory, reader, names) in enumerate(FACTORIES):
        module = f"userbad_{i}"
        (work / f"{module}.py").write_text(FACTORY_MODULE)

        def call(module=module, factory=factory, reader=reader) -> Outcome:
            hb.compose(work, "model=flax_mlp", "model.name=userbad",
                       f"model.factory._target_={module}.{factory}")  # fmt: skip
            sys.path.insert(0, str(work))
            params = work / "data" / "params"
            before = sorted(params.rglob("*")) if params.exists() else []
            try:
                result = stage(work, reader)
            finally:
                sys.path.remove(str(work))
                (work / "params.yaml").write_text(kept)
            if result.code == 0 and result.raised is None:
                result.err += " (train exited 0)"
            elif params.exists() and sorted(params.rglob("*")) != before:
                result.code, result.err = 0, "params changed by a failed train: " + result.err
            return result

        record("factory", f"model factory {factory}; stage {reader}", "refuse", call, names=names)


# --- 6. the API: bounds and paths ---------------------------------------------------------


def api_cases(base: Path, tmp: Path) -> None:
    import jax
    import numpy as np

    from vmapcheck.core.models import Model, mlp_forward_batch, mlp_forward_one, mlp_init
    from vmapcheck.testing import check_batching

    widths = [8, 16, 2]
    model = Model(
        name="api_mlp",
        in_features=8,
        out_features=2,
        forward_one=mlp_forward_one,
        forward_batch=mlp_forward_batch,
        init=lambda key: mlp_init(key, widths),
    )
    params = model.init(jax.random.key(0))
    few = np.ones((4, 8), np.float32)

    def api(examples=few, **kw) -> Callable[[], Outcome]:
        def run() -> Outcome:
            def body() -> int:
                report = check_batching(model, params, examples, gradients=False, **kw)
                print(f"passed={report.passed}; {str(report).splitlines()[0]}")
                return 0 if report.passed else 1

            return hb.captured(body)

        return run

    def refused(call: Callable[[], Outcome]) -> Callable[[], Outcome]:
        """A VmapcheckError out of the API is its one-line refusal (exit 2 at a CLI)."""

        def run() -> Outcome:
            result = call()
            from vmapcheck.errors import VmapcheckError

            if isinstance(result.raised, VmapcheckError):
                exc = result.raised
                return Outcome(2, result.out, f"{type(exc).__name__}: {exc}")
            if result.code == 0 and "passed=True" in result.out:
                result.err = "PASSED: " + result.out
            return result

        return run

    cases: list[tuple[str, Callable[[], Outcome], str, tuple[str, ...]]] = [
        ("np.zeros((1_000_000, 8))", refused(api(np.zeros((1_000_000, 8), np.float32))),
         "refuse", ("max_rows", "1,000,000")),
        ("np.zeros((10_001, 8))", refused(api(np.zeros((10_001, 8), np.float32))), "refuse",
         ("max_rows",)),
        ("np.zeros((200_000, 8)), max_rows=1000",
         refused(api(np.zeros((200_000, 8), np.float32), max_rows=1000)), "refuse",
         ("max_rows",)),
        ("max_rows=0", refused(api(max_rows=0)), "refuse", ("max_rows",)),
        ("max_rows='many'", refused(api(max_rows="many")), "refuse", ("max_rows",)),
        ("paths=['vmap_jit']", refused(api(paths=["vmap_jit"])), "refuse", ("paths",)),
        ("paths='vmap_jit' (a bare string)", refused(api(paths="vmap_jit")), "refuse",
         ("paths",)),
        ("paths=('vmap_jit', 'vmap_jit')", refused(api(paths=("vmap_jit", "vmap_jit"))),
         "refuse", ("paths",)),
        ("paths=[]", refused(api(paths=[])), "refuse", ("paths",)),
        ("paths='loop_eager,vmap_jit' (one string)", refused(api(paths="loop_eager,vmap_jit")),
         "refuse", ("paths",)),
        ("paths=['loop_eager', 'vmap_jit'] (fine)",
         refused(api(paths=["loop_eager", "vmap_jit"])), "serve", ()),
        ("examples a 100,000-deep nested list", refused(api(_deep_list(100_000))), "refuse",
         ("examples",)),
        ("seed=2**32", refused(api(seed=2**32)), "refuse", ("seed",)),
        ("seed=18446744073709551616", refused(api(seed=2**64)), "refuse", ("seed",)),
        ("seed=-1", refused(api(seed=-1)), "refuse", ("seed",)),
        ("examples with 0 rows", refused(api(np.zeros((0, 8), np.float32))), "refuse",
         ("examples",)),
    ]  # fmt: skip
    for what, call, expect, names in cases:
        record("api", f"check_batching({what})", expect, call, names=names)


def _deep_list(depth: int) -> list:
    deep: list = []
    for _ in range(depth):
        deep = [deep]
    return deep


def cases(base: Path, tmp: Path) -> None:
    """Every kind of part a of issue 45 (the module docstring), on copies of ``base``."""
    for group in (
        boundary_cases,
        cli_value_cases,
        params_file_cases,
        config_value_cases,
        data_file_cases,
        factory_cases,
        api_cases,
    ):
        group(base, tmp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the battery's --base folder")
    parser.add_argument("--only", default="", help="comma-separated functions (params_file,...)")
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_platforms", "cpu")
    base = args.base / "base"
    if not (base / "reports" / "track.json").exists():
        print("battery: make the base first (hardening_battery.py --base)", file=sys.stderr)
        return 2
    chosen = [name for name in args.only.split(",") if name]
    with tempfile.TemporaryDirectory(prefix="round3a-") as tmp_name:
        tmp = Path(tmp_name)
        if chosen:
            for name in chosen:
                globals()[f"{name}_cases"](base, tmp)
        else:
            cases(base, tmp)
    counts: dict[str, dict[str, int]] = {}
    for row in ROWS:
        counts.setdefault(row.group, {}).setdefault(row.outcome, 0)
        counts[row.group][row.outcome] += 1
    print(json.dumps(counts, indent=1))
    if args.out:
        args.out.write_text(json.dumps([row.__dict__ for row in ROWS], indent=1))
    return 0 if all(r.outcome in ("clean", "late") for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
