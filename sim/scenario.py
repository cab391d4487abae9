"""Scenario files: what to serve, on what, with which traffic, judged by which SLOs.

A scenario is YAML validated up front; every problem is reported with the
file, the field path and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.catalogue import BITS_PER_WEIGHT, catalogue
from sim.errors import MmsimError, validate_mapping
from sim.workload.config import WorkloadConfig


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MigConfig(Strict):
    """Split every GPU into MIG slices of one profile (each slice is a separate, smaller GPU)."""

    profile: str
    slices_per_gpu: int = Field(ge=1, le=7)


class ClusterConfig(Strict):
    nodes: int = Field(default=1, ge=1)
    gpus_per_node: int | None = Field(default=None, ge=1, description="default: the profile's")
    host_memory_gb: float = Field(default=256.0, gt=0)
    gpu_memory_gb: float | None = Field(default=None, gt=0, description="override the profile's GPU memory")
    mig: MigConfig | None = None


class ModelEntry(Strict):
    """One model deployment; ``alias`` names it when the same catalogue model is served twice (e.g. fp16 and fp8)."""

    name: str
    alias: str | None = None
    dtype: str = "fp16"
    replicas: int | Literal["dynamic"] | None = None
    gpus: list[int] | None = None
    gpu_share: float = Field(default=1.0, gt=0, le=1)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in catalogue():
            raise ValueError(f"unknown model {value!r}; expected one of {', '.join(sorted(catalogue()))}")
        return value

    @property
    def deployment(self) -> str:
        """The name requests use to address this deployment."""
        return self.alias or self.name

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in BITS_PER_WEIGHT:
            raise ValueError(f"unknown dtype {value!r}; expected one of {', '.join(BITS_PER_WEIGHT)}")
        return value


class Slo(Strict):
    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)


class EngineSection(Strict):
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=16)
    block_size: int = Field(default=16, ge=1)
    chunked_prefill: bool = True
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    preemption_mode: Literal["recompute", "swap"] = "recompute"


class PolicySection(Strict):
    name: str = "static"
    params: dict = Field(default_factory=dict)


class Scenario(Strict):
    """A whole scenario file."""

    name: str = "scenario"
    description: str = ""
    seed: int = 0
    profile: str = "paper-rtx5000"
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    models: list[ModelEntry] = Field(min_length=1)
    workload: WorkloadConfig
    slo: dict[str, Slo] = Field(default_factory=dict)
    engine: EngineSection = Field(default_factory=EngineSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    sample_interval_s: float | None = Field(default=None, gt=0, description="time-series sampling period")

    @model_validator(mode="after")
    def _cross_checks(self) -> "Scenario":
        names = [m.deployment for m in self.models]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"models listed twice: {', '.join(sorted(duplicates))} (give one of them an alias)")
        for key in self.slo:
            if key != "default" and key not in names:
                raise ValueError(f"slo.{key}: not a model of this scenario (expected 'default' or one of {', '.join(names)})")
        return self

    def slo_for(self, model: str) -> Slo:
        base = self.slo.get("default", Slo())
        own = self.slo.get(model)
        if own is None:
            return base
        return Slo(**{k: getattr(own, k) if getattr(own, k) is not None else getattr(base, k) for k in Slo.model_fields})


def parse_scenario(data: object, source: str) -> Scenario:
    return validate_mapping(Scenario, data, source)


def read_yaml(path: Path) -> object:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise MmsimError(f"cannot read file: {error.strerror}", source=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise MmsimError(f"not valid YAML{where}: {problem}", source=str(path)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    return parse_scenario(read_yaml(Path(path)), str(path))
