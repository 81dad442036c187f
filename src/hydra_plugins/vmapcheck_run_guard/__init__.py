"""Loaded by Hydra's plugin scan in every process that composes a config, DVC's own
included (``dvc exp run -S ...``): registers vmapcheck's resolver ``vmapcheck_idle``,
which refuses to compose params.yaml while a vmapcheck pipeline runs in the workspace
(:mod:`vmapcheck.running`). It defines no Hydra plugin class."""

from vmapcheck.running import register

register()
