"""swap-aware prices a parallel instance's swap as the engine charges it: its shards load at once, a node's disk
reading its own shards, and a host-RAM copy comes over each GPU's link; worked out by hand for two 70B models
pipelined over two one-GPU nodes of H100s (12 GB/s disk + 1 s, 40 GB/s host copy + 0.3 s, unload 0.19 s +
0.0128 s/GiB)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from sim import simulation
from sim.parallel import parallel_load_s
from sim.policies.fcfs_swap import held_requests
from sim.policies.swap_aware import SwapAwarePolicy, load_s, pending_gain_s
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk
from tests.conftest import scenario_dict

NEW, OLD = "llama-3.1-70b", "llama-2-70b"
GIB = 2**30
PROBE_S = 30.0


def weight_bytes(vocab):
    """fp16 weights of an 80-layer Llama-70B (GQA, 8 KV heads) with untied embeddings of ``vocab`` tokens."""
    return 2 * (80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 2 * vocab * 8192 + 8192)


NEW_BYTES, OLD_BYTES = weight_bytes(128256), weight_bytes(32000)


def disk_s(nbytes):
    return 1.0 + nbytes / 12e9


def host_s(nbytes):
    return 0.3 + nbytes / 40e9


def unload_s(nbytes):
    return 0.19 + 0.0128 * nbytes / GIB


class Probe(SwapAwarePolicy):
    """swap-aware that serves OLD from time 0 and, instead of deciding, records at PROBE_S what it would weigh
    for swapping NEW in."""

    name = "probe"

    def setup(self, view):
        self.seen = {}
        view.load(view.model_index(OLD), view.gpus[0])
        view.call_at(PROBE_S, self.probe)

    def plan(self, view):
        pass

    def probe(self, view):
        new, (victim,) = view.model_index(NEW), view.instances_of(view.model_index(OLD))
        self.seen = {"load_s": load_s(view, new, victim.gpu), "reload_s": self.victim_reload_s(view, victim),
                     "cost_s": self.eviction_cost_s(view, victim), "gain_s": pending_gain_s(view, new),
                     "held": len(held_requests(victim)), "pays": self.pays_for(view, new, [victim], self.eviction_cost_s(view, victim))}


def probe(layout, cluster, params):
    models = [{"name": NEW, **layout}, {"name": OLD, **layout}]
    scenario = parse_scenario(scenario_dict(profile="h100-sxm", cluster=cluster, models=models), "test")
    policy = Probe(**{"min_residency_s": 0.0, **params})
    # Four long OLD requests keep it busy past the probe; four NEW ones wait for a swap that never comes.
    rows = [(0.0, OLD, 500, 3000)] * 4 + [(1.0 + i, NEW, 200, 50) for i in range(4)]
    arrivals, names, prompts, outputs = zip(*rows)
    chunk = RequestChunk(np.array(arrivals, float), np.array(names, object), np.array(prompts, np.int64),
                         np.array(outputs, np.int64))
    with mock.patch.object(simulation, "make_policy", lambda name, params: policy):
        result = simulation.simulate(scenario, chunks=[chunk])
    return policy.seen, result.events


def test_a_pipeline_over_two_nodes_loads_in_half_the_time_and_swap_aware_prices_it_so():
    seen, events = probe({"pipeline_parallel": 2}, {"nodes": 2, "gpus_per_node": 1}, {"benefit_ratio": 1.5})
    # Each node's disk reads its one shard of two: half the one-GPU reload. The engine charged OLD's load so.
    load = events[(events["kind"] == "load") & (events["model"] == OLD)]
    assert load["duration_s"].tolist() == [pytest.approx(disk_s(OLD_BYTES) / 2, rel=1e-12)]
    assert seen["load_s"] == pytest.approx(disk_s(NEW_BYTES) / 2, rel=1e-12)
    assert seen["reload_s"] == pytest.approx(disk_s(OLD_BYTES) / 2, rel=1e-12)
    assert seen["held"] == 4 and seen["cost_s"] == pytest.approx(4 * (unload_s(OLD_BYTES) + disk_s(OLD_BYTES) / 2))
    # The swap's cost: each of the 4 waiting NEW requests waits for the load, each of the 4 held OLD ones for
    # the unload and its reload. The waiting work (121 request-seconds by now) would not pay 1.5 times for it at
    # one GPU's reload times (1.5 x 108 s); at the pipeline's it does (1.5 x 58 s), so swap-aware swaps.
    parallel_s = 4 * disk_s(NEW_BYTES) / 2 + 4 * (unload_s(OLD_BYTES) + disk_s(OLD_BYTES) / 2)
    one_gpu_s = 4 * disk_s(NEW_BYTES) + 4 * (unload_s(OLD_BYTES) + disk_s(OLD_BYTES))
    assert 1.5 * parallel_s <= seen["gain_s"] < 1.5 * one_gpu_s
    assert seen["pays"]


def test_a_victim_kept_in_host_ram_comes_back_over_each_gpus_link():
    seen, _ = probe({"tensor_parallel": 2}, {"nodes": 1, "gpus_per_node": 2, "host_memory_gb": 1024},
                    {"keep_weights_on_host": True})
    # One node, one disk: NEW (not in host RAM) loads in the one-GPU time; OLD, once kept in RAM, comes back
    # over both GPUs' links at once.
    assert seen["load_s"] == pytest.approx(disk_s(NEW_BYTES), rel=1e-12)
    assert seen["reload_s"] == pytest.approx(host_s(OLD_BYTES) / 2, rel=1e-12)


def test_a_shard_layout_loads_in_its_slowest_nodes_share():
    assert parallel_load_s(8.0, [0], from_host=False) == 8.0 == parallel_load_s(8.0, [0], from_host=True)
    assert parallel_load_s(8.0, [0, 0], from_host=False) == 8.0  # TP2: one disk reads both shards
    assert parallel_load_s(8.0, [0, 0], from_host=True) == 4.0  # each shard over its own link
    assert parallel_load_s(8.0, [0, 0, 1, 1], from_host=False) == 4.0  # TP2 x PP2 over two nodes
    assert parallel_load_s(8.0, [0, 0, 1, 1], from_host=True) == 2.0
