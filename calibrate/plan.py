"""What a calibration measures: grids, sizes and repeat counts, for a full or a quick run on each device.

A plan is plain data so tests can hand in tiny ones. ``plan_for`` gives the
defaults: a quick CPU plan finishes in well under a minute on two cores; a full
GPU plan covers serving-sized batches and contexts for a few models in minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MB, GB, GIB, MIB = 10**6, 10**9, 2**30, 2**20

Tick = Callable[[str], None]
"""Progress callback: called once per finished measurement with what was measured."""


def no_progress(description: str) -> None:
    """A progress callback that shows nothing."""


@dataclass(frozen=True)
class ComputePlan:
    """Grids for the per-layer compute benchmarks on one device."""

    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]  # tokens already cached per sequence
    prefill_tokens: tuple[int, ...]
    warmup: int
    repeats: int
    max_kv_bytes: int  # skip grid points whose KV caches (all rotated layers) would exceed this
    max_rotation: int  # at most this many distinct layers are cycled to defeat the last-level cache

    @property
    def points(self) -> int:
        """Progress ticks per model: each round times every decode point, prompt length and head batch once."""
        per_round = len(self.decode_batches) * len(self.decode_contexts) + len(self.prefill_tokens) + len(self.decode_batches)
        return per_round * self.repeats


@dataclass(frozen=True)
class Plan:
    """A whole calibration: compute grids for the device (and the host CPU when the device is a GPU) and movement sizes."""

    device: ComputePlan
    cpu: ComputePlan | None  # None when the device is the CPU itself
    transfer_sizes_bytes: tuple[int, ...]
    transfer_repeats: int
    load_sizes_bytes: tuple[int, ...]
    unload_sizes_bytes: tuple[int, ...]
    weight_repeats: int
    weight_tensor_bytes: int  # synthetic checkpoints are split into tensors of this size, like per-layer weights
    gemm_size: int
    bandwidth_bytes: int
    roofline_repeats: int


QUICK_CPU = ComputePlan(decode_batches=(1, 4, 8), decode_contexts=(128, 1024), prefill_tokens=(16, 64, 256),
                        warmup=1, repeats=5, max_kv_bytes=2 * GIB, max_rotation=4)
FULL_CPU = ComputePlan(decode_batches=(1, 2, 4, 8, 16), decode_contexts=(128, 512, 2048), prefill_tokens=(16, 64, 256, 512),
                       warmup=1, repeats=5, max_kv_bytes=4 * GIB, max_rotation=4)
# the host CPU of a GPU server: small grids, since a 14B layer in fp16 may run at a few GFLOP/s there
HOST_CPU_NEXT_TO_GPU = ComputePlan(decode_batches=(1, 4, 8), decode_contexts=(128, 1024), prefill_tokens=(8, 32, 128),
                                   warmup=1, repeats=3, max_kv_bytes=4 * GIB, max_rotation=2)
QUICK_GPU = ComputePlan(decode_batches=(1, 8, 32), decode_contexts=(256, 2048), prefill_tokens=(128, 512, 2048),
                        warmup=2, repeats=5, max_kv_bytes=8 * GIB, max_rotation=4)
FULL_GPU = ComputePlan(decode_batches=(1, 4, 16, 64, 128), decode_contexts=(256, 1024, 4096), prefill_tokens=(128, 512, 1024, 2048, 4096, 8192),
                       warmup=3, repeats=7, max_kv_bytes=16 * GIB, max_rotation=4)


def plan_for(device_type: str, quick: bool) -> Plan:
    """Default plan for a device type (``cpu`` or ``cuda``)."""
    if device_type == "cpu":
        return Plan(device=QUICK_CPU if quick else FULL_CPU, cpu=None,
                    transfer_sizes_bytes=(1 * MB, 8 * MB, 64 * MB) if quick else (1 * MB, 8 * MB, 64 * MB, 256 * MB, 1 * GB),
                    transfer_repeats=3 if quick else 5,
                    load_sizes_bytes=(32 * MIB, 96 * MIB, 192 * MIB) if quick else (64 * MIB, 256 * MIB, 512 * MIB, 1 * GIB),
                    unload_sizes_bytes=(64 * MIB, 256 * MIB) if quick else (64 * MIB, 256 * MIB, 1 * GIB),
                    weight_repeats=2 if quick else 3, weight_tensor_bytes=16 * MIB if quick else 64 * MIB,
                    gemm_size=1024 if quick else 2048, bandwidth_bytes=256 * MIB, roofline_repeats=3)
    return Plan(device=QUICK_GPU if quick else FULL_GPU, cpu=HOST_CPU_NEXT_TO_GPU,
                transfer_sizes_bytes=(1 * MB, 16 * MB, 256 * MB) if quick else (1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB, 1 * GB),
                transfer_repeats=3 if quick else 5,
                load_sizes_bytes=(256 * MIB, 1 * GIB) if quick else (256 * MIB, 1 * GIB, 2 * GIB),
                unload_sizes_bytes=(1 * GIB, 4 * GIB) if quick else (1 * GIB, 4 * GIB, 8 * GIB, 16 * GIB),
                weight_repeats=2 if quick else 3, weight_tensor_bytes=128 * MIB,
                gemm_size=4096 if quick else 8192, bandwidth_bytes=1 * GIB if quick else 4 * GIB, roofline_repeats=5)
