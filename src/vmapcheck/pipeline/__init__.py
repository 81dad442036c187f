"""The body of each DVC stage: ``vmapcheck.pipeline.<stage>.run(config, layout) -> exit code``.

``stages/<stage>.py`` (what dvc.yaml runs) only hands its config and the project's
:class:`~vmapcheck.layout.Layout` to ``run``; tests call ``run`` in-process.
"""

# The stage bodies and what they share (``stage``); ``multiprocess`` is the forward
# stage's own part.
__all__ = [
    "bench",
    "check",
    "forward",
    "gate",
    "prepare",
    "stage",
    "track",
    "train",
]
