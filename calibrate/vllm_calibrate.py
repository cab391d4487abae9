"""``mmsim calibrate --engine vllm``: probe a real vLLM engine, fit mmsim's step-cost model, assemble a profile.

The model's entry gets ``measured`` per-layer decode (affine fit and batch grid) and prefill costs, the
head's batch grid and the per-step CPU overhead, with the engine's name and version in each note and the
step samples kept. Link, weight-load and unload figures are not what an engine run measures: they come
from ``--base`` (a profile of ``mmsim calibrate --device cpu`` or ``--gpu N``) when given, and are
otherwise rough estimates from one host memory copy, tagged ``estimated``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from calibrate.allocator import allocator
from calibrate.vllm_engine import EngineLimits, StepRecord, VllmEngine, engine_version, model_folder
from calibrate.vllm_fit import fit_engine_samples, quadratic, whole_step_errors
from calibrate.vllm_probes import Prober, Tick, plan_for, summarise
from sim.catalogue import ModelSpec
from sim.costs import ModelCosts
from sim.profile import SCHEMA_VERSION, parse_profile


@dataclass(frozen=True)
class EngineCalibration:
    """What to calibrate: one model (catalogue spec, or a config.json) on one device with the engine's limits."""

    spec: ModelSpec
    config: Path | None
    dtype: str
    device: str  # "cpu" or "cuda:N"
    limits: EngineLimits
    quick: bool
    workdir: Path
    base: Path | None = None


def probe_count(request: EngineCalibration) -> int:
    """Progress ticks of :func:`run_engine_calibration`: start, warm-up, every probe, fit."""
    plan = plan_for(request.quick, request.limits)
    return 3 + plan.probes


def run_engine_calibration(request: EngineCalibration, tick: Tick) -> dict:
    """Measure and fit; return the profile as a JSON-ready dict (validated by the caller's write)."""
    folder = model_folder(request.spec, request.config, request.dtype, request.workdir)
    plan = plan_for(request.quick, request.limits)
    started = time.perf_counter()
    engine = VllmEngine(folder, request.dtype, request.limits, request.device)
    tick(f"vLLM engine started ({time.perf_counter() - started:.0f} s)")
    try:
        prober = Prober(engine)
        prober.run(plan, tick)
    finally:
        engine.close()
    samples = summarise(prober.steps)
    fit = fit_engine_samples(samples, request.spec.num_layers)
    profile = _base_profile(request)
    profile["models"][request.spec.name] = model_entry(request, fit, samples)
    costs = ModelCosts(parse_profile(profile, "engine calibration"), request.spec, request.dtype)
    errors = whole_step_errors(samples, lambda s: predicted_step_s(costs, s))
    profile["validation"][f"vllm_fit:{request.spec.name}"] = {
        "engine": engine_version(), "device": request.device, "allocator": allocator(), "residuals": fit["residuals"],
        "whole_step_errors": errors,
        "limits": request.limits.__dict__, "raw_steps": [step.as_sample() | {"probe": label} for label, step in prober.steps],
    }
    tick("fit")
    return profile


def predicted_step_s(costs: ModelCosts, sample: dict) -> float:
    """mmsim's price of a sampled step's composition."""
    prefills = sample["prefills"]
    return costs.mixed_step_s(sample["batch"], sample["context_tokens"], sum(p for p, _ in prefills), quadratic(prefills),
                              len(prefills))


def step_sample(step: StepRecord) -> dict:
    """A step's composition as ``predicted_step_s`` reads it."""
    return {"batch": len(step.decode_contexts), "context_tokens": float(sum(step.decode_contexts)),
            "prefills": [list(p) for p in step.prefills]}


def model_entry(request: EngineCalibration, fit: dict, samples: list[dict]) -> dict:
    """The profile's ModelCosts of the calibrated model (the CPU plays both roles on a CPU-only machine)."""
    version = engine_version()
    where = "CPU (as device)" if request.device == "cpu" else f"GPU {request.device}"
    limits = request.limits
    note = (f"{version} engine steps on {where}, {request.dtype}, block_size {limits.block_size}, "
            f"max_num_seqs {limits.max_num_seqs}, max_num_batched_tokens {limits.max_num_batched_tokens}; per-layer "
            "= decoder forward time / layers; means of the steps per probe and batch size")
    layer = {"source": "measured", "note": note, **fit["layer"], "samples": samples}
    head, overhead = fit["head"], fit["overhead"]
    entry = {
        "dtype": request.dtype, "gpu": layer,
        "head_gpu_s": head["intercept_s"], "head_gpu_per_seq_s": head["per_seq_s"], "head_gpu_grid": head["grid"],
        "step_overhead": {"source": "measured", **overhead,
                          "note": f"{version}: engine step wall time minus model-executor time, over every probe step"},
    }
    if request.device == "cpu":
        entry |= {"cpu": layer | {"note": note + "; CPU-only machine: the same costs serve as CPU costs"},
                  "head_cpu_s": head["intercept_s"], "head_cpu_per_seq_s": head["per_seq_s"], "head_cpu_grid": head["grid"]}
    return entry


def _base_profile(request: EngineCalibration) -> dict:
    """The profile to add the model to: ``--base`` when given, else a new one with estimated movement figures."""
    if request.base is not None:
        data = json.loads(Path(request.base).read_text())
        parse_profile(data, str(request.base))
        data.setdefault("validation", {})
        data["hardware"].setdefault("software", {})["engine"] = engine_version()
        return data
    from calibrate.bench_roofline import copy_bandwidth_bytes_per_s
    from calibrate.hardware import cpu_as_device_identity, cpu_identity

    import torch

    cpu = cpu_identity()
    bandwidth, sample = copy_bandwidth_bytes_per_s(torch.device("cpu"), 64 * 2**20, 5)
    gpu = cpu_as_device_identity(cpu) if request.device == "cpu" else _cuda_identity(request.device)
    estimate = (f"estimated from one {sample['bytes'] / 2**20:.0f} MiB host memory copy; the engine calibration does "
                "not measure it: pass --base with a profile of mmsim calibrate for measured figures")
    transfer = {"source": "estimated", "note": estimate, "latency_s": 1e-5, "bandwidth_bytes_per_s": bandwidth / 2,
                "per_copy_latency_s": 2e-6}
    load = {"source": "estimated", "note": estimate, "fixed_s": 0.5, "bandwidth_bytes_per_s": bandwidth / 4}
    name = f"vllm-{cpu['model'] if request.device == 'cpu' else gpu['name']}"
    return {
        "schema_version": SCHEMA_VERSION, "name": "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-"),
        "description": f"Calibrated from {engine_version()} engine steps by mmsim calibrate --engine vllm",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hardware": {"gpu": gpu, "cpu": cpu, "software": {"engine": engine_version(), "calibrated_device": request.device}},
        "link": {"host_to_device": transfer, "device_to_host": transfer},
        "weights": {"from_disk": load, "from_host": load,
                    "unload": {"source": "estimated", "note": estimate, "fixed_s": 0.05, "seconds_per_gib": 0.01}},
        "models": {}, "validation": {},
    }


def _cuda_identity(device: str) -> dict:
    from calibrate.hardware import gpu_identity

    import torch

    return gpu_identity(torch.device(device))
