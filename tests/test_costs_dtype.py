"""A profile's entry for a model, measured at one dtype, prices the model at another by what the dtype changes.

Before, an entry of another dtype was dropped and the model fell back to an unscaled roofline estimate: on
paper-rtx5000, Qwen3-8B with one 512-token request on an idle GPU had TTFT 0.1133 s / TPOT 0.0341 s / reload 4.70 s at
fp16 (its entry's dtype) but 0.0823 / 0.0273 / 4.54 at bf16, which moves the same bytes and runs the same FLOPs. Now
bf16 prices exactly as fp16, and fp8 halves the weights' streaming (launch kept), keeps the compute, and reads the KV
cache at its own dtype. Every expected figure below is worked out by hand from the entry's fields."""

from __future__ import annotations

import numpy as np
import pytest

from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.profile import builtin_profile_names, load_profile, parse_profile
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import scenario_dict, wall_clock_limit

LAUNCH = 1e-4
LAYERS = 36  # qwen2.5-3b
GPU = {"source": "measured", "decode_base_s": 1e-3, "decode_per_seq_s": 1e-4, "decode_per_context_token_s": 1e-7,
       "prefill_base_s": 2e-3, "prefill_per_token_s": 1e-5, "prefill_per_token_sq_s": 1e-9}
CPU = {"source": "measured", "decode_base_s": 5e-3, "decode_per_seq_s": 2e-4, "decode_per_context_token_s": 4e-7,
       "prefill_base_s": 6e-3, "prefill_per_token_s": 4e-5, "prefill_per_token_sq_s": 4e-9}


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):
        yield


def hand_profile(**entry) -> dict:
    """One fp16 entry for qwen2.5-3b with round numbers, a 0.1 ms launch, a 2 s fixed reload and a 0.2 s fixed unload."""
    link = {"source": "measured", "latency_s": 0.0, "bandwidth_bytes_per_s": 1e10}
    load = {"source": "measured", "fixed_s": 2.0, "bandwidth_bytes_per_s": 1e9}
    return {
        "schema_version": 1, "name": "hand", "gpu_launch_overhead_s": LAUNCH, "hardware": {
            "gpu": {"source": "measured", "name": "G", "memory_bytes": 2**35},
            "cpu": {"source": "measured", "model": "C", "cores": 2}},
        "link": {"host_to_device": link, "device_to_host": link},
        "weights": {"from_disk": load, "from_host": load,
                    "unload": {"source": "measured", "fixed_s": 0.2, "seconds_per_gib": 0.01}},
        "step_overhead": {"source": "measured", "fixed_s": 5e-4, "per_seq_s": 1e-5},
        "models": {"qwen2.5-3b": {"dtype": "fp16", "gpu": GPU, "head_gpu_s": 1e-3, "head_gpu_per_seq_s": 1e-5,
                                  "swap": {"source": "measured", "reload_s": 10.0, "unload_s": 1.0}, **entry}},
    }


def hand_costs(dtype: str, kv_dtype: str | None = None, **entry) -> ModelCosts:
    return ModelCosts(parse_profile(hand_profile(**entry), "test"), get_model("qwen2.5-3b"), dtype, kv_dtype)


def test_bf16_prices_exactly_as_the_fp16_entry():
    fp16, bf16 = hand_costs("fp16"), hand_costs("bf16")
    for batch, context in ((1, 0), (8, 4000), (64, 100_000)):
        assert bf16.decode_step_s(batch, context) == fp16.decode_step_s(batch, context)
    for tokens, cached in ((1, 0), (512, 0), (2048, 3000)):
        assert bf16.prefill_s(tokens, 1.0, cached) == fp16.prefill_s(tokens, 1.0, cached)
    assert bf16.reload_s() == fp16.reload_s() == 10.0
    assert bf16.unload_s() == fp16.unload_s() == 1.0
    profile = parse_profile(hand_profile(), "test")
    assert ModelCosts(profile, get_model("qwen2.5-3b"), "bf16").entry is profile.models["qwen2.5-3b"]  # as it is


def test_fp16_entry_by_hand():
    costs = hand_costs("fp16")
    # 36 x (1 ms + 8 x 0.1 ms + 4000 x 1e-7) + head (1 ms + 8 x 10 us) + overhead (0.5 ms + 8 x 10 us)
    assert costs.decode_step_s(8, 4000) == pytest.approx(36 * (1e-3 + 8e-4 + 4e-4) + 1.08e-3 + 5.8e-4, rel=1e-12)


