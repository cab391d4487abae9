"""The scenario sections of an elastic fleet: node pools, the cold-start pipeline, the autoscaler.

A cluster is one or more pools of identical nodes (one GPU type, one price); nodes beyond a pool's
``nodes`` exist only once an autoscaler provisions them. Stage defaults are midpoints of the ranges the
GPU-scheduling seed publishes for production cold starts (node 30-60 s, container 5-10 s, image pull
1-5 min for 10-30 GB, runtime and weight fetch 30-60 s, CPU deserialisation 30-120 s, GPU transfer
15-80 s, warm-up 5-30 s); GPU transfer defaults to the profile's measured reload seconds instead.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_NODES = 1024
MAX_GPUS_PER_NODE = 64
MAX_STAGE_S = 86_400.0

DEFAULT_PRICE_PER_GPU_HOUR = {
    "paper-rtx5000": 0.80,
    "paper-a6000": 0.50,
    "a100-80gb": 1.80,
    "h100-sxm": 3.00,
    "h200": 3.80,
}
"""US dollars per GPU-hour, on-demand: rounded public cloud list prices of late 2025, illustrative only
(override with ``price_per_gpu_hour``); 1.00 for a profile not listed."""
UNLISTED_PRICE_PER_GPU_HOUR = 1.00


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class MigConfig(Strict):
    """Split every GPU into MIG slices of one profile (each slice is a separate, smaller GPU)."""

    profile: str
    slices_per_gpu: int = Field(ge=1, le=7)


class ColdStart(Strict):
    """The timed stages between a scale-up decision and a ready instance (see the module docstring).

    ``lazy_pull`` starts the container once ``lazy_pull_fraction`` of the image is in (a stargz-style
    snapshotter fetches the rest in the background); ``weight_streaming`` overlaps weight fetch,
    deserialisation and GPU transfer (weights stream to the GPU as they arrive), so the three take as long
    as the slowest instead of their sum."""

    provision_s: float = Field(default=45.0, ge=0, le=MAX_STAGE_S, description="a new node: VM provisioning")
    container_init_s: float = Field(default=7.5, ge=0, le=MAX_STAGE_S)
    image_gb: float = Field(default=20.0, ge=0, le=1e4, description="container image size")
    registry_gb_per_s: float = Field(default=0.11, gt=0, le=1e4, description="image pull bandwidth (20 GB in ~3 min)")
    runtime_start_s: float = Field(default=15.0, ge=0, le=MAX_STAGE_S, description="the serving runtime's start")
    weight_fetch_gb_per_s: float = Field(default=0.5, gt=0, le=1e4, description="weights from remote storage")
    deserialise_gb_per_s: float = Field(default=0.2, gt=0, le=1e4, description="CPU deserialisation of the weights")
    gpu_transfer_s: float | None = Field(default=None, ge=0, le=MAX_STAGE_S, description="GPU allocation and weight "
                                         "transfer (default: the profile's reload seconds for the model)")
    warm_up_s: float = Field(default=15.0, ge=0, le=MAX_STAGE_S, description="warm-up forward passes, graph capture")
    lazy_pull: bool = False
    lazy_pull_fraction: float = Field(default=0.1, gt=0, le=1)
    weight_streaming: bool = False


class Pool(Strict):
    """Identical nodes of one GPU type: ``nodes`` up from the start, up to ``max_nodes`` when scaled."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    profile: str | None = Field(default=None, description="hardware profile (default: the scenario's)")
    nodes: int = Field(default=-1, ge=-1, le=MAX_NODES, description="nodes up at time 0 (default: min_nodes)")
    min_nodes: int = Field(default=0, ge=0, le=MAX_NODES)
    max_nodes: int = Field(default=-1, ge=-1, le=MAX_NODES, description="default: nodes")
    gpus_per_node: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_NODE, description="default: the profile's")
    host_memory_gb: float = Field(default=256.0, gt=0, le=1e6)
    gpu_memory_gb: float | None = Field(default=None, gt=0, le=1e4, description="override the profile's GPU memory")
    mig: MigConfig | None = None
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=1e4, description="US$ (default: per profile)")
    cold_start: ColdStart | None = Field(default=None, description="this pool's stages (default: the scenario's)")

    @model_validator(mode="after")
    def _sizes(self) -> "Pool":
        # -1: not given (pydantic checks the types first, so the defaults can be worked out from checked values)
        if self.nodes == -1:
            self.nodes = self.min_nodes
        if self.max_nodes == -1:
            self.max_nodes = max(self.nodes, 1)
        if self.max_nodes < 1:
            raise ValueError("max_nodes must be at least 1")
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes {self.min_nodes} is more than max_nodes {self.max_nodes}")
        if not self.min_nodes <= self.nodes <= self.max_nodes:
            raise ValueError(f"nodes {self.nodes} must lie between min_nodes {self.min_nodes} and max_nodes {self.max_nodes}")
        return self

    def price(self, profile_name: str) -> float:
        if self.price_per_gpu_hour is not None:
            return self.price_per_gpu_hour
        return DEFAULT_PRICE_PER_GPU_HOUR.get(profile_name, UNLISTED_PRICE_PER_GPU_HOUR)


class Autoscaler(Strict):
    """Which autoscaler sets each model's replica count, how often, and within which bounds."""

    name: str = "none"
    params: dict = Field(default_factory=dict)
    interval_s: float = Field(default=15.0, ge=1e-3, le=MAX_STAGE_S, description="how often it decides (HPA: 15 s)")
    min_replicas: int = Field(default=1, ge=0, le=MAX_NODES * MAX_GPUS_PER_NODE)
    max_replicas: int = Field(default=MAX_NODES * MAX_GPUS_PER_NODE, ge=1, le=MAX_NODES * MAX_GPUS_PER_NODE)
    scale_down_window_s: float = Field(default=300.0, ge=0, le=MAX_STAGE_S, description="a scale-down follows "
                                       "the highest replica count wanted over this window (HPA's stabilisation)")
    scale_to_zero_idle_s: float | dict[str, float] | None = Field(default=None, description="seconds without a "
                                                                  "request before a model scales to zero (per model)")
    node_idle_s: float = Field(default=600.0, ge=0, le=MAX_STAGE_S, description="an empty node is released after "
                               "this long (the cluster autoscaler's scale-down-unneeded-time: 10 min)")

    @model_validator(mode="after")
    def _bounds(self) -> "Autoscaler":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is more than max_replicas {self.max_replicas}")
        idle = self.scale_to_zero_idle_s
        for value in (idle.values() if isinstance(idle, dict) else [idle]):
            if value is not None and not 0 < value <= MAX_STAGE_S:
                raise ValueError(f"scale_to_zero_idle_s must be a positive number of seconds up to {MAX_STAGE_S:g}")
        return self

    def idle_timeout_s(self, model: str) -> float | None:
        idle = self.scale_to_zero_idle_s
        return idle.get(model) if isinstance(idle, dict) else idle
