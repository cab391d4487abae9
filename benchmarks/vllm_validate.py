"""mmsim vs a real vLLM engine at light / mid / heavy load: calibrate, replay, simulate, print the errors.

    python benchmarks/vllm_validate.py [--requests 60] [--full] [--out reports/vllm-validation] [--profile P] [--repeats N]

Steps (each a real command, as a user would run it):
1. a small random-weight Qwen2 model (2 layers, fp32: this AVX2 CPU has no fast bf16) as a config.json;
2. ``mmsim calibrate --engine vllm --device cpu --quick`` (``--full``: the full grid), unless --profile;
3. a Poisson trace at 1 request/s (prompts 32-1024 tokens, outputs 16-128), and the engine's capacity in
   requests/s as mmsim predicts it from the profile (the trace simulated at 100x its rate);
4. ``mmsim validate vllm`` at 20% / 60% / 150% of that capacity.

Targets (issue 20): mean and p90 E2E within +-10%, mean TTFT +-15%, throughput +-5% at each level.
Needs the ``vllm`` extra; takes about 2.5 minutes on 2 cores (4 with ``--repeats 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.vllm_engine import TINY_QWEN2
from peers import run_mmsim
from calibrate.vllm_validate import error_text, spread_text

LEVELS = {"light": 0.2, "mid": 0.6, "heavy": 1.5}
TARGETS_PCT = {"e2e_mean_s": 10, "e2e_p90_s": 10, "ttft_mean_s": 15, "throughput_tokens_per_s": 5}
MODEL = "tiny-qwen2"


def write_trace(path: Path, requests: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pd.DataFrame({"arrival_s": np.round(np.cumsum(rng.exponential(1.0, requests)), 6), "model": MODEL,
                  "prompt_tokens": rng.integers(32, 1025, requests), "output_tokens": rng.integers(16, 129, requests)}
                 ).to_csv(path, index=False)


def capacity_per_s(trace: Path, config: Path, profile: Path) -> float:
    """Requests per second mmsim predicts the engine sustains: the trace simulated at 100x its rate."""
    from calibrate.vllm_engine import EngineLimits
    from calibrate.vllm_validate import Trace, metrics, simulate_trace
    from sim.catalogue import model_from_hf_config, register_model

    spec = register_model(model_from_hf_config(config, MODEL))
    frame = pd.read_csv(trace)
    saturated = Trace(frame["arrival_s"].to_numpy() / 100, frame["prompt_tokens"].to_numpy(), frame["output_tokens"].to_numpy())
    result = metrics(simulate_trace(saturated, spec, config, "fp32", profile, EngineLimits()))
    span_s = frame["output_tokens"].sum() / result["throughput_tokens_per_s"]
    return len(frame) / span_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--full", action="store_true", help="full calibration grid instead of --quick")
    parser.add_argument("--profile", type=Path, help="skip calibration: use this profile")
    parser.add_argument("--out", type=Path, default=Path("reports/vllm-validation"))
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="replays of each level (their spread is printed)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = args.out / MODEL / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps(TINY_QWEN2, indent=1))
    profile = args.profile or args.out / "profile.json"
    loads_seen = [os.getloadavg()[0]]  # 1-minute load average: how shared the machine was
    started = time.perf_counter()
    if args.profile is None:
        run_mmsim(["calibrate", "--engine", "vllm", "--device", "cpu", "--config", str(config), "--models", MODEL,
                   "--dtype", "fp32", "--out", str(profile)] + ([] if args.full else ["--quick"]))
        print(f"calibration: {time.perf_counter() - started:.0f} s")
    trace = args.out / "trace.csv"
    write_trace(trace, args.requests, args.seed)
    capacity = capacity_per_s(trace, config, profile)
    loads = ",".join(f"{capacity * level:.4g}" for level in LEVELS.values())
    print(f"capacity predicted by mmsim: {capacity:.2f} requests/s; loads (requests/s): {loads}")
    started_validation = time.perf_counter()
    loads_seen.append(os.getloadavg()[0])
    run_mmsim(["validate", "vllm", str(trace), "--profile", str(profile), "--config", str(config), "--model", MODEL,
               "--dtype", "fp32", "--loads", loads, "--out", str(args.out), "--repeats", str(args.repeats)])
    loads_seen.append(os.getloadavg()[0])
    result = json.loads((args.out / "validation.json").read_text())
    validated = time.perf_counter() - started_validation
    failures = 0
    matched_failures = 0
    print(f"{'level':6} {'metric':24} {'real':>9} {'simulated':>9} {'error':>8}  {'target':14} {'at replay speed':>15}")
    for name, level in zip(LEVELS, result["levels"]):
        for metric, error in level["errors_pct"].items():
            target = TARGETS_PCT.get(metric)
            matched = level["errors_at_replay_speed_pct"][metric]
            met = target is None or abs(error) <= target
            matched_met = target is None or abs(matched) <= target
            failures += not met
            matched_failures += not matched_met
            verdict = "" if target is None else ("+-%d%% " % target) + ("met" if met else "MISSED")
            print(f"{name:6} {metric:24} {level['real'][metric]:9.4g} {level['simulated'][metric]:9.4g} {error:+7.1f}%  "
                  f"{verdict:14} {matched:+14.1f}%{'' if matched_met else ' MISSED'}")
    print(f"engine drift before the replay: {result['engine_drift_pct']:+.1f}% (the real engine's steps against the "
          "profile's prices of them: machine noise since calibration)")
    for name, level in zip(LEVELS, result["levels"]):
        kinds = level["steps_vs_profile_by_kind_pct"]
        print(f"{name}: the replay's steps took {level['steps_vs_profile_pct']:+.1f}% against the profile's prices of "
              f"them (decode-only {error_text(kinds['decode'])}, with prefills {error_text(kinds['prefill'])}); engine "
              f"off the CPU {level['steps_off_cpu_pct']:.1f}% of their time; the replay ran decode work "
              f"x{level['replay_speed']['decode']:.3f} and prefill work x{level['replay_speed']['prefill']:.3f} "
              "the profile's prices (the \"at replay speed\" column's simulator)")
        if level["replays"] > 1:
            spread = level["replay_spread_pct"]
            print(f"{name}: its {level['replays']} replays came apart by " + ", ".join(
                f"{metric} {spread_text(spread[metric])}" for metric in TARGETS_PCT) + " (largest - smallest, of their mean)")
    print(f"1-minute load average before calibration / before validation / after: "
          f"{' / '.join(f'{load:.2f}' for load in loads_seen)}")
    print(f"validation: {validated:.0f} s; {failures} target(s) missed ({matched_failures} with the simulator at the "
          f"replay's own speed); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
