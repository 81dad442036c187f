"""Select the JAX backend and precision before JAX initialises, and describe the result.

JAX picks its backends on first use; after that ``jax_platforms`` and ``jax_enable_x64``
no longer take effect. :func:`configure_jax` must therefore run before any array is
created. It never falls back silently: a backend that is asked for and absent is an error
that names the backends that are present. The stages that run on CPU whatever the run's
backend (prepare, train, check) keep their process off the accelerator altogether
(:func:`cpu_only_process`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vmapcheck.config import BackendConfig, PrecisionConfig, ToleranceConfig
from vmapcheck.core.record import RuntimeRecord
from vmapcheck.errors import BackendUnavailableError

# JAX reports CUDA and ROCm devices as platform "gpu".
_PLATFORM_TO_BACKEND = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}

# The installed packages that put JAX on an accelerator, by the platform they serve
# (normalized distribution names): libtpu; JAX's CUDA/ROCm plugins and the CUDA runtime
# and cuDNN wheels they load. A run records the versions of those of its own platform.
_ACCELERATOR_PACKAGES = {
    "tpu": re.compile(r"libtpu(-nightly)?"),
    "gpu": re.compile(r"jax-(cuda|rocm)\d+-(plugin|pjrt)|nvidia-(cuda-runtime|cudnn)-cu\d+"),
}
# platform_version longer than this (several lines of build details) keeps its first line.
_PLATFORM_VERSION_CHARS = 120


@dataclass(frozen=True)
class RuntimeInfo:
    """What actually ran: recorded in every report and MLflow run.

    Reports written before ``device_memory_gib``, ``platform_version`` and
    ``accelerator_runtime`` existed lack them (and so do stored references' meta.json):
    readers take them with ``.get``.
    """

    backend: str
    platform: str
    device_kind: str
    device_count: int
    # Memory of one device (its allocator's bytes_limit), GiB; None where JAX reports none
    # (CPU).
    device_memory_gib: float | None
    jax_version: str
    jaxlib_version: str
    # The backend's own version line (libtpu's build, the CUDA version; "cpu" on CPU).
    platform_version: str
    # {package: version} of the accelerator runtime installed for this platform (libtpu,
    # jax-cuda12-plugin, ...); {} on CPU.
    accelerator_runtime: dict[str, str]
    python_version: str
    os_platform: str
    enable_x64: bool
    matmul_precision: str
    xla_flags: str

    def as_dict(self) -> RuntimeRecord:
        """As the records hold it, in the fields' order (as ``dataclasses.asdict``)."""
        return {
            "backend": self.backend,
            "platform": self.platform,
            "device_kind": self.device_kind,
            "device_count": self.device_count,
            "device_memory_gib": self.device_memory_gib,
            "jax_version": self.jax_version,
            "jaxlib_version": self.jaxlib_version,
            "platform_version": self.platform_version,
            "accelerator_runtime": dict(self.accelerator_runtime),
            "python_version": self.python_version,
            "os_platform": self.os_platform,
            "enable_x64": self.enable_x64,
            "matmul_precision": self.matmul_precision,
            "xla_flags": self.xla_flags,
        }


def device_memory_gib(device: Any) -> float | None:
    """The memory of ``device`` in GiB (its allocator's ``bytes_limit``), or None where JAX
    reports none: CPU devices have no memory stats."""
    try:
        stats = device.memory_stats()
    except Exception:  # a backend without the call raises (NotImplementedError, XlaRuntimeError)
        return None
    limit = (stats or {}).get("bytes_limit")
    return round(limit / 2**30, 2) if isinstance(limit, int | float) and limit > 0 else None


def platform_version(device: Any) -> str:
    """The version line of ``device``'s backend: e.g. "cpu", "cuda 12080", or libtpu's
    "PJRT C API; TFRT TPU v5 lite; Built on ...". Lines joined with "; "; where that is
    longer than :data:`_PLATFORM_VERSION_CHARS`, the first line (cut to that length).
    "unknown" where the backend does not say."""
    try:
        text = str(device.client.platform_version)
    except Exception:
        try:
            import jax.extend.backend as jax_backend

            text = str(jax_backend.get_backend(device.platform).platform_version)
        except Exception:
            return "unknown"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    whole = "; ".join(lines)
    if len(whole) <= _PLATFORM_VERSION_CHARS:
        return whole or "unknown"
    return lines[0][:_PLATFORM_VERSION_CHARS]


def accelerator_runtime(jax_platform: str) -> dict[str, str]:
    """``{package: version}`` of the installed accelerator runtime packages that serve
    ``jax_platform`` (libtpu for "tpu"; JAX's CUDA or ROCm plugins, the CUDA runtime and
    cuDNN for "cuda"/"rocm"/"gpu"), read from their metadata (nothing is imported); {} for
    "cpu". Sorted by name."""
    pattern = _ACCELERATOR_PACKAGES.get(_PLATFORM_TO_BACKEND.get(jax_platform, jax_platform))
    if pattern is None:
        return {}
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", str(dist.metadata["Name"] or "")).lower()
        if pattern.fullmatch(name):
            found.setdefault(name, dist.version)
    return dict(sorted(found.items()))


def accelerator_runtime_text(runtime: Mapping[str, Any], short: bool = False) -> str | None:
    """A report's ``runtime["accelerator_runtime"]`` as text: "libtpu 0.0.42.1";
    ``short``: JAX's plugin or libtpu only, not the CUDA runtime, cuDNN or the PJRT twin of
    the plugin. None where none was recorded (CPU, or a report older than the key)."""
    packages = dict(runtime.get("accelerator_runtime") or {})
    if short:
        packages = {
            name: version
            for name, version in packages.items()
            if not (name.startswith("nvidia-") or name.endswith("-pjrt"))
        } or packages
    return versions_text(packages) or None


def versions_text(packages: Mapping[str, str]) -> str:
    """``{package: version}`` as text: "libtpu 0.0.42.1, ..."; "" for none."""
    return ", ".join(f"{name} {version}" for name, version in packages.items())


def device_text(runtime: Mapping[str, Any]) -> str:
    """The device of a report's ``runtime`` as the verdict names it: its kind, then its
    memory and accelerator runtime where recorded ("TPU v5 lite, 15.75 GiB, libtpu
    0.0.42.1"); the kind alone on CPU and in a report older than those keys."""
    parts = [str(runtime.get("device_kind", "?"))]
    memory = runtime.get("device_memory_gib")
    if memory is not None:
        parts.append(f"{memory:g} GiB")
    versions = accelerator_runtime_text(runtime, short=True)
    if versions:
        parts.append(versions)
    return ", ".join(parts)


def runtime_tags(runtime: Mapping[str, Any]) -> dict[str, str]:
    """MLflow tags of the device beyond its kind, from a report's ``runtime``:
    ``device_count``, ``device_memory_gib`` (not on CPU), ``platform_version`` and one
    ``<package>_version`` per accelerator runtime package (``libtpu_version``,
    ``jax_cuda12_plugin_version``). Only those the report records: an older one has none."""
    tags = {
        key: str(runtime[key])
        for key in ("device_count", "device_memory_gib", "platform_version")
        if runtime.get(key) is not None
    }
    for name, version in (runtime.get("accelerator_runtime") or {}).items():
        tags[f"{re.sub(r'[^0-9A-Za-z]+', '_', name)}_version"] = str(version)
    return tags


def available_backends() -> list[str]:
    """Backends (cpu/gpu/tpu) that initialise on this machine. Resets JAX's backends."""
    import jax
    import jax.extend.backend as jax_backend

    jax.config.update("jax_platforms", "")
    jax_backend.clear_backends()
    names = {_PLATFORM_TO_BACKEND.get(p, p) for p in jax_backend.backends()}
    return sorted(names)


def configure_jax(backend: BackendConfig, precision: PrecisionConfig) -> RuntimeInfo:
    """Pin JAX to ``backend`` and ``precision``; return what was selected.

    On CPU, ``backend.num_devices`` emulated devices are created (``jax_num_cpu_devices``,
    which only takes effect before JAX starts); elsewhere it must not exceed the devices
    present.

    Raises:
        BackendUnavailableError: the backend cannot start here (the message lists the
            backends that can), or backend.num_devices exceeds the devices present.
    """
    import jax

    jax.config.update("jax_platforms", backend.platform)
    jax.config.update("jax_enable_x64", precision.enable_x64)
    jax.config.update("jax_default_matmul_precision", precision.matmul_precision)
    if backend.platform == "cpu" and backend.num_devices is not None:
        # Emulated CPU devices for the sharded path: one client, N devices sharing the
        # host's cores (null: JAX's default). JAX refuses the change once it has started
        # in this process; then check_device_count judges the devices it has.
        with contextlib.suppress(RuntimeError):
            jax.config.update("jax_num_cpu_devices", backend.num_devices)
    try:
        devices = jax.devices()
    except Exception as exc:  # JAX raises RuntimeError or a bare AssertionError here.
        reason = str(exc).split(" (set JAX_PLATFORMS")[0] or f"no {backend.platform!r} plugin"
        present = available_backends()
        raise BackendUnavailableError(
            f"backend.name={backend.name!r} (JAX platform {backend.platform!r}) is not "
            f"available on this machine ({type(exc).__name__}: {reason}). Backends present: "
            f"{', '.join(present) or 'none'}; choose one, e.g. `dvc exp run -S backend=cpu`."
        ) from None
    # JAX already running on another platform in this process (jax_platforms is read
    # once, when JAX starts): it would run there, and the run would claim this backend.
    wanted = _PLATFORM_TO_BACKEND.get(backend.platform, backend.platform)
    if _PLATFORM_TO_BACKEND.get(devices[0].platform, devices[0].platform) != wanted:
        raise BackendUnavailableError(
            f"backend.platform={backend.platform!r} (backend.name={backend.name!r}) was "
            f"asked for, found JAX already started on {devices[0].platform!r} in this "
            "process (the platform is chosen once, when JAX starts): run it in a process "
            "of its own, or choose that backend"
        )
    check_device_count(backend.num_devices, devices)
    return runtime_info(backend.name, devices)


def runtime_info(backend_name: str, devices: list[Any] | None = None) -> RuntimeInfo:
    """What JAX runs on in this process now: ``backend_name`` (the config's name for the
    backend), the first of ``devices`` (default: every device JAX has) and how many,
    the versions, the float64 and matmul precision settings and ``XLA_FLAGS``. The
    forward stage records it (after :func:`configure_jax`), and so does the Python API,
    which configures nothing."""
    import jax
    import jaxlib

    devices = devices if devices is not None else jax.devices()
    return RuntimeInfo(
        backend=backend_name,
        platform=devices[0].platform,
        device_kind=devices[0].device_kind,
        device_count=len(devices),
        device_memory_gib=device_memory_gib(devices[0]),
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        platform_version=platform_version(devices[0]),
        accelerator_runtime=accelerator_runtime(devices[0].platform),
        python_version=sys.version.split()[0],
        os_platform=platform.platform(),
        enable_x64=bool(jax.config.jax_enable_x64),
        matmul_precision=str(jax.config.jax_default_matmul_precision),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
    )


def check_device_count(num_devices: int | None, devices: list[Any]) -> int:
    """How many devices the data-parallel mesh takes: ``num_devices``, or all of ``devices``.

    Raises:
        BackendUnavailableError: more devices asked for than are present; the message
            names the key, the number asked and the devices present.
    """
    if num_devices is None:
        return len(devices)
    if num_devices > len(devices):
        kinds = sorted({f"{d.platform} ({d.device_kind})" for d in devices})
        hint = f"set it to at most {len(devices)}, or null for all of them"
        if devices and devices[0].platform == "cpu":
            hint += " (CPU devices are emulated only when set before JAX starts: configure_jax)"
        raise BackendUnavailableError(
            f"backend.num_devices={num_devices} asks for {num_devices} devices, but "
            f"{len(devices)} are present ({', '.join(kinds) or 'none'}): {hint}"
        )
    return num_devices


def enable_key_reuse_checks() -> None:
    """Make JAX raise KeyReuseError when a typed PRNG key is consumed twice.

    The stages that draw random numbers (prepare, train) run with this on: each subkey
    of the key stream must feed exactly one random operation. It only sees typed keys
    (``jax.random.key``), which is all vmapcheck uses.
    """
    import jax

    jax.config.update("jax_debug_key_reuse", True)


# A folder for the stages' compile cache instead of each project's own .jax_cache/.
SHARED_COMPILE_CACHE_ENV = "VMAPCHECK_COMPILE_CACHE"
# The compile cache's bound (a quick run of the MLP keeps a few MB there), and the share
# of it that a pruned cache keeps (room for a few runs before the next pruning).
COMPILE_CACHE_MAX_BYTES = 2 * 1024**3
COMPILE_CACHE_PRUNED_SHARE = 0.75
# JAX's names for an entry and for the access time its own bounded mode keeps beside it.
_ENTRY_SUFFIX, _ATIME_SUFFIX = "-cache", "-atime"


def enable_compile_cache(folder: Path) -> None:
    """Keep every XLA executable this process compiles in ``folder`` (JAX's persistent
    compilation cache), and load it from there when a later process compiles the same
    program for the same backend, devices, flags and JAX/jaxlib versions.

    A stage rerun for another reason (a tolerance: ``check`` again) then loads its
    executables instead of compiling them again: the same machine code, so the same
    numbers. Every compile is kept, not only those over JAX's 1 s default: a stage's
    many small eager and jit compiles are what a rerun repeats. A folder already set
    (``JAX_COMPILATION_CACHE_DIR``) is kept; :data:`SHARED_COMPILE_CACHE_ENV` names a
    folder that replaces ``folder`` (one cache for several checkouts, or for a test
    session's many projects). Never for ``bench``: it times compiles (``compile_ms``) and
    counts them (the guard's replay); a cache hit is no compile.

    The cache is bounded here, once per process (:func:`prune_compile_cache`), not by
    JAX: JAX's own bound (``jax_compilation_cache_max_size``) sums the sizes of every
    entry in the folder on each new entry, which made a cold ``forward`` 16.5 s with an
    empty folder and 39.3 s with 2,000 other entries there (2026-12-06, the two-core VM, quiet).
    Without it JAX writes an entry in place, unlocked: a process that reads an entry
    another is still writing (parallel processes on one shared folder) gets a warning
    from JAX and compiles instead, with the same result.
    """
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        shared = os.environ.get(SHARED_COMPILE_CACHE_ENV, "").strip()
        jax.config.update("jax_compilation_cache_dir", shared or str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    prune_compile_cache(Path(jax.config.jax_compilation_cache_dir), COMPILE_CACHE_MAX_BYTES)


def prune_compile_cache(folder: Path, max_bytes: int) -> list[Path]:
    """If the entries in ``folder`` (JAX's ``<key>-cache`` files) hold more than
    ``max_bytes``, delete the oldest written until they hold at most
    :data:`COMPILE_CACHE_PRUNED_SHARE` of it; returns the entries deleted, oldest first.

    An entry another process deletes meanwhile is skipped, as is a folder not made yet.
    """
    entries = []
    for path in folder.glob(f"*{_ENTRY_SUFFIX}"):  # none in a folder not made yet
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            entries.append((stat.st_mtime_ns, path, stat.st_size))
    total = sum(size for _, _, size in entries)
    if total <= max_bytes:
        return []
    deleted = []
    for _, path, size in sorted(entries):
        if total <= max_bytes * COMPILE_CACHE_PRUNED_SHARE:
            break
        path.unlink(missing_ok=True)
        # Left by JAX's own bounded mode (a folder an older vmapcheck filled).
        path.with_name(path.name.removesuffix(_ENTRY_SUFFIX) + _ATIME_SUFFIX).unlink(
            missing_ok=True
        )
        total -= size
        deleted.append(path)
    return deleted


def cpu_only_process() -> None:
    """Keep this process off every accelerator: JAX may start its CPU backend only.

    The stages that run on CPU whatever the run's backend call it first, before anything
    imports JAX (vmapcheck.stages.prepare, .train and .check: training, the float64
    oracle, the diagnosis). JAX reads ``JAX_PLATFORMS`` when it is imported and then
    initialises no other backend, so no plugin (libtpu, CUDA) opens the device: a TPU
    is held by one process at a time, and a CPU stage must not take it from a forward or
    bench running beside it, nor fail because one holds it. It replaces a
    ``JAX_PLATFORMS`` set outside (an exported ``tpu`` is for forward and bench), and
    sets JAX's config too where JAX is imported already; :func:`configure_cpu_float32`
    and :func:`configure_cpu_float64` then refuse to run if JAX has started elsewhere.
    """
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        jax.config.update("jax_platforms", "cpu")


def _configure_cpu(
    name: Literal["f32", "f64"], dtype: Literal["float32", "float64"]
) -> RuntimeInfo:
    """CPU at ``dtype`` with the highest matmul precision (tolerances unused here).

    Raises:
        BackendUnavailableError: JAX had started on another backend in this process
            already (then ``jax_platforms`` no longer takes effect, and this would
            silently run on the accelerator).
    """
    none = ToleranceConfig(rtol=0.0, atol=0.0)
    info = configure_jax(
        # One device: these stages run nothing sharded (JAX's default CPU device count).
        BackendConfig(name="cpu", platform="cpu", num_devices=None),
        PrecisionConfig(
            name=name,
            dtype=dtype,
            enable_x64=dtype == "float64",
            matmul_precision="highest",
            tolerance=none,
            cross_run_tolerance=none,
        ),
    )
    if info.platform != "cpu":
        raise BackendUnavailableError(
            f"JAX had already started on {info.platform} ({info.device_kind}) in this "
            "process, so it cannot be pinned to CPU, where prepare, train and the float64 "
            "oracle run: nothing may use JAX before configure_cpu_float32/float64 (the "
            "stage modules call vmapcheck.core.runtime.cpu_only_process first)"
        )
    return info


def configure_cpu_float32() -> RuntimeInfo:
    """Data preparation and training always run on CPU in float32.

    Params and data then do not depend on the backend or precision under test, so a
    change of either reruns only the stages that run the model (forward onward).
    """
    info = _configure_cpu("f32", "float32")
    enable_key_reuse_checks()
    return info


def configure_cpu_float64() -> RuntimeInfo:
    """The float64 oracle runs on CPU with x64 enabled, whatever the run's backend."""
    return _configure_cpu("f64", "float64")
