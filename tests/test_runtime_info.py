"""What a run records of its device (vmapcheck.core.runtime.RuntimeInfo: memory, platform
version, accelerator runtime packages), how reports without those keys are still read,
and that the CPU stages' processes start no backend but CPU. JAX starts once per
process: what configures it runs in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import jax
import pytest

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S
from vmapcheck.bench.timing.machine import conditions
from vmapcheck.core.runtime import (
    accelerator_runtime,
    accelerator_runtime_text,
    device_memory_gib,
    device_text,
    platform_version,
    runtime_tags,
    versions_text,
)
from vmapcheck.report.check_sections import environment, verdict
from vmapcheck.report.summary import verdict_line

NEW_KEYS = ("device_memory_gib", "platform_version", "accelerator_runtime")

# A TPU run's runtime as configure_jax records it (TPU v5e, libtpu from jax[tpu]).
TPU_RUNTIME = {
    "backend": "tpu",
    "platform": "tpu",
    "device_kind": "TPU v5 lite",
    "device_count": 1,
    "device_memory_gib": 15.75,
    "jax_version": "0.10.2",
    "jaxlib_version": "0.10.2",
    "platform_version": "PJRT C API; TFRT TPU v5 lite; Built on Jun 17 2026",
    "accelerator_runtime": {"libtpu": "0.0.42.1"},
    "python_version": "3.12.1",
    "os_platform": "Linux",
    "enable_x64": False,
    "matmul_precision": "default",
    "xla_flags": "",
}


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def _stored_runtimes() -> dict[str, dict[str, Any]]:
    """The runtime of every stored reference (data/reference/<model>/meta.json)."""
    return {
        meta.parent.name: json.loads(meta.read_text())["runtime"]
        for meta in sorted((ROOT / "data" / "reference").glob("*/meta.json"))
    }


def _check(runtime: dict[str, Any]) -> dict[str, Any]:
    """The keys of check_details.json that the verdict and the environment table read."""
    return {
        "passed": True,
        "failures": [],
        "dtype": "float32",
        "tolerance": {"rtol": 1e-5, "atol": 1e-6},
        "cross_run_tolerance": {"rtol": 1e-4, "atol": 1e-5},
        "runtime": runtime,
        "not_provided": {},
        "sharded": None,
    }


# --- RuntimeInfo on CPU --------------------------------------------------------------


def test_configure_jax_records_the_device_memory_platform_version_and_runtime_on_cpu():
    result = _python(
        """
        import json
        from tests.helpers.config import compose_config
        from vmapcheck.core.runtime import configure_jax
        config = compose_config("backend=cpu")
        print(json.dumps(configure_jax(config.backend, config.precision).as_dict()))
        """,
        JAX_PLATFORMS="",
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.splitlines()[-1])
    assert info["platform"] == "cpu"
    memory = info["device_memory_gib"]
    assert memory is None or (isinstance(memory, float) and memory > 0)
    assert isinstance(info["platform_version"], str) and info["platform_version"]
    assert "\n" not in info["platform_version"]
    assert info["accelerator_runtime"] == {}


def test_the_cpu_device_reports_no_memory_a_version_and_no_accelerator_runtime():
    device = jax.devices("cpu")[0]
    assert device_memory_gib(device) is None or device_memory_gib(device) > 0
    assert platform_version(device)
    assert accelerator_runtime("cpu") == {}


def test_accelerator_runtime_lists_only_the_packages_of_the_platform():
    # None of these is installed on a CPU machine; where one is, only its own kind.
    assert all(name.startswith("libtpu") for name in accelerator_runtime("tpu"))
    for platform in ("cuda", "rocm", "gpu"):
        assert all(
            name.startswith(("jax-cuda", "jax-rocm", "nvidia-"))
            for name in accelerator_runtime(platform)
        )
    assert accelerator_runtime("no-such-platform") == {}


class _Device:
    """A device as JAX's PJRT devices answer these calls: memory_stats(), client."""

    platform = "tpu"

    def __init__(self, stats: Any = None, version: str = "cpu") -> None:
        self.stats = stats
        self.client = type("Client", (), {"platform_version": version})()

    def memory_stats(self) -> Any:
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        ({"bytes_limit": 16909336064, "bytes_in_use": 26624}, 15.75),
        ({"bytes_in_use": 1}, None),
        (None, None),
        (NotImplementedError("no memory stats"), None),
    ],
    ids=["tpu_v5e", "no_limit", "none", "raises"],
)
def test_device_memory_is_the_allocators_limit_or_none(stats, expected):
    assert device_memory_gib(_Device(stats)) == expected


def test_a_multi_line_platform_version_is_joined_and_a_long_one_keeps_its_first_line():
    libtpu = "PJRT C API\nTFRT TPU v5 lite\nBuilt on Jun 17 2026 11:08:48 (1781719728) cl/9337"
    assert platform_version(_Device(version=libtpu)) == (
        "PJRT C API; TFRT TPU v5 lite; Built on Jun 17 2026 11:08:48 (1781719728) cl/9337"
    )
    assert platform_version(_Device(version="cuda 12080")) == "cuda 12080"
    long = "first line\n" + "x" * 300
    assert platform_version(_Device(version=long)) == "first line"


def test_the_bench_conditions_carry_the_same_device_figures():
    machine = conditions()
    device = jax.devices()[0]
    assert machine["accelerator_runtime"] == versions_text(accelerator_runtime(device.platform))
    assert all(not isinstance(value, dict) for value in machine.values())  # table cells
    assert machine["platform_version"] == platform_version(device)
    assert "device_memory_gib" in machine


