"""The one line a failed job ends with: the rank whose error came first, and that error.

The first error is the cause; the other ranks fail after it, on the lost connection. A rank
that dies without a word (os._exit, SIGKILL, the OOM killer) records nothing: then the silent
ranks (named with their node, on several machines: the run folder is shared, so every node
sees every rank's error), or torchrun's own report of the first rank that exited, name the
likely cause. A launcher killed from outside is named itself.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from layerwise.strategies.files.locations import ERRORS_DIR, LOG_FILE
from layerwise.strategies.jobs.run_folder import node_file_name
from layerwise.strategies.runtime.divergence import LossDiverged

_DIVERGED = f"{LossDiverged.__name__}: "  # how a rank records the divergence it stopped on

# How gloo and NCCL report a peer that went away: a consequence, not a cause.
_PEER_LOST = re.compile(r"closed by peer|reset by peer|remote (worker|process)", re.IGNORECASE)
# torchrun's failure report (ChildFailedError): the rank and exit code of its first failure.
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)\s*"
                         r"\(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)


# a rank's error as it records it: {"rank": R, "time": seconds since the epoch, "error": line}
RankFailure = dict[str, Any]


def failure_line(out: Path, code: int, nproc: int, nnodes: int = 1,
                 node_rank: int = 0, unwritten: Sequence[RankFailure] = ()) -> str:
    """The rank whose error came first (the cause; the others fail after it) and its error,
    for node `node_rank` of a run of `nnodes` x `nproc` processes in `out` whose torchrun
    exited with `code`.

    A rank that was killed records nothing, and its peers then fail on the lost connection;
    then the silent ranks are named as the likely cause. `unwritten` are the errors ranks could
    not write to the run folder (a full disk) and said to the launcher instead.
    """
    log = out / node_file_name(LOG_FILE, node_rank)
    where = f"torchrun exit code {code}; log: {log}"
    if code < 0:
        return (f"training failed: torchrun was killed ({_signal_name(-code)}), and its "
                f"workers with it ({where})")
    failures = list(unwritten)
    for path in sorted((out / ERRORS_DIR).glob("rank*.json")):
        try:
            failures.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    silent = sorted(set(range(nproc * nnodes)) - {failure["rank"] for failure in failures})
    if not failures:
        return _unrecorded_failure(log, where)
    first = min(failures, key=lambda failure: failure["time"])
    if first["error"].startswith(_DIVERGED):  # every rank stopped on it: no rank to blame
        return f"training stopped: {first['error'].removeprefix(_DIVERGED)} ({where})"
    if silent and _PEER_LOST.search(first["error"]):
        return (f"training failed: {_ranks(silent, nproc, nnodes)} stopped without an error "
                f"(killed, or out of memory?), then rank {first['rank']} lost it: "
                f"{first['error']} ({where})")
    return f"training failed: rank {first['rank']} failed first: {first['error']} ({where})"


def _ranks(ranks: list[int], nproc: int, nnodes: int) -> str:
    """'rank 1, 2', or on several nodes 'rank 2, 3 (node 1)'."""
    if nnodes == 1:
        return "rank " + ", ".join(map(str, ranks))
    by_node = groupby(ranks, key=lambda rank: rank // nproc)
    return "; ".join(f"rank {', '.join(map(str, group))} (node {node})"
                     for node, group in by_node)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _unrecorded_failure(log: Path, where: str) -> str:
    """The failure line when no rank wrote an error: torchrun's own first failure, if logged.

    torchrun can notice a silent death before the peers notice the lost connection; it then
    stops them (SIGTERM) and they record nothing either. Its report names the first rank that
    exited.
    """
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    causes = _ROOT_CAUSE.findall(text)
    if not causes:
        return f"training failed: no rank recorded an error (a process was killed?) ({where})"
    rank, exit_code = causes[-1]  # the log gathers every launch of a resumed run
    return (f"training failed: rank {rank} stopped without an error (exit code {exit_code}: "
            f"killed, or out of memory?); torchrun then stopped the other ranks ({where})")
