"""Scenario files: what to serve, on what, with which traffic, judged by which SLOs.

A scenario is YAML validated up front; every problem is reported with the
file, the field path and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from sim.catalogue import catalogue, known_dtype
from sim.errors import MmsimError, validate_mapping
from sim.files import cut, load_yaml
from sim.fleet.config import Autoscaler, ColdStart, MigConfig, Pool
from sim.workload.config import MAX_NAME_CHARS, MAX_TIME_S, ModelName, WorkloadConfig

MAX_NODES = 1024
MAX_GPUS_PER_NODE = 64
MAX_SEED = 2**63 - 1


class Strict(BaseModel):
    """Base of every scenario section: unknown keys are errors, numbers must be finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ClusterConfig(Strict):
    """One pool of fixed nodes of the scenario's profile (the fields here), or ``pools`` of nodes of their own."""

    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    gpus_per_node: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_NODE, description="default: the profile's")
    host_memory_gb: float = Field(default=256.0, gt=0, le=1e6)
    gpu_memory_gb: float | None = Field(default=None, gt=0, le=1e4, description="override the profile's GPU memory")
    mig: MigConfig | None = None
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=1e4, description="US$ (default: per profile)")
    pools: list[Pool] | None = Field(default=None, min_length=1, max_length=64)
    placement: Literal["hardware-aware", "blind"] = Field(default="hardware-aware", description="which pool a model's "
                                                          "instances go to: the one fitting it best, or the first")

    @model_validator(mode="after")
    def _pools_alone(self) -> "ClusterConfig":
        if self.pools is None:
            return self
        beside = sorted(self.model_fields_set - {"pools", "placement"})
        if beside:
            raise ValueError(f"give {', '.join(beside)} per pool when the cluster has pools")
        names = [pool.name for pool in self.pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pools named twice: {', '.join(twice)}")
        if sum(pool.max_nodes for pool in self.pools) > MAX_NODES:
            raise ValueError(f"the pools' max_nodes add up to more than {MAX_NODES} nodes")
        return self

    def node_pools(self, profile: str) -> list[Pool]:
        """The cluster's pools; a cluster without ``pools`` is one pool, ``default``, of fixed size."""
        if self.pools is not None:
            return [pool if pool.profile else pool.model_copy(update={"profile": profile}) for pool in self.pools]
        return [Pool(name="default", profile=profile, nodes=self.nodes, min_nodes=self.nodes, max_nodes=self.nodes,
                     gpus_per_node=self.gpus_per_node, host_memory_gb=self.host_memory_gb,
                     gpu_memory_gb=self.gpu_memory_gb, mig=self.mig, price_per_gpu_hour=self.price_per_gpu_hour)]


class ModelEntry(Strict):
    """One model deployment; ``alias`` names it when the same catalogue model is served twice (e.g. fp16 and fp8)."""

    name: ModelName
    alias: ModelName | None = None
    dtype: str = "fp16"
    kv_dtype: Literal["fp32", "fp16", "bf16", "fp8", "int8", "fp4"] | None = Field(
        default=None, description="the KV cache's dtype (default: the model's activation dtype, as vLLM's 'auto')")
    replicas: int | Literal["dynamic"] | None = None
    gpus: list[int] | None = None
    gpu_share: float = Field(default=1.0, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=2, description="longest prompt + output this deployment "
                                      "accepts (default: what fits its KV room at full residency)")
    config: str | None = Field(default=None, description="a Hugging Face config.json with the architecture; "
                               "name then names this model instead of a catalogue entry")
    tensor_parallel: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE, description="GPUs of one node each instance "
                                 "splits its layers over")
    pipeline_parallel: int = Field(default=1, ge=1, le=MAX_NODES * MAX_GPUS_PER_NODE, description="stages, of "
                                   "tensor_parallel GPUs each, each instance splits its layers into")

    @model_validator(mode="after")
    def _parallel_whole_gpus(self) -> "ModelEntry":
        if self.tensor_parallel * self.pipeline_parallel > 1 and self.gpu_share < 1:
            raise ValueError("gpu_share below 1 (CPU offload) cannot be combined with tensor or pipeline parallelism")
        return self

    @model_validator(mode="before")
    @classmethod
    def _from_config(cls, data):
        """Register the architecture a ``config`` file describes under ``name`` before ``name`` is checked."""
        if isinstance(data, dict) and isinstance(data.get("config"), str) and isinstance(data.get("name"), str):
            from sim.catalogue import model_from_hf_config, register_model, resolve_config_path
            register_model(model_from_hf_config(resolve_config_path(data["config"]), data["name"]))
        return data

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value):
        if isinstance(value, int) and not 0 <= value <= MAX_NODES * MAX_GPUS_PER_NODE:
            raise ValueError(f"replicas must be between 0 and {MAX_NODES * MAX_GPUS_PER_NODE}")
        return value

    @field_validator("alias")
    @classmethod
    def _alias(cls, alias: str | None) -> str | None:
        # A deployment's name goes into comma-separated flags (--mix a=0.5,b=0.5) and run folder names.
        if alias is not None and (not alias.strip() or "," in alias or "=" in alias or not alias.isprintable()):
            raise ValueError(f"{alias!r} cannot name a deployment: give printable text without ',' or '='")
        return alias

    @field_validator("gpus")
    @classmethod
    def _gpu_indexes(cls, value):
        if value is not None and not value:
            raise ValueError("lists no GPU; list the GPUs to pin it to, or leave gpus out")
        if value is not None and any(not 0 <= index < MAX_NODES * MAX_GPUS_PER_NODE for index in value):
            raise ValueError("GPU indexes must be >= 0 and below the cluster's GPU count")
        if value is not None and len(set(value)) != len(value):  # loaded one instance per entry, twice on one GPU
            twice = next(index for index in value if value.count(index) > 1)
            raise ValueError(f"GPU {twice} is listed twice; list each GPU once (replicas on one GPU: use aliases)")
        return value

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in catalogue():
            raise ValueError(f"unknown model {cut(value)!r}; expected one of {', '.join(sorted(catalogue()))}")
        return value

    @property
    def deployment(self) -> str:
        """The name requests use to address this deployment."""
        return self.alias or self.name

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return known_dtype(value)