# --- where the figures appear, and reports without them ------------------------------


def test_a_tpu_run_names_its_memory_and_libtpu_in_the_verdict_tags_and_table():
    check = _check(TPU_RUNTIME)
    line = verdict_line(check)
    assert " on tpu (TPU v5 lite, 15.75 GiB, libtpu 0.0.42.1), float32, " in line
    assert "(TPU v5 lite, 15.75 GiB, libtpu 0.0.42.1)" in verdict(check, {})["headline"]
    assert runtime_tags(TPU_RUNTIME) == {
        "device_count": "1",
        "device_memory_gib": "15.75",
        "platform_version": "PJRT C API; TFRT TPU v5 lite; Built on Jun 17 2026",
        "libtpu_version": "0.0.42.1",
    }
    rows = str(environment(check, {}, None, {}, {}))
    for shown in ("device memory (GiB)", "15.75", "libtpu 0.0.42.1", "TFRT TPU v5 lite"):
        assert shown in rows


def test_a_gpu_runs_verdict_names_the_plugin_and_its_tags_every_package():
    runtime = {
        **TPU_RUNTIME,
        "backend": "gpu",
        "device_kind": "NVIDIA H200",
        "device_memory_gib": 139.8,
        "accelerator_runtime": {
            "jax-cuda12-pjrt": "0.11.2",
            "jax-cuda12-plugin": "0.11.2",
            "nvidia-cudnn-cu12": "9.8.0.87",
        },
    }
    assert device_text(runtime) == "NVIDIA H200, 139.8 GiB, jax-cuda12-plugin 0.11.2"
    assert accelerator_runtime_text(runtime) == (
        "jax-cuda12-pjrt 0.11.2, jax-cuda12-plugin 0.11.2, nvidia-cudnn-cu12 9.8.0.87"
    )
    tags = runtime_tags(runtime)
    assert tags["jax_cuda12_plugin_version"] == "0.11.2"
    assert tags["nvidia_cudnn_cu12_version"] == "9.8.0.87"


def test_a_cpu_run_adds_nothing_to_the_verdict_line():
    runtime = {**TPU_RUNTIME, "backend": "cpu", "device_kind": "cpu"}
    runtime |= {"device_memory_gib": None, "platform_version": "cpu", "accelerator_runtime": {}}
    assert " on cpu (cpu), float32, rtol=1e-05 atol=1e-06, jax " in verdict_line(_check(runtime))
    assert "device_memory_gib" not in runtime_tags(runtime)
    rows = str(environment(_check(runtime), {}, None, {}, {}))
    assert "(not reported)" in rows and "(none)" in rows


@pytest.mark.parametrize("model", sorted(_stored_runtimes()))
def test_a_report_or_reference_without_the_new_keys_is_still_read(model):
    """Stored references' meta.json (and reports of older runs) lack the new keys: the
    verdict, the HTML tables and the MLflow tags read them as before."""
    runtime = _stored_runtimes()[model]
    old = {k: v for k, v in runtime.items() if k not in NEW_KEYS}
    check = _check(old)
    assert f" on {old['backend']} ({old['device_kind']}), float32, " in verdict_line(check)
    assert f"({old['device_kind']}), float32" in verdict(check, {})["headline"]
    assert runtime_tags(old) == {"device_count": str(old["device_count"])}
    assert accelerator_runtime_text(old) is None
    environment(check, {}, None, {}, {})  # no KeyError


# --- prepare, train and check never open the accelerator -----------------------------

BACKENDS_AFTER_IMPORT = """
    import importlib, json, sys
    importlib.import_module(sys.argv[1])
    import jax, jax.extend.backend
    jax.devices()
    print(json.dumps(sorted(jax.extend.backend.backends())))
"""


@pytest.mark.parametrize("stage", ["prepare", "train", "check"])
def test_a_cpu_stages_process_starts_no_backend_but_cpu(stage):
    """Even where JAX_PLATFORMS names an accelerator (here one absent, which JAX would
    fail to start), importing the stage's module leaves JAX the CPU backend only."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BACKENDS_AFTER_IMPORT), f"vmapcheck.stages.{stage}"],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "tpu"},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == ["cpu"]


def test_cpu_only_process_also_pins_a_jax_imported_before_it():
    result = _python(
        """
        import json
        import jax, jax.extend.backend
        from vmapcheck.core.runtime import cpu_only_process, configure_cpu_float64
        cpu_only_process()
        info = configure_cpu_float64()
        print(json.dumps([info.platform, sorted(jax.extend.backend.backends())]))
        """,
        JAX_PLATFORMS="tpu",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == ["cpu", ["cpu"]]


def test_the_html_report_of_a_tpu_run_shows_its_device_and_the_conditions_table():
    from tests.test_html_report import make_inputs
    from vmapcheck.report.html import render_report

    check, bench, train, contract = make_inputs(failed=False)
    check["runtime"] = dict(TPU_RUNTIME)
    machine = dict(bench["machine"]["before"])
    machine |= {k: TPU_RUNTIME[k] for k in ("device_memory_gib", "platform_version")}
    machine["accelerator_runtime"] = "libtpu 0.0.42.1"
    bench["machine"] = {"before": machine, "after": machine, "noisy": False}
    page = render_report(check, bench, train, contract)
    assert "TPU v5 lite, 15.75 GiB, libtpu 0.0.42.1" in page
    assert page.count("libtpu 0.0.42.1") >= 3  # headline, environment, machine conditions
