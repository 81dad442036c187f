"""The printed verdict's reference line (vmapcheck.report.summary): a failed comparison
with the stored reference names its worst figure and bound, and always has a
``failure:`` line, however many pairs failed before it."""

from vmapcheck.bench.timing.budget import BUDGET_SETTING
from vmapcheck.check.kinds import finding, finding_lines
from vmapcheck.pipeline.check import gradients_line
from vmapcheck.report.summary import bench_budget_caveat, case_line, reference_line

MESSAGE = "reference made with jax 0.11.2 on cpu, compared with jax 0.10.2 on tpu"


def _result(max_abs: float, max_rel: float, ratio: float) -> dict:
    return {"max_abs": max_abs, "max_rel": max_rel, "bound_ratio": ratio, "rule": "terms"}


def test_a_failed_reference_names_its_worst_case_path_and_bound():
    reference = {
        "passed": False,
        "message": MESSAGE,
        "cases": {
            "standard": {
                "vmap_jit": _result(1e-3, 2e-3, 4.5),
                "loop_jit": _result(1e-6, 1e-6, 0.1),
            },
            "zeros": {"vmap_jit": _result(0.0, 0.0, 0.0)},
        },
    }
    line = reference_line(reference)
    assert line.startswith(f"  FAIL reference        {MESSAGE}; worst: standard/vmap_jit ")
    assert line.endswith(
        "worst: standard/vmap_jit bound_ratio=4.5 max_rel=0.002 max_abs=0.001 (rule terms)"
    )


TOLERANCE = {"rtol": 1e-5, "atol": 1e-6, "scale": "output"}


def test_a_case_line_leads_with_the_bound_ratio_then_max_rel_and_max_abs():
    """Issue 35 (7): the figure that decides first, so that a large max_rel of values
    within atol is never read as the verdict."""
    case = {
        "passed": True,
        "shape": [8, 4],
        "max_abs": 2e-10,
        "max_rel": 1.66,
        "bound_ratio": 0.00025,
        "scale_at_worst": 3e-9,  # rtol * S = 3e-14, far under atol: atol decided
        "rule": "output",
    }
    line = case_line("examples", case, TOLERANCE)
    assert line == (
        "  ok   examples         [8x4] worst pair: bound_ratio=0.00025 (atol decided) "
        "max_rel=1.66 max_abs=2e-10 (rule output)"
    )
    # Where rtol * S outweighs atol, the ratio is rtol's: nothing more is said.
    line = case_line("examples", {**case, "scale_at_worst": 10.0}, TOLERANCE)
    assert "worst pair: bound_ratio=0.00025 max_rel=1.66 max_abs=2e-10" in line


def test_the_gradient_line_leads_with_its_bound_ratio_and_leaf():
    """The transformer's gradient line read ``max_rel=1.66`` and ``ok`` (issue 35): the
    gradient of attn.key.bias is about 2e-10, under atol. It now shows the figure that
    decided first, at the leaf where it is reached."""
    grads = {
        "status": "ok",
        "passed": True,
        "loss": 2.3456,
        "max_abs": 4e-10,
        "max_rel": 1.66,
        "bound_ratio": 0.00025,
        "scale_at_worst": 1e-10,
        "worst_pair": "attn.key.bias",
        "per_example_vs_batch": {
            "attn.key.bias": {"max_rel": 1.66, "max_abs": 2e-10, "bound_ratio": 0.00025},
            "attn.key.kernel": {"max_rel": 1e-6, "max_abs": 4e-10, "bound_ratio": 0.0001},
        },
    }
    line = gradients_line(grads, TOLERANCE)
    assert line == (
        "  ok   gradients        mean per-example vs batch gradient (leaf by leaf): "
        "bound_ratio=0.00025 (attn.key.bias; atol decided) max_rel=1.66 (attn.key.bias) "
        "max_abs=4e-10 (attn.key.kernel); loss 2.346; NaN target detected"
    )


def test_a_passed_or_uncompared_reference_keeps_its_one_clause():
    passed = {"passed": True, "message": MESSAGE, "cases": {"standard": {"x": _result(0, 0, 0)}}}
    assert reference_line(passed) == f"  ok   reference        {MESSAGE}"
    corrupt = {"passed": False, "message": "corrupt: outputs.npz unreadable", "status": "corrupt"}
    assert reference_line(corrupt) == "  FAIL reference        corrupt: outputs.npz unreadable"