@pytest.mark.parametrize("kv_dtype, kv_read_s", [(None, 4e-4), ("fp16", 4e-4), ("fp8", 2e-4)])
def test_fp8_halves_the_weight_streaming_and_keeps_the_compute(kv_dtype, kv_read_s):
    costs = hand_costs("fp8", kv_dtype)
    # Layer base: 0.1 ms launch + 0.9 ms streaming / 2 = 0.55 ms; head: 0.1 ms + 0.9 ms / 2 = 0.55 ms. Per-sequence
    # compute (0.1 ms a layer, 10 us the head) and the engine's overhead as measured. The 4000 context tokens' KV reads
    # (0.4 ms a layer at fp16) are halved only by an fp8 KV cache: fp8 weights keep a 16-bit cache by default.
    by_hand = 36 * (0.55e-3 + 8e-4 + kv_read_s) + (0.55e-3 + 8e-5) + 5.8e-4
    assert costs.decode_step_s(8, 4000) == pytest.approx(by_hand, rel=1e-12)
    # Prefill: base 0.1 ms + 1.9 ms / 2 = 1.05 ms; 1000 tokens of compute (1e-5 each, 1e-9 x 1000^2) kept.
    assert costs.prefill_s(1000) == pytest.approx(36 * (1.05e-3 + 1e-2 + 1e-3) + (0.55e-3 + 1e-5) + 5.1e-4, rel=1e-12)
    # Reload: the 2 s fixed part plus the 8 s of moving bytes halved; unload: 0.2 s + 0.8 s / 2.
    assert costs.reload_s() == pytest.approx(6.0, rel=1e-12)
    assert costs.unload_s() == pytest.approx(0.6, rel=1e-12)
    assert costs.swap_penalty_s() == pytest.approx(6.6, rel=1e-12)


def test_an_fp8_kv_cache_on_fp16_weights_halves_only_the_kv_reads():
    costs = hand_costs("fp16", "fp8")
    assert costs.decode_step_s(8, 4000) == pytest.approx(36 * (1e-3 + 8e-4 + 2e-4) + 1.08e-3 + 5.8e-4, rel=1e-12)


def test_q4_and_fp32_scale_the_streaming_by_their_bits():
    q4 = hand_costs("q4")  # 4.5 bits a weight: 0.28125 of fp16's bytes
    assert q4.decode_step_s(1, 0) == pytest.approx(36 * (1e-4 + 9e-4 * 0.28125 + 1e-4) + (1e-4 + 9e-4 * 0.28125 + 1e-5)
                                                  + 5.1e-4, rel=1e-12)
    assert q4.reload_s() == pytest.approx(2.0 + 8.0 * 0.28125, rel=1e-12)
    # fp32: twice the weight bytes, and its default KV cache is fp32 too: twice the KV reads.
    fp32 = hand_costs("fp32")
    assert fp32.decode_step_s(8, 4000) == pytest.approx(36 * (1.9e-3 + 8e-4 + 8e-4) + (1.9e-3 + 8e-5) + 5.8e-4, rel=1e-12)
    assert fp32.reload_s() == pytest.approx(18.0, rel=1e-12)
    assert fp32.unload_s() == pytest.approx(1.8, rel=1e-12)


def test_measured_grids_shift_by_the_streaming_saved():
    grid = [{"batch": 4, "base_s": 1.5e-3, "per_context_token_s": 1e-7},
            {"batch": 16, "base_s": 3.0e-3, "per_context_token_s": 1.2e-7}]
    heads = [{"batch": 4, "seconds": 1.1e-3}, {"batch": 16, "seconds": 1.4e-3}]
    costs = hand_costs("fp8", "fp8", gpu=GPU | {"decode_grid": grid}, head_gpu_grid=heads)
    # Each grid base less the 0.45 ms of streaming saved (batch compute kept), its KV reads halved (fp8 KV); each
    # head point less its 0.45 ms.
    assert costs.decode_step_s(4, 1000) == pytest.approx(36 * (1.05e-3 + 1000 * 0.5e-7) + 0.65e-3 + 5.4e-4, rel=1e-12)
    assert costs.decode_step_s(16, 1000) == pytest.approx(36 * (2.55e-3 + 1000 * 0.6e-7) + 0.95e-3 + 6.6e-4, rel=1e-12)


def test_a_measured_cpu_scales_without_a_launch():
    costs = hand_costs("fp8", cpu=CPU, head_cpu_s=4e-3, head_cpu_per_seq_s=1e-5)
    # Every layer on the CPU (share 0): bases 5 ms / 2, compute kept; the CPU's head 4 ms / 2 + 10 us per sequence.
    assert costs.decode_step_s(1, 1000, 0.0) == pytest.approx(36 * (2.5e-3 + 2e-4 + 4e-4) + (2e-3 + 1e-5) + 5.1e-4, rel=1e-12)
    assert costs.prefill_s(100, 0.0) == pytest.approx(36 * (3e-3 + 4e-3 + 4e-5) + (2e-3 + 1e-5) + 5.1e-4, rel=1e-12)


