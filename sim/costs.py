"""Cost model: what the engine charges for compute, KV transfers and weight movement.

One :class:`ModelCosts` answers every timing question about one model (at one
dtype) on one profile's hardware. Per-layer costs come from the profile when it
has the model (measured, published or derived) and from a roofline estimate of
the profile's GPU and CPU otherwise.

Decode of B sequences holding C context tokens in total, with n_gpu of the L
layers on the GPU (share g = n_gpu / L)::

    t = n_gpu * t_gpu(B, C) + n_cpu * t_cpu(B, C) + boundary (if split) + head

A measured offload curve, when the profile has one, replaces the split terms:
``t = t_all_gpu(B, C) / curve(g)``. Every step time is affine in C, so a run of
k steps whose context grows by B per step has a closed-form sum; the engine's
fast-forward relies on that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim import profile as prof
from sim.catalogue import ModelSpec

GIB = 2**30
ROOFLINE_NOTE = "roofline estimate from the profile's GPU/CPU bandwidth and FLOP/s"


@dataclass(frozen=True)
class StepCoefficients:
    """A decode step time ``base_s + per_context_token_s * C`` for a fixed batch size and placement."""

    base_s: float
    per_context_token_s: float

    def step_s(self, context_tokens: float) -> float:
        return self.base_s + self.per_context_token_s * context_tokens

    def steps_s(self, context_tokens: float, batch: int, steps: int) -> float:
        """Sum of ``steps`` consecutive steps, context growing by ``batch`` tokens per step."""
        # step_s(context_tokens), written out: this runs several times per simulated step.
        first_s = self.base_s + self.per_context_token_s * context_tokens
        return steps * first_s + self.per_context_token_s * batch * steps * (steps - 1) / 2


class _PrefillLayer:
    """A layer's prefill cost ``base + per_token * P + per_token_sq * (P^2 + 2PC)``, as plain floats."""

    def __init__(self, cost: prof.LayerCost):
        self.base_s: float = cost.prefill_base_s
        self.per_token_s: float = cost.prefill_per_token_s
        self.per_token_sq_s: float = cost.prefill_per_token_sq_s

    def seconds(self, tokens: int, quadratic: int) -> float:
        return self.base_s + self.per_token_s * tokens + self.per_token_sq_s * quadratic


def estimate_layer_cost(spec: ModelSpec, dtype: str, bandwidth: float, flops: float, launch_s: float, note: str) -> prof.LayerCost:
    """Roofline per-layer cost: weights stream once per step, FLOPs scale with tokens."""
    weight_read_s = spec.layer_weight_bytes(dtype) / bandwidth
    return prof.LayerCost(
        source="estimated",
        note=note,
        decode_base_s=weight_read_s + launch_s,
        decode_per_seq_s=2 * spec.layer_params / flops,
        decode_per_context_token_s=spec.kv_bytes_per_token_per_layer() / bandwidth,
        prefill_base_s=weight_read_s + launch_s,
        prefill_per_token_s=2 * spec.layer_params / flops,
        prefill_per_token_sq_s=2 * spec.num_heads * spec.head_dim / flops,
    )


def _gpu_figures(profile: prof.Profile) -> tuple[float, float]:
    gpu = profile.hardware.gpu
    return gpu.memory_bandwidth_bytes_per_s or 1.0e12, gpu.bf16_flops_per_s or 1.0e14


def _cpu_figures(profile: prof.Profile) -> tuple[float, float]:
    cpu = profile.hardware.cpu
    return cpu.memory_bandwidth_bytes_per_s or 5.0e10, cpu.flops_per_s or 1.0e12


