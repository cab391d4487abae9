"""Host <-> device copy benchmarks: each direction, pinned and pageable, one bulk copy and per-layer copies.

A KV cache moves either as one buffer or as one tensor per layer and K/V (2 x
layers copies); the second is what Hugging Face and vLLM-style swapping do, and
its per-copy overhead is why the paper saw 10-16 GB/s per-layer against a
31.5 GB/s PCIe Gen4 x16 theoretical. On a CPU-only machine both ends are host
memory: the figures are host memcpy, and pinned memory does not exist.
"""

from __future__ import annotations

import torch

from calibrate.fit import fit_transfer
from calibrate.plan import Tick
from calibrate.timing import measure

DIRECTIONS = ("host_to_device", "device_to_host")


def pinned_options(device: torch.device) -> tuple[bool, ...]:
    """Pinned host memory needs CUDA; both kinds are measured where it exists."""
    return (True, False) if device.type == "cuda" else (False,)


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor], non_blocking: bool) -> None:
    for target, source in zip(targets, sources):
        target.copy_(source, non_blocking=non_blocking)


def bench_link(device: torch.device, sizes_bytes: tuple[int, ...], copy_counts: tuple[int, ...], repeats: int,
               tick: Tick) -> list[dict]:
    """Samples of ``bytes`` moved in ``copies`` equal tensors, per direction and host-memory kind."""
    samples = []
    for pinned in pinned_options(device):
        for size in sizes_bytes:
            host = torch.ones(size, dtype=torch.uint8, pin_memory=pinned)
            on_device = torch.ones(size, dtype=torch.uint8, device=device)
            for direction in DIRECTIONS:
                target, source = (on_device, host) if direction == "host_to_device" else (host, on_device)
                for copies in (1, *copy_counts):
                    targets, sources = list(target.chunk(copies)), list(source.chunk(copies))
                    timing = measure(lambda: _copy_all(targets, sources, pinned), device, warmup=1, repeats=repeats)
                    samples.append(timing.record(direction=direction, pinned=pinned, copies=len(targets), bytes=size))
                tick(f"{direction.replace('_', ' ')} {'pinned' if pinned else 'pageable'}: {size / 1e6:.0f} MB")
            del host, on_device
    return samples


def link_fits(device: torch.device, samples: list[dict]) -> dict[str, dict]:
    """TransferFit fields per direction: pinned samples on a GPU (what swapping engines use), pageable otherwise."""
    fitted_kind = device.type == "cuda"
    fits = {}
    for direction in DIRECTIONS:
        mine = [s for s in samples if s["direction"] == direction]
        notes = []
        for pinned in pinned_options(device):
            kind = [s for s in mine if s["pinned"] == pinned]
            fit = fit_transfer([s for s in kind if s["copies"] == 1], [s for s in kind if s["copies"] > 1])
            notes.append(f"{'pinned' if pinned else 'pageable'}: {fit['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s bulk, "
                         f"{fit['latency_s'] * 1e6:.1f} us latency, {fit['per_copy_latency_s'] * 1e6:.2f} us per extra copy")
            if pinned == fitted_kind:
                fits[direction] = fit
        what = "pinned host memory <-> GPU" if device.type == "cuda" else "host memcpy (CPU-only machine: no PCIe link, no pinned memory)"
        fits[direction] |= {
            "source": "measured",
            "note": f"{what}; fit of bulk copies, per-copy latency from per-layer copies; " + "; ".join(notes),
            "samples": mine,
        }
    return fits
