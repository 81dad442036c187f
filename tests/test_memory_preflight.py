"""Memory pre-flight (issue 34, case 6): work that cannot fit is refused at the stage's
start with both figures, not killed by the system minutes later."""

from __future__ import annotations

import pytest

from tests.helpers.config import compose_config
from tests.helpers.inprocess import run_stage, write_params
from vmapcheck.core.memory import available_bytes, check_train_memory, params_bytes
from vmapcheck.core.models import build_model
from vmapcheck.errors import ConfigError, ResourceError


def test_a_model_too_big_for_this_machine_is_refused_from_its_shapes():
    config = compose_config("model.hidden=[200000000]")
    model = build_model(config.model)
    count, size = params_bytes(model)  # shapes only: nothing of it is allocated
    assert count > 1.6e9 and size > 6e9
    if 5 * size <= available_bytes():
        pytest.skip("this machine could hold it")
    with pytest.raises(ResourceError) as info:
        check_train_memory(model, "model.hidden=[200000000]")
    message = str(info.value)
    assert "training model 'mlp'" in message and "parameters" in message
    assert "GiB of memory, and" in message and "GiB is available" in message
    assert "model.hidden=[200000000]" in message


def test_the_shipped_model_passes_the_preflight():
    check_train_memory(build_model(compose_config().model), "defaults")


def test_prepare_refuses_a_table_it_cannot_hold_before_making_a_row(tmp_path, capsys):
    write_params(tmp_path, "data.n_rows=10000000000")
    assert run_stage(tmp_path, "prepare") == 2
    err = capsys.readouterr().err
    assert "prepare: error: generating a table of 10,000,000,000 rows" in err
    assert "data.n_rows=10000000000" in err and "GiB is available" in err
    assert not (tmp_path / "data").exists()


def test_bench_repeats_are_bounded():
    with pytest.raises(ConfigError, match=r"bench\.repeats: Input should be less than or equal"):
        compose_config("bench.repeats=1000000000")
