"""Pure JAX: the model contract, the forward paths, the one tolerance rule and the
figures every check and benchmark is made of. It reads no file format (params_io does).

Every module is public, imported by a floor above (imported from the module: importing
this package loads no JAX). The ones a user meets first: ``models`` (:class:`Model`,
``build_model``), ``paths`` (the registry ``PATHS``), ``contract`` (input and output
contracts), ``cases`` (the registry ``CASE_KINDS``) and ``compare`` (the tolerance rule).
"""

__all__ = [
    "bitwise",
    "bitwise_verdict",
    "cases",
    "compare",
    "composition",
    "contract",
    "distributed",
    "forms",
    "forward",
    "gradients",
    "jit_cache",
    "keys",
    "leaves",
    "magnitude",
    "memory",
    "mesh",
    "models",
    "oracle",
    "paths",
    "record",
    "runtime",
    "state",
    "training",
]
