"""The printed verdict's reference line (vmapcheck.report.summary): a failed comparison
with the stored reference names its worst figure and bound, and always has a
``failure:`` line, however many pairs failed before it."""

from vmapcheck.report.summary import reference_line, shown_failures

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
    assert "max_abs=0.001 max_rel=0.002 (4.5 of its bound, rule terms)" in line


def test_a_passed_or_uncompared_reference_keeps_its_one_clause():
    passed = {"passed": True, "message": MESSAGE, "cases": {"standard": {"x": _result(0, 0, 0)}}}
    assert reference_line(passed) == f"  ok   reference        {MESSAGE}"
    corrupt = {"passed": False, "message": "corrupt: outputs.npz unreadable", "status": "corrupt"}
    assert reference_line(corrupt) == "  FAIL reference        corrupt: outputs.npz unreadable"


def test_the_references_first_failure_is_shown_after_many_pair_failures():
    pairs = [f"standard/loop_eager-vs-direct_jit: row {i}" for i in range(40)]
    failures = [*pairs, "reference/standard/vmap_jit: 4.5 of its bound", "reference/zeros/x: y"]
    shown = shown_failures(failures)
    assert shown == [*pairs[:10], "reference/standard/vmap_jit: 4.5 of its bound"]
    assert shown_failures(pairs) == pairs[:10]
    assert shown_failures(["reference: corrupt: x", *pairs]) == [
        "reference: corrupt: x",
        *pairs[:9],
    ]
