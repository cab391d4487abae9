"""The paper's two experiments, run in the simulator on a platform's profile.

Each run builds a :class:`~sim.scenario.Scenario` and calls
:func:`sim.simulation.simulate` with an experiment policy from
:mod:`sim.reproduce.policies`, the same code path as ``mmsim run``; every
number here is read back from the run's per-request results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sim.reproduce.policies  # noqa: F401  (registers the experiment policies)
from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.errors import MmsimError
from sim.profile import load_profile
from sim.scenario import Scenario, parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

PREEMPTION_PROMPT_TOKENS = 71  # Table III: 950.8 MiB at N=5000 is 5071 tokens of Qwen2.5-14B KV
JOB_A_TOKENS = 7000
JOB_B_TOKENS = 200  # job B's length does not enter A's overhead; short keeps the run small
CHECKPOINTS = (100, 200, 300, 500, 1000, 2000, 3000, 4000, 5000)
PAIRINGS = (("qwen2.5-3b", "qwen3-8b"), ("qwen3-8b", "qwen3-8b"), ("qwen3-8b", "qwen2.5-14b"), ("qwen2.5-14b", "qwen3-8b"))
OFFLOAD_MODELS = ("llama-3-8b", "qwen3-32b", "llama-2-70b")
OFFLOAD_SHARES = tuple(round(0.1 * i, 1) for i in range(11)) + (0.92, 0.94, 0.96, 0.98)
OUTPUT_LENGTHS = (50, 150, 300, 500, 1000, 5000)
OFFLOAD_PROMPT_TOKENS = 32  # the paper does not print its prompt; a short one keeps decode dominant
# The paper ran Llama-2-70B Q4 (36 GiB) through Ollama over the server's two GPUs; one simulated
# GPU with room for the whole model stands in for that pair.
OFFLOAD_GPU_MEMORY_GB = 96
PREEMPTION_COMPONENTS = ("kv_out", "unload", "reload", "kv_in")


@dataclass(frozen=True)
class PreemptionRun:
    """Job A of one (pairing, checkpoint) run: its charged pause components and its timings."""

    model_a: str
    model_b: str
    checkpoint: int
    tokens_at_preemption: int
    kv_tokens: int
    kv_out_s: float
    unload_s: float
    reload_s: float
    kv_in_s: float
    waiting_s: float
    service_s: float

    @property
    def overhead_s(self) -> float:
        """The paper's pause of A: the four charged components, excluding the time job B held the GPU."""
        return self.kv_out_s + self.unload_s + self.reload_s + self.kv_in_s

    @property
    def e2e_with_preemption_s(self) -> float:
        """A's service time less the time B's load, run and unload held the GPU (A's uncharged wait)."""
        return self.service_s - self.waiting_s


def _scenario(name: str, profile: str, models: list[dict], policy: dict, engine: dict, cluster: dict) -> Scenario:
    # The workload section is required by the schema; the experiment feeds its own requests as chunks.
    data = {
        "name": name, "profile": profile, "cluster": {"nodes": 1, "gpus_per_node": 1, **cluster}, "models": models,
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {models[0]["name"]: 1.0},
                                   "prompt_tokens": {"dist": "constant", "value": 1},
                                   "output_tokens": {"dist": "constant", "value": 1}}},
        "engine": engine, "policy": policy,
    }
    return parse_scenario(data, f"reproduce:{name}")


def preemption_scenario(profile: str, model_a: str, model_b: str, checkpoint: int) -> Scenario:
    """One preemption run; the paper used Hugging Face transformers (no vLLM memory cap), hence utilisation 1.0."""
    models = [{"name": model_a}] + ([{"name": model_b}] if model_b != model_a else [])
    policy = {"name": "paper-preemption", "params": {"model_a": model_a, "model_b": model_b, "preempt_after": checkpoint}}
    return _scenario(f"paper-preemption-{model_a}-{model_b}-N{checkpoint}", profile, models, policy,
                     {"gpu_memory_utilization": 1.0, "max_num_seqs": 1}, {})


def unserved(profile: str, scenario: Scenario, model: str, drop_reason: str) -> MmsimError:
    """The error for an experiment's request that its profile cannot serve (a user's profile of a smaller GPU)."""
    memory_gib = load_profile(profile).hardware.gpu.memory_bytes / 2**30
    return MmsimError(f"{scenario.name}: {model} is not served ({drop_reason}) on profile {profile}, whose GPU holds "
                      f"{memory_gib:,.1f} GiB: the experiment needs a GPU like the paper's (RTX 5000 Ada, 32 GB; "
                      f"A6000, 48 GB)", field="--profile")


