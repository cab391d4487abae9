"""``mmsim validate vllm``: replay a trace through a real vLLM engine at real arrival times, simulate the same
trace with mmsim under the same limits, and compare latency and throughput per load level.

A request is added to the engine once its arrival time has passed (the engine sees it at the next step
boundary, as a served engine does); its first token and its finish are the ends of the steps that produced
them, and every latency is measured from its arrival in the trace. Load levels scale the arrival rate
(a level of 2 halves every arrival time). The simulation is mmsim's ``static`` policy (vLLM's FCFS) on one
device with the profile given, the engine section's limits and KV room to spare. A level replayed several times
is compared by the mean of its replays, and how far the replays came apart is kept beside the errors.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.allocator import allocator
from calibrate.vllm_engine import EngineLimits, StepRecord, VllmEngine, engine_version
from calibrate.vllm_probes import Prober, plan_for
from calibrate.vllm_calibrate import predicted_step_s, step_sample
from calibrate.vllm_speed import replay_speed, with_step_costs_scaled
from sim.catalogue import ModelSpec
from sim.costs import ModelCosts
from sim.profile import load_profile
from sim.scenario import parse_scenario
from sim.simulation import simulate

METRICS = ("ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "tpot_p90_s", "e2e_mean_s", "e2e_p90_s", "throughput_tokens_per_s")
Tick = Callable[[str], None]


@dataclass(frozen=True)
class Trace:
    """One model's requests: arrival seconds, prompt and output tokens (parallel arrays, arrival order)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def at_load(self, load: float) -> Trace:
        return Trace(self.arrival_s / load, self.prompt_tokens, self.output_tokens)

    def __len__(self) -> int:
        return len(self.arrival_s)


def replay(engine: VllmEngine, trace: Trace, tick: Tick | None = None, steps: list[StepRecord] | None = None) -> pd.DataFrame:
    """Run ``trace`` through ``engine`` at its arrival times; one row per request (seconds from the trace's start).
    ``steps``, when given, receives every step's record."""
    first: dict[str, float] = {}
    finish: dict[str, float] = {}
    start = time.perf_counter()
    index, total = 0, len(trace)
    while index < total or engine.has_work():
        now = time.perf_counter() - start
        while index < total and trace.arrival_s[index] <= now:
            engine.add(f"v{index}", int(trace.prompt_tokens[index]), int(trace.output_tokens[index]))
            index += 1
        if not engine.has_work():
            time.sleep(min(0.05, max(0.0, float(trace.arrival_s[index]) - now)))
            continue
        record = engine.step()
        if steps is not None:
            steps.append(record)
        ended = record.end_s - start
        for rid in record.first_tokens:
            first[rid] = ended
        for rid in record.finished:
            finish[rid] = ended
            if tick is not None:
                tick(rid)
    ids = [f"v{i}" for i in range(total)]
    return _frame(trace, np.array([first[i] for i in ids]), np.array([finish[i] for i in ids]))


def _frame(trace: Trace, first_token_s: np.ndarray, finish_s: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": trace.arrival_s, "first_token_s": first_token_s, "finish_s": finish_s,
                         "prompt_tokens": trace.prompt_tokens, "output_tokens": trace.output_tokens})


