"""Stage `bench`: latency distributions of every path and batch size after warm-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp

from vmapcheck.bench.timing.bounds import LAUNCH_BOUND_MEANING, launch_bound_text, peak_caveat
from vmapcheck.bench.timing.budget import STOP_ALL, budget_clock_line
from vmapcheck.bench.timing.machine import (
    ConditionsSampler,
    conditions,
    conditions_line,
    machine_record,
)
from vmapcheck.bench.timing.progress import open_progress
from vmapcheck.bench.timing.records import BenchDetails, EarlyStopRecord, Peak, ReplayRecord
from vmapcheck.bench.timing.run import run_bench
from vmapcheck.config import Config
from vmapcheck.core.mesh import run_mesh
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import (
    PATHS,
    describe_distributed,
    describe_meshes,
    mesh_label,
    speedup_text,
)
from vmapcheck.core.runtime import configure_jax
from vmapcheck.data.regression import STANDARD_CASE, load_cases
from vmapcheck.guard.replay import replay_figures, replay_summary, run_replay
from vmapcheck.io import atomic_dir, atomic_write_json
from vmapcheck.layout import Layout
from vmapcheck.params_io import contract_digest, load_model_params, read_model_contract
from vmapcheck.report.headline import HEADLINE_SPEEDUPS, batch_label, bench_headline
from vmapcheck.report.plots import (
    write_latency_csvs,
    write_latency_png,
    write_speedup_csvs,
    write_speedup_png,
)

if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import BenchResult


def dvc_metrics(result: BenchDetails) -> dict[str, float | None]:
    """``reports/bench.json``, the DVC metrics of the benchmark: vmap's p50 speed-ups at
    the headline batch (:func:`vmapcheck.report.headline.bench_headline`), named as the
    MLflow run's ``summary/*`` speed-ups without the prefix, e.g. ``vmap_over_loop@b0128``
    (the batch in the name: a ratio at another batch size is another column, never
    compared with this one). The keys are fixed by the profile: a ratio not measured is
    null. The latencies, their confidence
    intervals, compile times and the matmul peak are in ``reports/bench_details.json``
    and in MLflow.
    """
    speed = bench_headline(result)
    if speed["batch"] is None:
        return {}
    # Every headline name, always: a figure left out stays as its key, empty (null), so
    # `dvc metrics diff` never compares one batch size with another.
    return {
        f"{name}@{batch_label(speed['batch'])}": (
            speed["speedups"][name]["ratio"] if name in speed["speedups"] else None
        )
        for name in HEADLINE_SPEEDUPS
    }


def early_stop_lines(early_stop: EarlyStopRecord) -> list[str]:
    """What ``run_bench``'s early stopping did, one line per reason and round count:
    ``stopped after 7 of 10 rounds (time budget): loop_eager/b128, ...``; one line when
    every cell took every round."""
    groups: dict[tuple[int, str], list[str]] = {}
    total, cells_in_all = 0, 0
    for path, by_batch in early_stop["cells"].items():
        for label, cell in by_batch.items():
            total, cells_in_all = max(total, cell["rounds"]), cells_in_all + 1
            if cell["stopped"] != STOP_ALL:
                groups.setdefault((cell["rounds"], cell["stopped"]), []).append(f"{path}/{label}")
    if not groups:
        return [f"early stop: none, every cell took all {total} rounds"]
    settings = early_stop["settings"]
    return [
        f"early stop: stopped after {rounds} rounds ({why}; min_rounds "
        f"{settings['min_rounds']}, ci_target {settings['ci_target']}, time_budget_s "
        f"{settings['time_budget_s']}): "
        + ("every cell" if len(cells) == cells_in_all else ", ".join(cells))
        for (rounds, why), cells in sorted(groups.items())
    ]


def peak_line(peak: Peak) -> str:
    """``matmul peak 147,556 GFLOP/s (8192^3 float32, matmul precision default; best of 3
    sweeps: ...; sweep stopped: ...)``, and its contention mark
    (:func:`~vmapcheck.bench.timing.bounds.peak_caveat`) where it has one."""
    sweeps = peak.get("sweeps_gflops")
    best_of = (
        f"best of {len(sweeps)} sweep(s): {', '.join(f'{g:,.1f}' for g in sweeps)}; "
        if sweeps
        else ""
    )
    contention = peak_caveat(peak)
    return (
        f"matmul peak {peak['gflops']:,.1f} GFLOP/s on this device now ({peak['size']}^3 "
        f"{peak.get('dtype', '?')}, matmul precision {peak.get('matmul_precision', '?')}; "
        f"{best_of}sweep stopped: {peak.get('stopped', '?')})"
        + (f"; {contention}" if contention else "")
    )


def roofline_text(result: BenchResult, label: str) -> str:
    """The headline paths' share of the matmul peak at ``label``: ``vmap_jit at 12.3%,
    direct_jit above the peak (flop count or peak wrong: not shown)``."""
    shares = []
    for path in PATHS.values():
        figures = result["figures"].get(path.name, {}).get(label)
        if not path.headline or figures is None:
            continue
        share = figures["roofline"]
        shares.append(
            f"{path.name} at {share:.1%}"
            if share is not None
            else f"{path.name} not shown (no flop count, or above the peak)"
        )
    contention = peak_caveat(result.get("peak"))
    marked = f" ({contention})" if contention else ""
    return ", ".join(shares) + f" of the matmul peak{marked}"


def phases_line(phases_s: dict[str, float]) -> str:
    """``took 21.4 s: timing 12.0 s, replay_bucketed 8.1 s, replay_unbucketed 1.3 s``."""
    shown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases_s.items())
    return f"took {sum(phases_s.values()):.1f} s: {shown}"


def run(config: Config, layout: Layout) -> None:
    runtime = configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params, _ = load_model_params(model, layout.params)
    rows = load_cases(layout.cases)[STANDARD_CASE]["x"]
    dtype = jnp.dtype(config.precision.dtype)
    mesh = run_mesh(config.backend.num_devices, config.backend.model_axis)
    # Progress bars on a terminal, plain lines in a log (dvc repro piped, CI). The load
    # and CPU frequency are sampled over all of it: compiles, warm-up, timing, replays.
    with open_progress("bench") as progress, ConditionsSampler() as sampler:
        result = run_bench(
            model, params, rows, config.bench, dtype, progress=progress, mesh=mesh, sampler=sampler
        )
        # Serving: a stream of requests of random sizes (and invalid ones) through the guard.
        replay = run_replay(model, params, rows, dtype, config.guard, progress=progress)
    # Noisy or not by the highest load of the whole bench, the replays included.
    machine = result["machine"]
    result["machine"] = machine_record(machine["before"], conditions(), sampler.summary())
    # Where the bench's own time went, so that a profile's bound can be read off every run.
    result["phases_s"] = {
        **result["phases_s"],
        **{f"replay_{name}": seconds for name, seconds in replay["wall_s"].items()},
    }
    # Devices and mesh shape of the data-parallel path.
    sharded = describe_distributed(model, mesh)
    # Every mesh path's: which is data-parallel, which tensor-parallel (none is vmap).
    meshes = describe_meshes(model, mesh)
    replayed: ReplayRecord = {**replay, "figures": replay_figures(replay)}
    details: BenchDetails = {
        "model": config.model.name,
        # What the model is, not its name: the verdict never compares two networks of
        # one name (vmapcheck.bench.verdict.baseline.CONTEXT).
        "model_contract": contract_digest(read_model_contract(layout.contract)),
        "precision": config.precision.name,
        "dtype": dtype.name,
        "runtime": runtime.as_dict(),
        "bench": config.bench.model_dump(),
        "sharded": sharded,
        "meshes": meshes,
        **result,
        # Last, as the bench has always written it (after the timing's own keys).
        "replay": replayed,
    }
    # From the details, which hold the profile: the headline batch is the profile's, not
    # the largest one measured (a budget that left out every cell past 1 row moved the
    # keys to @b0001, seen 2026-12-06).
    atomic_write_json(layout.bench_report, dvc_metrics(details))
    atomic_write_json(layout.bench_details, details)
    with atomic_dir(layout.plots) as folder:
        write_latency_csvs(folder, result["latency_ms"])
        # With their confidence intervals: a ratio is drawn with its interval (issue 43).
        write_speedup_csvs(folder / "speedup", result["speedup"], result.get("speedup_ci"))
        title = (
            f"{config.model.name} on {runtime.backend} ({runtime.device_kind}), {dtype.name}, "
            f"jax {runtime.jax_version}"
        )
        # Drawn here once: track embeds these files in the HTML report.
        write_latency_png(folder / layout.latency_png.name, result["latency_ms"], title)
        if result["speedup"]:
            write_speedup_png(
                folder / layout.speedup_png.name,
                result["speedup"],
                title,
                result.get("speedup_ci"),
            )
    print(f"bench: conditions: {conditions_line(result['machine'])}")
    if result["machine"]["noisy"]:
        print("bench: WARNING: load average above the core count: figures are noisy")
    print(f"bench: {peak_line(result['peak'])}")
    for line in early_stop_lines(result["early_stop"]):
        print(f"bench: {line}")
    for label, ratios in result["speedup"].items():
        if not ratios:  # no ratio's two paths both ran at this size
            continue
        ci = result["speedup_ci"].get(label, {})
        shown = ", ".join(f"{k} {speedup_text(v, ci.get(k))}" for k, v in ratios.items())
        print(f"bench: {label}: {shown}; {roofline_text(result, label)}")
    for path, entry in result["launch_bound"].items():
        print(f"bench: {path} launch-bound {launch_bound_text(entry)}: {LAUNCH_BOUND_MEANING}")
    print(f"bench: guard replay: {replay_summary(replayed)}")
    print(f"bench: {phases_line(result['phases_s'])}")
    clock = result["early_stop"].get("budget_clock")
    if clock:
        print(f"bench: {budget_clock_line(clock, config.bench.early_stop.time_budget_s)}")
    for distributed in (p for p in PATHS.values() if p.distributed):
        if distributed.same_program_as is None:  # no one-device program to set beside it
            continue
        one_device = result["latency_ms"][distributed.same_program_as]
        for label, stats in result["latency_ms"][distributed.name].items():
            if label in one_device:
                print(
                    f"bench: {label}: {mesh_label(meshes[distributed.name])} on "
                    f"{meshes[distributed.name]['platform']} p50 {stats['p50']:.3g} ms vs "
                    f"{distributed.same_program_as} (one device) {one_device[label]['p50']:.3g} ms"
                )