def run_preemption(profile: str, model_a: str, model_b: str, checkpoint: int) -> PreemptionRun:
    """Simulate job A (71-token prompt, 7000 tokens) interrupted after ``checkpoint`` tokens (0: never)."""
    scenario = preemption_scenario(profile, model_a, model_b, checkpoint)
    chunk = RequestChunk(np.zeros(2), np.array([model_a, model_b], dtype=object),
                         np.array([PREEMPTION_PROMPT_TOKENS, PREEMPTION_PROMPT_TOKENS]), np.array([JOB_A_TOKENS, JOB_B_TOKENS]))
    result = simulate(scenario, chunks=[chunk])
    job_a = result.requests.set_index("id").loc[0]
    if job_a["status"] != "completed":
        raise unserved(profile, scenario, model_a, job_a["drop_reason"])
    if job_a["generated_tokens"] != JOB_A_TOKENS:  # completed short of its tokens: a defect, not the profile's
        raise RuntimeError(f"{scenario.name}: job A completed with {job_a['generated_tokens']} tokens")
    swaps = result.events[(result.events["kind"] == "preempt_swap") & (result.events["request_id"] == 0)]
    if checkpoint and len(swaps) != 1:
        raise MmsimError(f"{scenario.name}: job A's KV cache was swapped out {len(swaps)} times, not once: profile "
                         f"{profile} leaves no host RAM or GPU room for the paper's preemption", field="--profile")
    kv_out = float(job_a["lost_kv_out_s"])
    kv_tokens = _kv_tokens_moved(scenario, model_a, kv_out) if checkpoint else 0
    return PreemptionRun(model_a, model_b, checkpoint, kv_tokens - PREEMPTION_PROMPT_TOKENS if checkpoint else 0, kv_tokens,
                         kv_out, float(job_a["lost_unload_s"]), float(job_a["lost_reload_s"]), float(job_a["lost_kv_in_s"]),
                         float(job_a["lost_waiting_s"]), float(job_a["finish_s"] - job_a["first_scheduled_s"]))


def _kv_tokens_moved(scenario: Scenario, model: str, kv_out_s: float) -> int:
    """KV tokens of the swap-out the engine charged ``kv_out_s`` for (its transfer time is affine in tokens)."""
    costs = ModelCosts(load_profile(scenario.profile), get_model(model), "fp16")
    one, two = costs.kv_transfer_s(1, "device_to_host"), costs.kv_transfer_s(2, "device_to_host")
    return int(round((kv_out_s - one) / (two - one))) + 1


def offload_scenario(profile: str, model: str, gpu_share: float) -> Scenario:
    """One Q4 model on one GPU with room for all of it, ``gpu_share`` of its layers there (Ollama's num_gpu)."""
    policy = {"name": "paper-offload", "params": {"gpu_share": gpu_share}}
    return _scenario(f"paper-offload-{model}-g{gpu_share:g}", profile, [{"name": model, "dtype": "q4"}], policy,
                     {"max_num_seqs": 1}, {"gpu_memory_gb": OFFLOAD_GPU_MEMORY_GB})


def decode_throughput(profile: str, model: str, gpu_share: float, output_tokens: int) -> float:
    """Output tokens per second of decode (finish minus first token) for one request, as the paper measures."""
    scenario = offload_scenario(profile, model, gpu_share)
    chunk = RequestChunk(np.zeros(1), np.array([model], dtype=object), np.array([OFFLOAD_PROMPT_TOKENS]), np.array([output_tokens]))
    row = simulate(scenario, chunks=[chunk]).requests.iloc[0]
    if row["status"] != "completed":
        raise unserved(profile, scenario, model, row["drop_reason"])
    return output_tokens / float(row["finish_s"] - row["first_token_s"])


def offload_curves(profile: str) -> dict[tuple[str, int], list[float]]:
    """Normalised decode throughput per (model, output length), one value per share in OFFLOAD_SHARES."""
    curves = {}
    for model in OFFLOAD_MODELS:
        for length in OUTPUT_LENGTHS:
            raw = [decode_throughput(profile, model, share, length) for share in OFFLOAD_SHARES]
            full = raw[OFFLOAD_SHARES.index(1.0)]
            curves[(model, length)] = [value / full for value in raw]
    return curves


@dataclass
class PlatformResult:
    """Both experiments on one platform: preemption runs, uninterrupted baselines, offload curves."""

    platform: str
    profile: str
    runs: list[PreemptionRun]
    baselines: dict[str, float]
    curves: dict[tuple[str, int], list[float]]


def run_platform(platform: str, profile: str | None = None) -> PlatformResult:
    """Run the paper's experiments on ``profile`` (default: the built-in ``paper-<platform>``)."""
    profile = profile or f"paper-{platform}"
    runs = [run_preemption(profile, a, b, n) for a, b in PAIRINGS for n in CHECKPOINTS]
    models = dict.fromkeys(a for a, _ in PAIRINGS)
    baselines = {a: run_preemption(profile, a, a, 0).service_s for a in models}
    return PlatformResult(platform, profile, runs, baselines, offload_curves(profile))
