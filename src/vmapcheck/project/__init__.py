"""A user's project: the pipeline definition ``vmapcheck init`` writes into any git
repository (:mod:`vmapcheck.project.init`), and the record of which vmapcheck code each
stage ran (:mod:`vmapcheck.project.code`), through which DVC reruns the stages a new
vmapcheck changes."""

# What the CLI and the stages import; ``merge``, ``options``, ``model_choice``,
# ``data_choice`` and ``data_fit`` are parts of ``init``.
__all__ = [
    "code",
    "init",
    "plots_page",
]
