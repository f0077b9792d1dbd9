"""Exit without collecting the garbage of a process that imported torch, MLflow and Prefect.

Python's finalisation clears every module and runs the cyclic garbage collector over all the
objects still alive: millions of them once torch, sympy, MLflow, Prefect and the flow are
imported. `layerwise run` printed its last line 3 s before the process ended, and a process
that only imported those took 1.6-1.8 s to end (benchmarks/bench_exit.py). gc.freeze moves every
tracked object into CPython's permanent generation, which no collection visits, so the process
ends in a fraction of that; the operating system reclaims the memory either way.

What still runs: every exit handler (MLflow's and Prefect's flushes, logging's shutdown,
weakref.finalize callbacks such as temporary folders' removal), and every finaliser that
reference counting reaches when the modules are cleared (open files close and flush). What
does not: finalisers of objects in reference cycles, which Python does not promise to run at
exit anyway.
"""

from __future__ import annotations

import atexit
import gc


def freeze_at_exit() -> None:
    """Freeze every live object after the exit handlers registered later than this call
    (atexit runs them last-registered first), before Python's finalisation."""
    atexit.register(gc.freeze)
