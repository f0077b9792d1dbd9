"""node 0's address for a run on several machines, as --rdzv-endpoint gives it, checked before
anything is written or started."""

from __future__ import annotations

import socket
from typing import NamedTuple

from layerwise.strategies.errors import LayerwiseError


class Endpoint(NamedTuple):
    """node 0's HOST:PORT."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """HOST:PORT (an IPv6 host in brackets) whose host resolves; LayerwiseError otherwise,
    before anything is written or started."""
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LayerwiseError(f"--rdzv-endpoint {text!r} is not HOST:PORT with a port 1..65535 "
                             f"(node 0's address, for example 10.0.0.1:29500)")
    endpoint = Endpoint(host, int(port))
    address_of(endpoint)
    return endpoint


def address_of(endpoint: Endpoint) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """The first address `endpoint` resolves to, with its family."""
    try:
        family, _, _, _, address = socket.getaddrinfo(endpoint.host, endpoint.port,
                                                      type=socket.SOCK_STREAM)[0]
    except OSError as error:
        raise LayerwiseError(f"--rdzv-endpoint {endpoint}: {endpoint.host!r} does not resolve "
                             f"({error.strerror}); give node 0's address") from error
    return family, address
