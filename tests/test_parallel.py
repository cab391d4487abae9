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


def run(loads, models, requests, mode="fast", gpus_per_node=4, nodes=1, engine=None):
    data = scenario_dict(profile="h100-sxm", cluster={"nodes": nodes, "gpus_per_node": gpus_per_node}, models=models)
    data["engine"] |= engine or {}
    scenario = parse_scenario(data, "test")
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


@pytest.mark.parametrize("big, loads, gpus_per_node, nodes, engine", [
    ({"tensor_parallel": 2}, [(0, 0), (1, 2), (1, 3)], 4, 1, {}),
    ({"pipeline_parallel": 2}, [(0, 0), (1, 2), (1, 3)], 4, 1, {}),
    # Stages on two nodes of two GPUs, hand-offs over the network; the memory limit makes the KV room short.
    ({"tensor_parallel": 2, "pipeline_parallel": 2}, [(0, 0)], 2, 2, {"gpu_memory_utilization": 0.45}),
], ids=["tp2", "pp2", "tp2xpp2"])
def test_fast_forward_equals_per_iteration_with_parallelism_under_kv_pressure(big, loads, gpus_per_node, nodes, engine):
    rng = np.random.default_rng(3)
    rows = sorted((float(t), BIG if len(loads) == 1 or rng.random() < 0.5 else SMALL, int(rng.integers(10, 3000)),
                   int(rng.integers(1, 400))) for t in np.cumsum(rng.exponential(0.05, 150)))
    models = [{"name": BIG, **big}, {"name": SMALL}]
    _, fast = run(loads, models, rows, "fast", gpus_per_node, nodes, engine)
    _, exact = run(loads, models, rows, "exact", gpus_per_node, nodes, engine)
    a, b = fast.requests.sort_values("id"), exact.requests.sort_values("id")
    assert list(a["status"]) == list(b["status"]) and a["status"].eq("completed").all()
    assert list(a["preemptions"]) == list(b["preemptions"]) and a.loc[a["model"] == BIG, "preemptions"].sum() > 0
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


def test_a_pipeline_iteration_is_its_largest_micro_batch_passing_every_stage():
    from sim.catalogue import get_model
    from sim.costs import ModelCosts
    from sim.profile import load_profile

    profile, spec = load_profile("h100-sxm"), get_model(BIG)
    one, staged = ModelCosts(profile, spec), ModelCosts(profile, spec, "fp16", None, 1, 2)
    across = ModelCosts(profile, spec, "fp16", None, 1, 2, stages_cross_nodes=True)
    per_seq = one.step_overhead_per_seq_s

    def handoff_s(tokens, link=profile.hardware.interconnect):  # one stage's activations: tokens x 8192 x 2 bytes
        return link.latency_s + tokens * 8192 * 2 / link.bandwidth_bytes_per_s

    # One sequence is one micro-batch: the other stage idles (the bubble), so one GPU's step plus the hand-off.
    assert staged.decode_step_s(1, 3000) == pytest.approx(one.decode_step_s(1, 3000) + handoff_s(1), rel=1e-12)
    assert across.decode_step_s(1, 3000) == pytest.approx(
        one.decode_step_s(1, 3000) + handoff_s(1, profile.hardware.network), rel=1e-12)
    # Three sequences: micro-batches of 2 and 1 in flight; the iteration is the pass of the 2, holding 2/3 of the
    # context, while the engine's CPU overhead is all three sequences'.
    assert staged.decode_step_s(3, 9000) == pytest.approx(one.decode_step_s(2, 6000) + per_seq + handoff_s(2), rel=1e-12)
    assert staged.decode_step_s(64, 64_000) == pytest.approx(
        one.decode_step_s(32, 32_000) + 32 * per_seq + handoff_s(32), rel=1e-12)
    # Both stages busy: faster than one GPU at the same batch, but each stage reads its weights once per micro-batch.
    assert one.decode_step_s(64, 64_000) / 2 < staged.decode_step_s(64, 64_000) < one.decode_step_s(64, 64_000)
    # A single prompt is one micro-batch.
    assert staged.prefill_s(2000, context_before=500) == pytest.approx(
        one.prefill_s(2000, context_before=500) + handoff_s(2000), rel=1e-12)
    # 2 decodes over 5000 tokens and chunks of 1000 and 600 (over 400 cached) tokens: two micro-batches, each of
    # one decode, one chunk, half the chunk tokens and half the attention term.
    quadratic = 1000 * 1000 + 600 * (600 + 2 * 400)
    assert staged.mixed_step_s(2, 5000, 1600, quadratic, 2) == pytest.approx(
        one.mixed_step_s(1, 2500, 800, quadratic // 2, 1) + 2 * per_seq + handoff_s(801), rel=1e-12)
    # A chunk is one sequence's, whole: beside 3 decodes it rides with 2 of them (and 2/3 of their context).
    assert staged.mixed_step_s(3, 6000, 1000, 1000 * 1000, 1) == pytest.approx(
        one.mixed_step_s(2, 4000, 1000, 1000 * 1000, 1) + per_seq + handoff_s(1002), rel=1e-12)


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
