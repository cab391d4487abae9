"""Roofline figures of a device: achieved GEMM FLOP/s and memory copy bandwidth.

They are what the profile's ``memory_bandwidth_bytes_per_s`` and ``*flops_per_s``
fields hold, and what costs of models that were not measured are extrapolated
from (see :mod:`calibrate.extrapolate`).
"""

from __future__ import annotations

import torch

from calibrate.layers import random_tensor
from calibrate.timing import measure


def gemm_flops_per_s(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> tuple[float, dict]:
    """FLOP/s of a ``size`` x ``size`` x ``size`` matrix product, and its sample."""
    with torch.inference_mode():
        a = random_tensor((size, size), dtype, device, seed=20)
        b = random_tensor((size, size), dtype, device, seed=21)
        timing = measure(lambda: torch.matmul(a, b), device, warmup=2, repeats=repeats)
    flops = 2 * size**3
    return flops / timing.typical_s, timing.record(kind="gemm", size=size, dtype=str(dtype).removeprefix("torch."), flops=flops)


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
