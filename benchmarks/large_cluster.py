"""scenarios/large-cluster.yaml (64 GPUs, 20 deployments, ~1M requests) under every built-in policy.

Each policy runs in its own process, pinned to one CPU core (the idlest), so that its peak RSS is its own
and the speed is one core's; the fastest of ``--repeat`` runs is reported (the others met noise).
``--duration-s`` shortens the 8-hour workload (the full run takes minutes per policy on two cores). The
figures depend on the build: ``pip install .`` compiles the engine and the built-in policies.

    python benchmarks/large_cluster.py [--duration-s 28800] [--policies static,swap-aware] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
from pathlib import Path

from peers import idlest_core
from sim.engine import build

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "large-cluster.yaml"
POLICIES = "static,fcfs-swap,time-slice,swap-aware,offload-aware,slo-aware"


def measure(policy: str, duration_s: float, repeat: int, queue) -> None:
    from sim.scenario import load_scenario
    from sim.simulation import simulate

    os.sched_setaffinity(0, {idlest_core()})
    scenario = load_scenario(SCENARIO)
    scenario.workload.generator.duration_s = duration_s
    runs = [simulate(scenario, base_dir=SCENARIO.parent, policy=policy).summary for _ in range(repeat)]
    s = min(runs, key=lambda summary: summary["sim_wall_seconds"])
    queue.put({"policy": policy, "requests": s["requests_total"], "wall_s": s["sim_wall_seconds"],
               "slo": s["slo_attainment"], "goodput": s["goodput_requests_per_s"], "preemptions": s["preemptions"],
               "loads": s["loads"], "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=28800.0)
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--repeat", type=int, default=3, help="runs per policy; the fastest is reported")
    args = parser.parse_args()
    context = mp.get_context("fork")
    print(f"engine: {build()}; one core, fastest of {args.repeat}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'policy':>14} {'requests':>10} {'wall s':>8} {'req/s':>8} {'RSS MB':>7} {'SLO':>6} {'goodput':>8} {'preempt':>8} {'loads':>6}")
    for policy in args.policies.split(","):
        queue = context.Queue()
        proc = context.Process(target=measure, args=(policy, args.duration_s, args.repeat, queue))
        proc.start()
        r = queue.get()
        proc.join()
        print(f"{r['policy']:>14} {r['requests']:>10,} {r['wall_s']:>8.1f} {r['requests'] / r['wall_s']:>8,.0f} "
              f"{r['rss_mb']:>7,.0f} {r['slo']:>6.1%} {r['goodput']:>8.2f} {r['preemptions']:>8,} {r['loads']:>6}")


if __name__ == "__main__":
    main()
