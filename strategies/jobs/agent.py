"""torchrun whose ranks are forked from its agent: the process a launch starts.

    python -m layerwise.strategies.jobs.agent --nproc-per-node 2 --max-restarts 0 \\
        -m layerwise.strategies.runtime.worker --out runs/RUN --steps 100

It takes torchrun's own arguments and runs torchrun's elastic agent (rendezvous, monitoring,
stopping every rank when one fails, its report), with one change: `-m MODULE` is imported once,
here, and each rank is a fork of this process running `MODULE.main(argv)`, instead of a fresh
interpreter that imports torch and the runtime again. That import is seconds per rank (torch,
and sympy, which autograd loads at its first backward with explicit gradients) against
milliseconds of a fork, and a launch pays it once instead of once per rank; the ranks are still
separate processes with their own address space, joined through torch.distributed as before.
torchrun itself offers a forking start only to Python callers of its launcher API, so this
module is that caller.

The agent never initialises CUDA (a rank picks its GPU after the fork), which is what makes
forking safe on GPUs: CUDA cannot be used in a child of a process that initialised it. torchrun's
launch config asks `torch.cuda.is_available()`, whose default check initialises the driver and
so poisons every later fork (seen on an H200: each rank failed with "Cannot re-initialize CUDA in
forked subprocess"); the agent asks for torch's NVML-based check instead, which counts the
devices without touching CUDA.

A forked rank starts with the agent's signal handlers, which turn SIGTERM into an exception;
it gets a fresh interpreter's back (SIGTERM ends it, Ctrl-C raises KeyboardInterrupt), so a
rank stops exactly as a spawned one did. The nodes' rendezvous backend
(strategies/hardware/node_rendezvous.py) is registered for runs on several machines.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args

from layerwise.strategies.hardware.node_rendezvous import BACKEND, create_handler
from layerwise.strategies.processes.quick_exit import freeze_at_exit

START_METHOD = "fork"
# torch's switch for an availability check through NVML, which does not initialise CUDA
NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
# Imported by every rank anyway, so imported once before the ranks fork: autograd loads
# torch's symbolic shapes (and sympy with them, ~0.6 s) at its first backward that is handed
# gradients, which the layer-wise executor's per-layer backward is.
PRELOADED = ("torch.fx.experimental.symbolic_shapes",)


class _Rank:
    """A rank's entry: fresh-interpreter signal handling, then the module's `main(argv)`.
    A class (not a closure) so that torchrun's report names the module that failed."""

    def __init__(self, module: str) -> None:
        self.__name__ = self.__qualname__ = module
        self._main: Callable[[list[str]], object] = importlib.import_module(module).main

    def __call__(self, argv: list[str]) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._main(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """torchrun's main for a `-m MODULE` whose `main(argv)` each forked rank runs."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    freeze_at_exit()  # the ranks end with os._exit; the agent would spend seconds collecting
    if not args.module:
        raise SystemExit("layerwise's agent starts a module's ranks: give -m MODULE")
    rendezvous_handler_registry.register(BACKEND, create_handler)
    os.environ[NVML_CUDA_CHECK] = "1"
    config, _, _ = config_from_args(args)
    config.start_method = START_METHOD
    for preloaded in PRELOADED:
        importlib.import_module(preloaded)
    elastic_launch(config=config, entrypoint=_Rank(args.training_script))(
        list(args.training_script_args))


if __name__ == "__main__":
    main()
