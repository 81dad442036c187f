"""The one boundary every entry point shows errors through (vmapcheck.errors.user_error):
the CLI's main, the stage runner and the Python API (issue 45, part a)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.config import compose_config
from vmapcheck import cli
from vmapcheck.errors import (
    BROKEN_PIPE,
    DEBUG_ENV,
    INTERNAL,
    REFUSED,
    ConfigError,
    api_error,
    describe,
    model_code_error,
    user_error,
)
from vmapcheck.io import file_kind
from vmapcheck.pipeline.stage import run_stage

SCRIPT = Path(sys.executable).with_name("vmapcheck")


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)


def test_an_os_error_is_one_line_naming_the_file_what_was_expected_and_found():
    loop = OSError(errno.ELOOP, "Too many levels of symbolic links", "/p/params.yaml")
    assert user_error(loop) == (
        REFUSED,
        "/p/params.yaml: expected a file, found a symbolic link loop (Too many levels of "
        "symbolic links)",
    )
    denied = PermissionError(errno.EACCES, "Permission denied", "data/t.csv")
    assert user_error(denied)[1].startswith("data/t.csv: expected a file this user may read")


def test_decode_recursion_overflow_and_memory_errors_are_refusals_in_one_line():
    try:
        b"name: caf\xe9\n".decode("utf-8")
    except UnicodeDecodeError as exc:
        assert describe(exc) == (
            "expected UTF-8 text, found the byte 0xe9 at offset 9 (invalid continuation byte)"
        )
    for exc, said in (
        (RecursionError("deep"), "nested too deeply for Python to read"),
        (OverflowError("int too large"), "expected a number in range, found one too large"),
        (MemoryError(), "ran out of memory (MemoryError)"),
    ):
        code, line = user_error(exc)
        assert code == REFUSED and said in line and "\n" not in line


def test_any_other_error_is_an_internal_error_in_one_line_and_debug_shows_it(monkeypatch):
    code, line = user_error(KeyError("x"))
    assert code == INTERNAL
    assert line.startswith("internal error: KeyError: 'x' (a bug in vmapcheck")
    assert f"{DEBUG_ENV}=1 shows the traceback" in line
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert user_error(KeyError("x")) is None  # the caller re-raises: the traceback
    assert api_error(OSError(errno.ENOENT, "gone", "f")) is None


def _users_init(key):
    raise ValueError("broken init")


def test_an_error_raised_in_the_models_code_names_the_model_and_where():
    try:
        _users_init(0)
    except ValueError as exc:
        line = model_code_error(exc, "mine")
    assert line is not None
    assert line.startswith("model 'mine': its code raised ValueError: broken init (at ")
    assert "test_errors.py:" in line and "in _users_init" in line
    # An error of vmapcheck's own code is no model's.
    try:
        compose_config("seed=-1")
    except ConfigError as exc:
        assert model_code_error(exc) is None


def test_a_stage_refuses_a_sys_exit_of_user_code_and_names_model_errors(tmp_path, capsys):
    (tmp_path / "params.yaml").write_text(
        __import__("yaml").safe_dump(compose_config().model_dump(mode="json"))
    )

    def exits(config, layout):
        sys.exit(0)

    assert run_stage("train", exits, tmp_path) == REFUSED
    assert "train: error: the stage's code called sys.exit(0)" in capsys.readouterr().err

    def raises(config, layout):
        _users_init(0)

    assert run_stage("train", raises, tmp_path) == REFUSED
    err = capsys.readouterr().err
    assert err.startswith("train: error: model 'mlp': its code raised ValueError: broken init")
    assert len(err.strip().splitlines()) == 1

    def bug(config, layout):
        return file_kind(None)  # raises inside vmapcheck's own code: a bug of vmapcheck's

    assert run_stage("train", bug, tmp_path) == INTERNAL
    assert "train: error: internal error: TypeError" in capsys.readouterr().err


def test_params_yaml_that_is_a_fifo_is_refused_by_a_stage_without_blocking(tmp_path, capsys):
    os.mkfifo(tmp_path / "params.yaml")
    assert run_stage("prepare", lambda config, layout: 0, tmp_path) == REFUSED
    err = capsys.readouterr().err
    assert "params.yaml: expected a params file (a regular file), found a FIFO" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["compare", "--width", "-5"], "argument --width: expected a width of at least 1"),
        (["compare", "-n", "x"], "argument -n: expected a count of runs of at least 0"),
        (
            ["verdict-paired", "--baseline-project", ".", "--batch-sizes", "abc"],
            "argument --batch-sizes: expected comma-separated batch sizes",
        ),
        (
            ["verdict-paired", "--baseline-project", ".", "--factor", "nan"],
            "argument --factor: expected a factor above 1",
        ),
        (["diagnose", "--out", "/proc/x.json"], "argument --out: '/proc/x.json': expected a"),
        (["store", "--root", "/dev/null", "probe"], "expected the project's folder, found a"),
    ],
)
def test_bad_flag_values_are_refused_before_any_work(args, said, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_an_out_path_that_is_a_directory_is_refused_at_the_door(tmp_path, capsys):
    (tmp_path / "reports").mkdir()
    with pytest.raises(SystemExit):
        cli.main(["verdict", "--baseline", "x", "--out", str(tmp_path / "reports")])
    assert "expected a file path, found a directory" in capsys.readouterr().err


def test_a_command_whose_reader_went_away_ends_quietly(tmp_path):
    """`vmapcheck ... | head`: no traceback, no error line, the status of SIGPIPE."""
    (tmp_path / "conf").symlink_to(Path(__file__).resolve().parents[1] / "conf")
    with subprocess.Popen(
        [str(SCRIPT), "params"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as done:
        assert done.stdout is not None and done.stderr is not None
        done.stdout.close()  # the reader goes away before the command writes
        err = done.stderr.read().decode()
        assert done.wait(timeout=120) == BROKEN_PIPE, err
    assert err == ""


def test_debug_shows_the_traceback_behind_the_one_line(tmp_path):
    plain = subprocess.run(
        [str(SCRIPT), "gate"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == REFUSED and "Traceback" not in plain.stderr
    for args in (["--debug", "gate"], ["gate", "--debug"]):  # before or after the command
        debug = subprocess.run(
            [str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert "Traceback (most recent call last)" in debug.stderr
