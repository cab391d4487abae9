"""Simulation speed and memory: fast-forward vs per-iteration reference mode, side by side.

A 16-GPU (2 nodes x 8 H100), 8-model scenario under the ``static`` policy with
continuous batching and KV-pressure preemption. Prints simulated requests per
wall-second for both modes on the same requests, their ratio, and peak RSS.
Each mode runs in its own process, pinned to one CPU core (the idlest), so that
peak RSS is that mode's own and the speed is one core's.

The figures depend on the engine build: ``pip install .`` compiles the engine
with mypyc, ``pip install -e .`` (or ``MMSIM_PURE_PYTHON=1``) leaves it pure
Python. The script says which one it measured.

    python benchmarks/sim_speed.py [--requests 100000] [--exact-requests 20000] [--autoscaler queue-depth]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core: no BLAS threads spinning beside the run

import numpy as np  # noqa: E402 - after the thread setting, which numpy reads on import
from peers import idlest_core  # noqa: E402 - beside this script

MODELS = ["qwen2.5-3b", "qwen2.5-7b", "qwen3-8b", "llama-3-8b", "mistral-7b", "llama-2-7b", "qwen2.5-14b", "llama-2-13b"]


def scenario(rate_per_s: float, autoscaler: str = "none"):
    """The benchmark's cluster: 2 nodes of 8 H100s; with an autoscaler, a pool of 1 to 4 such nodes that starts
    with 2 (the same placement at time 0), deciding every 15 s."""
    from sim.scenario import parse_scenario

    cluster = {"nodes": 2, "gpus_per_node": 8, "host_memory_gb": 1024}
    if autoscaler != "none":
        cluster = {"pools": [{"name": "h100", "nodes": 2, "min_nodes": 1, "max_nodes": 4, "gpus_per_node": 8,
                              "host_memory_gb": 1024}]}
    return parse_scenario({
        "name": "bench-16gpu-8models", "profile": "h100-sxm",
        "cluster": cluster,
        "autoscaler": {"name": autoscaler, "interval_s": 15.0},
        "models": [{"name": m} for m in MODELS],
        "workload": {"generator": {"duration_s": 10, "arrivals": {"process": "poisson", "rate_per_s": rate_per_s},
                                   "mix": {m: 1 for m in MODELS},
                                   "prompt_tokens": {"dist": "constant", "value": 1}, "output_tokens": {"dist": "constant", "value": 1}}},
        "slo": {"default": {"ttft_s": 2.0, "tpot_s": 0.1}},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 8192},
        "sample_interval_s": 60.0,
    }, "benchmark")


def chunks(n: int, rate_per_s: float, seed: int = 0, chunk_rows: int = 65536):
    """Poisson arrivals, Zipf-ish model mix, lognormal lengths; streamed in chunks."""
    from sim.workload.chunk import RequestChunk

    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, len(MODELS) + 1)
    start = 0.0
    for first in range(0, n, chunk_rows):
        m = min(chunk_rows, n - first)
        arrivals = start + np.cumsum(rng.exponential(1 / rate_per_s, m))
        start = float(arrivals[-1])
        models = np.asarray(MODELS, object)[rng.choice(len(MODELS), m, p=weights / weights.sum())]
        prompts = np.clip(rng.lognormal(np.log(600), 0.8, m), 1, 8000).astype(np.int64)
        outputs = np.clip(rng.lognormal(np.log(150), 0.9, m), 1, 4000).astype(np.int64)
        yield RequestChunk(arrivals, models, prompts, outputs, first_id=first)


def measure(mode: str, n: int, rate: float, repeat: int, autoscaler: str, queue) -> None:
    """Run ``repeat`` times in this process and report the fastest (as timeit does: the others met noise)."""
    from sim.simulation import simulate

    os.sched_setaffinity(0, {idlest_core()})
    result = None
    for _ in range(repeat):  # one result held at a time, so that peak RSS is one run's
        candidate = simulate(scenario(rate, autoscaler), mode=mode, chunks=chunks(n, rate))
        if result is None or candidate.summary["sim_wall_seconds"] < result.summary["sim_wall_seconds"]:
            result = candidate
        del candidate
    s = result.summary
    queue.put({"mode": mode, "requests": n, "wall_s": s["sim_wall_seconds"],
               "requests_per_wall_s": n / s["sim_wall_seconds"], "simulated_s": s["simulated_seconds"],
               "preemptions": s["preemptions"], "completed": s["requests_completed"],
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "finish": result.tables.requests.column("finish_s")})


def engine_build() -> str:
    from sim.engine import build

    return build()


def run(mode: str, n: int, rate: float, repeat: int, autoscaler: str) -> dict:
    queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=measure, args=(mode, n, rate, repeat, autoscaler, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--exact-requests", type=int, default=None,
                        help="run per-iteration mode on this prefix of the requests only (default: all of them)")
    parser.add_argument("--rate", type=float, default=400.0, help="arrivals per second (sets load and preemption)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the fastest is reported")
    parser.add_argument("--autoscaler", default="none", help="run with this autoscaler deciding every 15 s over a "
                        "pool of 1-4 nodes (e.g. queue-depth, predictive); default none: the fixed 2 nodes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n_exact = min(args.exact_requests or args.requests, args.requests)
    fast = run("fast", args.requests, args.rate, args.repeat, args.autoscaler)
    exact = run("exact", n_exact, args.rate, args.repeat, args.autoscaler)
    fast_small = fast if n_exact == args.requests else run("fast", n_exact, args.rate, args.repeat, args.autoscaler)
    same = np.allclose(fast_small["finish"], exact["finish"], rtol=1e-9, atol=0, equal_nan=True)
    report = {
        "fast": {k: v for k, v in fast.items() if k != "finish"},
        "fast_on_exact_prefix": {k: v for k, v in fast_small.items() if k != "finish"},
        "exact": {k: v for k, v in exact.items() if k != "finish"},
        "speedup_fast_over_exact": exact["wall_s"] / fast_small["wall_s"],
        "fast_equals_exact": bool(same),
        "engine_build": engine_build(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    fleet = "" if args.autoscaler == "none" else f", autoscaler {args.autoscaler} (1-4 nodes)"
    print(f"scenario: 16 GPUs (2x8 H100 estimate), 8 models, Poisson {args.rate}/s, static policy{fleet}; "
          f"engine: {engine_build()}, one core, fastest of {args.repeat} runs")
    rows = [("fast", fast), ("exact", exact)] if fast_small is fast else \
        [("fast", fast), ("fast (prefix)", fast_small), ("exact (prefix)", exact)]
    for label, row in rows:
        print(f"{label:>15}: {row['requests']:>9,} requests in {row['wall_s']:7.2f} s wall = "
              f"{row['requests_per_wall_s']:>9,.0f} req/s; peak RSS {row['peak_rss_mb']:,.0f} MB; "
              f"preemptions {row['preemptions']:,}; simulated {row['simulated_s']:,.0f} s")
    print(f"fast-forward speedup over per-iteration on the same {n_exact:,} requests: "
          f"{report['speedup_fast_over_exact']:.1f}x; identical finish times: {same}")


if __name__ == "__main__":
    main()
