"""The machine's conditions, recorded with every benchmark (results without them are noise).

:func:`conditions` is a snapshot. :class:`ConditionsSampler` samples the load average and
the CPU frequency from the start of the bench to its end (compile, warm-up, timing, the
guard's replays), and :func:`machine_record` judges the bench noisy from the highest
load seen over all of it: a snapshot before and after the timing rounds read "13.2-13.2"
inside a 45 s run whose compiles and replays it never saw (issue 35).
"""

from __future__ import annotations

import math
import os
import platform
import threading
import time
from collections.abc import Mapping
from typing import Any

import psutil

from vmapcheck.bench.timing.records import (
    Conditions,
    JaxSettings,
    MachineRecord,
    Sampled,
    Spread,
)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def conditions() -> Conditions:
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


def _jax_settings() -> JaxSettings:
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


# How often the sampler reads the load and the frequency: the 1-minute load average moves
# by a few percent a second, so one reading a second sees every spell of a bench stage.
SAMPLE_INTERVAL_S = 1.0
# What the samples span when the bench stage takes them (vmapcheck.pipeline.bench).
WHOLE_BENCH = ("compile", "warm-up", "timing", "peak sweep", "replays")


def cpu_mhz() -> float | None:
    """The mean current frequency of the CPUs as the OS reports it (MHz); None where it
    reports none. A VM often reports its nominal frequency, unchanging."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError, RuntimeError):
        return None
    return float(freq.current) if freq is not None and freq.current else None


def _spread(values: list[float]) -> Spread | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return {"min": min(finite), "max": max(finite), "mean": sum(finite) / len(finite)}


class ConditionsSampler:
    """The 1-minute load average and the CPU frequency, read every ``interval_s`` in a
    daemon thread from ``start()`` (or ``with``) to ``stop()``, with one reading at each
    end. ``covers``: what the samples span, in words (:data:`WHOLE_BENCH`)."""

    def __init__(
        self, interval_s: float = SAMPLE_INTERVAL_S, covers: tuple[str, ...] = WHOLE_BENCH
    ) -> None:
        self.interval_s = interval_s
        self.covers = covers
        self.loads: list[float] = []
        self.mhz: list[float | None] = []
        self.began: float | None = None
        self.ended: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        self.loads.append(os.getloadavg()[0])
        self.mhz.append(cpu_mhz())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def start(self) -> ConditionsSampler:
        if self._thread is None:
            self.began = time.time()
            self._read()
            self._thread = threading.Thread(target=self._run, name="conditions", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None and self.ended is None:
            self._stop.set()
            self._thread.join()
            self._read()
            self.ended = time.time()

    def __enter__(self) -> ConditionsSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> Sampled:
        """``{"covers", "span_s", "samples", "interval_s", "load_avg_1m": {"min", "max",
        "mean"}, "cpu_mhz": {...} | None}`` over the readings so far (a sampler still
        running: up to now)."""
        end = self.ended if self.ended is not None else time.time()
        return {
            "covers": list(self.covers),
            "span_s": round(end - (self.began or end), 3),
            "samples": len(self.loads),
            "interval_s": self.interval_s,
            "load_avg_1m": _spread(self.loads),
            "cpu_mhz": _spread([m for m in self.mhz if m is not None]),
        }


def machine_record(before: Conditions, after: Conditions, during: Sampled | None) -> MachineRecord:
    """bench_details.json's ``machine``: the conditions ``before`` and ``after``
    (:func:`conditions`), the samples ``during`` (:meth:`ConditionsSampler.summary`; None:
    not sampled) and ``noisy``: the highest 1-minute load seen, before, during or after,
    above the usable cores."""
    loads = [before["load_avg_1m"], after["load_avg_1m"]]
    sampled = during.get("load_avg_1m") if during else None
    if sampled:
        loads.append(sampled["max"])
    return {
        "before": before,
        "after": after,
        "during": during,
        "noisy": max(loads) > (before["usable_cores"] or 1),
    }


def conditions_line(machine: MachineRecord) -> str:
    """The conditions of a bench in one line (bench_details.json's ``machine``):
    ``load 2.1-6.3 (1-minute average, 45 samples over 44 s: compile, warm-up, timing,
    peak sweep, replays) on 2 usable cores; CPU 2600-2600 MHz; noisy``."""
    before = machine["before"]
    # A record from before the sampling has no readings (None, or no key at all).
    during: Mapping[str, Any] = machine.get("during") or {}
    load = during.get("load_avg_1m")
    if load:
        text = (
            f"load {load['min']:.1f}-{load['max']:.1f} (1-minute average, {during['samples']} "
            f"samples over {during['span_s']:.0f} s: {', '.join(during['covers'])})"
        )
    else:  # a record from before the sampling: the two snapshots
        text = (
            f"load {before['load_avg_1m']:.1f} before, {machine['after']['load_avg_1m']:.1f} "
            "after the timing"
        )
    text += f" on {before['usable_cores']} usable cores"
    mhz = during.get("cpu_mhz")
    if mhz:
        text += f"; CPU {mhz['min']:.0f}-{mhz['max']:.0f} MHz as the OS reports it"
    return text + ("; noisy (load above the usable cores)" if machine["noisy"] else "")
