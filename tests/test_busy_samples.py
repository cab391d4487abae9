"""A GPU's busy share in the time series counts the step running at a sample, not only the steps ended by then.

Before, a step's time was credited when it ended: one 8,000-token prompt on Qwen3-8B with 70% of its layers on the
CPU is one prefill step of about 23 s, and every sample every 0.5 s read the GPU as idle (busy share 0 in all 51),
while the summary said 88.6% busy. The expected figures come from the run's own request times."""

from __future__ import annotations

import numpy as np
import pytest

from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import scenario_dict, wall_clock_limit

INTERVAL_S = 0.5


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(60):
        yield


def test_a_long_prefill_reads_busy_in_every_sample_it_spans():
    scenario = parse_scenario(scenario_dict(
        models=[{"name": "qwen3-8b", "gpu_share": 0.3}], cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 256},
        engine={"max_num_seqs": 16, "max_num_batched_tokens": 8192}, sample_interval_s=INTERVAL_S), "test")
    chunks = [RequestChunk(np.array([1.0]), np.array(["qwen3-8b"], object), np.array([8000]), np.array([5]))]
    result = simulate(scenario, policy="static", chunks=chunks)
    request = result.requests.iloc[0]
    samples = result.timeseries
    samples = samples[samples["gpu"] == 0]
    assert request["first_token_s"] - request["first_scheduled_s"] > 10 * INTERVAL_S  # one long prefill step
    inside = samples[(samples["time_s"] > request["first_scheduled_s"] + INTERVAL_S)
                     & (samples["time_s"] <= request["first_token_s"])]
    assert len(inside) >= 10
    assert (inside["busy_share"] > 0.999).all(), inside["busy_share"].describe()
    # Every busy second up to the last sample is in the series, and none twice.
    last = samples["time_s"].max()
    busy_by_last = min(last, request["finish_s"]) - request["first_scheduled_s"]
    assert (samples["busy_share"] * INTERVAL_S).sum() == pytest.approx(busy_by_last, rel=0.02)


def test_the_utilisation_signal_counts_the_step_running(tmp_path):
    """An autoscaler's utilisation read a GPU mid-prefill as idle, for the same reason."""
    out = tmp_path / "seen.jsonl"
    (tmp_path / "watch.py").write_text(
        "import json\nfrom sim.fleet.autoscalers import Autoscaler\n\n\n"
        "class Watch(Autoscaler):\n    name = 'watch'\n\n    def desired(self, signals):\n"
        f"        with open({str(out)!r}, 'a') as file:\n"
        "            file.write(json.dumps([signals.now, signals.utilisation]) + '\\n')\n"
        "        return signals.replicas, 'watching'\n")
    scenario = parse_scenario(scenario_dict(
        models=[{"name": "qwen3-8b", "gpu_share": 0.3}], cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 256},
        engine={"max_num_seqs": 16, "max_num_batched_tokens": 8192},
        autoscaler={"name": f"{tmp_path}/watch.py:Watch", "interval_s": 1.0}), "test")
    chunks = [RequestChunk(np.array([1.0]), np.array(["qwen3-8b"], object), np.array([8000]), np.array([5]))]
    request = simulate(scenario, policy="static", chunks=chunks).requests.iloc[0]
    import json

    seen = [json.loads(line) for line in out.read_text().splitlines()]
    inside = [share for now, share in seen if request["first_scheduled_s"] + 1.0 < now <= request["first_token_s"]]
    assert len(inside) >= 5 and min(inside) > 0.999, inside
