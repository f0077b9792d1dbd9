"""Shared network ports in gradient synchronisation (t_s): who else sends through a device's port.

A link with `shared_by: s` gives each aligned run of s devices one port (`Link.shared_by`; on
the paper's testbed a node's four P100s share one 100 Gb/s InfiniBand card). t_x prices the
receivers behind a port in cost/tables.py; here the replica groups of one layer's config, which
synchronise at the same time:

- a ring all-reduce crosses a port once each way per group whose ring leaves the port's unit
  there, so k groups crossing one port each move at 1/k of its bandwidth (`ring_links`);
- a parameter server takes its r-1 gradients and sends its r-1 updates one after another, so
  its own traffic never contends with itself, but a port also carries the other groups' servers
  and replicas behind it: every (server, replica) pair across a shared port puts one message
  each way through the port at either end, and the port needs at least the sum of those
  messages' bytes over its bandwidth (`ServerPorts`), which t_s takes when it exceeds the
  slowest server's own round trips.

Why our own code: no library models contention of a cost model's port; a few loops over the
groups of one config suffice, and the cost model calls them once per config.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerwise.strategies.hardware.cluster import Cluster, Link


def shares_ports(cluster: Cluster, devices: int) -> bool:
    """Whether devices 0..`devices`-1 of `cluster` can talk over a link whose port more than
    one device shares (a tier is crossed once its inner unit is smaller than `devices`)."""
    inner = 1
    for size, link in cluster.link_tiers():
        if inner >= devices:
            return False
        if link.shared_by > 1:
            return True
        inner = size
    return False


def _tiers_joining(tiers: Sequence[tuple[int, Link]], group: Sequence[int]) -> list[int]:
    """Indices into `tiers` (`Cluster.link_tiers()`) of the tiers whose link joins two devices
    of `group`: two of them in one unit of the tier but in different units of the tier
    before."""
    used = []
    inner = 1
    for k, (size, _) in enumerate(tiers):
        inner_units: dict[int, set[int]] = {}
        for device in group:
            inner_units.setdefault(device // size, set()).add(device // inner)
        if any(len(units) > 1 for units in inner_units.values()):
            used.append(k)
        inner = size
    return used


def ring_links(cluster: Cluster, groups: Sequence[Sequence[int]]) -> list[Link]:
    """The link each group's ring all-reduce runs at when all groups reduce at once: over the
    tiers its ring crosses, the lowest bandwidth and highest latency (as
    `Cluster.slowest_link`), a shared port's bandwidth (and ring bandwidth) divided by the
    groups whose rings cross it behind the same port."""
    tiers = cluster.link_tiers()
    used = [_tiers_joining(tiers, group) for group in groups]
    crossing: Counter[tuple[int, int]] = Counter()  # (tier, port) -> groups crossing it
    for group, tier_ids in zip(groups, used, strict=True):
        for k in tier_ids:
            crossing.update({(k, device // tiers[k][1].shared_by) for device in group})
    links = []
    for group, tier_ids in zip(groups, used, strict=True):
        candidates = []
        for k in tier_ids:
            link = tiers[k][1]
            share = max(crossing[k, device // link.shared_by] for device in group)
            candidates.append(link if share == 1 else link.model_copy(update={
                "bandwidth": link.bandwidth / share,
                "ring_bandwidth": None if link.ring_bandwidth is None
                else link.ring_bandwidth / share}))
        slow = min(candidates, key=lambda link: link.allreduce_bandwidth)
        latency = max(link.latency for link in candidates)
        links.append(slow if latency == slow.latency else slow.model_copy(
            update={"latency": latency, "ring_latency": None}))
    return links


@dataclass(frozen=True)
class ServerPorts:
    """The parameter servers' messages through each shared port of one config: seconds per
    byte of a group's shard, (groups, ports); the servers are the groups' first devices."""

    seconds_per_byte: np.ndarray

    @classmethod
    def of(cls, cluster: Cluster, groups: Sequence[Sequence[int]]) -> ServerPorts:
        """The table for replica groups of equal size (one config's), server first in each."""
        tiers = cluster.link_tiers()
        sizes = np.array([size for size, _ in tiers])
        shared_by = np.array([link.shared_by for _, link in tiers])
        per_byte = np.array([1.0 / link.bandwidth for _, link in tiers])
        devices = np.array(groups)
        servers, members = devices[:, :1], devices[:, 1:]
        # each (server, member) pair's tier: the first whose unit holds both
        tier = np.argmax(servers[..., None] // sizes == members[..., None] // sizes, axis=2)
        group, pair = np.nonzero(shared_by[tier] > 1)
        tier = tier[group, pair]
        ends = np.stack([servers[group, 0], members[group, pair]])  # both ends use a port
        keys = tier * (devices.max() + 1) + ends // shared_by[tier]
        ports, column = np.unique(keys, return_inverse=True)
        table = np.zeros((len(groups), len(ports)))
        np.add.at(table, (np.broadcast_to(group, ends.shape), column.reshape(ends.shape)),
                  per_byte[tier])
        return cls(seconds_per_byte=table)

    def seconds(self, shard_bytes: Sequence[int]) -> float:
        """The busiest port's time, one way, for these shards (bytes per group)."""
        if not self.seconds_per_byte.size:
            return 0.0
        return float((np.asarray(shard_bytes, dtype=np.float64) @ self.seconds_per_byte).max())
