"""Layers a deployment keeps on the CPU (``gpu_share`` < 1) live in its node's RAM.

Before, they took none: Llama-2-70B at share 0.1 (about 115 GiB of layers on the CPU) loaded and ran beside 1 GB of
host RAM, and a node running an offloaded model offered that RAM again for swapped KV and cached weights. The
figures expected here come from the model's size in the catalogue and the GPU weights the run samples."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from sim.catalogue import catalogue
from sim.errors import MmsimError
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import scenario_dict, wall_clock_limit

GIB = 2**30
HOST_GIB = 5

POLICIES = textwrap.dedent('''
    import json

    from sim.policies.base import Policy


    class HalfOnCpu(Policy):
        """Qwen2.5-3B with half its layers on the CPU; at t=1 it notes what host RAM is left, then tries a second
        such copy on the node's other GPU, and writes what it saw to ``OUT``."""
        name = "half-on-cpu"

        def setup(self, view):
            view.load(0, view.gpus[0], gpu_share=0.5)
            view.call_at(1.0, self.look)

        def look(self, view):
            free = [size for size in range(0, {host} * 2**30 + 1, 2**24) if view.host_room_for(0, size)]
            second = view.load(0, view.gpus[1], gpu_share=0.5) is not None
            with open(OUT, "w") as file:
                json.dump({{"free_bytes": max(free), "second": second}}, file)
''').format(host=HOST_GIB)


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(60):
        yield


def one_request(model="qwen2.5-3b"):
    return [RequestChunk(np.array([0.5]), np.array([model], object), np.array([100]), np.array([10]))]


def test_a_deployment_whose_cpu_layers_fit_no_nodes_ram_is_refused():
    scenario = parse_scenario(scenario_dict(models=[{"name": "llama-2-70b", "gpu_share": 0.1}],
                                            cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 1}), "test")
    with pytest.raises(MmsimError) as refused:
        simulate(scenario, policy="static", chunks=one_request("llama-2-70b"))
    message = str(refused.value)
    assert "models.llama-2-70b.gpu_share" in message and "of the model's layers on the CPU" in message, message


def test_offloaded_layers_take_host_ram_from_swaps_and_from_another_load(tmp_path):
    seen = tmp_path / "seen.json"
    path = tmp_path / "half.py"
    path.write_text(f"OUT = {str(seen)!r}\n" + POLICIES)
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}],
                                            cluster={"nodes": 1, "gpus_per_node": 2, "host_memory_gb": HOST_GIB}),
                              "test")
    result = simulate(scenario, policy=f"{path}:HalfOnCpu", chunks=one_request())
    on_gpu = result.timeseries["weight_bytes"].max()
    on_cpu = catalogue()["qwen2.5-3b"].weight_bytes("fp16") - on_gpu
    assert 2 * GIB < on_cpu < HOST_GIB * GIB / 2 * 1.5  # about half of ~6 GiB: one copy fits, two do not
    saw = json.loads(seen.read_text())
    # The RAM a swap or a cached copy may take is the node's less the first copy's CPU layers (to the probe's 16 MiB).
    assert HOST_GIB * GIB - on_cpu - 2**24 <= saw["free_bytes"] <= HOST_GIB * GIB - on_cpu
    assert saw["second"] is False  # its CPU layers do not fit what is left


def test_cached_weights_give_way_to_the_cpu_layers_of_a_load():
    """offload.yaml with 24 GiB of host RAM under swap-aware keeping evicted weights on the host: the cache filled the
    RAM (about 18.7 GiB) and Qwen3-32B, 40% of its layers on the CPU (6.6 GiB), was never loaded again: 34 of its
    requests dropped as not_placed. A cache gives way; every request is served, as before layers took RAM."""
    import yaml
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scenarios" / "offload.yaml"
    data = yaml.safe_load(path.read_text())
    data["cluster"]["host_memory_gb"] = 24
    data["policy"] = {"name": "swap-aware", "params": {"keep_weights_on_host": True}}
    result = simulate(parse_scenario(data, str(path)), base_dir=path.parent)
    assert result.summary["requests_dropped"] == 0, result.summary["drop_reasons"]
