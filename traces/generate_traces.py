"""Generate the small native traces shipped in ``traces/`` (deterministic: same code, same bytes).

    python traces/generate_traces.py [--out-dir traces]

``azure-two-models.csv`` is a synthetic two-service trace whose statistics are
fitted to the public Azure LLM inference traces of 2023 (code and conversation
services, one hour each; see ../shared/traces/README.md). It holds none of
their rows: only the parameters below, which were measured on those files:
request rate, burstiness and the mean/CV of the lengths. The bursty code
service is fitted per 30-s window: a share of windows is idle, active windows
have a lognormal rate, and inter-arrivals within a window have their own CV.
Code requests go to qwen2.5-7b, conversation requests to qwen3-8b.

``mixed-three-models.csv`` is the workload of the design's ``mixed`` scenario
(Poisson arrivals, three Qwen models) for tests and examples that want a file.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from sim.workload.config import GeneratorConfig
from sim.workload.generator import generate
from sim.workload.merge import merge_streams
from sim.workload.writer import write_trace

DURATION_S = 300.0
WINDOW_S = 30.0

AZURE_CODE_2023 = {
    "model": "qwen2.5-7b",
    "rate_per_s": 2.567,              # over the whole hour
    "idle_window_share": 0.348,       # 30-s windows without a request
    "active_rate_mean_per_s": 3.92,   # rate of the other windows: lognormal with this mean and CV
    "active_rate_cv": 0.83,
    "window_interarrival_cv": 2.45,   # burstiness inside a window (request-weighted mean)
    "prompt": {"mean": 2048, "cv": 0.964, "max": 7437},
    "output": {"mean": 27.9, "cv": 2.147, "max": 1899},
}
AZURE_CONV_2023 = {
    "model": "qwen3-8b",
    "rate_per_s": 5.53,
    "interarrival_cv": 1.09,
    "prompt": {"mean": 1155, "cv": 0.960, "max": 14050},
    "output": {"mean": 211, "cv": 0.771, "max": 1000},
}
WINDOW_SEED, CODE_SEED, CONV_SEED, MIXED_SEED = 2023, 11, 12, 7


def lognormal_length(fit: dict) -> dict:
    return {"dist": "lognormal", **fit}


def code_windows() -> list[list[float]]:
    """Per-window [start_s, rate, cv] for the code service, drawn from the fitted window model.

    The idle windows are exactly the fitted share (rounded), placed at random, so
    that a short trace keeps the hour's on/off balance; the generator then rescales
    the rates to the fitted mean rate.
    """
    fit = AZURE_CODE_2023
    rng = np.random.default_rng(WINDOW_SEED)
    starts_s = np.arange(0.0, DURATION_S, WINDOW_S)
    idle = rng.choice(len(starts_s), size=round(len(starts_s) * fit["idle_window_share"]), replace=False)
    sigma = math.sqrt(math.log1p(fit["active_rate_cv"] ** 2))
    mu = math.log(fit["active_rate_mean_per_s"]) - sigma**2 / 2
    rates = np.round(rng.lognormal(mu, sigma, len(starts_s)), 3)
    rates[idle] = 0.0
    return [[float(start_s), float(rate), fit["window_interarrival_cv"]] for start_s, rate in zip(starts_s, rates)]


def azure_two_models(target: Path) -> int:
    """The two fitted services, generated separately and merged by time."""
    code = GeneratorConfig.model_validate({
        "duration_s": DURATION_S,
        "arrivals": {"process": "rate-series", "windows": code_windows(), "rate_per_s": AZURE_CODE_2023["rate_per_s"]},
        "mix": {AZURE_CODE_2023["model"]: 1.0},
        "prompt_tokens": lognormal_length(AZURE_CODE_2023["prompt"]),
        "output_tokens": lognormal_length(AZURE_CODE_2023["output"]),
    })
    conv = GeneratorConfig.model_validate({
        "duration_s": DURATION_S,
        "arrivals": {"process": "gamma", "rate_per_s": AZURE_CONV_2023["rate_per_s"],
                     "cv": AZURE_CONV_2023["interarrival_cv"]},
        "mix": {AZURE_CONV_2023["model"]: 1.0},
        "prompt_tokens": lognormal_length(AZURE_CONV_2023["prompt"]),
        "output_tokens": lognormal_length(AZURE_CONV_2023["output"]),
    })
    streams = [generate(code, seed=CODE_SEED), generate(conv, seed=CONV_SEED)]
    return write_trace(merge_streams(streams), target)


def mixed_three_models(target: Path) -> int:
    """The design's mixed-scenario workload as a file."""
    mixed = GeneratorConfig.model_validate({
        "duration_s": DURATION_S,
        "arrivals": {"process": "poisson", "rate_per_s": 4.0},
        "mix": {"qwen2.5-3b": 0.5, "qwen3-8b": 0.3, "qwen2.5-14b": 0.2},
        "prompt_tokens": {"dist": "lognormal", "mean": 1000, "cv": 1.0},
        "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 1.0},
    })
    return write_trace(generate(mixed, seed=MIXED_SEED), target)


TRACES = {"azure-two-models.csv": azure_two_models, "mixed-three-models.csv": mixed_three_models}


def main(out_dir: Path) -> None:
    for name, build in TRACES.items():
        rows = build(out_dir / name)
        print(f"{out_dir / name}: {rows} requests")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    main(parser.parse_args().out_dir)
