"""The machine's conditions, recorded with every benchmark (results without them are noise)."""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def conditions() -> dict[str, Any]:
    """CPU model, cores, load averages, memory and threading settings, right now; the
    device's kind, count, memory and runtime versions."""
    memory = psutil.virtual_memory()
    load1, load5, load15 = os.getloadavg()
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "load_avg_1m": load1,
        "load_avg_5m": load5,
        "load_avg_15m": load15,
        "memory_total_gib": round(memory.total / 2**30, 2),
        "memory_available_gib": round(memory.available / 2**30, 2),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        **_jax_settings(),
    }


def _jax_settings() -> dict[str, Any]:
    """The JAX settings that change numbers or speed (after the backend is chosen), and
    the device's memory and runtime versions (as RuntimeInfo records them)."""
    import jax
    import jaxlib

    from vmapcheck.core.runtime import (
        accelerator_runtime,
        device_memory_gib,
        platform_version,
        versions_text,
    )

    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "device_memory_gib": device_memory_gib(device),
        "platform_version": platform_version(device),
        # As text, like every condition (the report's machine table shows each as a
        # value): "libtpu 0.0.42.1"; "" on CPU. bench_details.json's runtime has the dict.
        "accelerator_runtime": versions_text(accelerator_runtime(device.platform)),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
        "enable_x64": bool(jax.config.jax_enable_x64),
    }
