"""Ten million requests streamed from a Parquet trace: wall time, event-loop time and peak RSS of one ``mmsim run``.

The workload is ``scenarios/large-cluster.yaml``'s (64 H100s, 20 deployments, Zipf popularity, bursty arrivals at
35 requests/s) generated as a native trace by ``mmsim trace generate`` (once; kept in ``--workdir`` for reruns),
then replayed as a trace, which the engine reads a chunk at a time. The run is its own process, pinned to one CPU
core (the idlest), so its peak RSS is its own and its speed one core's. Targets (issue 18): under 2 GB peak RSS
and under 2 minutes, compiled build (``pip install .``). Run it from outside the checkout's folder, or its
``sim/`` (pure Python) is what runs.

    python benchmarks/stream_10m.py [--requests 10000000] [--workdir /tmp/mmsim-10m]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml

from peers import idlest_core, run_mmsim

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "large-cluster.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mmsim-10m"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    trace = args.workdir / f"trace-{args.requests}.parquet"
    if not trace.is_file():
        started = time.perf_counter()
        run_mmsim(["trace", "generate", "--config", str(SCENARIO), "--max-requests", str(args.requests),
                   "--duration", str(10 * args.requests / 35), "--out", str(trace)])
        print(f"generated {trace} in {time.perf_counter() - started:.0f} s")
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["name"] = f"large-cluster-trace-{args.requests}"
    scenario["workload"] = {"trace": {"path": str(trace), "format": "mmsim"}}
    path = args.workdir / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    stdout, wall_s, peak_mb = run_mmsim(["run", str(path), "--out", str(args.workdir / "run"), "--force", "--json"],
                                        idlest_core())
    summary = json.loads(stdout)
    loop_s = summary["sim_wall_seconds"]
    print(f"{summary['requests_total']:,} requests streamed from a trace ({summary['engine_build']} engine, one core, "
          f"load average {os.getloadavg()[0]:.2f}): whole process {wall_s:.1f} s "
          f"({summary['requests_total'] / wall_s:,.0f} req/s; target under 120 s), event loop {loop_s:.1f} s "
          f"({summary['requests_total'] / loop_s:,.0f} req/s), peak RSS {peak_mb:,.0f} MB (target under 2,048)")


if __name__ == "__main__":
    main()
