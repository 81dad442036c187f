"""Diagnosis: when a check fails, find the first stage, layer and leaf that diverge.

The protocol of MISSION.md ("Diagnosing a divergence"), run in its order. Each stage is
either ruled out, with the evidence that rules it out, or the first to diverge:

1. ``data`` — data and preprocessing: every case file matches its manifest's sha256;
   the cases re-derive from the prepared splits (:func:`regression_cases`); the prepared
   rows re-derive from the raw source (anonymization keeps the numbers, the key stream
   chooses the rows); a model's own preprocessing steps (``Model.preprocessing``) agree
   between the paths.
2. ``key_stream`` — the named subkeys are reproducible and distinct; ``init`` consumes
   no key twice (``jax_debug_key_reuse``), is a function of its key alone, and draws no
   two params leaves from one key (a reused key repeats the same random numbers).
3. ``shapes`` — params tree structure and every leaf's shape and dtype against the
   model's contract; every layer's activation shape and dtype in every path, evaluated
   abstractly (``jax.eval_shape``); the recorded output contract and refusals.
4. ``forward`` — without jit: the forms the model provides (loop, vmap, vmap_of_jit, and
   direct when it has a hand-batched forward), on a minimal input (one row) first, then
   the failing case; layer by layer, the first layer where two paths disagree or a
   non-finite value appears. A path the model does not provide is named as such in the
   report (``not_provided``), never said to agree.
5. ``loss``, 6. ``gradients`` (every leaf), 7. ``update`` (one optax step, every leaf):
   eager, the per-example loop against the batched forms, on inputs with targets.
8. ``jit`` — the transformations added back one at a time: each path under ``jax.jit``
   against its eager form, per layer; the loss gradients under jit.
9. ``backend`` — the run's stored outputs (computed on its backend) against the same
   paths recomputed here, on CPU.
10. ``sharding`` — the run's ``sharded_jit`` against its ``vmap_jit`` (same backend).
11. ``reference`` — this run against the stored verified run (versions, backend).

The protocol stops at the first stage that diverges: later stages inherit that
divergence and would only repeat it. Every numeric comparison records the max absolute
and relative error, the distance in ULPs (units in the last place of the compared dtype)
and the tolerance it used, which is always the run's own setting, never widened.
Non-finite values are located, never masked (no ``nan_to_num``). Nothing here writes
an input value: only error figures, shapes, dtypes and indices.

``vmapcheck diagnose`` (:func:`on_demand`; ``make diagnose``) runs it on demand against
the current outputs; the ``check`` stage runs it whenever a check fails
(``reports/diagnosis.json`` and ``reports/diagnosis.txt``, :func:`for_check`).

The package, in the protocol's order: :mod:`.subject` (what the diagnosis runs on, the
stages and their results), :mod:`.layers` (the layer-by-layer walk), :mod:`.inputs`
(stages 1-3), :mod:`.numerics` (stages 4-8), :mod:`.runs` (stages 9-11) and
:mod:`.protocol` (the stages run in order, on a project, and the report).
"""

from vmapcheck.check.diagnosis.inputs import data_stage, key_stream_stage, shapes_stage
from vmapcheck.check.diagnosis.numerics import (
    forward_stage,
    gradients_stage,
    jit_stage,
    loss_stage,
    update_stage,
)
from vmapcheck.check.diagnosis.protocol import (
    diagnose,
    diagnose_project,
    for_check,
    not_needed,
    on_demand,
    probes_for,
    render_text,
    write_report,
)
from vmapcheck.check.diagnosis.runs import backend_stage, reference_stage, sharding_stage
from vmapcheck.check.diagnosis.subject import (
    STAGE_NAMES,
    STAGES,
    DataSources,
    Probe,
    StoredRun,
    Subject,
)

__all__ = [
    "STAGES",
    "STAGE_NAMES",
    "DataSources",
    "Probe",
    "StoredRun",
    "Subject",
    "backend_stage",
    "data_stage",
    "diagnose",
    "diagnose_project",
    "for_check",
    "forward_stage",
    "gradients_stage",
    "jit_stage",
    "key_stream_stage",
    "loss_stage",
    "not_needed",
    "on_demand",
    "probes_for",
    "reference_stage",
    "render_text",
    "shapes_stage",
    "sharding_stage",
    "update_stage",
    "write_report",
]