def simulate_trace(trace: Trace, spec: ModelSpec, config: Path | None, dtype: str, profile: Path,
                   limits: EngineLimits, device: str = "cpu") -> pd.DataFrame:
    """The same requests through mmsim: one device, ``static`` policy, the engine's limits; KV room as the engine
    has it (on the CPU: the weights plus twice the KV pool, so that KV never binds where vLLM's does not)."""
    weights_gb = spec.weight_bytes(dtype) / 1e9
    memory = {"gpu_memory_gb": round(weights_gb + 2 * limits.kv_cache_gib + 2.0, 3)} if device == "cpu" else {}
    # The real engine has its weights loaded before the first request: so must the simulated one.
    lead_s = ModelCosts(load_profile(profile), spec, dtype).reload_s() + 1.0
    with tempfile.TemporaryDirectory(prefix="mmsim-validate-") as folder:
        path = Path(folder) / "trace.csv"
        pd.DataFrame({"arrival_s": trace.arrival_s + lead_s, "model": spec.name, "prompt_tokens": trace.prompt_tokens,
                      "output_tokens": trace.output_tokens}).to_csv(path, index=False)
        model = {"name": spec.name, "dtype": dtype} | ({"config": str(Path(config).resolve())} if config else {})
        data = {"name": "validate-vllm", "profile": str(Path(profile).resolve()),
                "cluster": {"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64.0, **memory},
                "models": [model], "workload": {"trace": {"path": str(path), "format": "mmsim"}},
                "engine": {"max_num_seqs": limits.max_num_seqs, "max_num_batched_tokens": limits.max_num_batched_tokens,
                           "block_size": limits.block_size, "chunked_prefill": True,
                           "gpu_memory_utilization": limits.gpu_memory_utilization},
                "policy": {"name": "static"}}
        result = simulate(parse_scenario(data, "validate vllm"), base_dir=Path(folder), mode="fast")
        frame = result.requests.sort_values("id").reset_index(drop=True)
    return _frame(trace, frame["first_token_s"].to_numpy() - lead_s, frame["finish_s"].to_numpy() - lead_s)


def metrics(frame: pd.DataFrame) -> dict:
    """Mean and p90 TTFT, TPOT (outputs of more than one token) and E2E; output tokens per second."""
    ttft = frame["first_token_s"] - frame["arrival_s"]
    e2e = frame["finish_s"] - frame["arrival_s"]
    many = frame["output_tokens"] > 1
    tpot = (frame["finish_s"] - frame["first_token_s"])[many] / (frame["output_tokens"][many] - 1)
    span = float(frame["finish_s"].max() - frame["arrival_s"].min())
    out: dict[str, float] = {"requests": len(frame)}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_mean_s"] = float(values.mean()) if len(values) else float("nan")
        out[f"{name}_p90_s"] = float(np.percentile(values, 90)) if len(values) else float("nan")
    out["throughput_tokens_per_s"] = float(frame["output_tokens"].sum()) / max(span, 1e-12)
    return out


def errors_pct(simulated: dict, real: dict) -> dict:
    return {name: round(100 * (simulated[name] - real[name]) / real[name], 2) if real[name] else None for name in METRICS}


def mean_of_replays(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, dict, dict]:
    """The replays of one level together: each request's times averaged over them, each metric's mean over them,
    and how far apart the replays came, per metric: (largest - smallest) / mean, in % (None for one replay). The
    spread is the engine disagreeing with itself on the same trace: no simulator's error can be read finer."""
    by_replay = [metrics(frame) for frame in frames]
    together = frames[0].copy()
    for column in ("first_token_s", "finish_s"):
        together[column] = np.mean([frame[column].to_numpy() for frame in frames], axis=0)
    real = {"requests": by_replay[0]["requests"],
            **{name: float(np.mean([m[name] for m in by_replay])) for name in METRICS}}
    spread = {name: round(100 * (max(m[name] for m in by_replay) - min(m[name] for m in by_replay)) / real[name], 2)
              if len(frames) > 1 and real[name] else None for name in METRICS}
    return together, real, spread


def validate_levels(engine: VllmEngine, trace: Trace, loads: list[float], spec: ModelSpec, config: Path | None,
                    dtype: str, profile: Path, limits: EngineLimits, tick: Tick, repeats: int = 1) -> dict:
    """Replay (``repeats`` times) and simulate ``trace`` at each load level; the comparison as a JSON-ready dict."""
    levels = []
    prober = Prober(engine)
    prober.warm_up(plan_for(True, limits))
    costs = ModelCosts(load_profile(profile), spec, dtype)
    profile_data = json.loads(Path(profile).read_text())
    drift = engine_drift_pct(prober, costs)
    for load in loads:
        scaled = trace.at_load(load)
        steps: list[StepRecord] = []
        replays = [replay(engine, scaled, lambda rid: tick(f"load {load:g}: {rid} finished"), steps)
                   for _ in range(repeats)]
        real, real_m, spread = mean_of_replays(replays)
        simulated = simulate_trace(scaled, spec, config, dtype, profile, limits, engine.device)
        sim_m = metrics(simulated)
        speed = replay_speed(steps, profile_data, spec, dtype) if spec.name in profile_data["models"] else (1.0, 1.0)
        matched = simulate_at_speed(scaled, spec, config, dtype, profile, limits, engine.device, speed)
        levels.append({"load": load, "requests": len(scaled), "replays": repeats, "replay_spread_pct": spread,
                       "real": real_m, "simulated": sim_m,
                       "errors_pct": errors_pct(sim_m, real_m), **replay_step_diagnostics(steps, costs),
                       "replay_speed": {"decode": round(speed[0], 4), "prefill": round(speed[1], 4)},
                       "simulated_at_replay_speed": matched,
                       "errors_at_replay_speed_pct": None if matched is None else errors_pct(matched, real_m),
                       "per_request": {"real_e2e_s": (real["finish_s"] - real["arrival_s"]).round(6).tolist(),
                                       "simulated_e2e_s": (simulated["finish_s"] - simulated["arrival_s"]).round(6).tolist(),
                                       "real_ttft_s": (real["first_token_s"] - real["arrival_s"]).round(6).tolist(),
                                       "simulated_ttft_s": (simulated["first_token_s"] - simulated["arrival_s"]).round(6).tolist()}})
    worst = max((abs(v) for level in levels for v in level["errors_pct"].values() if v is not None), default=0.0)
    calibrated_with = profile_data.get("validation", {}).get(f"vllm_fit:{spec.name}", {}).get("allocator")
    return {"engine": engine_version(), "model": spec.name, "dtype": dtype, "profile": str(profile),
            "allocator": allocator(), "profile_allocator": calibrated_with, "limits": limits.__dict__,
            "engine_drift_pct": drift, "levels": levels, "max_abs_error_pct": worst}


def replay_step_diagnostics(steps: list[StepRecord], costs: ModelCosts) -> dict:
    """How the replay's own steps compare with the profile: their time over the profile's prices of the same
    compositions (+: the engine ran slower than calibrated), and the share of their time the engine's thread
    was off the CPU (other processes had it). Diagnostics of the machine's noise, not corrections."""
    def against_profile(chosen: list[StepRecord]) -> float | None:
        wall_s = sum(step.wall_s for step in chosen)
        priced_s = sum(predicted_step_s(costs, step_sample(step)) for step in chosen)
        return round(100 * (wall_s / priced_s - 1), 2) if priced_s else None

    wall_s = sum(step.wall_s for step in steps)
    cpu_s = sum(step.cpu_s for step in steps)
    # By kind too: a machine's drift need not slow compute-bound prefills and overhead-bound decodes alike, and
    # first tokens come out of the steps holding prefills.
    return {"steps_vs_profile_pct": against_profile(steps),
            "steps_vs_profile_by_kind_pct": {"decode": against_profile([s for s in steps if not s.prefills]),
                                             "prefill": against_profile([s for s in steps if s.prefills])},
            "steps_off_cpu_pct": round(100 * (1 - cpu_s / wall_s), 2) if wall_s else None}


def simulate_at_speed(trace: Trace, spec: ModelSpec, config: Path | None, dtype: str, profile: Path,
                      limits: EngineLimits, device: str, speed: tuple[float, float]) -> dict | None:
    """:func:`metrics` of :func:`simulate_trace` with ``spec``'s step costs scaled by ``speed`` (decode work,
    prefill work: :func:`calibrate.vllm_speed.replay_speed`): the simulator at the speed the machine ran the
    replay at. None when the profile has no entry of the model's own (its costs are estimates)."""
    data = json.loads(Path(profile).read_text())
    if spec.name not in data.get("models", {}):
        return None
    with tempfile.TemporaryDirectory(prefix="mmsim-speed-") as folder:
        path = Path(folder) / "profile.json"
        path.write_text(json.dumps(with_step_costs_scaled(data, spec.name, *speed)))
        return metrics(simulate_trace(trace, spec, config, dtype, path, limits, device))


def engine_drift_pct(prober: Prober, costs: ModelCosts) -> float:
    """How much slower (+) or faster (-) this engine runs now than the profile prices the same steps: a few
    decode and prefill probes, before the replay. A diagnostic of the machine's noise, not a correction."""
    from calibrate.vllm_probes import ProbePlan, summarise

    prober.steps.clear()
    sweep = ProbePlan(decode_batches=(2, 8), decode_contexts=(256,), decode_steps=6, prefill_prompts=(), mixed=(),
                      passes=1)
    prober.steps.extend(("drift decode", step) for step in prober.decode_sweep(sweep, 256))
    prober.prefill(500)
    samples = summarise(prober.steps)
    prober.steps.clear()
    real = sum(s["wall_s"] for s in samples)
    return round(100 * (real / sum(predicted_step_s(costs, s) for s in samples) - 1), 2)


def summary_rows(result: dict) -> list[list[str]]:
    """Per load level: the real and simulated means, the error of each metric, and its error with the simulator at
    the replay's own speed, for a table."""
    rows = []
    for level in result["levels"]:
        matched = level.get("errors_at_replay_speed_pct") or {}
        for name in METRICS:
            real, simulated = level["real"][name], level["simulated"][name]
            rows.append([f"{level['load']:g}", name, f"{real:.4g}", f"{simulated:.4g}",
                         error_text(level["errors_pct"][name]), error_text(matched.get(name))])
    return rows


def error_text(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.1f}%"


def spread_text(spread: float | None) -> str:
    """A spread of replays (``replay_spread_pct``), never negative: no sign."""
    return "n/a" if spread is None else f"{spread:.1f}%"
