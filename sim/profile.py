"""Hardware profile: the versioned contract between ``calibrate`` (writer) and ``sim`` (reader).

A profile describes one host type: its GPU and CPU, the PCIe link, how fast
weights load and unload, and per-model compute costs. Every group of numbers
carries its provenance (``measured``, ``published``, ``derived`` or
``estimated``) and a note saying where it came from.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.catalogue import known_dtype
from sim.errors import MmsimError, validate_mapping
from sim.files import load_json
from sim.fleet.config import MAX_GPUS_PER_NODE
from sim.profile_checks import check_bounds, check_grid_axis, check_never_falls, is_numeric

SCHEMA_VERSION = 1
Source = Literal["measured", "published", "derived", "estimated"]
NonNegative = Field(ge=0)
Positive = Field(gt=0)


class Strict(BaseModel):
    """Base of every profile section: unknown keys are errors; numbers are finite and not text."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_not_text(cls, data):
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if field is not None and isinstance(value, (str, bool)) and is_numeric(field.annotation):
                    raise ValueError(f"{name} must be a number, not {json.dumps(value)[:40]}")  # as the file has it
        return data



class Sourced(Strict):
    """A group of numbers that share one provenance."""

    source: Source
    note: str = ""


class MigSlice(Strict):
    """A MIG slice: a separate smaller GPU with a share of the SMs and a fixed memory size."""

    compute_share: float = Field(gt=0, le=1)
    memory_bytes: int = Positive


class GpuInfo(Sourced):
    name: str
    memory_bytes: int = Positive
    # Bounded as a scenario's cluster.gpus_per_node is: the profile's value stands in for it, and the simulator
    # builds every GPU of a node (10**8 of them exhausted memory).
    gpus_per_node: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE)
    pcie_generation: int | None = None
    pcie_width: int | None = None
    driver: str | None = None
    memory_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    bf16_flops_per_s: float | None = Field(default=None, gt=0)
    mig_profiles: dict[str, MigSlice] = Field(default_factory=dict)


class CpuInfo(Sourced):
    model: str
    cores: int = Field(ge=1)
    ram_bytes: int | None = Field(default=None, gt=0)
    memory_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    flops_per_s: float | None = Field(default=None, gt=0)


class Interconnect(Sourced):
    """A collective's link: ``latency_s + bytes / bandwidth_bytes_per_s``, with ``bandwidth_bytes_per_s`` the
    bus bandwidth nccl-tests reports (so a ring all-reduce of n ranks moves 2(n-1)/n of the bytes at it)."""

    kind: str = "pcie"
    bandwidth_bytes_per_s: float = Field(gt=0, le=1e15)
    latency_s: float = Field(ge=0, le=1.0)


DEFAULT_INTERCONNECT = Interconnect(source="estimated", kind="pcie", bandwidth_bytes_per_s=2.0e10, latency_s=1.5e-5,
                                    note="PCIe 4.0 x16 peer traffic, when a profile names no interconnect")
DEFAULT_NETWORK = Interconnect(source="estimated", kind="ethernet", bandwidth_bytes_per_s=1.25e10, latency_s=2.0e-5,
                               note="100 Gb/s between nodes, when a profile names no network")


class Hardware(Strict):
    gpu: GpuInfo
    cpu: CpuInfo
    software: dict[str, str] = Field(default_factory=dict)
    interconnect: Interconnect | None = Field(default=None, description="between the GPUs of a node (tensor parallelism)")
    network: Interconnect | None = Field(default=None, description="between nodes (pipeline stages on other nodes)")


class TransferFit(Sourced):
    """Time of one host<->device copy of n bytes: ``latency_s + n / bandwidth_bytes_per_s``.

    ``per_copy_latency_s`` is the extra cost of each tensor copy when a KV cache
    moves as per-layer tensors (2 per layer) instead of one bulk buffer.
    """

    latency_s: float = NonNegative
    bandwidth_bytes_per_s: float = Positive
    per_copy_latency_s: float = 0.0
    samples: list[dict] = Field(default_factory=list)


class Link(Strict):
    host_to_device: TransferFit
    device_to_host: TransferFit


class LoadFit(Sourced):
    """Weight load: ``fixed_s + bytes / bandwidth_bytes_per_s``."""

    fixed_s: float = NonNegative
    bandwidth_bytes_per_s: float = Positive
    samples: list[dict] = Field(default_factory=list)


class UnloadFit(Sourced):
    """Weight unload (del, gc, empty_cache, sync): ``fixed_s + seconds_per_gib * GiB``."""

    fixed_s: float = NonNegative
    seconds_per_gib: float = NonNegative
    samples: list[dict] = Field(default_factory=list)


