"""The serving guard: a batched predictor that serves verified params, refusing what it
cannot serve, and its replay of a request stream.

Its public names, by module (imported from the module: importing this package loads no
JAX, so it re-exports nothing):

- ``predictor``: :class:`~vmapcheck.guard.predictor.Guard` (limits, validation, the
  ``jit(vmap)`` forward, the output check), ``REASONS``, ``INVALID_KINDS``,
  ``invalid_kinds``;
- ``replay``: the bench stage's replay through a guard (``request_stream``, ``replay``,
  ``run_replay``, ``replay_figures``, ``replay_summary``, ``REQUEST_CANARY``).

It stands a floor above :mod:`vmapcheck.bench`, whose sampling, latency figures and
progress it uses, and below :mod:`vmapcheck.tracking` (MLflow serving builds a Guard)
and :mod:`vmapcheck.pipeline` (the bench stage runs the replay). docs/guard.md
describes it.
"""

__all__ = ["predictor", "replay"]
