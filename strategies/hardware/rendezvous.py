"""How processes started on this machine find each other to form a torch.distributed group,
without listening on the network.

The runtime's tests and benchmarks and the link calibration (calibrate.py) all start their
ranks themselves, on one machine, and need an init_method for them. `layerwise train` on one
machine starts torchrun, whose default rendezvous is a TCP store listening on every interface,
unauthenticated, and whose workers then form their group through a second one: both are
replaced by file stores in a private folder, and gloo and NCCL are held to the loopback
interface for the connections between the workers.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

# The init_method of a torchrun worker on one machine (a file:// URI); set by the launcher.
RENDEZVOUS_VARIABLE = "LAYERWISE_RENDEZVOUS"


def local_rendezvous(folder: str | os.PathLike[str]) -> str:
    """An init_method for processes on this machine: a file store in `folder` (fresh for each
    launch). A TCP port picked free in advance can be taken by another process before the
    store binds it; a file in one's own folder cannot."""
    return Path(folder, "rendezvous").absolute().as_uri()


def loopback_environment(folder: Path) -> dict[str, str]:
    """The environment of a one-machine torchrun launch that opens no socket beyond the
    loopback interface, its rendezvous files in `folder` (fresh and private to the launch).

    torchrun's c10d rendezvous runs on a file store (its documented `store_type=file`) and
    does not share a TCP store with the workers (TORCH_DISABLE_SHARE_RDZV_TCP_STORE); the
    workers join through `local_rendezvous` instead of torchrun's MASTER_ADDR and PORT, read
    from RENDEZVOUS_VARIABLE. A TCP store binding its own address listens on every interface.
    """
    environment = {
        "PET_RDZV_BACKEND": "c10d",  # torchrun's --rdzv-backend, and so on
        "PET_RDZV_ENDPOINT": str(folder / "agents"),
        "PET_RDZV_CONF": "store_type=file",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        RENDEZVOUS_VARIABLE: local_rendezvous(folder),
    }
    interface = loopback_interface()
    if interface is not None:
        environment |= {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    return environment


def loopback_interface() -> str | None:
    """The loopback interface's name (lo on Linux, lo0 on macOS and the BSDs), if it has one
    of those."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)