class Slo(Strict):
    """Latency limits in seconds (None: no limit) that a request is held to."""

    ttft_s: float | None = Field(default=None, gt=0, le=1e6)
    tpot_s: float | None = Field(default=None, gt=0, le=1e6)
    e2e_s: float | None = Field(default=None, gt=0, le=1e6)
    # A model's SLO (``Scenario.slo_for``) carries what its requests of each of the scenario's classes are held to,
    # so that the engine, handed the models' SLOs, has the classes' too. Private: no file can set it.
    _by_class: dict[str, Slo] = PrivateAttr(default_factory=dict)

    def for_class(self, label: str | None) -> Slo:
        """The limits this SLO's requests of class ``label`` are held to: this SLO itself for no class or for one
        the scenario does not name (see ``Scenario.slo_for``)."""
        return self._by_class.get(label, self) if label else self

    def over(self, base: Slo) -> Slo:
        """These limits, each one left unset taken from ``base``."""
        return Slo(**{field: getattr(base, field) if getattr(self, field) is None else getattr(self, field)
                      for field in Slo.model_fields})


class EngineSection(Strict):
    max_num_seqs: int = Field(default=256, ge=1, le=1 << 16)
    max_num_batched_tokens: int = Field(default=8192, ge=16, le=1 << 24)
    block_size: int = Field(default=16, ge=1, le=1024)
    chunked_prefill: bool = True
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    progress_horizon_s: float = Field(default=3600.0, gt=0, le=1e7, description="simulated seconds without a "
                                      "token while work is outstanding before the run stops with a diagnosis")
    progress_max_loads: int = Field(default=1000, ge=1, description="reloads (loads of a model unloaded "
                                    "since the last token) before the run stops with a diagnosis")
    prefix_caching: bool = Field(default=True, description="vLLM's automatic prefix caching, for requests whose "
                                 "trace rows carry prefix_ids")


class RoutingWeights(Strict):
    """Weights of the ``prefix-aware`` rule's scorers (see :mod:`sim.engine.routing`)."""

    prefix: float = Field(default=3.0, ge=0, le=1e6)
    queue: float = Field(default=2.0, ge=0, le=1e6)
    kv: float = Field(default=2.0, ge=0, le=1e6)


class RoutingSection(Strict):
    """Which of a model's instances queues a new request, for every policy that does not route itself."""

    rule: Literal["least-loaded", "round-robin", "prefix-aware"] = "least-loaded"
    weights: RoutingWeights = Field(default_factory=RoutingWeights)


class PolicySection(Strict):
    name: str = "static"
    params: dict = Field(default_factory=dict)


