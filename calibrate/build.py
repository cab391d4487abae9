"""Assemble benchmark results into a profile (the ``sim.profile`` schema) and write it atomically.

Pure data in, JSON-ready dict out: no torch here, so the assembly is testable
with synthetic samples. Every fitted group keeps its raw samples.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.extrapolate import ReferencePoint, Roofline, efficiency, estimated_layer_cost, head_bytes, head_seconds_per_byte
from calibrate.fit import fit_affine, fit_decode, fit_load, fit_prefill, fit_unload
from sim.catalogue import ModelSpec, catalogue
from sim.profile import SCHEMA_VERSION, Profile, parse_profile


@dataclass
class DeviceResults:
    """Compute benchmarks of one model on one device (see ``calibrate.bench_compute.bench_model``)."""

    decode: list[dict]
    prefill: list[dict]
    head: list[dict]
    boundary: list[dict]
    chained_layers: int
    timer: str  # "CUDA events" or "perf_counter"


@dataclass
class Measurements:
    """Everything a calibration measured, before fitting."""

    device_type: str  # "cuda" or "cpu"
    dtype: str
    gpu: dict
    cpu: dict
    software: dict[str, str]
    device_roofline: dict  # flops_per_s (bf16 GEMM), bandwidth_bytes_per_s, samples
    cpu_roofline: dict  # flops_per_s (GEMM in ``dtype``), bandwidth_bytes_per_s, samples
    device_reference: ReferencePoint
    cpu_reference: ReferencePoint
    specs: dict[str, ModelSpec]
    on_device: dict[str, DeviceResults]
    on_cpu: dict[str, DeviceResults] = field(default_factory=dict)  # empty when the device is the CPU
    link: dict[str, dict] = field(default_factory=dict)  # TransferFit fields per direction
    interconnect: dict | None = None  # Interconnect fields; None with fewer than two GPUs (the default applies)
    load_disk: list[dict] = field(default_factory=list)
    load_disk_note: str = ""
    load_host: list[dict] = field(default_factory=list)
    unload: list[dict] = field(default_factory=list)


def layer_cost(results: DeviceResults, where: str, dtype: str, head_batch: int) -> dict:
    """A measured LayerCost: decode and prefill fits with their samples (head and hand-off samples ride along)."""
    decode, decode_error = fit_decode(results.decode)
    prefill, prefill_error = fit_prefill(results.prefill)
    batches = sorted({s["batch"] for s in results.decode})
    contexts = sorted({s["context_per_seq"] for s in results.decode})
    prompts = [s["prompt_tokens"] for s in results.prefill]
    note = (f"{where}, {dtype}: decode fit over batch {batches} x context/seq {contexts} (max error {decode_error:.1%}), "
            f"prefill over {prompts} tokens (max error {prefill_error:.1%}); chain of {results.chained_layers} layers "
            f"timed with {results.timer}; LM head fitted over the batch grid, hand-off quoted at batch {head_batch}")
    samples = ([s | {"kind": "decode"} for s in results.decode] + [s | {"kind": "prefill"} for s in results.prefill]
               + [s | {"kind": "head"} for s in results.head] + [s | {"kind": "boundary"} for s in results.boundary])
    return {"source": "measured", "note": note} | decode | prefill | {"samples": samples}


def _figures(identity: dict, roof: dict, bandwidth_key: str, flops_key: str, what: str) -> dict:
    note = f"{identity['note']}; roofline: {what}"
    return identity | {"note": note, bandwidth_key: roof["bandwidth_bytes_per_s"], flops_key: roof["flops_per_s"]}


def hardware(m: Measurements) -> dict:
    device_what = (f"bf16 GEMM {m.device_roofline['flops_per_s'] / 1e12:.2f} TFLOP/s, "
                   f"copy {m.device_roofline['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (read + write)")
    cpu_what = (f"{m.dtype} GEMM {m.cpu_roofline['flops_per_s'] / 1e12:.3f} TFLOP/s, "
                f"copy {m.cpu_roofline['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (read + write)")
    section = {
        "gpu": _figures(m.gpu, m.device_roofline, "memory_bandwidth_bytes_per_s", "bf16_flops_per_s", device_what),
        "cpu": _figures(m.cpu, m.cpu_roofline, "memory_bandwidth_bytes_per_s", "flops_per_s", cpu_what),
        "software": m.software,
    }
    return section | ({"interconnect": m.interconnect} if m.interconnect else {})


def at_batch(samples: list[dict], batch: int) -> float:
    """The measured time at ``batch`` (the reference batch is always on the grid, so no fit is needed)."""
    return next(s["typical_s"] for s in samples if s["batch"] == batch)


def head_fit(samples: list[dict]) -> tuple[float, float]:
    """LM head time per step as ``fixed + per_seq * batch`` (the vocabulary projection grows with the batch)."""
    return fit_affine([s["batch"] for s in samples], [s["typical_s"] for s in samples])


def measured_models(m: Measurements) -> dict[str, dict]:
    """ModelCosts of the benchmarked models."""
    device_word = "GPU" if m.device_type == "cuda" else "CPU (as device)"
    out = {}
    for name, results in m.on_device.items():
        gpu = layer_cost(results, device_word, m.dtype, m.device_reference.batch)
        head_gpu = head_fit(results.head)
        if name in m.on_cpu:
            cpu = layer_cost(m.on_cpu[name], "host CPU", m.dtype, m.cpu_reference.batch)
            head_cpu = head_fit(m.on_cpu[name].head)
            boundary = at_batch(results.boundary, m.device_reference.batch)
        else:
            cpu = gpu | {"note": "CPU-only machine: the CPU's measured per-layer costs serve as both device and CPU costs"}
            head_cpu, boundary = head_gpu, 0.0
        out[name] = {"dtype": m.dtype, "gpu": gpu, "cpu": cpu, "head_gpu_s": head_gpu[0], "head_cpu_s": head_cpu[0],
                     "head_gpu_per_seq_s": head_gpu[1], "head_cpu_per_seq_s": head_cpu[1], "boundary_s": boundary}
    return out


def estimated_models(m: Measurements, measured: dict[str, dict]) -> dict[str, dict]:
    """ModelCosts of every other catalogue model, extrapolated from the measured ones."""
    others = {name: spec for name, spec in catalogue().items() if name not in measured}
    specs = m.specs | others
    device_roof = Roofline(m.device_roofline["bandwidth_bytes_per_s"], m.device_roofline["flops_per_s"])
    cpu_roof = Roofline(m.cpu_roofline["bandwidth_bytes_per_s"], m.cpu_roofline["flops_per_s"])
    device_ratios = efficiency({n: c["gpu"] for n, c in measured.items()}, specs, m.dtype, device_roof, m.device_reference)
    cpu_ratios = efficiency({n: c["cpu"] for n, c in measured.items()}, specs, m.dtype, cpu_roof, m.cpu_reference)
    rates = {key: head_seconds_per_byte({n: c[key] for n, c in measured.items()}, specs, m.dtype)
             for key in ("head_gpu_s", "head_cpu_s", "head_gpu_per_seq_s", "head_cpu_per_seq_s")}
    boundary = statistics.median(c["boundary_s"] for c in measured.values())
    device_word = "GPU" if m.device_type == "cuda" else "CPU (as device)"
    return {name: {
        "dtype": m.dtype,
        "gpu": estimated_layer_cost(spec, m.dtype, device_roof, device_ratios, device_word),
        "cpu": estimated_layer_cost(spec, m.dtype, cpu_roof, cpu_ratios, "host CPU"),
        **{key: head_bytes(spec, m.dtype) * rate for key, rate in rates.items()},
        "boundary_s": boundary,
    } for name, spec in others.items()}


def launch_overhead_s(m: Measurements, measured: dict[str, dict]) -> float:
    """Per-layer fixed cost beyond streaming the weights once: median over the measured models."""
    bandwidth = m.device_roofline["bandwidth_bytes_per_s"]
    return statistics.median(max(0.0, c["gpu"]["decode_base_s"] - m.specs[n].layer_weight_bytes(m.dtype) / bandwidth)
                             for n, c in measured.items())


def weights(m: Measurements) -> dict:
    target = "GPU" if m.device_type == "cuda" else "model-owned host memory (CPU-only machine)"
    host_kind = "pinned host tensors" if m.device_type == "cuda" else "host tensors (memcpy)"
    return {
        "from_disk": {"source": "measured", "note": f"safetensors file -> host -> {target}; {m.load_disk_note}",
                      **fit_load(m.load_disk), "samples": m.load_disk},
        "from_host": {"source": "measured", "note": f"{host_kind} -> {target}, one copy per weight tensor",
                      **fit_load(m.load_host), "samples": m.load_host},
        "unload": {"source": "measured", "note": "drop the weight tensors, gc.collect, empty_cache, synchronize",
                   **fit_unload(m.unload), "samples": m.unload},
    }


def assemble_profile(m: Measurements, name: str, description: str, created: str) -> dict:
    """The profile as a JSON-ready dict (not yet validated)."""
    measured = measured_models(m)
    return {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "description": description,
        "created": created,
        "hardware": hardware(m),
        "link": m.link,
        "weights": weights(m),
        "gpu_launch_overhead_s": launch_overhead_s(m, measured),
        "models": measured | estimated_models(m, measured),
        "validation": {},
    }


def write_profile(data: dict, path: Path) -> Profile:
    """Validate ``data`` against the schema, then write it atomically (temp file in the same folder, then rename)."""
    profile = parse_profile(data, "calibration result")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            json.dump(data, handle, indent=1)
            handle.write("\n")
        os.chmod(handle.name, 0o644)  # temp files are created private; a profile is meant to be shared
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return profile
