"""The handful of figures a reviewer reads first, computed in one place.

The same figures are the DVC metrics (`dvc exp show`, `dvc metrics diff`), the MLflow
run's summary metrics (logged as ``_summary/*`` with ``@`` spelled ``_at_``, since MLflow
sorts names as text and refuses ``@``: vmapcheck.tracking.log) and the first screen of the
HTML report. They are computed from the detail reports (``check_details.json``,
``bench_details.json``), so every surface says the same thing.

Batch labels are zero-padded (:func:`batch_label`) so that ``b0016`` sorts before
``b0128`` wherever names are sorted as text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from vmapcheck.core.paths import SPEEDUPS

# Types only: the bench stage draws its headline from here, and needs no check schema.
if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import BenchDetails
    from vmapcheck.check.schema import CheckDetails

# Zero-padding width of a batch label: 4 digits hold the shipped profiles (up to 4,096
# rows); a larger batch simply gets more digits.
_BATCH_DIGITS = 4

# The speed-ups a reviewer compares, in the order shown: every SPEEDUPS entry.
HEADLINE_SPEEDUPS = tuple(speedup.name for speedup in SPEEDUPS)


class WorstPair(TypedDict):
    """The pair of forwards that disagree most (:func:`worst_pair`)."""

    case: str
    pair: str  # "<left> vs <right>"
    max_abs: float | None
    max_rel: float
    bound_ratio: float | None


class WorstPath(TypedDict):
    """The forward furthest from the float64 oracle or the stored reference."""

    case: str
    path: str
    max_rel: float


class VsReference(TypedDict):
    """The stored reference's comparison: its status, worst max_rel and verdict, and
    the case and path of the worst (None: not compared)."""

    status: str | None
    max_rel: float | None
    passed: bool | None
    case: str | None
    path: str | None


class CheckHeadline(TypedDict):
    """The agreement figures a reviewer reads first (:func:`check_headline`)."""

    passed: bool
    n_failures: int
    worst: WorstPair | None
    vs_reference: VsReference
    vs_float64: WorstPath | None
    invalid_refused: int
    invalid_total: int


class SpeedupFigure(TypedDict):
    """One headline speed-up: the ratio and its confidence interval ([low, high]; None:
    none computed)."""

    ratio: float
    ci: list[float] | None


class BenchHeadline(TypedDict):
    """The speed-ups at the headline batch (:func:`bench_headline`; None: no batch), by
    name, and the reason the bench gave for each left out."""

    batch: int | None
    speedups: dict[str, SpeedupFigure]
    left_out: dict[str, str]


def batch_label(batch_size: int) -> str:
    """``b0128`` for 128 rows: sorts as text in numeric order."""
    return f"b{batch_size:0{_BATCH_DIGITS}d}"


def batch_from_label(label: str) -> int:
    """The row count of a label, padded (``b0128``) or not (``b128``)."""
    return int(label.lstrip("b"))


def worst_pair(check: CheckDetails) -> WorstPair | None:
    """The pair of forwards that disagree most (by max relative error) over every case.

    Returns ``{"case", "pair", "max_abs", "max_rel", "bound_ratio"}`` or None when no case
    produced comparable outputs."""
    worst: WorstPair | None = None
    for case_name, case in check["cases"].items():
        for pair_name, pair in case.get("pairs", {}).items():
            rel = pair.get("max_rel")
            if rel is None:
                continue
            if worst is None or rel > worst["max_rel"]:
                worst = {
                    "case": case_name,
                    "pair": pair_name.replace("-vs-", " vs "),
                    "max_abs": pair.get("max_abs"),
                    "max_rel": rel,
                    "bound_ratio": pair.get("bound_ratio"),
                }
    return worst


def worst_bound_ratio(check: CheckDetails) -> float | None:
    """The figure the agreement check is decided by: the largest bound ratio (``|a - b|``
    over the bound of vmapcheck.core.compare's tolerance rule) of any pair of forwards in
    any case (above 1 fails). Not always :func:`worst_pair`'s: a pair with a large relative
    error on outputs near 0 sits under its ``atol``. None when no pair has one."""
    ratios = [
        float(ratio)
        for case in check["cases"].values()
        for pair in case.get("pairs", {}).values()
        if (ratio := pair.get("bound_ratio")) is not None
    ]
    return max(ratios) if ratios else None


def worst_vs_float64(check: CheckDetails) -> WorstPath | None:
    """The forward furthest from the float64 oracle: ``{"case", "path", "max_rel"}``."""
    worst: WorstPath | None = None
    for case_name, case in check["cases"].items():
        for path, result in case.get("oracle", {}).items():
            rel = result.get("max_rel")
            if rel is not None and (worst is None or rel > worst["max_rel"]):
                worst = {"case": case_name, "path": path, "max_rel": rel}
    return worst


def worst_vs_reference(check: CheckDetails) -> WorstPath | None:
    """The forward furthest from the stored reference: ``{"case", "path", "max_rel"}``;
    None when the reference was not compared (missing, stale) or gave no figure."""
    worst: WorstPath | None = None
    for case_name, by_path in check.get("reference", {}).get("cases", {}).items():
        for path, result in by_path.items():
            rel = result.get("max_rel")
            if rel is not None and (worst is None or rel > worst["max_rel"]):
                worst = {"case": case_name, "path": path, "max_rel": rel}
    return worst


def check_headline(check: CheckDetails) -> CheckHeadline:
    """The agreement figures of ``check_details.json`` a reviewer reads first.

    Keys: ``passed``, ``n_failures``, ``worst`` (:func:`worst_pair`), ``vs_reference``
    (``{"status", "max_rel", "passed", "case", "path"}``; case and path from
    :func:`worst_vs_reference`, None when not compared), ``vs_float64`` (:func:`worst_vs_float64`),
    ``invalid_refused`` and ``invalid_total`` (invalid-input cases refused by every
    path)."""
    negative = check.get("negative", {})
    reference = check.get("reference", {})
    where = worst_vs_reference(check)
    return {
        "passed": bool(check["passed"]),
        "n_failures": len(check.get("failures", [])),
        "worst": worst_pair(check),
        "vs_reference": {
            "status": reference.get("status"),
            "max_rel": reference.get("max_rel"),
            "passed": reference.get("passed"),
            "case": where["case"] if where else None,
            "path": where["path"] if where else None,
        },
        "vs_float64": worst_vs_float64(check),
        "invalid_refused": sum(bool(n.get("passed")) for n in negative.values()),
        "invalid_total": len(negative),
    }


def noisy_caveat(bench: Mapping[str, Any]) -> str | None:
    """The caveat of a benchmark timed on a busy machine (its load average above the
    usable cores, before or after: ``bench_details.json``'s ``machine``), with the load;
    None when it was not busy or no conditions were recorded."""
    conditions = bench.get("machine") or {}
    if not conditions.get("noisy"):
        return None
    before, after = conditions["before"], conditions["after"]
    cores = before["usable_cores"]
    # The load sampled from the bench's start to its end (compile, warm-up, timing,
    # replays), the figure that made it noisy; a record from before the sampling has
    # the snapshots before and after the timing only.
    during = conditions.get("during") or {}
    load = during.get("load_avg_1m")
    if load:
        return (
            f"speed figures noisy: load average {load['min']:.1f}-{load['max']:.1f} on {cores} "
            f"usable cores over the whole benchmark ({', '.join(during['covers'])}; "
            f"{during['span_s']:.0f} s)"
        )
    load = max(before["load_avg_1m"], after["load_avg_1m"])
    return (
        f"speed figures noisy: load average {load:.1f} on {cores} usable cores during the benchmark"
    )


def headline_batch(bench: BenchDetails) -> int | None:
    """The batch size the headline speed-ups are read at, fixed by the bench profile
    (``bench_details.json``'s ``bench``), never by what ran: the largest of its
    ``batch_sizes`` within ``loop_max_batch`` (where the loop is planned), else its
    largest. A cell left out there (a budget, a compile) leaves its figure empty, not
    the headline moved to another size. A record without its profile (older runs): the
    largest batch where vmap over the loop was measured, else any speed-up."""
    profile = bench.get("bench") if isinstance(bench.get("bench"), dict) else {}
    sizes = profile.get("batch_sizes")
    if sizes:
        cap = profile.get("loop_max_batch")
        within = [b for b in sizes if cap is None or b <= cap]
        return max(within or sizes)
    speedups = bench.get("speedup", {})
    with_loop = [batch_from_label(b) for b, r in speedups.items() if "vmap_over_loop" in r]
    measured = with_loop or [batch_from_label(b) for b in speedups]
    return max(measured) if measured else None


def bench_headline(bench: BenchDetails) -> BenchHeadline:
    """The speed-ups at :func:`headline_batch`, each with its confidence interval.

    Returns ``{"batch": int | None, "speedups": {name: {"ratio", "ci"}}}``; ``ci`` is
    ``[low, high]`` or None. Names are those of :data:`HEADLINE_SPEEDUPS` measured."""
    batch = headline_batch(bench)
    if batch is None:
        return {"batch": None, "speedups": {}, "left_out": {}}
    # bench_details.json may label batches either way (older runs: unpadded).
    label = next((b for b in bench.get("speedup", {}) if batch_from_label(b) == batch), None)
    ratios = bench.get("speedup", {}).get(label, {}) if label else {}
    intervals = bench.get("speedup_ci", {}).get(label, {}) if label else {}
    return {
        "batch": batch,
        "speedups": {
            name: {"ratio": ratios[name], "ci": intervals.get(name)}
            for name in HEADLINE_SPEEDUPS
            if name in ratios
        },
        # The figures the bench left out there, with the reason it gave (a record that
        # never timed a path, e.g. from before it existed, says nothing).
        "left_out": {
            name: why
            for name in HEADLINE_SPEEDUPS
            if name not in ratios and (why := _why_left_out(bench, name, batch))
        },
    }


def _why_left_out(bench: BenchDetails, name: str, batch: int) -> str | None:
    """The reason the bench gave for leaving out one of speed-up ``name``'s paths at
    ``batch``, or None."""
    entry = next((s for s in SPEEDUPS if s.name == name), None)
    paths = (entry.slower, entry.faster) if entry is not None else ()
    skipped = bench.get("skipped", {})
    for path in paths:
        for label, why in (skipped.get(path) or {}).items():
            if batch_from_label(label) == batch:
                return str(why)
    return None


def summary_metrics(check: CheckDetails, bench: BenchDetails | None = None) -> dict[str, float]:
    """The run's summary metrics, named ``summary/...`` so they sort first in MLflow.

    Only measured figures appear: a figure that does not exist for this run (no
    reference yet, no float64 oracle, no benchmark) is left out, never logged as 0."""
    head = check_headline(check)
    metrics: dict[str, float] = {
        "summary/passed": float(head["passed"]),
        "summary/n_failures": float(head["n_failures"]),
        "summary/invalid_refused": float(head["invalid_refused"]),
        "summary/invalid_total": float(head["invalid_total"]),
    }
    if head["worst"] is not None:
        metrics["summary/worst_max_rel"] = float(head["worst"]["max_rel"])
    bound = worst_bound_ratio(check)
    if bound is not None:
        metrics["summary/worst_bound_ratio"] = bound
    if head["vs_reference"]["max_rel"] is not None:
        metrics["summary/worst_vs_reference_max_rel"] = float(head["vs_reference"]["max_rel"])
    if head["vs_float64"] is not None:
        metrics["summary/worst_vs_f64_max_rel"] = float(head["vs_float64"]["max_rel"])
    speed = bench_headline(bench) if bench is not None else None
    if speed is not None and speed["batch"] is not None:  # no batch: no speed-ups either
        for name, figure in speed["speedups"].items():
            metrics[f"summary/{name}@{batch_label(speed['batch'])}"] = float(figure["ratio"])
    return metrics
