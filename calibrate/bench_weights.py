"""Weight movement benchmarks: load from disk (safetensors) and from host RAM, and unload.

Synthetic checkpoints of a few sizes are written with safetensors and read back
the way Hugging Face loads a model: the file to host memory, then each tensor
to the device (on a CPU-only machine, copied into model-owned host memory, as
``load_state_dict`` does). Before each disk load the file's pages are evicted
from the page cache (``posix_fadvise(DONTNEED)``) so the figure is the disk's,
not RAM's. "From host" is a host-RAM weight cache (pinned on a GPU) copied to
the device. Unload is what frees a model: drop the tensors, ``gc.collect``,
``empty_cache`` and synchronise.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from calibrate.layers import random_tensor
from calibrate.plan import Tick
from calibrate.timing import Timing, synchronize, wall_time

WEIGHT_DTYPE = torch.float16


def _pieces(nbytes: int, tensor_bytes: int) -> list[int]:
    """Element counts of the tensors making up ``nbytes`` of fp16 weights, ``tensor_bytes`` each (last one smaller)."""
    element = torch.finfo(WEIGHT_DTYPE).bits // 8
    full, rest = divmod(nbytes, tensor_bytes)
    sizes = [tensor_bytes] * full + ([rest] if rest else [])
    return [size // element for size in sizes if size >= element]


def write_checkpoint(folder: Path, nbytes: int, tensor_bytes: int) -> Path:
    """A safetensors file of ``nbytes`` random fp16 weights, flushed to disk."""
    path = folder / f"synthetic-{nbytes}.safetensors"
    cpu = torch.device("cpu")
    tensors = {f"layers.{i}.weight": random_tensor((n,), WEIGHT_DTYPE, cpu, seed=i) for i, n in enumerate(_pieces(nbytes, tensor_bytes))}
    save_file(tensors, str(path))
    _flush(path)
    return path


def _flush(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_page_cache(path: Path) -> bool:
    """Evict ``path`` from the page cache; False where the OS offers no way to (then loads read RAM)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def load_from_disk(path: Path, device: torch.device) -> list[torch.Tensor]:
    """Disk -> host -> device, as a model load does."""
    tensors = load_file(str(path), device="cpu")
    if device.type == "cuda":
        return [t.to(device) for t in tensors.values()]
    return [t.clone() for t in tensors.values()]


def bench_load_disk(device: torch.device, sizes_bytes: tuple[int, ...], tensor_bytes: int, folder: Path, repeats: int,
                    tick: Tick) -> tuple[list[dict], bool]:
    """Samples of disk loads, and whether the page cache could be dropped before each."""
    samples, dropped = [], True
    for size in sizes_bytes:
        path = write_checkpoint(folder, size, tensor_bytes)
        times = []
        try:
            for _ in range(repeats):
                dropped = drop_page_cache(path) and dropped
                loaded: list[torch.Tensor] = []
                times.append(wall_time(lambda: loaded.extend(load_from_disk(path, device)), device))
                loaded.clear()
                _free(device)
        finally:
            path.unlink()
        samples.append(Timing.of(times, device).record(source="disk", bytes=size))
        tick(f"weight load from disk: {size / 2**20:.0f} MiB")
    return samples, dropped


def bench_load_host(device: torch.device, sizes_bytes: tuple[int, ...], tensor_bytes: int, repeats: int,
                    tick: Tick) -> list[dict]:
    """Samples of loads from a host-RAM copy of the weights (pinned where a GPU makes that possible)."""
    samples = []
    pinned = device.type == "cuda"
    for size in sizes_bytes:
        host = [torch.ones(n, dtype=WEIGHT_DTYPE, pin_memory=pinned) for n in _pieces(size, tensor_bytes)]
        times = [_time_host_load(host, device) for _ in range(repeats)]
        host.clear()
        samples.append(Timing.of(times, device).record(source="host", pinned=pinned, bytes=size))
        tick(f"weight load from host RAM: {size / 2**20:.0f} MiB")
    return samples


def _time_host_load(host: list[torch.Tensor], device: torch.device) -> float:
    """Seconds to copy host weights to the device (pinned, asynchronous) or into new host memory; then free them."""
    loaded: list[torch.Tensor] = []
    if device.type == "cuda":
        seconds = wall_time(lambda: loaded.extend(t.to(device, non_blocking=True) for t in host), device)
    else:
        seconds = wall_time(lambda: loaded.extend(t.clone() for t in host), device)
    loaded.clear()
    _free(device)
    return seconds


def bench_unload(device: torch.device, sizes_bytes: tuple[int, ...], tensor_bytes: int, repeats: int, tick: Tick) -> list[dict]:
    """Samples of freeing a model's weights: del + gc + empty_cache + synchronize."""
    samples = []
    for size in sizes_bytes:
        times = []
        for _ in range(repeats):
            weights = [torch.ones(n, dtype=WEIGHT_DTYPE, device=device) for n in _pieces(size, tensor_bytes)]
            synchronize(device)

            def unload() -> None:
                weights.clear()
                _free(device)

            times.append(wall_time(unload, device))
        samples.append(Timing.of(times, device).record(bytes=size))
        tick(f"weight unload: {size / 2**20:.0f} MiB")
    return samples


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    synchronize(device)

