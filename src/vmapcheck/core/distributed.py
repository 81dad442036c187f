"""One run as several processes: JAX's multi-controller runtime (``jax.distributed``).

Every process runs the same program on the same inputs (the forward stage whole: each
path, each case, in the same order), as JAX's multi-controller model asks: a computation
over a mesh that spans processes is entered by all of them together. What each process
holds of a global array is its own devices' shards; the data-parallel path places its
batch and params with :func:`put` (:func:`jax.make_array_from_callback`: each process
builds only its addressable shards, from the whole batch every process has) and brings
the output back whole with :func:`to_host`. The single-device paths run on each process's
first local device; their results are the same on every process, and process 0 alone
writes (:func:`writes`), after every process has finished (:func:`barrier`).

How a process learns it is one of a group (:func:`launched`), from its environment:

- started by vmapcheck on one machine (``backend.processes``: vmapcheck.pipeline.
  multiprocess): :data:`COORDINATOR_ENV` (``127.0.0.1:<port>``), :data:`PROCESSES_ENV`,
  :data:`PROCESS_ID_ENV` and, on CPU, :data:`LOCAL_DEVICES_ENV` (its emulated devices);
- started by a cluster (a TPU slice's workers, SLURM, Open MPI, a GKE job):
  :data:`CLUSTER_ENV` ``=cluster``, and ``jax.distributed.initialize()`` with no
  arguments finds the coordinator, the process count and this process's index the
  cluster's way (docs/multiprocess.md).

Neither set: one process, and nothing here changes anything.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmapcheck.config import BackendConfig
from vmapcheck.errors import BackendUnavailableError, ConfigError, first_line

# JAX is imported where it runs: every stage reads its place in a group (launched), and
# the stages that run no JAX (code, track) do not load it (vmapcheck.pipeline.stage).
if TYPE_CHECKING:
    import jax
    from jax.sharding import Sharding

COORDINATOR_ENV = "VMAPCHECK_COORDINATOR"
PROCESSES_ENV = "VMAPCHECK_NUM_PROCESSES"
PROCESS_ID_ENV = "VMAPCHECK_PROCESS_ID"
LOCAL_DEVICES_ENV = "VMAPCHECK_LOCAL_DEVICES"
CLUSTER_ENV = "VMAPCHECK_DISTRIBUTED"
CLUSTER = "cluster"  # CLUSTER_ENV's one value
LOCAL_ENV = (COORDINATOR_ENV, PROCESSES_ENV, PROCESS_ID_ENV, LOCAL_DEVICES_ENV)

# How long a process waits for the others to join (jax.distributed's connection
# retries; JAX's default is 300 s): a process here reaches initialize seconds after it
# starts (its imports took 0.8-2 s on 2 cores at load 7, 2026-12-07), so 120 s is wide
# margin; a process that dies is caught sooner by the launcher, which watches every
# process (vmapcheck.pipeline.multiprocess).
INIT_TIMEOUT_S = 120
# A process silent this long is taken for dead, and the others stop (jax.distributed's
# heartbeats): what ends a cluster's processes when one dies with no launcher watching.
HEARTBEAT_TIMEOUT_S = 60
# How long a finished process waits at exit for the others to finish too.
SHUTDOWN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Launch:
    """What this process's environment says of its group.

    ``coordinator`` (``host:port``), ``processes`` and ``process_id``: None when the
    cluster says them (:data:`CLUSTER_ENV`); ``local_devices``: the emulated CPU devices
    this process holds, None: JAX's default."""

    coordinator: str | None
    processes: int | None
    process_id: int | None
    local_devices: int | None

    def label(self) -> str:
        """``process 1 of 4``, what this process's messages are prefixed with."""
        if self.process_id is None:
            return "a process of the cluster"
        return f"process {self.process_id} of {self.processes}"


def _whole(env: Mapping[str, str], name: str, low: int) -> int:
    text = env[name]
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise ConfigError(f"{name}: expected a whole number of at least {low}, found {text!r}")
    return value


def launched(env: Mapping[str, str] | None = None) -> Launch | None:
    """This process's place in a group, from ``env`` (default: ``os.environ``); None: it
    runs alone.

    Raises:
        ConfigError: a variable holds what it cannot (named, with what was expected
            and what was found), or the local variables are set only in part."""
    env = os.environ if env is None else env
    cluster = env.get(CLUSTER_ENV)
    local = [name for name in LOCAL_ENV[:3] if name in env]
    if cluster is not None:
        if cluster != CLUSTER:
            raise ConfigError(f"{CLUSTER_ENV}: expected {CLUSTER!r} or unset, found {cluster!r}")
        if local:
            raise ConfigError(
                f"{CLUSTER_ENV}={CLUSTER} and {local[0]} are both set: the cluster names the "
                "coordinator and the process, or vmapcheck's launcher does, not both"
            )
        return Launch(None, None, None, None)
    if not local:
        return None
    if len(local) < 3:
        missing = [name for name in LOCAL_ENV[:3] if name not in env]
        raise ConfigError(
            f"{missing[0]}: expected it set together with {', '.join(local)} (a process of "
            "a local group needs the coordinator, the process count and its own index)"
        )
    coordinator = env[COORDINATOR_ENV]
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{COORDINATOR_ENV}: expected host:port, found {coordinator!r}")
    processes = _whole(env, PROCESSES_ENV, 1)
    process_id = _whole(env, PROCESS_ID_ENV, 0)
    if process_id >= processes:
        raise ConfigError(
            f"{PROCESS_ID_ENV}: expected an index below {PROCESSES_ENV}={processes}, "
            f"found {process_id}"
        )
    devices = _whole(env, LOCAL_DEVICES_ENV, 1) if LOCAL_DEVICES_ENV in env else None
    return Launch(coordinator, processes, process_id, devices)


