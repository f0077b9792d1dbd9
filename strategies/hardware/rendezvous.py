"""How the processes of a run find each other to form a torch.distributed group, listening
only where they must.

The runtime's tests and benchmarks and the link calibration (calibrate.py) all start their
ranks themselves, on one machine, and need an init_method for them. `layerwise train` on one
machine starts torchrun, whose default rendezvous is a TCP store listening on every interface,
unauthenticated, and whose workers then form their group through a second one: both are
replaced by file stores in a private folder, and gloo and NCCL are held to the loopback
interface for the connections between the workers.

On several machines the nodes meet at node 0's --rdzv-endpoint. torch's TCP store binds every
interface whatever host it is given, so node 0's launcher binds the endpoint's address itself
and hosts the store on that socket (`hosted_store`); every node's torchrun and every worker
join it as clients (`node_environment`), and no other store is started.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from layerwise.strategies.errors import LayerwiseError

# The init_method of a torchrun worker (a file:// URI on one machine, NODE_STORE_SCHEME:// on
# several); set by the launcher.
RENDEZVOUS_VARIABLE = "LAYERWISE_RENDEZVOUS"
# node 0's store at HOST:PORT, which the workers join as clients
NODE_STORE_SCHEME = "layerwise-node0"
# how long torchrun's agents wait for every node to join (torch's default join_timeout)
JOIN_TIMEOUT_SECONDS = 600


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
    from RENDEZVOUS_VARIABLE. A TCP store listens on every interface unless handed a socket
    bound to one; on one machine, file stores need no socket at all.
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


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT or [IPV6]:PORT."""
    host, _, port = endpoint.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def node_environment(endpoint: str) -> dict[str, str]:
    """The environment of one node's torchrun in a run on several machines: its c10d
    rendezvous joins node 0's store at `endpoint` as a client (`hosted_store` serves it), shares
    no store with the workers, and the workers join the same store (`joined_store`). Nodes that
    meet on a loopback address are on one machine: their gloo and NCCL stay on it too."""
    environment = {
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_CONF": f"is_host=false,join_timeout={JOIN_TIMEOUT_SECONDS}",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        RENDEZVOUS_VARIABLE: f"{NODE_STORE_SCHEME}://{endpoint}",
    }
    interface = loopback_interface()
    if interface is not None and _is_loopback(split_endpoint(endpoint)[0]):
        environment |= {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    return environment


@contextlib.contextmanager
def hosted_store(endpoint: str, timeout_seconds: float) -> Iterator[None]:
    """Node 0's rendezvous store, listening at `endpoint`'s address only, while the block
    runs. LayerwiseError (one line) when that address and port cannot be had."""
    host, port = split_endpoint(endpoint)
    try:
        listener = socket.create_server((host, port), family=_family(host))
    except OSError as problem:  # in use, not this machine's address, or no such host
        reason = (problem.strerror if isinstance(problem, socket.gaierror) or not problem.errno
                  else os.strerror(problem.errno))
        raise LayerwiseError(
            f"cannot listen at --rdzv-endpoint {endpoint} for the other nodes: {reason}; give "
            "every node the same free HOST:PORT of node 0") from None
    descriptor = listener.detach()  # the store owns the socket from here and closes it
    try:
        store = dist.TCPStore(host, port, is_master=True, master_listen_fd=descriptor,
                              wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_seconds))
    except BaseException:
        os.close(descriptor)
        raise
    try:
        yield
    finally:
        del store  # stops listening


def joined_store(init_method: str, timeout_seconds: float) -> dist.Store:
    """The workers' part of node 0's store named by a NODE_STORE_SCHEME:// init_method."""
    host, port = split_endpoint(init_method.removeprefix(f"{NODE_STORE_SCHEME}://"))
    store = dist.TCPStore(host, port, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_seconds))
    return dist.PrefixStore("layerwise/workers", store)


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a host name: the address it resolves to first
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
