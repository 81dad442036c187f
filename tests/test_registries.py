"""One house per concept: PATHS, CASE_KINDS, the comparison rule and the Layout.

Every consumer asks the registries; these tests pin the registries' own promises and
that no other module names a path, rebuilds the tolerance rule or a stage file path.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import ROOT, compose_config
from vmapcheck.config import ToleranceConfig
from vmapcheck.core.cases import CASE_KINDS, kind_of
from vmapcheck.core.compare import compare, looser, within
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import (
    PATHS,
    SPEEDUPS,
    build,
    get,
    not_provided,
    path_names,
    plain_path,
    split_output_key,
    twin,
)
from vmapcheck.errors import ArtifactError
from vmapcheck.layout import Layout

SRC = ROOT / "src" / "vmapcheck"


def _sources(*exclude: str) -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for p in SRC.rglob("*.py")
        if str(p.relative_to(ROOT)) not in exclude
    }


def test_every_batched_path_agrees_with_the_plain_path_on_the_mlp():
    model = build_model(compose_config("model=mlp").model)
    params = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, model.in_features), jnp.float32)
    built = build(model, jnp.float32, "batch")
    assert set(built) == set(path_names("batch"))
    want = np.asarray(built[plain_path()](params, x))
    for name, fn in built.items():
        got = np.asarray(fn(params, x))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_each_entry_is_consistent():
    for name, path in PATHS.items():
        assert path.name == name
        assert path.takes in ("batch", "vector")
        assert path.about
        if path.same_program_as is not None:
            assert path.same_program_as in PATHS
        if not path.distributed and not path.no_eager:  # one-device forms: eager and jit
            other = twin(path)
            assert other is not None and other.form == path.form and other.jit != path.jit
    assert sum(p.plain for p in PATHS.values()) == 1
    for speedup in SPEEDUPS:
        assert speedup.slower in PATHS and speedup.faster in PATHS


def test_an_unknown_path_or_kind_is_an_error_never_a_default():
    with pytest.raises(KeyError, match="unknown forward path 'loop_fast'"):
        get("loop_fast")
    with pytest.raises(KeyError, match="unknown forward path"):
        split_output_key("standard.nope_jit")
    with pytest.raises(ArtifactError, match=r"case 'odd' has kind 'sideways'; expected one of"):
        kind_of({"kind": "sideways"}, "odd")


def test_case_kinds_say_which_paths_they_run():
    assert CASE_KINDS["batch"].paths() == path_names("batch")
    assert CASE_KINDS["vector"].paths() == path_names("vector")
    invalid = CASE_KINDS["invalid"]
    assert invalid.paths({"runs_on": "vector"}) == path_names("vector")
    assert invalid.paths({"runs_on": "batch"}) == path_names("batch")
    assert not invalid.valid and not invalid.oracle and not invalid.in_reference
    for kind in CASE_KINDS.values():
        assert kind.judged in ("agreement", "refusal")
        assert kind.valid == (kind.judged == "agreement")


def test_a_model_without_a_hand_batched_form_lacks_exactly_the_paths_that_need_it():
    from vmapcheck.core.models import Model

    base = build_model(compose_config("model=mlp").model)
    model = Model(
        name="no_direct",
        init=base.init,
        forward_one=base.forward_one,
        in_features=base.in_features,
        out_features=base.out_features,
    )
    missing = not_provided(model)
    assert set(missing) == {p.name for p in PATHS.values() if p.missing}
    assert all("forward_batch" in reason for reason in missing.values())
    assert set(build(model, jnp.float32, "batch")) == set(path_names("batch")) - set(missing)


def test_the_tolerance_rule_is_symmetric_and_scaled_by_the_larger_magnitude():
    tol = ToleranceConfig(rtol=1e-3, atol=0.0)
    assert within(1.0, 1.0009, tol) and within(1.0009, 1.0, tol)
    assert not within(1.0, 1.002, tol)
    a, b = np.array([1.0, 2.0]), np.array([1.0009, 2.001])
    assert compare(a, b, tol)["passed"] == compare(b, a, tol)["passed"] is True
    assert looser({"rtol": 1e-5, "atol": 1e-3}, {"rtol": 1e-4, "atol": 1e-6}) == ToleranceConfig(
        rtol=1e-4, atol=1e-3
    )


def test_no_module_outside_the_registry_names_or_parses_a_path():
    literal = re.compile(r"\"({})\"".format("|".join(PATHS)))
    for name, text in _sources("src/vmapcheck/core/paths.py").items():
        assert 'rsplit("_"' not in text, name
        assert not literal.search(text), f"{name} names a path: {literal.search(text)[0]}"


def test_only_the_comparison_module_writes_the_tolerance_rule():
    rule = re.compile(r"atol\s*\+\s*\S*rtol\s*\*")
    for name, text in _sources("src/vmapcheck/core/compare.py").items():
        code = "\n".join(
            line for line in text.splitlines() if not line.lstrip().startswith(("#", 'f"', '"'))
        )
        assert not rule.search(code), name


def test_only_the_layout_builds_the_paths_stages_exchange():
    for name, text in _sources("src/vmapcheck/layout.py").items():
        assert '/ "data"' not in text and '/ "reports"' not in text, name


def test_the_layout_names_what_dvc_yaml_declares():
    import yaml

    declared = set()
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in stages.values():
        for out in [*stage.get("outs", []), *stage.get("metrics", [])]:
            declared.add(out if isinstance(out, str) else next(iter(out)))
    layout = Layout(ROOT)
    named = {
        str(getattr(layout, attr).relative_to(ROOT))
        for attr in dir(Layout)
        if isinstance(getattr(Layout, attr), property)
    }
    # The per-stage wall-time records, one per stage: Layout.stage_time(stage).
    named |= {str(layout.stage_time(stage).relative_to(ROOT)) for stage in stages}
    # The code stage's records, one per stage it records: Layout.code_record(stage).
    named |= {str(layout.code_record(stage).relative_to(ROOT)) for stage in stages}
    assert declared <= named, sorted(declared - named)


def test_the_public_api_resolves_lazily():
    import subprocess
    import sys

    import vmapcheck

    for name in vmapcheck.__all__:
        assert getattr(vmapcheck, name) is not None, name
    assert vmapcheck.PATHS is PATHS and vmapcheck.CASE_KINDS is CASE_KINDS
    # Importing the package alone loads no JAX (the CLI's --help stays fast).
    code = "import sys, vmapcheck; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
