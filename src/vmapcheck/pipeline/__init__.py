"""The body of each DVC stage: ``vmapcheck.pipeline.<stage>.run(config, layout) -> exit code``.

``stages/<stage>.py`` (what dvc.yaml runs) only hands its config and the project's
:class:`~vmapcheck.layout.Layout` to ``run``; tests call ``run`` in-process.
"""
