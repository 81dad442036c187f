"""Your models: a package at the repository root that the stages import from (they run as
``python -m stages.<name>`` from the root) and that dvc.yaml declares as a dependency of
every stage that runs a model, so editing a file here reruns them. docs/own-model.md."""
