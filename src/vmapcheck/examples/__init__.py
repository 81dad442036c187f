"""Worked "bring your own model" examples: factories returning a
:class:`vmapcheck.core.models.Model`.

- :mod:`vmapcheck.examples.flax_mlp`: an MLP written with Flax NNX (``pip install -e '.[flax]'``);
  provides ``forward_one`` and a hand-batched ``forward_batch`` (all six paths).
- :mod:`vmapcheck.examples.equinox_mlp`: an MLP written with Equinox
  (``pip install -e '.[equinox]'``); provides ``forward_one`` only, so the ``direct`` paths
  are reported as not provided.
- :mod:`vmapcheck.examples.haiku_cnn`: a dm-haiku ConvNet with ``hk.BatchNorm``
  (``pip install -e '.[haiku]'``); its Haiku state is folded into the params and declared
  (``Model.state_leaves``, docs/state-leaves.md).

Each module imports its framework at import time; it is imported only when a config names
it (``conf/model/flax_mlp.yaml``, ``conf/model/equinox_mlp.yaml``). See docs/own-model.md.
"""

# The example models, each named by a config (its framework is imported with it);
# ``images`` is the image models' shared part.
__all__ = [
    "equinox_mlp",
    "flax_cnn",
    "flax_mlp",
    "flax_transformer",
    "haiku_cnn",
    "keras_model",
    "mc_dropout",
    "resnet",
    "slow_mlp",
    "two_tower",
]
