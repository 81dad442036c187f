"""The one command line: ``vmapcheck <command>`` (the installed console script and
``python -m vmapcheck``), its usage errors, and each command reaching its library function."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S
from vmapcheck import cli
from vmapcheck.cli import benchmark, checks, common, parser, project, tracking

COMMANDS = [
    "init",
    "diagnose",
    "reference",
    "verdict",
    "verdict-paired",
    "compare",
    "registry",
    "rollback",
    "promote",
    "ui",
    "params",
    "plots",
    "summary",
    "gate",
    "store",
]
# The console script pip installed next to this interpreter (pip install -e . makes it).
SCRIPT = Path(sys.executable).with_name("vmapcheck")


def _env() -> dict[str, str]:
    """This environment without a store or DVC root that would redirect the command."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "DVC_ROOT")}
    return env | {"COLUMNS": "100"}


def vmapcheck(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.is_file(), f"{SCRIPT}: not installed; run `pip install -e .` (make setup)"
    return subprocess.run(
        [str(SCRIPT), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=HANG_S
    )


def test_help_lists_every_command_with_one_line_each():
    result = vmapcheck("--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "usage: vmapcheck [-h] [--version] [--debug] <command> ..."
    for name in COMMANDS:
        [line] = [line for line in lines if line.startswith(f"  {name} ")]
        assert line.split(maxsplit=1)[1].strip() == cli.COMMANDS[name]
    assert list(cli.COMMANDS) == COMMANDS
    # python -m vmapcheck is the same command line.
    module = subprocess.run(
        [sys.executable, "-m", "vmapcheck", "--help"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert module.returncode == 0 and module.stdout == result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus"], "vmapcheck: error: argument <command>: invalid choice: 'bogus'"),
        (["store", "where", "--bogus"], "vmapcheck store: error: unknown option --bogus"),
        (["store", "nowhere"], "vmapcheck store: error: argument verb: invalid choice"),
        (["verdict"], "vmapcheck verdict: error: the following arguments are required"),
        ([], "vmapcheck: error: the following arguments are required: <command>"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args, message):
    result = vmapcheck(*args)
    assert result.returncode == 2
    assert result.stdout == "" and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(message), result.stderr
    assert result.stderr.splitlines()[-1] == errors[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # A mistyped command, verb or choice: argparse's refusal, and the closest name.
        (
            ["comapre"],
            "vmapcheck: error: argument <command>: invalid choice: 'comapre' "
            "(did you mean compare?)",
        ),
        (
            ["store", "wehre"],
            "vmapcheck store: error: argument verb: invalid choice: 'wehre' (did you mean where?)",
        ),
        (
            ["reference", "shwo"],
            "vmapcheck reference: error: argument verb: invalid choice: "
            "'shwo' (did you mean show?)",
        ),
        # An unknown option is named as such, before the missing command or flag it hides.
        (["--verison"], "vmapcheck: error: unknown option --verison (did you mean --version?)"),
        (
            ["init", "--modle", "mlp"],
            "vmapcheck init: error: unknown option --modle (did you mean --model?)",
        ),
        (
            ["compare", "-n", "5", "--fitler", "x"],
            "vmapcheck compare: error: unknown option --fitler (did you mean --filter?)",
        ),
        (
            ["verdict", "--baseline=x", "--bogus"],
            "vmapcheck verdict: error: unknown option --bogus\n",
        ),
    ],
)
def test_a_typo_is_refused_with_the_closest_name(args, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err + "\n"
    if message.endswith("\n"):  # nothing close: no guess
        assert "did you mean" not in err


@pytest.mark.parametrize(
    "args",
    [
        # What argparse itself accepts is not an unknown option: an abbreviation, a short
        # option with its value attached, --key=value, a negative number, after --.
        ["compare", "--fil", "x", "-n5", "--width=80"],
        ["verdict", "--baseline", "x", "--factor", "-1e-3"],
        ["params", "--", "--not-an-option"],
        ["reference", "make", "--reason=--why"],
        # An abbreviation's value is skipped as the full option's is (argparse judges it).
        ["compare", "--fil", "-x", "-n", "5"],
    ],
)
def test_options_argparse_takes_are_known(args):
    assert parser.unknown_option(cli.build_parser(), args) is None


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"vmapcheck {cli.__version__}\n"


def test_store_where_in_a_copy_of_the_project_names_its_store(tmp_path):
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    result = vmapcheck("store", "where", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"store: sqlite:///{tmp_path.resolve()}/mlflow.db" in result.stdout.splitlines()
    assert f"{(tmp_path / 'mlartifacts').resolve().as_uri()}" in result.stdout
    assert not (tmp_path / "mlflow.db").exists()  # where only says where


def test_a_missing_params_yaml_is_an_error_not_a_traceback(tmp_path):
    result = vmapcheck("store", "where", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("store: error: ") and "params.yaml" in result.stderr


def test_help_loads_neither_jax_nor_mlflow():
    code = (
        "import sys, vmapcheck.cli as c; c.build_parser().format_help(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'jax', 'mlflow', 'hydra', 'numpy', 'pydantic', 'scipy'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_help_constants_are_the_modules_own():
    from vmapcheck.bench.verdict.paired import DEFAULT_PROCESSES, DEFAULT_ROUNDS, DEFAULT_SAMPLES
    from vmapcheck.tracking.baselines import LAST_VERIFIED
    from vmapcheck.tracking.runs import DEFAULT_N

    assert benchmark.LAST_VERIFIED == LAST_VERIFIED and tracking.COMPARE_DEFAULT_N == DEFAULT_N
    assert (benchmark.PAIRED_ROUNDS, benchmark.PAIRED_SAMPLES, benchmark.PAIRED_PROCESSES) == (
        DEFAULT_ROUNDS,
        DEFAULT_SAMPLES,
        DEFAULT_PROCESSES,
    )


def test_every_command_is_in_exactly_one_group():
    """cli merges the groups' VERBS: a command in two groups would silently take the last
    one's flags, one in none would have no parser."""
    grouped = [name for group in (project, checks, benchmark, tracking) for name in group.VERBS]
    assert sorted(grouped) == sorted(cli.COMMANDS)
    assert cli.VERBS.keys() == cli.COMMANDS.keys()


@pytest.mark.parametrize(
    ("parse", "text", "refusal"),
    [
        (common.tcp_port, "80", "expected a port number 1024-65535, found 80"),
        (common.tcp_port, "http", "expected a port number 1024-65535, found 'http'"),
        (common.whole_number("a width of at least 1 column", 1), "0", "found '0'"),
        (common.number_in("a factor above 1", 1.0, 10.0), "nan", "a factor above 1, found"),
        (common.batch_sizes, "8,0", "batch sizes of at least 1 row (8,64), found '8,0'"),
        (common.folder, "/no/such/folder", "expected the project's folder, found nothing there"),
    ],
)
def test_a_flag_value_is_refused_naming_what_was_expected_and_found(parse, text, refusal):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert refusal in str(refused.value)


def test_the_flag_types_return_the_value():
    assert common.tcp_port("5000") == 5000 and common.batch_sizes("8,64") == [8, 64]
    assert common.number_in("a level", 0, 1)("0.05") == 0.05
    assert common.folder(str(ROOT)) == ROOT


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: vmapcheck {name}")


def test_diagnose_writes_under_the_project_root_by_default(tmp_path, monkeypatch):
    """``diagnose`` calls vmapcheck.check.diagnosis.on_demand(layout, out)."""
    calls = []

    def on_demand(layout, out):
        calls.append((layout.root, out))
        return 1

    fake = types.ModuleType("vmapcheck.check.diagnosis")
    fake.on_demand = on_demand
    monkeypatch.setitem(sys.modules, "vmapcheck.check.diagnosis", fake)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["diagnose"]) == 1
    assert cli.main(["diagnose", "--out", "elsewhere/d.json"]) == 1
    assert calls == [
        (tmp_path, tmp_path / "reports" / "diagnosis-on-demand.json"),
        (tmp_path, tmp_path / "elsewhere" / "d.json"),
    ]


@pytest.mark.parametrize("port", ["99999", "80", "abc"])
def test_ui_refuses_a_port_it_cannot_open(port, capsys):
    """`vmapcheck ui --port 99999` printed URLs, then an OverflowError, and exited 0."""
    with pytest.raises(SystemExit) as info:
        cli.main(["ui", "--port", port])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --port: expected a port number 1024-65535, found" in err and port in err
