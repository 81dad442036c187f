"""The data: sources, anonymization, the prepared splits and the regression cases.

Its public modules, the ones other floors import (imported from the module: importing
this package loads no JAX): ``regression`` (the regression cases of every case kind),
``splits`` (the prepared splits) and ``anonymize`` (the anonymization of a table).
``sources`` (the registry of data sources), ``builtin`` (the shipped tables) and
``git_guard`` (a table's file kept out of git) serve the prepare stage through them.
"""

__all__ = ["anonymize", "regression", "splits"]
