"""mmsim on Vidur's reference configuration, to set its results and speed beside Vidur's.

Llama-2-70B at tensor_parallel 2 on A100-80GB GPUs, 4 replicas (8 GPUs), Sarathi-like chunked prefill of
512 tokens, at most 128 sequences per batch, Poisson arrivals, prompt and output lengths from ShareGPT
(``../shared/traces/sharegpt_vidur/``, Vidur's own processed trace). Prints simulated throughput, TTFT,
TPOT and E2E, and the simulation's speed (requests per wall-second of the event loop and of the process).

    python benchmarks/vidur_reference.py [--requests 10000] [--rate 1.2] [--mode fast|exact]
                                         [--tensor-parallel 2] [--pipeline-parallel 1]

Other degrees keep the 8 GPUs, in 8 / (tp x pp) replicas (Vidur's ``--replica_config_tensor_parallel_size``
and ``--replica_config_num_pipeline_stages``).

Run it from outside the repository (or after ``pip install .``) to measure the compiled engine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

STARTED = time.perf_counter()
TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "sharegpt_vidur" / \
    "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MODEL = "llama-2-70b"


def scenario(tensor_parallel: int = 2, pipeline_parallel: int = 1):
    from sim.scenario import parse_scenario

    size = tensor_parallel * pipeline_parallel

    return parse_scenario({
        "name": "vidur-reference", "profile": "a100-80gb", "seed": 0,
        "cluster": {"nodes": 1, "gpus_per_node": 8, "host_memory_gb": 1024},
        "models": [{"name": MODEL, "tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel,
                    "gpus": list(range(0, 8, size))}],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {MODEL: 1.0}, "prompt_tokens": {"dist": "constant", "value": 1},
                                   "output_tokens": {"dist": "constant", "value": 1}}},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 512, "chunked_prefill": True, "block_size": 16},
        "policy": {"name": "static"}, "sample_interval_s": 60.0,
    }, "vidur-reference")


def requests(n: int, rate: float, seed: int = 0):
    from sim.workload.chunk import RequestChunk

    if not TRACE.is_file():
        sys.exit(f"needs Vidur's ShareGPT trace at {TRACE} (../shared beside the repository)")
    pairs = pd.read_csv(TRACE)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(pairs), n)
    prompts = pairs["num_prefill_tokens"].to_numpy(np.int64)[rows]
    outputs = pairs["num_decode_tokens"].to_numpy(np.int64)[rows]
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    return [RequestChunk(arrivals, np.full(n, MODEL, object), prompts, outputs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1.2, help="Poisson arrivals per second (cluster-wide)")
    parser.add_argument("--mode", choices=("fast", "exact"), default="fast")
    parser.add_argument("--tensor-parallel", type=int, choices=(1, 2, 4, 8), default=2)
    parser.add_argument("--pipeline-parallel", type=int, choices=(1, 2, 4, 8), default=1)
    args = parser.parse_args()
    size = args.tensor_parallel * args.pipeline_parallel
    if size > 8:
        parser.error("tensor_parallel x pipeline_parallel must fit the 8 GPUs")
    from sim.engine import build
    from sim.simulation import simulate

    result = simulate(scenario(args.tensor_parallel, args.pipeline_parallel), mode=args.mode,
                      chunks=requests(args.requests, args.rate))
    s, frame = result.summary, result.requests
    done = frame[frame["status"] == "completed"]
    loop_s, total_s = s["sim_wall_seconds"], time.perf_counter() - STARTED
    print(f"Vidur reference: {MODEL} TP{args.tensor_parallel} PP{args.pipeline_parallel} x {8 // size} replicas on "
          f"A100-80GB, chunk 512, batch <= 128, Poisson {args.rate}/s, "
          f"{args.requests:,} ShareGPT requests; engine {build()}, {args.mode} mode")
    print(f"  completed {len(done):,}/{len(frame):,}; throughput {s['throughput_tokens_per_s']:,.0f} output tokens/s, "
          f"{s['throughput_requests_per_s']:.2f} requests/s over {s['simulated_seconds']:,.0f} simulated s")
    for column in ("ttft_s", "tpot_s", "e2e_s"):
        values = done[column].dropna()
        print(f"  {column[:-2].upper():>4}: mean {values.mean():.3f} s, p50 {values.median():.3f} s, p90 {values.quantile(0.9):.3f} s")
    print(f"  speed: loop {args.requests / loop_s:,.0f} requests/s ({loop_s:.2f} s), whole process "
          f"{args.requests / total_s:,.0f} requests/s ({total_s:.2f} s), peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