class ModelCosts:
    """Timing of one model (at one dtype) on one profile's hardware."""

    def __init__(self, profile: prof.Profile, spec: ModelSpec, dtype: str = "fp16"):
        self.profile = profile
        self.spec = spec
        self.dtype = dtype
        entry = profile.models.get(spec.name)
        if entry is not None and entry.dtype != dtype:
            entry = None
        self.entry = entry
        launch = profile.gpu_launch_overhead_s
        gpu_bw, gpu_flops = _gpu_figures(profile)
        cpu_bw, cpu_flops = _cpu_figures(profile)
        self.gpu = entry.gpu if entry else estimate_layer_cost(spec, dtype, gpu_bw, gpu_flops, launch, ROOFLINE_NOTE)
        self.cpu = (entry.cpu if entry and entry.cpu else
                    estimate_layer_cost(spec, dtype, cpu_bw, cpu_flops, 0.0, ROOFLINE_NOTE))
        head_bytes = spec.vocab_size * spec.hidden_size * spec.weight_bytes(dtype) / spec.params
        self.head_gpu_s = entry.head_gpu_s if entry else head_bytes / gpu_bw + launch
        self.head_cpu_s = entry.head_cpu_s if entry and entry.cpu else head_bytes / cpu_bw
        self.head_gpu_per_seq_s = entry.head_gpu_per_seq_s if entry else 0.0
        self.head_cpu_per_seq_s = entry.head_cpu_per_seq_s if entry and entry.cpu else 0.0
        self.boundary_s = entry.boundary_s if entry else 0.0
        curve = entry.offload_curve if entry else None
        self._curve = (np.array([p.gpu_share for p in curve.points]), np.array([p.normalized_throughput for p in curve.points])) if curve else None
        if self._curve is not None:
            order = np.argsort(self._curve[0])
            self._curve = (self._curve[0][order], self._curve[1][order])
        self._coefficients: dict[int, StepCoefficients] = {}
        # The figures every step reads, copied out of the profile's models once (native fields when compiled).
        self._layers: int = spec.num_layers
        self._kv_bytes_per_token: int = spec.kv_bytes_per_token()
        self._gpu_prefill = _PrefillLayer(self.gpu)
        self._cpu_prefill = _PrefillLayer(self.cpu)

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self._layers

    def gpu_layers(self, gpu_share: float) -> int:
        if gpu_share == 1.0:  # nearly every call
            return self._layers
        return int(round(gpu_share * self._layers))

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes_per_token

    def weight_bytes(self) -> int:
        return self.spec.weight_bytes(self.dtype)

    def gpu_weight_bytes(self, gpu_share: float = 1.0) -> int:
        """Weights resident on the GPU when ``gpu_share`` of the layers are there (embeddings and head stay on GPU)."""
        layers = self.spec.layer_weight_bytes(self.dtype) * self.gpu_layers(gpu_share)
        rest = self.weight_bytes() - self.spec.layer_weight_bytes(self.dtype) * self._layers
        return int(layers + (rest if gpu_share > 0 else 0))

    # -- compute -------------------------------------------------------------------------------
    def step_coefficients(self, batch: int, gpu_share: float = 1.0) -> StepCoefficients:
        """Decode step time for ``batch`` sequences as an affine function of total context."""
        n_gpu = self.gpu_layers(gpu_share)
        key = batch * (self._layers + 1) + n_gpu  # (batch, n_gpu) as one int: cheaper to hash than a tuple
        cached = self._coefficients.get(key)
        if cached is not None:
            return cached
        n_cpu = self._layers - n_gpu
        if self._curve is not None:
            factor = 1.0 / float(np.interp(n_gpu / self._layers, *self._curve))
            n_gpu, n_cpu, boundary = self._layers, 0, 0.0
        else:
            factor, boundary = 1.0, (self.boundary_s if 0 < n_gpu < self._layers else 0.0)
        g, c = self.gpu, self.cpu
        base = (n_gpu * (g.decode_base_s + g.decode_per_seq_s * batch)
                + n_cpu * (c.decode_base_s + c.decode_per_seq_s * batch)
                + boundary + self._head_s(n_gpu > 0, batch))
        per_context = n_gpu * g.decode_per_context_token_s + n_cpu * c.decode_per_context_token_s
        result = StepCoefficients(base * factor, per_context * factor)
        self._coefficients[key] = result
        return result

    def _head_s(self, on_gpu: bool, batch: int) -> float:
        """LM head + sampling for one step of ``batch`` sequences, on the GPU or (all layers offloaded) the CPU."""
        if on_gpu:
            return self.head_gpu_s + self.head_gpu_per_seq_s * batch
        return self.head_cpu_s + self.head_cpu_per_seq_s * batch

    def decode_step_s(self, batch: int, context_tokens: float, gpu_share: float = 1.0) -> float:
        return self.step_coefficients(batch, gpu_share).step_s(context_tokens)

    def prefill_s(self, tokens: int, gpu_share: float = 1.0, context_before: int = 0) -> float:
        """Forward pass over ``tokens`` new tokens that attend to ``context_before`` cached ones."""
        n_gpu = self.gpu_layers(gpu_share)
        n_cpu = self._layers - n_gpu
        quadratic = tokens * tokens + 2 * tokens * context_before
        boundary = self.boundary_s if 0 < n_gpu < self._layers else 0.0
        return (n_gpu * self._gpu_prefill.seconds(tokens, quadratic) + n_cpu * self._cpu_prefill.seconds(tokens, quadratic)
                + boundary + self._head_s(n_gpu > 0, 1))

    def mixed_step_s(self, batch: int, context_tokens: float, prefill_tokens: int, prefill_context: int,
                     gpu_share: float = 1.0) -> float:
        """One iteration holding ``batch`` decodes and a prefill chunk: fixed per-layer costs are paid once."""
        if prefill_tokens == 0:
            return self.decode_step_s(batch, context_tokens, gpu_share)
        prefill = self.prefill_s(prefill_tokens, gpu_share, prefill_context)
        if batch == 0:
            return prefill
        overlap = self.decode_step_s(0, 0, gpu_share)
        return prefill + self.decode_step_s(batch, context_tokens, gpu_share) - overlap

    # -- movement ------------------------------------------------------------------------------
    def kv_transfer_s(self, tokens: int, direction: str) -> float:
        """Move ``tokens`` tokens of KV cache; direction is ``device_to_host`` or ``host_to_device``."""
        if tokens <= 0:
            return 0.0
        fit: prof.TransferFit = getattr(self.profile.link, direction)
        override = self.entry.kv_transfer if self.entry else None
        fixed = getattr(override, f"{direction}_s") if override else fit.latency_s + 2 * self._layers * fit.per_copy_latency_s
        return fixed + tokens * self.kv_bytes_per_token / fit.bandwidth_bytes_per_s

    def reload_s(self, gpu_share: float = 1.0, from_host: bool = False) -> float:
        """Load the GPU-resident part of the weights, from disk or from a host-RAM copy."""
        fraction = self.gpu_weight_bytes(gpu_share) / self.weight_bytes()
        if fraction == 0:
            return 0.0
        fit = self.profile.weights.from_host if from_host else self.profile.weights.from_disk
        swap = self.entry.swap if self.entry else None
        if swap is not None and not from_host:
            fixed = min(fit.fixed_s, swap.reload_s)
            return fixed + (swap.reload_s - fixed) * fraction
        return fit.fixed_s + self.gpu_weight_bytes(gpu_share) / fit.bandwidth_bytes_per_s

    def unload_s(self, gpu_share: float = 1.0) -> float:
        fraction = self.gpu_weight_bytes(gpu_share) / self.weight_bytes()
        if fraction == 0:
            return 0.0
        fit = self.profile.weights.unload
        swap = self.entry.swap if self.entry else None
        if swap is not None:
            fixed = min(fit.fixed_s, swap.unload_s)
            return fixed + (swap.unload_s - fixed) * fraction
        return fit.fixed_s + fit.seconds_per_gib * self.gpu_weight_bytes(gpu_share) / GIB

    def swap_penalty_s(self) -> float:
        """Unload plus reload from disk: the paper's per-(model, hardware) preemption constant."""
        return self.unload_s() + self.reload_s()
