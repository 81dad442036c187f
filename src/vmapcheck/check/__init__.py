"""The checks of the forward record and the stored reference.

Its public modules, the ones other floors import (imported from the module: importing
this package loads no JAX):

- ``checks``: the check stage's judgment of every case (``run_checks``);
- ``rules``: the registry of case rules, what each case judges;
- ``kinds``: the kinds of finding (``batching``, ``numerical``, ``model``, ``contract``);
- ``schema``: ``reports/check_details.json`` typed (``CheckDetails`` and its parts);
- ``reference``: the stored reference outputs and their comparison across runs;
- ``diagnosis``: when a check fails, the first stage, layer and leaf that diverge.

``case_findings`` and ``probes`` are ``checks``' own parts: no other floor imports them.
"""

__all__ = ["checks", "diagnosis", "kinds", "reference", "rules", "schema"]
