"""The shipped Hydra config groups (backend, bench, data, guard, model, precision,
tracking, train): a project's ``conf/config.yaml`` puts this package on Hydra's search
path (``hydra.searchpath: [pkg://vmapcheck.conf]``), so ``-S model=flax_mlp`` finds them
while the project's own ``conf/<group>/<option>.yaml`` files come first."""

# Config files only, no module: nothing to import from it.
__all__: list[str] = []
