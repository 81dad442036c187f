"""What a run shows: the headline figures, the plots, the HTML report and the printed
summary.

Its public modules, the ones other floors import (imported from the module: importing
this package loads no JAX, as the track stage and ``vmapcheck summary`` need):
``headline``, ``plots``, ``html``, ``summary``, ``elements`` (the report's pieces shared
by the HTML and the Python API's summary) and ``check_sections``. ``bench_sections`` and
``failures`` are parts of ``html`` and ``summary``: no other floor imports them.
"""

__all__ = ["check_sections", "elements", "headline", "html", "plots", "summary"]
