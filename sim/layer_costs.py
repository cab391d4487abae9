"""Per-layer costs as the cost model reads them: batch-size curves of a layer's decode terms, its prefill cost,
the roofline estimate used where a profile has no figures for a model, a profile's figures measured at one dtype
priced at another, and a CPU layer's costs raised to the GPU's where the CPU was not measured."""

from __future__ import annotations

from bisect import bisect_left

from sim import profile as prof
from sim.catalogue import ModelSpec, default_kv_dtype

ROOFLINE_NOTE = "roofline estimate from the profile's GPU/CPU bandwidth and FLOP/s"


class BatchCurve:
    """A cost as a function of batch size: ``intercept + slope * B``, or, given measured ``points`` (batch,
    seconds), piecewise linear through (0, intercept) and the points, extended past the last point by the
    last segment's slope (never negative); plus an affine ``offset`` (see :meth:`raised`)."""

    def __init__(self, intercept: float, slope: float, points: list[tuple[int, float]],
                 offset: tuple[float, float] = (0.0, 0.0)):
        self.intercept = intercept
        self.slope = slope
        self.points = sorted(dict(points).items())  # one value per batch size: a repeated one would divide by 0
        self.offset = offset
        # A fitted intercept above the first measured point would make a small batch cheaper than none.
        start = min(intercept, self.points[0][1]) if self.points else intercept
        self._batches: list[float] = [0.0] + [float(b) for b, _ in self.points]
        self._values: list[float] = [start] + [v for _, v in self.points]

    def raised(self, intercept: float, slope: float) -> BatchCurve:
        """This curve plus ``intercept + slope * B``."""
        return BatchCurve(self.intercept, self.slope, self.points, (self.offset[0] + intercept, self.offset[1] + slope))

    def at(self, batch: int) -> float:
        return self._curve(batch) + self.offset[0] + self.offset[1] * batch

    def _curve(self, batch: int) -> float:
        x, y = self._batches, self._values
        if len(x) == 1:
            return self.intercept + self.slope * batch
        i = bisect_left(x, float(batch))
        if i < len(x) and x[i] == batch:
            return y[i]
        if i >= len(x):  # past the grid: the last segment's slope
            slope = max(0.0, (y[-1] - y[-2]) / (x[-1] - x[-2]))
            return y[-1] + slope * (batch - x[-1])
        return y[i - 1] + (y[i] - y[i - 1]) * (batch - x[i - 1]) / (x[i] - x[i - 1])


def layer_curves(cost: prof.LayerCost) -> tuple[BatchCurve, BatchCurve]:
    """A layer's decode base and per-context-token cost as functions of batch size."""
    grid = cost.decode_grid
    base = BatchCurve(cost.decode_base_s, cost.decode_per_seq_s, [(p.batch, p.base_s) for p in grid])
    per_context = BatchCurve(cost.decode_per_context_token_s, 0.0, [(p.batch, p.per_context_token_s) for p in grid])
    return base, per_context


def excess(cpu: float, gpu: float) -> float:
    """How much a CPU term exceeds the GPU's (0 where it does not)."""
    return max(0.0, cpu - gpu)


def cpu_raised_to_gpu(cpu: prof.LayerCost, gpu: prof.LayerCost) -> prof.LayerCost:
    """``cpu`` with each coefficient raised to at least the GPU's (decode grids are raised by ``BatchCurve.raised``)."""
    fields = ("decode_base_s", "decode_per_seq_s", "decode_per_context_token_s", "prefill_base_s",
              "prefill_per_token_s", "prefill_per_token_sq_s")
    return cpu.model_copy(update={name: max(getattr(cpu, name), getattr(gpu, name)) for name in fields})


class PrefillLayer:
    """A layer's prefill cost ``base + per_token * P + per_token_sq * (P^2 + 2PC)``, as plain floats."""

    def __init__(self, cost: prof.LayerCost):
        self.base_s: float = cost.prefill_base_s
        self.per_token_s: float = cost.prefill_per_token_s
        self.per_token_sq_s: float = cost.prefill_per_token_sq_s

    def seconds(self, tokens: float, quadratic: float) -> float:
        return self.base_s + self.per_token_s * tokens + self.per_token_sq_s * quadratic


def estimate_layer_cost(spec: ModelSpec, dtype: str, bandwidth: float, flops: float, launch_s: float, note: str) -> prof.LayerCost:
    """Roofline per-layer cost: weights stream once per step, FLOPs scale with tokens."""
    weight_read_s = spec.layer_weight_bytes(dtype) / bandwidth
    return prof.LayerCost(
        source="estimated",
        note=note,
        decode_base_s=weight_read_s + launch_s,
        decode_per_seq_s=2 * spec.active_layer_params / flops,
        decode_per_context_token_s=spec.kv_bytes_per_token_per_layer(default_kv_dtype(dtype)) / bandwidth,
        prefill_base_s=weight_read_s + launch_s,
        prefill_per_token_s=2 * spec.active_layer_params / flops,
        prefill_per_token_sq_s=2 * spec.num_heads * spec.head_dim / flops,
    )


def streamed(seconds: float, launch_s: float, weight_ratio: float) -> float:
    """A cost of a fixed launch (at most ``launch_s``) plus streaming weights, with ``weight_ratio`` times the bytes."""
    launch = min(launch_s, seconds)
    return launch + (seconds - launch) * weight_ratio


def layer_at_dtype(cost: prof.LayerCost, weight_ratio: float, kv_ratio: float, launch_s: float,
                   note: str) -> prof.LayerCost:
    """``cost``, measured at one dtype, at another whose weights take ``weight_ratio`` times the bytes and whose
    default KV cache ``kv_ratio`` times: the decode and prefill bases are the layer's weights streaming plus the
    launch ``launch_s`` (see :func:`estimate_layer_cost`), and only their streaming scales; context tokens' KV reads
    scale with the KV bytes. The per-sequence and per-token terms are compute, kept as measured: conservative, as a
    narrower format's faster tensor cores are not credited (nor a quantised one's dequantisation charged)."""
    shift = streamed(cost.decode_base_s, launch_s, weight_ratio) - cost.decode_base_s  # the same at every batch
    grid = [point.model_copy(update={"base_s": max(0.0, point.base_s + shift),
                                     "per_context_token_s": point.per_context_token_s * kv_ratio})
            for point in cost.decode_grid]
    return cost.model_copy(update={
        "note": f"{cost.note}; {note}" if cost.note else note,
        "decode_base_s": cost.decode_base_s + shift,
        "decode_per_context_token_s": cost.decode_per_context_token_s * kv_ratio,
        "prefill_base_s": streamed(cost.prefill_base_s, launch_s, weight_ratio),
        "decode_grid": grid,
    })


def gpu_figures(profile: prof.Profile) -> tuple[float, float]:
    """The GPU's memory bandwidth (bytes/s) and bf16 FLOP/s for a roofline estimate, defaults where unmeasured."""
    gpu = profile.hardware.gpu
    return gpu.memory_bandwidth_bytes_per_s or 1.0e12, gpu.bf16_flops_per_s or 1.0e14


def cpu_figures(profile: prof.Profile) -> tuple[float, float]:
    """The CPU's memory bandwidth (bytes/s) and FLOP/s for a roofline estimate, defaults where unmeasured."""
    cpu = profile.hardware.cpu
    return cpu.memory_bandwidth_bytes_per_s or 5.0e10, cpu.flops_per_s or 1.0e12
