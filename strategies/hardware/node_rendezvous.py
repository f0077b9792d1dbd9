"""How the nodes of a run on several machines meet: at node 0's --rdzv-endpoint, listening on
that address alone, each node ranked by its --node-rank, with a line while some are missing.

torchrun's own backends cannot give all three. Its static rendezvous has node 0's agent host a
TCP store, and a TCP store listens on every interface whatever host it is given; its c10d
rendezvous ranks the nodes by host and process id, not by --node-rank, so a failure would name
the wrong node. A TCP store does serve a socket handed to it, so node 0's launcher binds the
endpoint's address itself and hosts the store there (`hosted_store`), and every node's torchrun
joins it as a client through the backend `create_handler` makes (registered in torchrun's
handler registry by the agent, strategies/jobs/agent.py), ranked by
--node-rank (`NodeRankRendezvous`). The launchers watch the joining (`JoinWatch`) to say who
is missing, and end a run whose nodes never all come (JOIN_SECONDS).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
from collections.abc import Iterator

from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.endpoint import Endpoint, address_of, parse_endpoint

BACKEND = "layerwise-nodes"  # torchrun's --rdzv-backend for it
NODE_RANK_CONFIG = "node_rank"  # its --rdzv-conf key for this node's place
JOIN_SECONDS = 600.0  # as long as torchrun's static rendezvous waits for its nodes
JOINED_KEY = "layerwise/joined"  # how many nodes' agents have joined
ALL_JOINED_KEY = "layerwise/all-joined"  # set by the last to join; every agent waits for it
NODE_KEY = "layerwise/node/{}"  # joins per --node-rank: a second one is a rank given twice
CONNECT_SECONDS = 1.0  # one try of a launcher watching the store


@contextlib.contextmanager
def hosted_store(endpoint: Endpoint) -> Iterator[TCPStore]:
    """Node 0's store for the run, listening on the endpoint's address only (a TCP store
    binding the address itself would take every interface); it stops listening when the last
    reference to it goes. LayerwiseError when this machine cannot listen there."""
    family, address = address_of(endpoint)
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen()
    except OSError as error:
        listener.close()
        raise LayerwiseError(f"node 0 cannot listen at {endpoint} ({error.strerror}): "
                             f"--rdzv-endpoint must be an address of node 0's machine and a "
                             f"free port") from error
    descriptor = listener.detach()  # the store closes it
    try:
        store = TCPStore(endpoint.host, endpoint.port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=JOIN_SECONDS),
                         master_listen_fd=descriptor)
    except BaseException:
        os.close(descriptor)
        raise
    yield store


def _client(endpoint: Endpoint, seconds: float) -> TCPStore:
    return TCPStore(endpoint.host, endpoint.port, is_master=False,
                    timeout=datetime.timedelta(seconds=seconds))


def _listening(endpoint: Endpoint) -> bool:
    """Whether something accepts connections at `endpoint` (one try of CONNECT_SECONDS)."""
    try:
        socket.create_connection((endpoint.host, endpoint.port), CONNECT_SECONDS).close()
    except OSError:
        return False
    return True


def joined(store: Store) -> int:
    """How many nodes' agents have joined so far."""
    return int(store.add(JOINED_KEY, 0))


class JoinWatch:
    """What a launcher says while the nodes gather: `missing()` is the line for now, or None
    once all have joined; it connects to node 0's store when it can."""

    def __init__(self, endpoint: Endpoint, nnodes: int, store: Store | None = None) -> None:
        self.endpoint, self.nnodes, self._store = endpoint, nnodes, store
        self._started = time.monotonic()

    def missing(self) -> str | None:
        waited = f"{time.monotonic() - self._started:.0f} s"
        if self._store is None:
            if not _listening(self.endpoint):  # a store client failing logs c10d errors
                return f"waiting for node 0 at {self.endpoint} ({waited})"
            self._store = _client(self.endpoint, JOIN_SECONDS)
        count = joined(self._store)
        if count >= self.nnodes:
            return None
        return (f"waiting for the nodes at {self.endpoint}: {count} of {self.nnodes} joined "
                f"({waited})")


class NodeRankRendezvous(RendezvousHandler):
    """torchrun's rendezvous for one node: joins node 0's hosted store as a client, waits for
    every node, and takes its rank from --node-rank."""

    def __init__(self, endpoint: Endpoint, node_rank: int, nnodes: int, run_id: str) -> None:
        self.endpoint, self.node_rank, self.nnodes, self.run_id = (endpoint, node_rank, nnodes,
                                                                   run_id)
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # the workers form their group through the same store

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = _client(self.endpoint, JOIN_SECONDS)
            if self._store.add(NODE_KEY.format(self.node_rank), 1) > 1:
                raise LayerwiseError(f"two nodes were started with --node-rank "
                                     f"{self.node_rank}; give each its own 0..{self.nnodes - 1}")
            if self._store.add(JOINED_KEY, 1) == self.nnodes:
                self._store.set(ALL_JOINED_KEY, "1")
            self._store.wait([ALL_JOINED_KEY])
        return RendezvousInfo(PrefixStore(self.run_id, self._store), self.node_rank, self.nnodes,
                              RendezvousStoreInfo(self.endpoint.host, self.endpoint.port))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        return None

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


def create_handler(parameters: RendezvousParameters) -> NodeRankRendezvous:
    """torchrun's handler for BACKEND from its --rdzv-endpoint, --nnodes and --rdzv-conf."""
    return NodeRankRendezvous(parse_endpoint(parameters.endpoint),
                              int(parameters.config[NODE_RANK_CONFIG]), parameters.max_nodes,
                              parameters.run_id)