class Scenario(Strict):
    """A whole scenario file."""

    name: str = Field(default="scenario", min_length=1, max_length=MAX_NAME_CHARS)

    @field_validator("name")
    @classmethod
    def _named(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("must not be empty or blank: it names the scenario's runs and reports")
        return name
    description: str = ""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    profile: str = "paper-rtx5000"
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    models: list[ModelEntry] = Field(min_length=1)
    workload: WorkloadConfig
    slo: dict[str, Slo] = Field(default_factory=dict)
    slo_classes: dict[str, Slo] = Field(default_factory=dict, description="limits per request class (a trace's "
                                        "slo_class); a limit a class leaves unset is its request's model's")
    engine: EngineSection = Field(default_factory=EngineSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    cold_start: ColdStart = Field(default_factory=ColdStart)
    autoscaler: Autoscaler = Field(default_factory=Autoscaler)
    sample_interval_s: float | None = Field(default=None, ge=1e-3, le=MAX_TIME_S, description="time-series sampling period")

    @field_validator("slo_classes", mode="before")
    @classmethod
    def _class_labels(cls, value: object) -> object:
        """Labels are checked before the mapping is: a YAML key such as ``1`` is not a trace's text."""
        bad = [label for label in value if not isinstance(label, str) or not label.strip()] \
            if isinstance(value, dict) else []
        if bad:
            raise ValueError(f"a class label must be non-empty text, not {cut(repr(bad[0]))}")
        long = [label for label in value if len(label) > MAX_NAME_CHARS] if isinstance(value, dict) else []
        if long:  # no trace's label can match it: a trace's slo_class is at most as long
            raise ValueError(f"a class label is at most {MAX_NAME_CHARS} characters, not {len(long[0]):,}")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> "Scenario":
        names = [m.deployment for m in self.models]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"models listed twice: {', '.join(sorted(duplicates))} (give one of them an alias)")
        for key in self.slo:
            if key != "default" and key not in names:
                raise ValueError(f"slo.{key}: not a model of this scenario (expected 'default' or one of {', '.join(names)})")
        idle = self.autoscaler.scale_to_zero_idle_s
        for key in (idle if isinstance(idle, dict) else {}):
            if key not in names:
                raise ValueError(f"autoscaler.scale_to_zero_idle_s.{key}: not a model of this scenario "
                                 f"(expected one of {', '.join(names)})")
        self.workload.serve(names)
        return self

    @property
    def pools(self) -> list[Pool]:
        return self.cluster.node_pools(self.profile)

    def check_requested_models(self, source: str) -> None:
        """A workload naming a model the scenario does not serve is an error: its requests would all be dropped
        as model_not_served, almost surely from a typo or a forgotten ``models`` entry."""
        names = [m.deployment for m in self.models]
        unserved = [name for name in self.workload.requested_models() if name not in names]
        if unserved:
            where = "generator.mix" if self.workload.generator else "trace"
            raise MmsimError(f"model {cut(unserved[0])!r} is not served by this scenario (models: {', '.join(names)})",
                             source=source, field=f"workload.{where}")

    def slo_for(self, model: str) -> Slo:
        """The limits ``model``'s requests are held to: its ``slo`` entry's, each one it leaves unset the default's.
        Its ``for_class(label)`` gives those of its requests of class ``label``: the ``slo_classes`` entry's, with
        these where the entry leaves one unset."""
        base = self.slo.get("default", Slo())
        own = self.slo.get(model)
        slo = base if own is None else own.over(base)
        if not self.slo_classes:
            return slo
        slo = slo.model_copy()  # not the scenario's own entry: the classes are this model's
        slo._by_class = {label: limits.over(slo) for label, limits in self.slo_classes.items()}
        return slo


def with_autoscaler(scenario: Scenario, name: str) -> Scenario:
    """``scenario`` under another autoscaler (its parameters kept only if it is the same one), checked as a
    scenario's own would be."""
    from sim.fleet.autoscalers import make_autoscaler

    own = scenario.autoscaler
    params = own.params if name == own.name else {}
    make_autoscaler(name, params)
    return scenario.model_copy(update={"autoscaler": own.model_copy(update={"name": name, "params": params})})


def parse_scenario(data: object, source: str, base_dir: Path | None = None) -> Scenario:
    """Validate parsed scenario data strictly: ``"16"`` is not a number, ``true`` not a time. A model's relative
    ``config`` path is read from ``base_dir`` (the scenario file's folder), when given."""
    if base_dir is None:
        return _check_plugins(validate_mapping(Scenario, data, source, strict=True), source)
    from sim.catalogue import configs_relative_to

    with configs_relative_to(Path(base_dir)):
        return _check_plugins(validate_mapping(Scenario, data, source, strict=True), source)


def _check_plugins(scenario: Scenario, source: str) -> Scenario:
    """An unknown policy or autoscaler, or a bad parameter of one, is an error when the scenario is read, not when
    a run reaches it: a sweep would otherwise start, and record a failed run for each misspelt name (a user's
    file is loaded only once the user has allowed it)."""
    from sim.fleet.autoscalers import make_autoscaler
    from sim.policies.registry import is_policy_file, make_policy

    for section, make in (("policy", make_policy), ("autoscaler", make_autoscaler)):
        config = getattr(scenario, section)
        if is_policy_file(config.name):
            continue
        try:
            make(config.name, config.params)
        except MmsimError as error:
            raise MmsimError(error.args[0], source=source, field=error.field or section) from None
    return scenario


def read_yaml(path: Path, what: str = "YAML file") -> object:
    """A YAML file parsed safely: regular file, size cap, UTF-8, no duplicate keys, bounded depth."""
    return load_yaml(Path(path), what)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (its workload may only name models it serves)."""
    scenario = parse_scenario(read_yaml(Path(path), "scenario file"), str(path), Path(path).parent)
    scenario.check_requested_models(str(path))
    return scenario
