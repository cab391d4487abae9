"""A node's shared channels: the PCIe link each way, the disk, and host RAM for swapped KV.

Channels are FIFO timelines: a transfer asked for at time t starts when the
channel is free and holds it for its duration, so concurrent KV swaps and
weight loads on one node queue behind each other without extra events.
"""

from __future__ import annotations

from sim.engine.prefix import IdleRuns

INF = float("inf")


class Node:
    """One server: its GPUs share this node's link, disk and host memory.

    A node of an elastic pool may be down (not provisioned: unbilled, its GPUs hidden from policies). It is
    billed from the moment its provisioning starts; ``billed_seconds`` counts the time billed before
    ``billed_since_s``, the latest such start."""

    def __init__(self, index: int, host_memory_bytes: int, pool: int = 0, up: bool = True):
        self.index = index
        self.host_memory_bytes = host_memory_bytes
        self.pool = pool
        self.up = up
        self.billed = up
        self.billed_since_s = 0.0
        self.billed_seconds = 0.0
        # When the serving image is (or will be) fully on the node: nodes up from the start have it already.
        self.image_ready_s = 0.0 if up else INF
        self.disk_ready_s: dict[int, float] = {}  # model -> when a cold start's fetch of its weights is on disk
        self.host_kv_bytes = 0
        self.offloaded: dict[int, int] = {}  # instance uid -> bytes of its layers kept on the CPU, in host RAM
        self.host_weights: dict[int, int] = {}  # model -> bytes of its weights cached in host RAM
        # model -> (prefix-cache idle runs, oldest first, their blocks and bytes) kept in host RAM by an unload
        self.host_prefixes: dict[int, tuple[IdleRuns, int, int]] = {}
        self.free_at = {"host_to_device": 0.0, "device_to_host": 0.0, "disk": 0.0}

    def provision(self, now: float) -> None:
        """Start provisioning the node: billed from now, usable once it is up."""
        self.billed = True
        self.billed_since_s = now

    def release(self, now: float) -> None:
        """Give the node back: billing stops, and what its disk and RAM held is gone."""
        self.billed_seconds += now - self.billed_since_s
        self.billed = False
        self.up = False
        self.image_ready_s = INF
        self.disk_ready_s.clear()
        self.host_weights.clear()
        self.host_prefixes.clear()

    def seconds_billed(self, now: float) -> float:
        """How long the node has been billed in all, until ``now``."""
        return self.billed_seconds + (now - self.billed_since_s if self.billed else 0.0)

    def transfer(self, now: float, seconds: float, channel: str) -> float:
        """Book ``seconds`` on ``channel`` from ``now``; returns the wait plus the transfer."""
        start = max(now, self.free_at[channel])
        self.free_at[channel] = start + seconds
        return start + seconds - now

    def host_free_bytes(self) -> int:
        return (self.host_memory_bytes - self.host_kv_bytes - sum(self.offloaded.values())
                - sum(self.host_weights.values()) - sum(held for _, _, held in self.host_prefixes.values()))

    def reserve_host(self, kv_bytes: int) -> bool:
        """Hold swapped KV in host RAM if it fits next to cached weights."""
        if kv_bytes > self.host_free_bytes():
            return False
        self.host_kv_bytes += kv_bytes
        return True

    def cache_weights(self, model: int, weight_bytes: int) -> bool:
        """Keep a model's weights in host RAM (a policy's choice at unload) if they fit."""
        if model in self.host_weights:
            return True
        if weight_bytes > self.host_free_bytes():
            return False
        self.host_weights[model] = weight_bytes
        return True

    def keep_prefixes(self, model: int, runs: IdleRuns, blocks: int, prefix_bytes: int) -> bool:
        """Hold a model's cached prefix blocks in host RAM (an LMCache-style CPU tier) if they fit beside
        what is there; a newer copy replaces an older one."""
        self.host_prefixes.pop(model, None)
        if prefix_bytes > self.host_free_bytes():
            return False
        self.host_prefixes[model] = (runs, blocks, prefix_bytes)
        return True

    def room_for_offload(self, nbytes: int, model: int) -> bool:
        """Make ``nbytes`` of host RAM free for layers a load keeps on the CPU, evicting what is only a cache if it
        must (kept prefix caches, then other models' cached weights, oldest first, then ``model``'s own); whether
        they fit. Swapped KV is never evicted: its requests need it back."""
        for cache in (self.host_prefixes, self.host_weights):
            for key in sorted(cache, key=lambda held: held == model):  # stable: oldest first, the loading model last
                if nbytes <= self.host_free_bytes():
                    return True
                del cache[key]
        return nbytes <= self.host_free_bytes()

    def release_host(self, kv_bytes: int) -> None:
        self.host_kv_bytes -= kv_bytes