class WeightMovement(Strict):
    from_disk: LoadFit
    from_host: LoadFit
    unload: UnloadFit


class BatchPoint(Strict):
    """One measured batch size of a decode grid: ``base_s + per_context_token_s * C`` at that batch."""

    batch: int = Field(ge=1)
    base_s: float = NonNegative
    per_context_token_s: float = NonNegative


class HeadPoint(Strict):
    """LM head + sampling seconds per step at one measured batch size."""

    batch: int = Field(ge=1)
    seconds: float = NonNegative


class StepOverhead(Sourced):
    """CPU time per engine step outside the forward pass (scheduling, input preparation, output processing):
    ``fixed_s + per_seq_s * S`` for a step holding S sequences."""

    fixed_s: float = NonNegative
    per_seq_s: float = NonNegative
    samples: list[dict] = Field(default_factory=list)


class LayerCost(Sourced):
    """Seconds for one decoder layer on one device.

    Decode step of B sequences with C tokens of context in total:
    ``decode_base_s + decode_per_seq_s * B + decode_per_context_token_s * C``; when ``decode_grid`` holds
    measured batch sizes, the cost at batch B is interpolated linearly between (0, decode_base_s,
    decode_per_context_token_s) and the grid's points instead (still affine in C at a fixed batch).
    Prefill of P tokens over C cached ones:
    ``prefill_base_s + prefill_per_token_s * P + prefill_per_token_sq_s * (P**2 + 2 * P * C)``.
    """

    decode_base_s: float = NonNegative
    decode_per_seq_s: float = NonNegative
    decode_per_context_token_s: float = NonNegative
    prefill_base_s: float = NonNegative
    prefill_per_token_s: float = NonNegative
    prefill_per_token_sq_s: float = NonNegative
    decode_grid: list[BatchPoint] = Field(default_factory=list)
    samples: list[dict] = Field(default_factory=list)

    @field_validator("decode_grid")
    @classmethod
    def _decode_axis(cls, points: list[BatchPoint]) -> list[BatchPoint]:
        return check_grid_axis(points, "batch")

    @model_validator(mode="after")
    def _grid_never_falls(self):
        check_never_falls(self.decode_grid, ("base_s", "per_context_token_s"), "decode_grid")
        return self


class OffloadPoint(Strict):
    gpu_share: float = Field(ge=0, le=1)
    normalized_throughput: float = Field(gt=0, le=1.5)


class OffloadCurve(Sourced):
    """Measured decode throughput vs share of layers on the GPU (1.0 = all on GPU)."""

    points: list[OffloadPoint] = Field(min_length=2)

    @field_validator("points")
    @classmethod
    def _share_axis(cls, points: list[OffloadPoint]) -> list[OffloadPoint]:
        return check_grid_axis(points, "gpu_share")


class KvTransferOverride(Sourced):
    """Per-model fixed cost of moving a KV cache (per-layer copy overhead), each direction."""

    device_to_host_s: float = NonNegative
    host_to_device_s: float = NonNegative


class SwapCosts(Sourced):
    """Per-model measured reload and unload seconds; they override the generic weight fits."""

    reload_s: float = Positive
    unload_s: float = NonNegative


class ModelCosts(Strict):
    """Costs of one model on this host; anything absent is estimated from the roofline."""

    # The dtype the entry was measured at; the model's other dtypes are priced from it, scaled by what the dtype
    # changes (sim.costs.entry_at_dtype), which a misspelt one could not be.
    dtype: Annotated[str, AfterValidator(known_dtype)] = "fp16"
    gpu: LayerCost
    cpu: LayerCost | None = None
    head_gpu_s: float = Field(default=0.0, ge=0, description="LM head + sampling per decode step on GPU")
    head_cpu_s: float = Field(default=0.0, ge=0)
    head_gpu_per_seq_s: float = Field(default=0.0, ge=0, description="LM head cost growing with the batch, per sequence")
    head_cpu_per_seq_s: float = Field(default=0.0, ge=0)
    head_gpu_grid: list[HeadPoint] = Field(default_factory=list, description="measured head seconds by batch size")
    head_cpu_grid: list[HeadPoint] = Field(default_factory=list)
    boundary_s: float = Field(default=0.0, ge=0, description="GPU<->CPU hand-off per step when offloaded")
    step_overhead: StepOverhead | None = Field(default=None, description="this model's per-step CPU overhead "
                                               "(overrides the profile's)")
    offload_curve: OffloadCurve | None = None
    swap: SwapCosts | None = None
    kv_transfer: KvTransferOverride | None = None

    @field_validator("head_gpu_grid", "head_cpu_grid")
    @classmethod
    def _head_axes(cls, points: list[HeadPoint]) -> list[HeadPoint]:
        return check_grid_axis(points, "batch")

    @model_validator(mode="after")
    def _head_grids_never_fall(self):
        check_never_falls(self.head_gpu_grid, ("seconds",), "head_gpu_grid")
        check_never_falls(self.head_cpu_grid, ("seconds",), "head_cpu_grid")
        return self


