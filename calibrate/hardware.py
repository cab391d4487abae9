"""Hardware identity: which GPU, CPU and software a calibration ran on.

The GPU is read through torch (name, memory, SMs, L2) and NVML (PCIe generation
and width, maximum and current; driver; clocks). The CPU from /proc (model,
RAM) and the affinity mask (cores we may use). Everything returned is a dict
shaped like the profile's ``GpuInfo`` / ``CpuInfo`` / ``software`` fields.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable

import numpy as np
import torch

from calibrate.timing import usable_cores
from sim.errors import MmsimError
from sim.files import counted


def resolve_device(gpu: int | None, device: str | None) -> torch.device:
    """The torch device to calibrate from ``--gpu N`` / ``--device cpu|cuda[:N]``; a missing GPU is a user error."""
    if gpu is not None and device is not None:
        raise MmsimError("give either --gpu N or --device, not both")
    if device is None:
        return cuda_device(0 if gpu is None else gpu)
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        index = device.partition(":")[2]
        if index and not index.isdigit():
            raise MmsimError(f"bad --device {device!r}; expected cpu, cuda or cuda:N")
        return cuda_device(int(index or 0))
    raise MmsimError(f"bad --device {device!r}; expected cpu, cuda or cuda:N")


def cuda_device(index: int) -> torch.device:
    """``cuda:index``, or a one-line error that suggests the CPU-only calibration."""
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", built without CUDA")
        raise MmsimError(f"no CUDA GPU is available ({build}); to calibrate this machine's CPU use --device cpu")
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise MmsimError(f"GPU {index} does not exist; this machine has {counted(count, 'GPU')} (0..{count - 1})")
    return torch.device("cuda", index)


def _nvml_query(fn: Callable, *args: object) -> object | None:
    """One NVML query; None when the driver or the virtualisation layer does not answer it."""
    import pynvml
    try:
        value = fn(*args)
    except pynvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _nvml_handle(device: torch.device, props: object) -> object | None:
    import pynvml
    uuid = getattr(props, "uuid", None)
    handle = _nvml_query(pynvml.nvmlDeviceGetHandleByUUID, f"GPU-{uuid}") if uuid else None
    return handle or _nvml_query(pynvml.nvmlDeviceGetHandleByIndex, device.index or 0)


def _nvml_details(device: torch.device, props: object) -> dict:
    """PCIe, driver and clock figures from NVML, or ``{"error": why}`` when NVML is not usable here."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as error:  # a missing package or library: NVML is optional, identity falls back to torch
        return {"error": f"NVML unavailable ({type(error).__name__}: {error})"}
    handle = _nvml_handle(device, props)
    if handle is None:
        return {"error": "NVML has no handle for this GPU"}
    q = lambda fn, *args: _nvml_query(fn, handle, *args)  # noqa: E731
    return {
        "pcie_generation": q(pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
        "pcie_width": q(pynvml.nvmlDeviceGetMaxPcieLinkWidth),
        "pcie_generation_current": q(pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
        "pcie_width_current": q(pynvml.nvmlDeviceGetCurrPcieLinkWidth),
        "driver": _nvml_query(pynvml.nvmlSystemGetDriverVersion),
        "memory_bytes": getattr(q(pynvml.nvmlDeviceGetMemoryInfo), "total", None),
        "sm_clock_max_mhz": q(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
        "sm_clock_mhz": q(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
        "memory_clock_max_mhz": q(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM),
        "memory_clock_mhz": q(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM),
    }


def gpu_identity(device: torch.device) -> dict:
    """GpuInfo fields (without roofline figures) for a CUDA device."""
    props = torch.cuda.get_device_properties(device)
    nvml = _nvml_details(device, props)
    extras = [f"{props.multi_processor_count} SMs", f"L2 {props.L2_cache_size / 2**20:.0f} MiB",
              f"compute capability {props.major}.{props.minor}"]
    if "error" in nvml:
        extras.append(nvml["error"])
    else:
        extras.append(f"PCIe Gen{nvml['pcie_generation']} x{nvml['pcie_width']} max, "
                      f"Gen{nvml['pcie_generation_current']} x{nvml['pcie_width_current']} current")
        extras.append(f"SM clock {nvml['sm_clock_mhz']} MHz (max {nvml['sm_clock_max_mhz']}), "
                      f"memory clock {nvml['memory_clock_mhz']} MHz (max {nvml['memory_clock_max_mhz']})")
    return {
        "source": "measured",
        "note": "identity from torch and NVML: " + "; ".join(extras),
        "name": props.name,
        "memory_bytes": int(nvml.get("memory_bytes") or props.total_memory),
        "pcie_generation": nvml.get("pcie_generation"),
        "pcie_width": nvml.get("pcie_width"),
        "driver": nvml.get("driver"),
    }


def cpu_as_device_identity(cpu: dict) -> dict:
    """GpuInfo fields for a CPU-only calibration, where the CPU plays the device's role too."""
    return {
        "source": "measured",
        "note": "CPU-only calibration: no GPU; the CPU plays the device's role (device costs are the CPU's, "
                "memory is host RAM, 'transfers' are host memory copies)",
        "name": f"CPU as device: {cpu['model']}",
        "memory_bytes": cpu["ram_bytes"],
    }


def _proc_field(path: str, key: str) -> str | None:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        return None
    return None


def cpu_identity() -> dict:
    """CpuInfo fields (without roofline figures) for this host."""
    model = _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
    mem_total = _proc_field("/proc/meminfo", "MemTotal")
    ram = int(mem_total.split()[0]) * 1024 if mem_total else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cores = usable_cores()
    return {
        "source": "measured",
        "note": f"model from /proc/cpuinfo, RAM from /proc/meminfo; {counted(cores, 'usable core')} of {os.cpu_count()} online",
        "model": model,
        "cores": cores,
        "ram_bytes": int(ram),
    }


def software_versions(device: torch.device, plan_name: str) -> dict[str, str]:
    """Versions and settings that affect the numbers."""
    import safetensors
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "os": platform.platform(),
        "calibrated_device": str(device),
        "calibration_plan": plan_name,
        "torch_threads": str(torch.get_num_threads()),
    }
    if device.type == "cuda":
        versions["cudnn"] = str(torch.backends.cudnn.version())
    return versions