def join(backend: BackendConfig) -> Launch | None:
    """Join this process to its group (:func:`launched`) before JAX starts its backend:
    the platform and, on CPU, this process's emulated devices set, then
    ``jax.distributed.initialize``. None (nothing done): the process runs alone.

    Raises:
        BackendUnavailableError: JAX refused to join (its error said, with this
            process's place), or a cluster's process count is not
            ``backend.processes``. A group that does not form within
            :data:`INIT_TIMEOUT_S` raises nothing: JAX aborts this process (SIGABRT),
            after this process has said on stderr what it waited for.
    """
    launch = launched()
    if launch is None:
        return None
    import jax

    jax.config.update("jax_platforms", backend.platform)
    if backend.platform == "cpu" and launch.local_devices is not None:
        jax.config.update("jax_num_cpu_devices", launch.local_devices)
    # JAX's preemption service takes SIGTERM over (a preemption notice, for training
    # to checkpoint at a sync point), and a process then ran on to write the outputs
    # of a stage its launcher had stopped. A check has nothing to save: SIGTERM ends
    # it, as it ends every stage (vmapcheck.pipeline.stage).
    jax.config.update("jax_enable_preemption_service", False)
    where = launch.coordinator or "the cluster's coordinator"
    # A group that never forms is not an exception: JAX aborts the waiting process
    # (SIGABRT, "DEADLINE_EXCEEDED ... RegisterTask") once INIT_TIMEOUT_S has passed. So
    # that its log says which process waited for what, this line comes first.
    waiting = threading.Timer(
        INIT_TIMEOUT_S * 0.9,
        lambda: print(
            f"{launch.label()}: the group of processes at {where} has not formed after "
            f"{INIT_TIMEOUT_S * 0.9:.0f} s: another process died or never started; JAX "
            f"ends this one once {INIT_TIMEOUT_S} s have passed",
            file=sys.stderr,
            flush=True,
        ),
    )
    waiting.daemon = True
    waiting.start()
    try:
        jax.distributed.initialize(
            launch.coordinator,
            launch.processes,
            launch.process_id,
            initialization_timeout=INIT_TIMEOUT_S,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
            shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
        )
        count = jax.process_count()
    except Exception as exc:  # JAX raises RuntimeError or its own XlaRuntimeError here
        # The stage's message says which process this is (vmapcheck.pipeline.stage).
        hint = ""
        if launch.coordinator is None:
            hint = (
                f"; {CLUSTER_ENV}={CLUSTER} asks JAX to find the cluster (a TPU slice, "
                "SLURM, Open MPI, a Kubernetes Job): unset it to run alone, or set "
                "backend.processes for a group on this machine"
            )
        raise BackendUnavailableError(
            f"could not join the group of processes at {where} ({type(exc).__name__}: "
            f"{first_line(exc)}){hint}"
        ) from None
    finally:
        waiting.cancel()
    if count != backend.processes:
        raise BackendUnavailableError(
            f"backend.processes={backend.processes}, but the cluster started {count} "
            f"processes: set -S +backend.processes={count}, so that the run's record says "
            "how it ran"
        )
    return launch


def writes() -> bool:
    """Whether this process writes the run's records: process 0 of a group, or the
    process that runs alone."""
    import jax

    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process of the group reaches ``name`` (no-op alone): process 0
    writes only once every process has computed what it writes, so that a process that
    died first leaves no record behind."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _global(leaf: Any, sharding: Sharding) -> jax.Array:
    import jax
    import numpy as np

    if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        # A typed key array has no numpy form: its data is placed, then wrapped again.
        data = _global(jax.random.key_data(leaf), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def put(tree: Any, sharding: Sharding) -> Any:
    """Every leaf of ``tree`` placed by ``sharding``: ``jax.device_put`` when this process
    addresses every device of it; else a global array whose addressable shards this
    process builds from its copy of the whole leaf (every process holds the same
    ``tree``: the same cases, the same params)."""
    import jax

    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)
    return jax.tree_util.tree_map(lambda leaf: _global(leaf, sharding), tree)


def to_host(out: jax.Array) -> Any:
    """``out`` whole on this process: itself when this process addresses every shard,
    else its shards from every process gathered, in order (a numpy array of ``out``'s
    global shape; every process calls it, as it is a collective)."""
    if out.is_fully_addressable:
        return out
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(out, tiled=True)


def whole_rows(out: jax.Array, rows: int) -> Any:
    """A mesh path's output ``out`` whole on this process (:func:`to_host`), its first
    ``rows`` rows: the padding that made the batch a multiple of the ``"data"`` axis
    dropped. Shapes: (padded_rows, ...) -> (rows, ...)."""
    out = to_host(out)
    return out if out.shape[0] == rows else out[:rows]
