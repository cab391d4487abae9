"""How long the weight load of a tensor- or pipeline-parallel instance takes, shard by shard.

The engine books a load's transfers with :func:`node_load_share` (sim/engine/residency.py) and swap-aware
prices a swap with :func:`parallel_load_s`: one formula, so a policy's estimate is what the engine charges
(docs/parallel.md).
"""

from __future__ import annotations

from collections.abc import Sequence


def node_load_share(shards_on_node: int, shards: int, from_host: bool) -> float:
    """The share of the one-GPU reload time that one node's part of a load takes, ``shards_on_node`` of the
    instance's ``shards`` weight shards being on that node. A node's disk is one channel, so the reads of
    its shards follow one another; from a host-RAM copy each shard comes over its own GPU's link at once."""
    return 1.0 / shards if from_host else shards_on_node / shards


def parallel_load_s(reload_s: float, shard_nodes: Sequence[int], from_host: bool) -> float:
    """Seconds until every shard is in, ``shard_nodes`` naming each shard's node and ``reload_s`` being the
    one-GPU reload: the nodes load at once, so the slowest node's share (while no other transfer holds
    their disks or links). One GPU's load is ``reload_s`` itself."""
    shards = len(shard_nodes)
    if shards == 1:
        return reload_s  # swap-aware prices one-GPU reloads at every plan: no set, no count
    return max(reload_s * node_load_share(shard_nodes.count(node), shards, from_host) for node in set(shard_nodes))

