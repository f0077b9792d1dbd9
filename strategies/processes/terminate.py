"""SIGTERM handled as Ctrl-C is: an exception that unwinds the process.

Python's default SIGTERM ends the process at once: no `finally`, no context exit, no
multiprocessing finalizer. A launcher stopped so (by `timeout`, a scheduler, `kill`) would leave
its children to their parent-death signals and its semaphores to the resource tracker's
warning. Inside `terminate_as_exit` a SIGTERM raises SystemExit(143) instead; `join_or_kill`
then stops the processes the block started, which Python's exit would wait for.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from torch.multiprocessing import ProcessContext


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(128 + 15) while the block runs (main thread only, where
    Python allows handlers; elsewhere the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_then_join(start: Callable[[], ProcessContext],
                    between: Callable[[], None] = lambda: None) -> None:
    """Start processes (`start`, torch's start_processes) with Ctrl-C and SIGTERM held until
    every one of them exists, then `join_or_kill` them. A stop arriving while they start would
    otherwise unwind out of the start with the processes begun so far unknown to anyone: left
    to read their setup from a parent gone (tracebacks of EOFError and of a vanished
    semaphore on the terminal). Held, the stop is raised once the start returns, and the
    processes are killed as any stop kills them. Main thread only, as Python's handlers."""
    if threading.current_thread() is not threading.main_thread():
        join_or_kill(start(), between)
        return
    held: list[int] = []
    previous = {number: signal.signal(number, lambda signum, _frame: held.append(signum))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        workers = start()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    try:
        for number in held[:1]:  # the first stop, as its own handler takes it
            handler = previous[number]
            if callable(handler):
                handler(number, None)
            elif number == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                raise SystemExit(128 + number)
    except BaseException:
        for process in workers.processes:
            if process.is_alive():
                process.kill()
        raise
    join_or_kill(workers, between)


def join_or_kill(workers: ProcessContext, between: Callable[[], None] = lambda: None) -> None:
    """Wait for every process of `workers`, calling `between` while they run (torch's join
    raises the first failure). If this process is stopped meanwhile (Ctrl-C, or SIGTERM inside
    `terminate_as_exit`), they are killed before the exception goes on: Python's exit would
    otherwise wait for them to finish their work."""
    try:
        while not workers.join(timeout=0.1):
            between()
    except BaseException:
        for process in workers.processes:
            if process.is_alive():
                process.kill()
        raise