def test_a_dtype_never_drops_the_entry_on_the_paper_profile():
    """The audit's figures: Qwen3-8B on paper-rtx5000, whose entry is derived at fp16 (launch 20 us, no overhead)."""
    profile = load_profile("paper-rtx5000")
    entry = profile.models["qwen3-8b"]
    layer, launch = entry.gpu, profile.gpu_launch_overhead_s
    fp16, bf16, fp8 = (ModelCosts(profile, get_model("qwen3-8b"), dtype) for dtype in ("fp16", "bf16", "fp8"))
    for batch, context in ((1, 0), (1, 600), (32, 50_000)):
        assert bf16.decode_step_s(batch, context) == fp16.decode_step_s(batch, context)
        assert fp8.decode_step_s(batch, context) < fp16.decode_step_s(batch, context)
    assert bf16.prefill_s(512) == fp16.prefill_s(512) == pytest.approx(0.1133, abs=5e-5)
    assert bf16.reload_s() == fp16.reload_s() == 4.7 and bf16.unload_s() == fp16.unload_s() == 0.41
    # fp8: the streaming part of each of the 36 layers and of the head halves...
    saved = 36 * (layer.decode_base_s - launch) / 2 + (entry.head_gpu_s - launch) / 2
    assert fp16.decode_step_s(1, 0) - fp8.decode_step_s(1, 0) == pytest.approx(saved, rel=1e-9)
    assert fp8.decode_step_s(1, 0) == pytest.approx(
        36 * (launch + (layer.decode_base_s - launch) / 2 + layer.decode_per_seq_s) + launch + (entry.head_gpu_s - launch) / 2,
        rel=1e-12)
    # ...while compute (more sequences, more prompt tokens) and KV reads (fp16 KV either way) cost the same.
    assert fp8.decode_step_s(9, 5000) - fp8.decode_step_s(1, 0) == pytest.approx(
        fp16.decode_step_s(9, 5000) - fp16.decode_step_s(1, 0), rel=1e-9)
    assert fp8.prefill_s(2000) - fp8.prefill_s(1) == pytest.approx(fp16.prefill_s(2000) - fp16.prefill_s(1), rel=1e-9)
    # Reload: Table II's 4.7 s less the profile's fixed 1.754 s, halved; unload likewise (fixed 0.197 s).
    disk, unload = profile.weights.from_disk.fixed_s, profile.weights.unload.fixed_s
    assert fp8.reload_s() == pytest.approx(disk + (4.7 - disk) / 2, rel=1e-12)
    assert fp8.reload_s() == pytest.approx(3.2269, abs=1e-4)
    assert fp8.unload_s() == pytest.approx(unload + (0.41 - unload) / 2, rel=1e-12)


@pytest.mark.parametrize("profile_name", builtin_profile_names())
def test_fewer_weight_bits_are_never_slower(profile_name):
    """Across every built-in entry: each dtype of fewer bits prices every step and every swap at most as a wider one."""
    profile = load_profile(profile_name)
    order = ("q4", "fp8", "fp16", "fp32")
    for name in profile.models:
        costs = [ModelCosts(profile, get_model(name), dtype) for dtype in order]
        for narrow, wide in zip(costs, costs[1:]):
            for share in (1.0, 0.6, 0.0):
                assert narrow.decode_step_s(16, 20_000, share) <= wide.decode_step_s(16, 20_000, share)
                assert narrow.prefill_s(1000, share, 500) <= wide.prefill_s(1000, share, 500)
                assert narrow.decode_step_s(1, 100, share * 0.5) >= narrow.decode_step_s(1, 100, share) * (1 - 1e-12)
            assert narrow.reload_s() <= wide.reload_s() and narrow.unload_s() <= wide.unload_s()


def one_request(dtype: str):
    scenario = parse_scenario(scenario_dict(
        models=[{"name": "qwen3-8b", "dtype": dtype}], cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 256},
        engine={"max_num_seqs": 64, "max_num_batched_tokens": 8192}), "test")
    chunks = [RequestChunk(np.array([100.0]), np.array(["qwen3-8b"], object), np.array([512]), np.array([100]))]
    return simulate(scenario, policy="static", chunks=chunks).requests.iloc[0]


def test_one_request_end_to_end_at_fp16_bf16_and_fp8():
    fp16, bf16, fp8 = one_request("fp16"), one_request("bf16"), one_request("fp8")
    for column in ("first_token_s", "finish_s", "ttft_s", "tpot_s"):
        assert bf16[column] == fp16[column], column
    assert fp16["ttft_s"] == pytest.approx(0.1133, abs=5e-5) and fp16["tpot_s"] == pytest.approx(0.0341, abs=5e-5)
    # fp8, by hand from the entry: a 512-token prefill with its base's streaming halved; 99 decode steps at batch 1
    # over 513..611 context tokens (fp16 KV), their bases and the head's streaming halved.
    profile = load_profile("paper-rtx5000")
    entry, launch = profile.models["qwen3-8b"], profile.gpu_launch_overhead_s
    layer = entry.gpu
    head = launch + (entry.head_gpu_s - launch) / 2
    ttft = 36 * (launch + (layer.prefill_base_s - launch) / 2 + layer.prefill_per_token_s * 512
                 + layer.prefill_per_token_sq_s * 512 ** 2) + head
    tpot = 36 * (launch + (layer.decode_base_s - launch) / 2 + layer.decode_per_seq_s
                 + layer.decode_per_context_token_s * 562) + head
    assert fp8["ttft_s"] == pytest.approx(ttft, rel=1e-6)
    assert fp8["tpot_s"] == pytest.approx(tpot, rel=1e-4)
    assert fp8["tpot_s"] == pytest.approx(0.0175, abs=1e-4)
