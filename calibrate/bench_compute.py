"""Compute microbenchmarks of one model on one device: per-layer decode and prefill, LM head, GPU<->CPU hand-off.

Layers are timed as a chain of a few distinct layers (each with its own KV
cache), the way a forward pass runs them, and the time is divided by the chain
length; see :func:`calibrate.layers.rotation_count` for why one layer alone
would read too fast. Grid points are timed in interleaved rounds
(:func:`calibrate.timing.measure_rounds`).
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from calibrate.layers import DecoderLayer, KVCache, LmHead, Rope, last_level_cache_bytes, random_tensor, rotation_count
from calibrate.plan import ComputePlan, Tick
from calibrate.timing import measure, measure_rounds
from sim.catalogue import ModelSpec


@dataclass
class LayerChain:
    """A few distinct decoder layers of one model on one device, with rotary tables long enough for the grids."""

    spec: ModelSpec
    dtype: torch.dtype
    device: torch.device
    layers: list[DecoderLayer]
    rope: Rope

    @classmethod
    def build(cls, spec: ModelSpec, dtype: torch.dtype, device: torch.device, plan: ComputePlan) -> LayerChain:
        per_layer_bytes = spec.layer_params * torch.finfo(dtype).bits / 8
        limit = min(plan.max_rotation, spec.num_layers)
        count = rotation_count(per_layer_bytes, last_level_cache_bytes(device), limit)
        positions = max(max(plan.decode_contexts) + 1, max(plan.prefill_tokens))
        layers = [DecoderLayer(spec, dtype, device, seed=10 * i) for i in range(count)]
        return cls(spec, dtype, device, layers, Rope(spec.head_dim, positions, dtype, device))

    def kv_bytes(self, batch: int, tokens: int) -> int:
        """KV cache bytes for ``batch`` sequences of ``tokens`` across the chain."""
        element = torch.finfo(self.dtype).bits // 8
        return len(self.layers) * 2 * batch * self.spec.num_kv_heads * self.spec.head_dim * tokens * element

    def caches(self, batch: int, tokens: int) -> list[KVCache]:
        return [KVCache(self.spec, batch, tokens, self.dtype, self.device) for _ in self.layers]

    def forward(self, x: torch.Tensor, caches: list[KVCache], start: int) -> torch.Tensor:
        for layer, cache in zip(self.layers, caches):
            x = layer.forward(x, cache, start, self.rope)
        return x


def bench_decode(chain: LayerChain, plan: ComputePlan, tick: Tick) -> list[dict]:
    """Per-layer decode step time over the (batch, context) grid; C is the batch's total cached tokens."""
    points = []
    for batch in plan.decode_batches:
        for context in plan.decode_contexts:
            if chain.kv_bytes(batch, context + 1) <= plan.max_kv_bytes:
                points.append((batch, context))
            else:
                for _ in range(plan.repeats):
                    tick(f"{chain.spec.name} decode on {chain.device.type}: batch {batch}, context {context} "
                         "(skipped: KV over the plan's limit)")
    timings = measure_rounds([partial(_chain_call, chain, batch, 1, context) for batch, context in points],
                             chain.device, plan.warmup, plan.repeats,
                             _ticker(tick, plan, [f"{chain.spec.name} decode on {chain.device.type}: batch {b}, context {c}"
                                                  for b, c in points]))
    layers = len(chain.layers)
    return [timing.scaled(1 / layers).record(batch=batch, context_per_seq=context, context_tokens=batch * context,
                                             chained_layers=layers)
            for (batch, context), timing in zip(points, timings)]


def bench_prefill(chain: LayerChain, plan: ComputePlan, tick: Tick) -> list[dict]:
    """Per-layer prefill time of one prompt over the prompt-length grid."""
    timings = measure_rounds([partial(_chain_call, chain, 1, tokens, 0) for tokens in plan.prefill_tokens],
                             chain.device, plan.warmup, plan.repeats,
                             _ticker(tick, plan, [f"{chain.spec.name} prefill on {chain.device.type}: {tokens} tokens"
                                                  for tokens in plan.prefill_tokens]))
    layers = len(chain.layers)
    return [timing.scaled(1 / layers).record(prompt_tokens=tokens, chained_layers=layers)
            for tokens, timing in zip(plan.prefill_tokens, timings)]


def _chain_call(chain: LayerChain, batch: int, tokens: int, start: int) -> Callable[[], object]:
    """The chain's forward pass on ``tokens`` new tokens per sequence at position ``start``, with fresh KV caches."""
    caches = chain.caches(batch, start + tokens)
    x = random_tensor((batch, tokens, chain.spec.hidden_size), chain.dtype, chain.device, seed=5)
    return lambda: chain.forward(x, caches, start)


def _ticker(tick: Tick, plan: ComputePlan, labels: list[str]) -> Callable[[int, int], None]:
    return lambda round_index, index: tick(f"{labels[index]} (round {round_index + 1}/{plan.repeats})")


def bench_head(spec: ModelSpec, dtype: torch.dtype, device: torch.device, plan: ComputePlan, tick: Tick) -> list[dict]:
    """LM head + greedy sampling + embedding of the sampled tokens, per decode step, over the batch grid."""
    head = LmHead(spec, dtype, device)

    def call(batch: int) -> Callable[[], object]:
        hidden = random_tensor((batch, 1, spec.hidden_size), dtype, device, seed=7)
        return lambda: head.step(hidden)

    labels = [f"{spec.name} LM head on {device.type}: batch {batch}" for batch in plan.decode_batches]
    timings = measure_rounds([partial(call, batch) for batch in plan.decode_batches], device, plan.warmup,
                             plan.repeats, _ticker(tick, plan, labels))
    return [timing.record(batch=batch) for batch, timing in zip(plan.decode_batches, timings)]


def bench_boundary(spec: ModelSpec, dtype: torch.dtype, device: torch.device, plan: ComputePlan) -> list[dict]:
    """GPU -> CPU -> GPU round trip of a decode batch's hidden states: the hand-off when layers are split."""
    samples = []
    for batch in plan.decode_batches:
        hidden = random_tensor((batch, 1, spec.hidden_size), dtype, device, seed=8)
        timing = measure(lambda: hidden.to("cpu").to(device), device, plan.warmup, plan.repeats)
        samples.append(timing.record(batch=batch))
    return samples


def reference_batch(plan: ComputePlan) -> int:
    """The batch size a single-number cost (LM head, hand-off) is quoted at: the middle of the decode grid."""
    return int(statistics.median_low(plan.decode_batches))


def release(device: torch.device) -> None:
    """Return freed memory to the device so the next model starts from a clean allocator."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_model(spec: ModelSpec, dtype: torch.dtype, device: torch.device, plan: ComputePlan, tick: Tick) -> dict:
    """Every compute benchmark of one model on one device: raw samples by kind."""
    with torch.inference_mode():
        chain = LayerChain.build(spec, dtype, device, plan)
        decode = bench_decode(chain, plan, tick)
        prefill = bench_prefill(chain, plan, tick)
        chained = len(chain.layers)
        del chain
        release(device)
        head = bench_head(spec, dtype, device, plan, tick)
        release(device)
        boundary = bench_boundary(spec, dtype, device, plan) if device.type == "cuda" else []
    return {"decode": decode, "prefill": prefill, "head": head, "boundary": boundary, "chained_layers": chained}
