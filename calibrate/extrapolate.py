"""Costs of catalogue models that were not measured, extrapolated from the ones that were.

A model's roofline cost (``sim.layer_costs.estimate_layer_cost`` from the measured
bandwidth and GEMM rate) is optimistic by a factor that depends on the host
and the software, not much on the model. That factor is measured on the
calibrated models (measured cost / roofline cost at a typical decode and prefill
point) and applied to the roofline of every other model; the result is tagged
``estimated``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sim.catalogue import ModelSpec
from sim.layer_costs import estimate_layer_cost

DECODE_FIELDS = ("decode_base_s", "decode_per_seq_s", "decode_per_context_token_s")
PREFILL_FIELDS = ("prefill_base_s", "prefill_per_token_s", "prefill_per_token_sq_s")


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings of one device."""

    bandwidth_bytes_per_s: float
    flops_per_s: float


@dataclass(frozen=True)
class ReferencePoint:
    """Where measured and roofline costs are compared: a typical decode step and prompt."""

    batch: int
    context_tokens: int
    prompt_tokens: int


def decode_s(cost: dict, batch: int, context_tokens: int) -> float:
    return cost["decode_base_s"] + cost["decode_per_seq_s"] * batch + cost["decode_per_context_token_s"] * context_tokens


def prefill_s(cost: dict, tokens: int) -> float:
    return cost["prefill_base_s"] + cost["prefill_per_token_s"] * tokens + cost["prefill_per_token_sq_s"] * tokens**2


def _roofline_cost(spec: ModelSpec, dtype: str, roof: Roofline) -> dict:
    return estimate_layer_cost(spec, dtype, roof.bandwidth_bytes_per_s, roof.flops_per_s, 0.0, "").model_dump()


def efficiency(measured: dict[str, dict], specs: dict[str, ModelSpec], dtype: str, roof: Roofline,
               at: ReferencePoint) -> tuple[float, float]:
    """Median (measured / roofline) time over the measured models, for decode and for prefill."""
    decode, prefill = [], []
    for name, cost in measured.items():
        ideal = _roofline_cost(specs[name], dtype, roof)
        decode.append(decode_s(cost, at.batch, at.context_tokens) / decode_s(ideal, at.batch, at.context_tokens))
        prefill.append(prefill_s(cost, at.prompt_tokens) / prefill_s(ideal, at.prompt_tokens))
    return statistics.median(decode), statistics.median(prefill)


def estimated_layer_cost(spec: ModelSpec, dtype: str, roof: Roofline, ratios: tuple[float, float], device: str) -> dict:
    """LayerCost fields for an unmeasured model: its roofline cost times the measured efficiency factors."""
    ideal = _roofline_cost(spec, dtype, roof)
    decode_ratio, prefill_ratio = ratios
    cost = {k: ideal[k] * decode_ratio for k in DECODE_FIELDS} | {k: ideal[k] * prefill_ratio for k in PREFILL_FIELDS}
    note = (f"roofline of the measured {device} ({roof.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
            f"{roof.flops_per_s / 1e12:.2f} TFLOP/s) x measured efficiency ({decode_ratio:.2f} decode, "
            f"{prefill_ratio:.2f} prefill) of the calibrated models")
    return {"source": "estimated", "note": note} | cost


def head_bytes(spec: ModelSpec, dtype: str) -> float:
    """Bytes of LM head weights read per decode step."""
    return spec.vocab_size * spec.hidden_size * spec.weight_bytes(dtype) / spec.params


def head_seconds_per_byte(head_s: dict[str, float], specs: dict[str, ModelSpec], dtype: str) -> float:
    """Median measured LM head time per head weight byte."""
    return statistics.median(seconds / head_bytes(specs[name], dtype) for name, seconds in head_s.items())
