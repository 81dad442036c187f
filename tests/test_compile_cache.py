"""JAX's persistent compilation cache of the stages (vmapcheck.core.runtime.enable_compile_cache):
a second process loads what the first compiled, with the same result. Each side runs in
a subprocess of its own: the cache is a process-wide JAX setting, and the benchmark's
tests in this process count compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.wait import HANG_S
from vmapcheck.core.runtime import SHARED_COMPILE_CACHE_ENV, prune_compile_cache
from vmapcheck.layout import Layout

# Compiles one jit function with the cache on; prints its output, and how many compiles
# hit and missed the cache (JAX's own monitoring events).
PROGRAM = """
import json, sys
from pathlib import Path
import jax, jax.numpy as jnp
from jax import monitoring
from vmapcheck.core.runtime import enable_compile_cache

events = {"hits": 0, "misses": 0}
EVENT = "/jax/compilation_cache/cache_"


def count(name, **kwargs):
    if name in (EVENT + "hits", EVENT + "misses"):
        events[name.removeprefix(EVENT)] += 1


monitoring.register_event_listener(count)
enable_compile_cache(Path(sys.argv[1]))
out = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0))(jnp.arange(12.0).reshape(3, 4))
print(json.dumps({**events, "out": out.tolist()}))
"""


def _run(folder, shared: Path | None = None) -> dict:
    """PROGRAM in a subprocess with the cache in ``folder``, or in ``shared`` when given
    (SHARED_COMPILE_CACHE_ENV; the test session's own shared cache is not passed on)."""
    env = {k: v for k, v in os.environ.items() if k != SHARED_COMPILE_CACHE_ENV}
    if shared is not None:
        env[SHARED_COMPILE_CACHE_ENV] = str(shared)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(folder)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=True,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    folder = Layout(tmp_path).compile_cache
    first = _run(folder)
    assert first["misses"] >= 1 and first["hits"] == 0, first
    assert any(folder.iterdir()), f"{folder}: expected cache entries, found none"
    second = _run(folder)
    assert second["hits"] >= 1 and second["misses"] == 0, second
    assert second["out"] == first["out"]


def test_a_shared_cache_replaces_each_projects_own(tmp_path):
    shared = tmp_path / "shared"
    first = _run(tmp_path / "a" / ".jax_cache", shared)
    second = _run(tmp_path / "b" / ".jax_cache", shared)
    assert first["misses"] >= 1 and second["hits"] >= 1 and second["misses"] == 0, second
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # Not JAX's bound (a scan of the whole folder on every new entry), so none of the
    # lock and access-time files it keeps: each entry is one file.
    names = [path.name for path in shared.iterdir()]
    assert names and all(name.endswith("-cache") for name in names), names


def _entry(folder: Path, key: str, size: int, age_s: int) -> Path:
    """A cache entry of ``size`` bytes written ``age_s`` seconds ago, with the access-time
    file JAX's own bounded mode keeps beside it."""
    path = folder / f"{key}-cache"
    path.write_bytes(b"x" * size)
    (folder / f"{key}-atime").write_bytes(b"\0" * 8)
    written = 1_000_000 - age_s
    os.utime(path, (written, written))
    return path


def test_a_cache_over_its_bound_loses_its_oldest_entries_down_to_three_quarters(tmp_path):
    entries = [_entry(tmp_path, f"jit_f-{i}", 100, age_s=10 * (8 - i)) for i in range(8)]
    assert prune_compile_cache(tmp_path, max_bytes=800) == []  # at the bound: kept
    deleted = prune_compile_cache(tmp_path, max_bytes=700)
    # 800 bytes over a 700 bound: the oldest go until at most 525 (75 %) remain.
    assert deleted == entries[:3]
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == sorted(f"jit_f-{i}-{kind}" for i in range(3, 8) for kind in ("cache", "atime"))
    assert prune_compile_cache(tmp_path / "not-made-yet", max_bytes=1) == []