def test_the_references_first_failure_is_shown_after_many_pair_failures():
    pairs = [f"standard/loop_eager-vs-direct_jit: row {i}" for i in range(40)]
    failures = [*pairs, "reference/standard/vmap_jit: 4.5 of its bound", "reference/zeros/x: y"]
    batching = [f"failure: [batching] {p}" for p in pairs]

    def shown(lines):
        kinds = ["numerical" if line.startswith("reference") else "batching" for line in lines]
        found = [finding(kind, line) for kind, line in zip(kinds, lines, strict=True)]
        return finding_lines({"findings": found, "failures": lines})

    assert shown(failures) == [
        *batching[:10],
        "failure: [numerical] reference/standard/vmap_jit: 4.5 of its bound",
    ]
    assert shown(pairs) == batching[:10]
    assert shown(["reference: corrupt: x", *pairs]) == [
        "failure: [numerical] reference: corrupt: x",
        *batching[:9],
    ]
    # A report from before the kinds: its failure lines, untagged.
    assert finding_lines({"failures": pairs[:2]}) == [f"failure: {p}" for p in pairs[:2]]


def _budget_reason(path: str, rows: int) -> str:
    return (
        f"{path} left out at {rows} rows: compiling it would take about 40 s (as vmap_jit "
        f"took at this size), more than the 3 s left of the bench's budget of 75 s "
        f"({BUDGET_SETTING}; compiling and warm-up count)"
    )


def _bench(left_out: dict[str, list[int]], speedup: dict[str, dict[str, float]]) -> dict:
    """bench_details.json of the full profile, its budget having left ``left_out`` out."""
    skipped = {
        path: {f"b{rows}": _budget_reason(path, rows) for rows in sizes}
        for path, sizes in left_out.items()
    }
    # A cap is no budget: never in the caveat.
    skipped["loop_jit"] = {"b1024": "loop_jit capped at 256 rows (bench.loop_max_batch)"}
    return {
        "bench": {"batch_sizes": [1, 16, 256, 1024, 4096], "loop_max_batch": 256},
        "speedup": speedup,
        "skipped": skipped,
        "early_stop": {"settings": {"time_budget_s": 75.0}, "cells": {}},
    }


def test_a_bench_whose_budget_left_out_the_headline_says_it_measured_too_little():
    """Issue 43: under load, `-S bench=full` left every vmap and direct path out above 16
    rows, and the verdict said only `stopped early` beside PASSED."""
    bench = _bench(
        {"vmap_jit": [256, 1024, 4096], "direct_jit": [256, 1024, 4096], "vmap_eager": [4096]},
        {"b16": {"vmap_over_loop": 3.0}, "b256": {}},
    )
    assert bench_budget_caveat(bench) == (
        "the benchmark measured too little to compare speeds: vmap_jit, direct_jit left out "
        "at 256, 1024, 4096 rows; vmap_eager left out at 4096 rows by its time budget "
        f"(raise {BUDGET_SETTING}, 75 s in this run, to time them)"
    )


def test_a_bench_whose_budget_left_every_path_out_says_so_in_two_words():
    bench = _bench({"vmap_jit": [16, 256], "direct_jit": [16, 256]}, {})
    bench["skipped"].pop("loop_jit")  # the two paths are all the bench had
    assert bench_budget_caveat(bench) == (
        "the benchmark measured too little to compare speeds: every path left out at 16, "
        f"256 rows by its time budget (raise {BUDGET_SETTING}, 75 s in this run, to time them)"
    )


def test_a_bench_that_measured_its_headline_names_what_its_budget_left_out():
    bench = _bench({"direct_jit": [4096]}, {"b256": {"vmap_over_loop": 3.0}})
    assert bench_budget_caveat(bench) == (
        "the benchmark left paths untimed: direct_jit left out at 4096 rows by its time "
        f"budget (raise {BUDGET_SETTING}, 75 s in this run, to time them)"
    )


def test_a_bench_its_budget_cut_nothing_of_has_no_caveat():
    assert bench_budget_caveat(_bench({}, {"b256": {"vmap_over_loop": 3.0}})) is None
    assert bench_budget_caveat(None) is None
