"""Run a whole calibration: identity, roofline, per-model compute, link, interconnect, weight movement; then fit and
assemble.

``run_calibration`` is what ``mmsim calibrate`` calls; it reports each finished
measurement to a progress callback and returns the profile as a dict.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from calibrate.bench_compute import bench_model, reference_batch
from calibrate.bench_interconnect import activation_sizes_bytes, node_interconnect
from calibrate.bench_roofline import gemm_flops_per_s, roofline
from calibrate.bench_transfer import bench_link, link_fits, pinned_options
from calibrate.bench_weights import bench_load_disk, bench_load_host, bench_unload
from calibrate.build import DeviceResults, Measurements, assemble_profile
from calibrate.extrapolate import ReferencePoint
from calibrate.hardware import cpu_as_device_identity, cpu_identity, gpu_identity, software_versions
from calibrate.layers import torch_dtype
from calibrate.plan import ComputePlan, Plan, Tick, no_progress
from calibrate.timing import configured
from sim.catalogue import ModelSpec
from sim.errors import MmsimError

CPU = torch.device("cpu")
CPU_GEMM_SIZE = 1024  # a CPU without native fp16 math runs larger products for seconds


@dataclass(frozen=True)
class Request:
    """What to calibrate: a device, models at a dtype, where scratch checkpoints may be written."""

    device: torch.device
    models: tuple[ModelSpec, ...]
    dtype: str
    plan_name: str  # "quick" or "full", recorded in the profile
    workdir: Path
    threads: int | None = None  # torch CPU threads; None: the idle cores (recorded in the profile for validate)


def total_steps(plan: Plan, request: Request) -> int:
    """How many progress ticks ``run_calibration`` makes (for the progress bar)."""
    per_model = plan.device.points + (plan.cpu.points if plan.cpu else 0)
    link = len(pinned_options(request.device)) * len(plan.transfer_sizes_bytes) * 2
    weights = 2 * len(plan.load_sizes_bytes) + len(plan.unload_sizes_bytes)
    return 3 + len(request.models) * per_model + link + weights


def reference_point(plan: ComputePlan) -> ReferencePoint:
    """The middle of a compute plan's grids: where single-number costs are quoted and models compared."""
    batch = reference_batch(plan)
    contexts, prompts = sorted(plan.decode_contexts), sorted(plan.prefill_tokens)
    return ReferencePoint(batch, batch * contexts[len(contexts) // 2], prompts[len(prompts) // 2])


def _device_results(raw: dict, device: torch.device) -> DeviceResults:
    timer = "CUDA events" if device.type == "cuda" else "perf_counter"
    return DeviceResults(raw["decode"], raw["prefill"], raw["head"], raw["boundary"], raw["chained_layers"], timer)


def run_calibration(request: Request, plan: Plan, tick: Tick = no_progress) -> dict:
    """Measure everything the plan asks for and return the assembled (not yet validated) profile."""
    with configured(request.device, request.threads):
        return _measure_all(request, plan, tick)


def _measure_all(request: Request, plan: Plan, tick: Tick) -> dict:
    device, dtype = request.device, torch_dtype(request.dtype)
    cpu = cpu_identity()
    gpu = gpu_identity(device) if device.type == "cuda" else cpu_as_device_identity(cpu)
    tick("hardware identity")

    device_roof = roofline(device, torch.bfloat16, plan.gemm_size, plan.bandwidth_bytes, plan.roofline_repeats)
    cpu_plan = plan.cpu or plan.device
    cpu_roof = roofline(CPU, dtype, min(plan.gemm_size, CPU_GEMM_SIZE), min(plan.bandwidth_bytes, 2**30), plan.roofline_repeats)
    cpu_dtype_line = cpu_dtype_note(request.dtype, dtype, cpu_roof["flops_per_s"], plan.roofline_repeats)
    tick("roofline: GEMM and memory bandwidth")

    on_device, on_cpu = {}, {}
    for spec in request.models:
        on_device[spec.name] = _device_results(bench_model(spec, dtype, device, plan.device, tick), device)
        if plan.cpu is not None:
            on_cpu[spec.name] = _device_results(bench_model(spec, dtype, CPU, plan.cpu, tick), CPU)

    copy_counts = tuple(sorted({2 * spec.num_layers for spec in request.models}))
    link_samples = bench_link(device, plan.transfer_sizes_bytes, copy_counts, plan.transfer_repeats, tick)
    try:
        interconnect, interconnect_line = node_interconnect(
            device, activation_sizes_bytes(tuple(spec.hidden_size for spec in request.models)), plan.transfer_repeats)
    except MmsimError as error:  # minutes of other measurements are worth keeping without it
        interconnect, interconnect_line = None, f"interconnect not measured: {error}; the default applies"
    tick("interconnect between GPUs")

    with tempfile.TemporaryDirectory(dir=request.workdir, prefix=".mmsim-calibrate-") as scratch:
        disk, dropped = bench_load_disk(device, plan.load_sizes_bytes, plan.weight_tensor_bytes, Path(scratch),
                                        plan.weight_repeats, tick)
    disk_note = (f"checkpoints written under {request.workdir}; "
                 + ("page cache dropped with posix_fadvise(DONTNEED) before each load" if dropped
                    else "page cache could not be dropped: figures may be RAM reads"))
    host = bench_load_host(device, plan.load_sizes_bytes, plan.weight_tensor_bytes, plan.weight_repeats, tick)
    unload = bench_unload(device, plan.unload_sizes_bytes, plan.weight_tensor_bytes, plan.weight_repeats, tick)

    measurements = Measurements(
        device_type=device.type, dtype=request.dtype, gpu=gpu, cpu=cpu,
        software=software_versions(device, request.plan_name) | {"interconnect": interconnect_line}
        | ({"cpu_dtype": cpu_dtype_line} if cpu_dtype_line else {}),
        device_roofline=device_roof, cpu_roofline=cpu_roof,
        device_reference=reference_point(plan.device), cpu_reference=reference_point(cpu_plan),
        specs={spec.name: spec for spec in request.models}, on_device=on_device, on_cpu=on_cpu,
        link=link_fits(device, link_samples), interconnect=interconnect, load_disk=disk, load_disk_note=disk_note,
        load_host=host, unload=unload,
    )
    name = default_name(gpu["name"])
    description = (f"Calibrated on {gpu['name']} / {cpu['model']} by mmsim calibrate "
                   f"({request.plan_name} plan, {request.dtype}, models: {', '.join(s.name for s in request.models)})")
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return assemble_profile(measurements, name, description, created)


def cpu_dtype_note(name: str, dtype: torch.dtype, half_flops_per_s: float, repeats: int) -> str | None:
    """A line for a CPU whose half-precision products run at under a tenth of its fp32 ones (no native fp16/bf16 math:
    AVX2 here, 1.4 against 166 GFLOP/s): the profile then prices CPU layers in ``name`` at torch's slow path there."""
    if dtype == torch.float32:
        return None
    fp32_flops_per_s, _ = gemm_flops_per_s(CPU, torch.float32, CPU_GEMM_SIZE, repeats)
    if half_flops_per_s * 10 >= fp32_flops_per_s:
        return None
    return (f"this CPU runs {name} products at {half_flops_per_s / 1e9:.1f} GFLOP/s against {fp32_flops_per_s / 1e9:.0f} "
            f"in fp32 (no native {name} math): its {name} CPU layers are priced at that speed; an engine on such a CPU "
            "computes in fp32 (vLLM's CPU build does): calibrate with --dtype fp32 to price that")


def default_name(device_name: str) -> str:
    """A profile name from the device name: ``calibrated-nvidia-h200``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return f"calibrated-{slug}"
