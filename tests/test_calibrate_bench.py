"""Every calibration microbenchmark runs on the CPU with tiny sizes, and the torch layer computes what it claims."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from calibrate.bench_compute import LayerChain, bench_decode, bench_head, bench_model, bench_prefill  # noqa: E402
from calibrate.bench_roofline import roofline  # noqa: E402
from calibrate.bench_transfer import bench_link, link_fits  # noqa: E402
from calibrate.bench_weights import bench_load_disk, bench_load_host, bench_unload, drop_page_cache, write_checkpoint  # noqa: E402
from calibrate.build import write_profile  # noqa: E402
from calibrate.hardware import cpu_identity, resolve_device, software_versions  # noqa: E402
from calibrate.layers import DecoderLayer, KVCache, LmHead, Rope, random_tensor, rotation_count, torch_dtype  # noqa: E402
from calibrate.plan import ComputePlan, Plan, no_progress  # noqa: E402
from calibrate.run import Request, run_calibration, total_steps  # noqa: E402
from calibrate.timing import Timing, configured, measure  # noqa: E402
from calibrate.validate import LoopShape, predict, validate  # noqa: E402
from sim.catalogue import ModelSpec, catalogue  # noqa: E402
from sim.costs import ModelCosts  # noqa: E402
from sim.errors import MmsimError  # noqa: E402
from sim.profile import load_profile  # noqa: E402

CPU = torch.device("cpu")
KIB, MIB = 2**10, 2**20
TINY = ModelSpec(name="qwen-tiny", hf_id="test/qwen-tiny", family="qwen2", num_layers=4, hidden_size=64, num_heads=4,
                 num_kv_heads=2, head_dim=16, ffn_size=128, vocab_size=512, tied_embeddings=True, qkv_bias=True)
TINY_QK = dataclasses.replace(TINY, name="qwen3-tiny", qkv_bias=False, qk_norm=True, tied_embeddings=False)
TINY_COMPUTE = ComputePlan(decode_batches=(1, 2, 4), decode_contexts=(8, 32), prefill_tokens=(4, 16, 32),
                           warmup=1, repeats=2, max_kv_bytes=64 * MIB, max_rotation=2)
TINY_PLAN = Plan(device=TINY_COMPUTE, cpu=None, transfer_sizes_bytes=(64 * KIB, 256 * KIB), transfer_repeats=2,
                 load_sizes_bytes=(64 * KIB, 256 * KIB), unload_sizes_bytes=(64 * KIB, 256 * KIB), weight_repeats=2,
                 weight_tensor_bytes=32 * KIB, gemm_size=64, bandwidth_bytes=MIB, roofline_repeats=2)


class Ticks:
    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, description: str) -> None:
        self.seen.append(description)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    """A whole CPU calibration of two tiny models, written and read back."""
    folder = tmp_path_factory.mktemp("calibration")
    request = Request(CPU, (TINY, TINY_QK), "fp32", "tiny", folder)
    ticks = Ticks()
    data = run_calibration(request, TINY_PLAN, ticks)
    path = folder / "tiny.json"
    write_profile(data, path)
    return path, data, ticks, request


# -- the layer itself -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [TINY, TINY_QK], ids=lambda s: s.name)
def test_prefill_equals_token_by_token_decode(spec):
    """Causal attention over the KV cache with RoPE: one prefill pass and P single-token steps agree."""
    dtype = torch.float32
    layer, rope = DecoderLayer(spec, dtype, CPU), Rope(spec.head_dim, 16, dtype, CPU)
    x = random_tensor((2, 10, spec.hidden_size), dtype, CPU, seed=3)
    with torch.inference_mode():
        whole = layer.forward(x, KVCache(spec, 2, 16, dtype, CPU), 0, rope)
        cache = KVCache(spec, 2, 16, dtype, CPU)
        steps = torch.cat([layer.forward(x[:, i:i + 1], cache, i, rope) for i in range(10)], dim=1)
    assert torch.allclose(whole, steps, atol=1e-4)


def test_layer_weights_match_the_catalogue_parameter_count():
    layer = DecoderLayer(TINY_QK, torch.float16, CPU)
    assert layer.nbytes == TINY_QK.layer_params * 2
    head = LmHead(TINY, torch.float16, CPU)
    assert head.nbytes == (TINY.vocab_size * TINY.hidden_size + TINY.hidden_size) * 2  # tied: one matrix
    tokens = head.sample(random_tensor((3, 1, TINY.hidden_size), torch.float16, CPU))
    assert tokens.shape == (3, 1) and int(tokens.max()) < TINY.vocab_size


def test_multi_token_forward_must_start_at_zero():
    layer, rope = DecoderLayer(TINY, torch.float32, CPU), Rope(TINY.head_dim, 16, torch.float32, CPU)
    with pytest.raises(ValueError):
        layer.forward(torch.zeros(1, 2, TINY.hidden_size), KVCache(TINY, 1, 16, torch.float32, CPU), 3, rope)


def test_random_tensor_repeats_a_block_and_has_the_right_scale():
    t = random_tensor((3, 1000), torch.float32, CPU, scale=0.5)
    assert t.shape == (3, 1000) and 0.4 < float(t.std()) < 0.6
    assert math.prod(random_tensor((2**21 + 3,), torch.float16, CPU).shape) == 2**21 + 3


def test_rotation_defeats_the_cache_but_stays_within_limits():
    assert rotation_count(100 * MIB, 300 * MIB, 4) == 4
    assert rotation_count(1 * 2**30, 60 * MIB, 4) == 2
    assert rotation_count(1 * KIB, 300 * MIB, 3) == 3
    assert rotation_count(1 * KIB, 300 * MIB, 1) == 1


def test_quantised_dtypes_are_refused():
    assert torch_dtype("bf16") is torch.bfloat16
    with pytest.raises(MmsimError, match="fp16"):
        torch_dtype("q4")


# -- timing ------------------------------------------------------------------------------------------

def test_measure_counts_warmup_and_repeats_and_uses_min_on_cpu():
    calls = []
    timing = measure(lambda: calls.append(1), CPU, warmup=2, repeats=3)
    assert len(calls) == 5 and len(timing.samples_s) == 3 and timing.statistic == "min"
    record = Timing((1.0, 3.0, 2.0), "min").scaled(0.5).record(batch=2)
    assert record == {"batch": 2, "typical_s": 0.5, "statistic": "min", "median_s": 1.0, "min_s": 0.5, "max_s": 1.5, "repeats": 3}
    assert Timing((1.0, 3.0, 2.0), "median").typical_s == 2.0


# -- each microbenchmark -----------------------------------------------------------------------------

def test_decode_prefill_and_head_benchmarks():
    ticks = Ticks()
    with torch.inference_mode():
        chain = LayerChain.build(TINY, torch.float32, CPU, TINY_COMPUTE)
        decode = bench_decode(chain, TINY_COMPUTE, ticks)
        prefill = bench_prefill(chain, TINY_COMPUTE, ticks)
    head = bench_head(TINY, torch.float32, CPU, TINY_COMPUTE, ticks)
    assert len(chain.layers) == 2
    assert [(s["batch"], s["context_tokens"]) for s in decode] == [(b, b * c) for b in (1, 2, 4) for c in (8, 32)]
    assert [s["prompt_tokens"] for s in prefill] == [4, 16, 32]
    assert [s["batch"] for s in head] == [1, 2, 4]
    assert all(s["typical_s"] > 0 and s["repeats"] == 2 for s in decode + prefill + head)
    assert len(ticks.seen) == TINY_COMPUTE.points


def test_decode_points_over_the_kv_limit_are_skipped():
    plan = dataclasses.replace(TINY_COMPUTE, max_kv_bytes=1)
    ticks = Ticks()
    with torch.inference_mode():
        samples = bench_decode(LayerChain.build(TINY, torch.float32, CPU, plan), plan, ticks)
    assert samples == [] and all("skipped" in t for t in ticks.seen)


def test_bench_model_on_cpu_has_no_hand_off():
    raw = bench_model(TINY_QK, torch.bfloat16, CPU, TINY_COMPUTE, no_progress)
    assert raw["boundary"] == [] and raw["chained_layers"] == 2 and len(raw["decode"]) == 6


def test_link_benchmark_and_fit():
    samples = bench_link(CPU, (64 * KIB, 256 * KIB), (8,), 2, no_progress)
    assert {(s["direction"], s["copies"], s["pinned"]) for s in samples} == {
        (d, c, False) for d in ("host_to_device", "device_to_host") for c in (1, 8)}
    fits = link_fits(CPU, samples)
    for fit in fits.values():
        assert fit["bandwidth_bytes_per_s"] > 0 and fit["per_copy_latency_s"] >= 0 and "memcpy" in fit["note"]


def test_weight_benchmarks(tmp_path):
    path = write_checkpoint(tmp_path, 100 * KIB, 32 * KIB)
    assert path.stat().st_size >= 100 * KIB and drop_page_cache(path)
    disk, dropped = bench_load_disk(CPU, (64 * KIB, 128 * KIB), 32 * KIB, tmp_path, 2, no_progress)
    host = bench_load_host(CPU, (64 * KIB, 128 * KIB), 32 * KIB, 2, no_progress)
    unload = bench_unload(CPU, (64 * KIB, 128 * KIB), 32 * KIB, 2, no_progress)
    assert dropped == hasattr(os, "posix_fadvise")
    assert [s["bytes"] for s in disk] == [64 * KIB, 128 * KIB] and all(s["source"] == "disk" for s in disk)
    assert all(s["typical_s"] > 0 for s in disk + host + unload)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # scratch checkpoints are removed


def test_the_roofline_product_shrinks_to_its_time_budget(monkeypatch):
    # bf16 products on a CPU without native bf16 math ran 2.3 s at size 1024: the timed size must fit the budget.
    from calibrate import bench_roofline

    monkeypatch.setattr(bench_roofline, "GEMM_BUDGET_S", 1e-9)
    assert bench_roofline.gemm_flops_per_s(CPU, torch.float32, 1024, 1)[1]["size"] == bench_roofline.GEMM_PROBE_SIZE
    monkeypatch.setattr(bench_roofline, "GEMM_BUDGET_S", 1e9)
    assert bench_roofline.gemm_flops_per_s(CPU, torch.float32, 512, 1)[1]["size"] == 512


def test_roofline_figures():
    figures = roofline(CPU, torch.float32, 64, MIB, 2)
    assert figures["flops_per_s"] > 1e6 and figures["bandwidth_bytes_per_s"] > 1e6
    assert [s["kind"] for s in figures["samples"]] == ["gemm", "copy"]


# -- identity ------------------------------------------------------------------------------------------

def test_identity_and_device_resolution():
    cpu = cpu_identity()
    assert cpu["cores"] >= 1 and cpu["ram_bytes"] > 0 and cpu["model"]
    assert resolve_device(None, "cpu") == CPU
    assert software_versions(CPU, "quick")["torch"] == torch.__version__
    with pytest.raises(MmsimError, match="either"):
        resolve_device(0, "cpu")
    with pytest.raises(MmsimError, match="expected cpu"):
        resolve_device(None, "cuda:x")
    if not torch.cuda.is_available():
        with pytest.raises(MmsimError, match="--device cpu"):
            resolve_device(0, None)


# -- the whole calibration and its profile ------------------------------------------------------------

def test_calibration_writes_a_profile_the_simulator_accepts(tiny_profile):
    path, data, ticks, request = tiny_profile
    profile = load_profile(path)
    assert len(ticks.seen) == total_steps(TINY_PLAN, request)
    assert profile.hardware.gpu.name.startswith("CPU as device")
    assert profile.hardware.gpu.memory_bandwidth_bytes_per_s > 0 and profile.hardware.cpu.flops_per_s > 0
    for name in ("qwen-tiny", "qwen3-tiny"):
        costs = profile.models[name]
        assert costs.gpu.source == "measured" and costs.dtype == "fp32"
        assert costs.cpu.decode_base_s == costs.gpu.decode_base_s  # the CPU plays both roles
        assert {s["kind"] for s in costs.gpu.samples} == {"decode", "prefill", "head"}
        head_samples = {s["batch"]: s["typical_s"] for s in costs.gpu.samples if s["kind"] == "head"}
        fitted = {b: costs.head_gpu_s + costs.head_gpu_per_seq_s * b for b in head_samples}  # fixed + per-seq fit
        assert all(abs(fitted[b] - t) <= 0.5 * t for b, t in head_samples.items()) and costs.boundary_s == 0.0
    for name in catalogue():
        assert profile.models[name].gpu.source == "estimated"
        model_costs = ModelCosts(profile, catalogue()[name], "fp32")
        assert model_costs.decode_step_s(8, 8000) > model_costs.decode_step_s(1, 100) > 0
    assert profile.link.host_to_device.source == "measured" and profile.link.host_to_device.samples
    assert profile.weights.from_disk.samples and profile.weights.unload.samples
    assert profile.hardware.software["calibrated_device"] == "cpu"
    assert json.loads(path.read_text())["schema_version"] == 1


def subnormals_survive() -> bool:
    """Whether arithmetic still yields subnormal numbers (flushing them is process-wide CPU state)."""
    return sys.float_info.min / 4 > 0.0


def test_calibration_leaves_the_process_float_and_thread_settings_as_it_found_them(tiny_profile):
    """Calibration flushes denormals for speed; left on, it broke later float work in the same process."""
    threads = torch.get_num_threads()
    assert subnormals_survive()
    with configured(CPU, threads + 1):
        assert not subnormals_survive() and torch.get_num_threads() == threads + 1
    assert subnormals_survive() and torch.get_num_threads() == threads


def test_write_profile_refuses_invalid_data_and_leaves_nothing(tiny_profile, tmp_path):
    _, data, _, _ = tiny_profile
    bad = json.loads(json.dumps(data))
    bad["link"]["host_to_device"]["bandwidth_bytes_per_s"] = -1
    with pytest.raises(MmsimError, match="bandwidth_bytes_per_s"):
        write_profile(bad, tmp_path / "bad.json")
    assert list(tmp_path.iterdir()) == []


def test_validate_runs_the_loop_and_predicts_with_the_cost_model(tiny_profile):
    path, _, _, _ = tiny_profile
    profile = load_profile(path)
    shape = LoopShape(layers=3, cpu_layers=1, batch=2, prompt_tokens=8, new_tokens=6)
    result = validate(profile, TINY, CPU, shape, repeats=2)
    decode, prefill = predict(profile, TINY, "fp32", shape)
    assert result["predicted_decode_s"] == pytest.approx(decode)
    assert result["predicted_tokens_per_s"] == pytest.approx(12 / decode)
    assert result["measured_tokens_per_s"] > 0 and math.isfinite(result["error_pct"])
    assert result["gpu_share"] == pytest.approx(2 / 3) and len(result["decode_runs_s"]) == 2
    # the prediction is the simulator's own: three layers' worth of ModelCosts with a growing context
    costs = ModelCosts(profile, dataclasses.replace(TINY, num_layers=3), "fp32")
    steps = sum(costs.decode_step_s(2, 2 * (8 + i), 2 / 3) for i in range(6))
    assert decode == pytest.approx(steps)
    assert prefill == pytest.approx(costs.prefill_s(8, 2 / 3))


def test_validate_rejects_impossible_shapes(tiny_profile):
    profile = load_profile(tiny_profile[0])
    with pytest.raises(MmsimError, match="cpu-layers"):
        validate(profile, TINY, CPU, LoopShape(2, 3, 1, 4, 2), 1)
    with pytest.raises(MmsimError, match="too many"):
        validate(profile, TINY, CPU, LoopShape(5, 0, 1, 4, 2), 1)


def test_a_cpu_without_fast_half_precision_is_named():
    # On an AVX2 CPU fp16 products ran at 1.4 GFLOP/s against 166 in fp32: the profile would price fp16 CPU layers at
    # torch's slow path, silently.
    from calibrate.run import cpu_dtype_note

    note = cpu_dtype_note("fp16", torch.float16, 1.0, 1)
    assert note is not None and "fp16 products at 0.0 GFLOP/s" in note and "--dtype fp32" in note
    assert cpu_dtype_note("fp16", torch.float16, 1e18, 1) is None
    assert cpu_dtype_note("fp32", torch.float32, 1.0, 1) is None