class Profile(Strict):
    """One host type's measured (or published, derived, estimated) costs."""

    schema_version: int
    name: str
    description: str = ""
    created: str = ""
    hardware: Hardware
    link: Link
    weights: WeightMovement
    gpu_launch_overhead_s: float = Field(default=2e-5, ge=0, description="per-layer fixed cost for roofline estimates")
    step_overhead: StepOverhead | None = Field(default=None, description="per-step CPU overhead of the serving "
                                               "engine, for every model without its own; none: 0")
    models: dict[str, ModelCosts] = Field(default_factory=dict)
    validation: dict = Field(default_factory=dict)

    @field_validator("schema_version", mode="before")
    @classmethod
    def _check_version(cls, version):
        if type(version) is not int:  # 1.0 == 1 (and True == 1): a version is written as a whole number
            raise ValueError(f"{json.dumps(version)[:40]} is not a whole number; write {SCHEMA_VERSION}")
        if version != SCHEMA_VERSION:
            raise ValueError(f"version {version} is not supported; this mmsim reads version {SCHEMA_VERSION}")
        return version

    @field_validator("name")
    @classmethod
    def _named(cls, name: str) -> str:
        if not name.strip():  # messages name the profile: "profile  cannot meet the scenario's SLOs"
            raise ValueError("must not be empty or blank (messages and reports name the profile by it)")
        return name

    def provenance(self) -> dict[str, str]:
        """Where each group of numbers came from, for reports."""
        rows: dict[str, str] = {
            "hardware.gpu": self.hardware.gpu.source,
            "hardware.cpu": self.hardware.cpu.source,
            "link.host_to_device": self.link.host_to_device.source,
            "link.device_to_host": self.link.device_to_host.source,
            "weights.from_disk": self.weights.from_disk.source,
            "weights.from_host": self.weights.from_host.source,
            "weights.unload": self.weights.unload.source,
        }
        if self.step_overhead:
            rows["step_overhead"] = self.step_overhead.source
        for name, costs in self.models.items():
            rows[f"models.{name}.gpu"] = costs.gpu.source
            if costs.step_overhead:
                rows[f"models.{name}.step_overhead"] = costs.step_overhead.source
            if costs.cpu:
                rows[f"models.{name}.cpu"] = costs.cpu.source
            if costs.swap:
                rows[f"models.{name}.swap"] = costs.swap.source
            if costs.offload_curve:
                rows[f"models.{name}.offload_curve"] = costs.offload_curve.source
            if costs.kv_transfer:
                rows[f"models.{name}.kv_transfer"] = costs.kv_transfer.source
        return rows


def parse_profile(data: object, source: str) -> Profile:
    """Validate an already-parsed JSON object as a profile."""
    if isinstance(data, dict) and "schema_version" not in data:
        raise MmsimError(f"missing field (expected schema_version: {SCHEMA_VERSION})", source=source, field="schema_version")
    check_bounds(data, source)
    return validate_mapping(Profile, data, source, kind="JSON object")


def load_profile_file(path: Path) -> Profile:
    """A profile JSON file, read safely (regular file, size cap, UTF-8, no duplicate keys, bounded depth)."""
    return parse_profile(load_json(Path(path), "profile"), str(path))


def builtin_profile_names() -> list[str]:
    folder = resources.files("sim").joinpath("data/profiles")
    return sorted(entry.name.removesuffix(".json") for entry in folder.iterdir() if entry.name.endswith(".json"))


@lru_cache(maxsize=32)
def _builtin(name: str) -> Profile:
    text = resources.files("sim").joinpath(f"data/profiles/{name}.json").read_text()
    return parse_profile(json.loads(text), f"built-in profile {name}")


def load_profile(name_or_path: str | Path, base_dir: Path | None = None) -> Profile:
    """A built-in profile by name, or a profile JSON file by path (relative to ``base_dir``)."""
    name = str(name_or_path)
    if name in builtin_profile_names():
        return _builtin(name)
    path = Path(name)
    if not path.is_absolute() and base_dir is not None and os.path.exists(base_dir / path):
        path = base_dir / path
    if path.suffix == ".json" or os.path.exists(path):
        return load_profile_file(path)
    raise MmsimError(f"unknown profile {name!r}; built-in profiles: {', '.join(builtin_profile_names())}, or a path to a profile JSON")
