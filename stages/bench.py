"""DVC stage `bench`: latency distributions of every path and batch size after warm-up."""

import contextlib
from collections.abc import Callable, Iterator

import jax.numpy as jnp
from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn

from vmapcheck.bench import metrics_summary, run_bench
from vmapcheck.config import Config
from vmapcheck.guard import replay_figures, replay_summary, run_replay
from vmapcheck.io import atomic_dir, atomic_write_json
from vmapcheck.models import build_model
from vmapcheck.params_io import load_model_params
from vmapcheck.paths import ShardedForward, data_mesh
from vmapcheck.plots import write_latency_csvs, write_latency_png, write_speedup_csv
from vmapcheck.regression import load_cases
from vmapcheck.runtime import configure_jax
from vmapcheck.stage import CASES, PARAMS, REPORTS, stage_main


@contextlib.contextmanager
def bench_progress() -> Iterator[Callable[[str, float], None]]:
    """A progress bar on a terminal; one plain line per step in logs (dvc repro in CI)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda message, _done: print(f"bench: {message}", flush=True)
        return
    columns = (*Progress.get_default_columns(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("bench", total=1.0)
        yield lambda message, done: bar.update(
            task, completed=done, description=f"bench: {message}"
        )


@stage_main("bench")
def main(config: Config) -> None:
    runtime = configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params, _ = load_model_params(model, PARAMS)
    rows = load_cases(CASES)["standard"]["x"]
    dtype = jnp.dtype(config.precision.dtype)
    mesh = data_mesh(config.backend.num_devices)
    with bench_progress() as progress:
        result = run_bench(model, params, rows, config.bench, dtype, progress=progress, mesh=mesh)
    # Devices and mesh shape of the data-parallel path (sharded_jit).
    sharded = ShardedForward(model, mesh).describe()
    # Serving: a stream of requests of random sizes (and invalid ones) through the guard.
    print(f"bench: replaying {config.guard.replay.n_requests} requests through the guard")
    replay = run_replay(model, params, rows, dtype, config.guard)
    result["replay"] = {**replay, "figures": replay_figures(replay)}
    atomic_write_json(REPORTS / "bench.json", metrics_summary(result))
    atomic_write_json(
        REPORTS / "bench_details.json",
        {
            "model": config.model.name,
            "precision": config.precision.name,
            "dtype": dtype.name,
            "runtime": runtime.as_dict(),
            "bench": config.bench.model_dump(),
            "sharded": sharded,
            **result,
        },
    )
    with atomic_dir(REPORTS / "plots") as folder:
        write_latency_csvs(folder, result["latency_ms"])
        write_speedup_csv(folder / "speedup.csv", result["speedup"])
        write_latency_png(
            folder / "latency.png",
            result["latency_ms"],
            f"{config.model.name} on {runtime.backend} ({runtime.device_kind}), {dtype.name}, "
            f"jax {runtime.jax_version}",
        )
    if result["machine"]["noisy"]:
        print("bench: WARNING: load average above the core count: figures are noisy")
    print(f"bench: matmul peak {result['peak']['gflops']:.1f} GFLOP/s on this machine now")
    for label, ratios in result["speedup"].items():
        shown = ", ".join(f"{k}={v:.2f}x" for k, v in ratios.items())
        roof = result["figures"]["vmap_jit"].get(label, {}).get("roofline", float("nan"))
        print(f"bench: {label}: {shown}; vmap_jit at {roof:.1%} of the matmul peak")
    print(f"bench: guard replay: {replay_summary(result['replay'])}")
    for label, stats in result["latency_ms"]["sharded_jit"].items():
        vmap = result["latency_ms"]["vmap_jit"].get(label)
        if vmap:
            print(
                f"bench: {label}: sharded_jit (data-parallel over {sharded['devices']} "
                f"{sharded['platform']} device(s), not vmap) p50 {stats['p50']:.3g} ms vs "
                f"vmap_jit (one device) {vmap['p50']:.3g} ms"
            )


if __name__ == "__main__":
    raise SystemExit(main())
