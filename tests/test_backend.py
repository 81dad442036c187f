"""Backend selection: never a silent fallback. Runs in subprocesses (JAX starts once)."""

import subprocess
import sys
import textwrap

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S


def _run(code: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "JAX_PLATFORMS": ""}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_absent_gpu_is_an_error_naming_the_backends_present():
    result = _run("""
        from vmapcheck.config import BackendConfig
        from tests.helpers.config import compose_config
        from vmapcheck.errors import BackendUnavailableError
        from vmapcheck.core.runtime import configure_jax
        import jax
        config = compose_config("backend=gpu")
        try:
            configure_jax(config.backend, config.precision)
        except BackendUnavailableError as exc:
            print("ERROR:", exc)
        else:
            print("SELECTED:", jax.devices())
    """)
    assert result.returncode == 0, result.stderr
    if "SELECTED" in result.stdout:  # a machine with a GPU: it must really be one
        assert "cuda" in result.stdout.lower() or "gpu" in result.stdout.lower()
        return
    assert "backend.name='gpu' (JAX platform 'cuda') is not available" in result.stdout
    assert "Backends present: cpu" in result.stdout


def test_cpu_and_x64_are_selected_before_jax_starts():
    result = _run("""
        from tests.helpers.config import compose_config
        from vmapcheck.core.runtime import configure_jax
        import jax.numpy as jnp
        config = compose_config("precision=f64")
        info = configure_jax(config.backend, config.precision)
        print(info.backend, info.platform, info.enable_x64, jnp.ones(2, jnp.float64).dtype)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "cpu", "True", "float64"]
