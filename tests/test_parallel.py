"""Tensor- and pipeline-parallel instances: one instance spans tp x pp GPUs, holding a shard of its weights and
of every KV block on each; sizes worked out by hand for Llama-3.1-70B."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from sim import simulation
from sim.errors import MmsimError
from sim.policies.base import Policy
from sim.scenario import parse_scenario
from sim.workload.chunk import RequestChunk
from tests.conftest import scenario_dict

GIB = 2**30
BIG, SMALL = "llama-3.1-70b", "llama-3-8b"


class Placing(Policy):
    """Loads (model, gpu) pairs at time 0 and records what each load returned."""

    name = "placing"

    def __init__(self, loads):
        super().__init__()
        self.loads, self.results = loads, []

    def setup(self, view):
        for model, gpu in self.loads:
            self.results.append(view.load(model, view.gpus[gpu]))


def run(loads, models, requests, mode="fast", gpus_per_node=4, nodes=1):
    scenario = parse_scenario(scenario_dict(profile="h100-sxm", cluster={"nodes": nodes, "gpus_per_node": gpus_per_node},
                                            models=models), "test")
    policy = Placing(loads)
    arrivals, names, prompts, outputs = zip(*requests)
    chunk = RequestChunk(np.array(arrivals, float), np.array(names, object), np.array(prompts, np.int64),
                         np.array(outputs, np.int64))
    with mock.patch.object(simulation, "make_policy", lambda name, params: policy):
        result = simulation.simulate(scenario, mode=mode, chunks=[chunk])
    return policy.results, result


def test_a_tp2_instance_holds_half_the_weights_and_half_of_each_kv_block_on_each_gpu():
    (big,), result = run([(0, 1)], [{"name": BIG, "tensor_parallel": 2}], [(0.0, BIG, 100, 10)])
    assert [g.index for g in big.shards] == [0, 1] and big.gpu.index == 0  # GPU 1's aligned pair is 0-1
    # 80 layers x (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 2 x 8192) + 2 x 128256 x 8192 + 8192 params,
    # 2 bytes each, halved.
    params = 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 2 * 128256 * 8192 + 8192
    assert big.weight_bytes == pytest.approx(params * 2 / 2, rel=1e-6)
    # KV per token: 2 (K, V) x 80 layers x 8 heads x 128 x 2 bytes; each rank keeps 4 of the 8 heads.
    assert big.block_bytes == 16 * 2 * 80 * 4 * 128 * 2
    assert result.requests["status"].eq("completed").all()


def test_a_gpu_holds_either_parallel_instances_of_its_group_or_single_gpu_ones():
    results, _ = run([(0, 0), (1, 1), (1, 2), (0, 2)],
                     [{"name": BIG, "tensor_parallel": 2}, {"name": SMALL}], [(0.0, SMALL, 10, 2)])
    big, small_on_shard, small, big_again = results
    assert big is not None and small_on_shard is None  # GPU 1 belongs to the TP pair 0-1
    assert small is not None and small.shards is None
    assert big_again is None  # GPUs 2-3 hold a one-GPU instance (and 70B does not fit beside it anyway)


def test_every_gpu_of_an_instance_is_busy_for_its_steps():
    _, result = run([(0, 0)], [{"name": BIG, "tensor_parallel": 2}], [(0.0, BIG, 500, 200), (1.0, BIG, 300, 100)])
    per_gpu = result.timeseries.groupby("gpu")["busy_share"].mean()
    assert per_gpu.loc[0] == pytest.approx(per_gpu.loc[1]) and per_gpu.loc[0] > 0
    assert per_gpu.get(2, 0.0) == 0


def test_fast_forward_equals_per_iteration_with_tensor_parallelism():
    rng = np.random.default_rng(3)
    rows = sorted((float(t), BIG if rng.random() < 0.5 else SMALL, int(rng.integers(10, 3000)), int(rng.integers(1, 400)))
                  for t in np.cumsum(rng.exponential(0.1, 150)))
    models = [{"name": BIG, "tensor_parallel": 2}, {"name": SMALL}]
    _, fast = run([(0, 0), (1, 2), (1, 3)], models, rows, mode="fast")
    _, exact = run([(0, 0), (1, 2), (1, 3)], models, rows, mode="exact")
    a, b = fast.requests.sort_values("id"), exact.requests.sort_values("id")
    assert list(a["status"]) == list(b["status"]) and a["status"].eq("completed").all()
    for column in ("first_token_s", "finish_s"):
        assert np.allclose(a[column], b[column], rtol=1e-9, atol=0)


@pytest.mark.parametrize("entry, message", [
    ({"name": BIG, "tensor_parallel": 3}, "does not divide"),
    ({"name": BIG, "tensor_parallel": 4, "pipeline_parallel": 3}, "does not tile"),
    ({"name": BIG, "tensor_parallel": 2, "gpu_share": 0.5}, "gpu_share"),
])
def test_parallel_degrees_that_do_not_fit_the_cluster_are_refused(entry, message):
    with pytest.raises((MmsimError, ValueError), match=message):
        scenario = parse_scenario(scenario_dict(profile="h100-sxm", cluster={"nodes": 2, "gpus_per_node": 4},
                                                models=[entry]), "test")
        simulation.simulate(scenario, chunks=[RequestChunk(np.zeros(1), np.array([BIG], object), np.array([10]),
                                                           np.array([2]))])


def test_tensor_parallel_steps_are_faster_but_less_than_linearly():
    from sim.catalogue import get_model
    from sim.costs import ModelCosts
    from sim.profile import load_profile

    profile, spec = load_profile("h100-sxm"), get_model(BIG)
    one, two, four = (ModelCosts(profile, spec, "fp16", None, tp) for tp in (1, 2, 4))
    for batch, context in ((1, 1000), (64, 64_000)):
        t1, t2, t4 = (c.decode_step_s(batch, context) for c in (one, two, four))
        assert t1 / 2 < t2 < t1 and t2 / 2 < t4 < t2  # launch costs and all-reduces do not shrink with the ranks
    # A pipeline without micro-batches in flight is never faster than one GPU: the same layers plus hand-offs.
    staged = ModelCosts(profile, spec, "fp16", None, 1, 2)
    assert staged.decode_step_s(8, 8000) > one.decode_step_s(8, 8000)
    assert staged.prefill_s(2000) > one.prefill_s(2000)


def test_fp8_kv_halves_kv_bytes_and_doubles_the_tokens_that_fit():
    from sim.catalogue import get_model

    spec = get_model(BIG)
    assert spec.kv_bytes_per_token("fp8") * 2 == spec.kv_bytes_per_token("fp16") == 2 * 80 * 8 * 128 * 2
    summaries = {}
    for kv in ("fp16", "fp8"):
        _, result = run([(0, 0)], [{"name": BIG, "tensor_parallel": 2, "kv_dtype": kv}], [(0.0, BIG, 100, 10)])
        summaries[kv] = result.summary["per_model"][BIG]["max_model_len"]
    assert summaries["fp8"] == pytest.approx(2 * summaries["fp16"], abs=16)  # whole 16-token blocks


def test_one_gpu_entries_are_unchanged_by_explicit_defaults():
    plain = [{"name": SMALL}]
    explicit = [{"name": SMALL, "tensor_parallel": 1, "pipeline_parallel": 1, "kv_dtype": "fp16"}]
    rows = [(0.1 * i, SMALL, 50 + 37 * i % 900, 1 + 13 * i % 300) for i in range(200)]
    _, a = run([(0, 0)], plain, rows)
    _, b = run([(0, 0)], explicit, rows)
    assert a.requests["finish_s"].tolist() == b.requests["finish_s"].tolist()
