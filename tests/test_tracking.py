"""MLflow metric names: one sortable scheme, always valid for MLflow."""

import re

from vmapcheck.tracking.log import collect_metrics, metric_name

VALID = re.compile(r"^[\w.\- :/]+$")  # what MLflow accepts in a metric name


def test_leaf_paths_become_valid_metric_names():
    assert metric_name("gradients/layers[0].W/max_abs") == "gradients/layers.0.W/max_abs"
    assert VALID.match(metric_name("odd~name[1]"))


def test_collected_metrics_are_all_valid_names():
    check = {
        "passed": True,
        "failures": [],
        "cases": {
            "standard": {
                "passed": True,
                "pairs": {"loop_eager-vs-vmap_jit": {"max_abs": 0.0, "max_rel": 0.0}},
            }
        },
        "negative": {},
        "reference": {"status": "missing", "passed": False},
        "gradients": {
            "status": "ok",
            "passed": True,
            "loss": 0.5,
            "nan_probe": {"loss_finite": False, "grads_finite": False},
            "per_example_vs_batch": {"layers[0].W": {"max_abs": 1e-8, "max_rel": 1e-7}},
        },
    }
    bench = {"latency_ms": {}, "figures": {}, "speedup": {}}
    metrics = collect_metrics(check, bench, {"val_loss": 0.1})
    assert "gradients/layers.0.W/max_rel" in metrics
    assert metrics["gradients/nan_probe_detected"] == 1.0
    assert all(VALID.match(name) for name in metrics)
