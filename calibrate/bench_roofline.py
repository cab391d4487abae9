"""Roofline figures of a device: achieved GEMM FLOP/s and memory copy bandwidth.

They are what the profile's ``memory_bandwidth_bytes_per_s`` and ``*flops_per_s``
fields hold, and what costs of models that were not measured are extrapolated
from (see :mod:`calibrate.extrapolate`).
"""

from __future__ import annotations

import torch

from calibrate.layers import random_tensor
from calibrate.timing import Timing, measure


GEMM_PROBE_SIZE = 256
GEMM_BUDGET_S = 0.1
"""Longest one timed product may take: a CPU without native fp16/bf16 math runs them at ~1 GFLOP/s (AVX2 here), where
a 1024-size product took 2.3 s and the two rooflines of a quick calibration 23 s of its minute."""


def gemm_flops_per_s(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> tuple[float, dict]:
    """FLOP/s of a square matrix product, and its sample: of side ``size``, or the largest power-of-two fraction of
    it that a small first product says runs within ``GEMM_BUDGET_S`` (never below ``GEMM_PROBE_SIZE``)."""
    with torch.inference_mode():
        if size > GEMM_PROBE_SIZE:
            probe = _gemm_timing(device, dtype, GEMM_PROBE_SIZE, repeats=1)
            rate = 2 * GEMM_PROBE_SIZE**3 / probe.typical_s
            while size > GEMM_PROBE_SIZE and 2 * size**3 / rate > GEMM_BUDGET_S:
                size //= 2
        timing = _gemm_timing(device, dtype, size, repeats)
    flops = 2 * size**3
    return flops / timing.typical_s, timing.record(kind="gemm", size=size, dtype=str(dtype).removeprefix("torch."), flops=flops)


def _gemm_timing(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> Timing:
    a = random_tensor((size, size), dtype, device, seed=20)
    b = random_tensor((size, size), dtype, device, seed=21)
    return measure(lambda: torch.matmul(a, b), device, warmup=2, repeats=repeats)


def copy_bandwidth_bytes_per_s(device: torch.device, nbytes: int, repeats: int) -> tuple[float, dict]:
    """Bytes/s of a device-local copy, counting bytes read and bytes written (the STREAM "copy" convention)."""
    with torch.inference_mode():
        source = torch.ones(nbytes, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        timing = measure(lambda: target.copy_(source), device, warmup=2, repeats=repeats)
    return 2 * nbytes / timing.typical_s, timing.record(kind="copy", bytes=nbytes)


def roofline(device: torch.device, dtype: torch.dtype, gemm_size: int, copy_bytes: int, repeats: int) -> dict:
    """GEMM FLOP/s in ``dtype`` and copy bandwidth of ``device``, with samples."""
    flops, gemm_sample = gemm_flops_per_s(device, dtype, gemm_size, repeats)
    bandwidth, copy_sample = copy_bandwidth_bytes_per_s(device, copy_bytes, repeats)
    return {"flops_per_s": flops, "bandwidth_bytes_per_s": bandwidth, "samples": [gemm_sample, copy_sample]}
