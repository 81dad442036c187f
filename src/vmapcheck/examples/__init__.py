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
