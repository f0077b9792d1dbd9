"""The one line a failed job ends with: the rank whose error came first, and that error.

The first error is the cause; the other ranks fail after it, on the lost connection. A rank
that dies without a word (os._exit, SIGKILL, the OOM killer) records nothing: then the silent
ranks, or torchrun's own report of the first rank that exited, name the likely cause.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from strategies.jobs.launch import LOG_FILE
from strategies.runtime.divergence import LossDiverged
from strategies.runtime.worker import ERRORS_DIR

_DIVERGED = f"{LossDiverged.__name__}: "  # how a rank records the divergence it stopped on

# How gloo and NCCL report a peer that went away: a consequence, not a cause.
_PEER_LOST = re.compile(r"closed by peer|reset by peer|remote (worker|process)", re.IGNORECASE)
# torchrun's failure report (ChildFailedError): the rank and exit code of its first failure.
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)\s*"
                         r"\(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)


def failure_line(out: Path, code: int, local_ranks: range) -> str:
    """The rank whose error came first (the cause; the others fail after it) and its error.

    A rank that was killed records nothing, and its peers then fail on the lost connection;
    then the silent ranks of this node are named as the likely cause.
    """
    failures = []
    for path in sorted((out / ERRORS_DIR).glob("rank*.json")):
        try:
            failures.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    where = f"torchrun exit code {code}; log: {out / LOG_FILE}"
    silent = sorted(set(local_ranks) - {failure["rank"] for failure in failures})
    if not failures:
        return _unrecorded_failure(out / LOG_FILE, where)
    first = min(failures, key=lambda failure: failure["time"])
    if first["error"].startswith(_DIVERGED):  # every rank stopped on it: no rank to blame
        return f"training stopped: {first['error'].removeprefix(_DIVERGED)} ({where})"
    if silent and _PEER_LOST.search(first["error"]):
        names = ", ".join(map(str, silent))
        return (f"training failed: rank {names} stopped without an error (killed, or out of "
                f"memory?), then rank {first['rank']} lost it: {first['error']} ({where})")
    return f"training failed: rank {first['rank']} failed first: {first['error']} ({where})"


def _unrecorded_failure(log: Path, where: str) -> str:
    """The failure line when no rank wrote an error: torchrun's own first failure, if logged.

    torchrun can notice a silent death before the peers notice the lost connection; it then
    stops them (SIGTERM) and they record nothing either. Its report names the first rank that
    exited.
    """
    try:
        causes = _ROOT_CAUSE.findall(log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        causes = []
    if not causes:
        return f"training failed: no rank recorded an error (a process was killed?) ({where})"
    rank, exit_code = causes[-1]  # the log gathers every launch of a resumed run
    return (f"training failed: rank {rank} stopped without an error (exit code {exit_code}: "
            f"killed, or out of memory?); torchrun then stopped the other ranks ({where})")
