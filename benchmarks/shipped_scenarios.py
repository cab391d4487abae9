"""Every shipped scenario under its own policy, timed two ways: as one ``mmsim run`` process, and as a run inside a
process that has already imported mmsim (what each run of a sweep, a ``compare`` or a capacity search costs).

For each ``scenarios/*.yaml`` that ``mmsim run`` takes (the sweep specs are skipped) it prints the requests, the
event loop's seconds and requests per second (the summary's ``sim_wall_seconds``, which includes streaming the
workload in), the whole process's, and the warm run's (reading the scenario, the loop, the summary and writing the
run folder, as ``sim.runner.run_scenario`` does for every run of a sweep). Each figure is the fastest of
``--repeat`` runs, pinned to the idlest core. The figures depend on the engine build (``pip install .`` compiles
it); the script says which one it measured. Run it from outside the checkout's folder, or its ``sim/`` (pure
Python) is what runs.

    python benchmarks/shipped_scenarios.py [--repeat 3] [--only mixed,offload] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from peers import idlest_core, run_mmsim
from sim.engine import build
from sim.runner import run_scenario
from sim.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def shipped() -> list[Path]:
    """The shipped scenarios ``mmsim run`` takes (the sweep specs are not scenarios)."""
    return sorted(path for path in SCENARIOS.glob("*.yaml") if not path.name.startswith("sweep-"))


def chosen(only: str | None, left_out: frozenset[str] = frozenset()) -> list[Path]:
    """The shipped scenarios named in ``only`` (comma-separated), else all of them but ``left_out``."""
    names = set(only.split(",")) if only else None
    return [path for path in shipped() if (path.stem in names if names is not None else path.stem not in left_out)]


def cold(path: Path, out: Path, repeat: int, core: int) -> dict:
    """``mmsim run`` as its own process: the fastest whole process and loop of ``repeat``."""
    runs = []
    for _ in range(repeat):
        stdout, wall_s, _ = run_mmsim(["run", str(path), "--out", str(out), "--force", "--json"], core, cwd=path.parent)
        runs.append((wall_s, json.loads(stdout)))
    return {"requests": runs[0][1]["requests_total"], "policy": runs[0][1]["policy"],
            "loop_s": min(summary["sim_wall_seconds"] for _, summary in runs),
            "process_s": min(wall_s for wall_s, _ in runs)}


def warm(path: Path, out: Path, repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` runs in this process (mmsim already imported): scenario read, loop,
    summary and run folder written."""
    run_scenario(path, out_dir=out, show_progress=False, replace=True)  # the first run in a process pays imports
    best_s = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run_scenario(path, scenario=load_scenario(path), out_dir=out, show_progress=False, replace=True)
        best_s = min(best_s, time.perf_counter() - started)
    return best_s


def per_s(requests: int, seconds: float) -> float | None:
    """Requests per second, or None for a run too small to time (a scenario of a couple of requests)."""
    return requests / seconds if requests >= 100 and seconds > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the fastest is reported")
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all shipped)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    paths = chosen(args.only)
    core = idlest_core()
    os.sched_setaffinity(0, {core})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            row = {"scenario": path.stem, **cold(path, Path(tmp) / "cold", args.repeat, core)}
            row["warm_run_s"] = warm(path, Path(tmp) / "warm", args.repeat)
            for name in ("loop", "process", "warm_run"):
                row[f"{name}_requests_per_s"] = per_s(row["requests"], row[f"{name}_s"])
            rows.append(row)
    if args.json:
        print(json.dumps({"engine_build": build(), "core": core, "rows": rows}, indent=1))
        return
    print(f"engine build: {build()} (core {core}, fastest of {args.repeat})")
    print(f"{'scenario':20} {'policy':14} {'requests':>9} {'loop s':>8} {'loop req/s':>11} {'process s':>9} "
          f"{'req/s':>9} {'warm run s':>10} {'req/s':>9}")

    def rate(value: float | None) -> str:
        return f"{value:,.0f}" if value is not None else "-"

    for row in sorted(rows, key=lambda r: -r["requests"]):
        print(f"{row['scenario']:20} {row['policy']:14} {row['requests']:>9,} {row['loop_s']:>8.3f} "
              f"{rate(row['loop_requests_per_s']):>11} {row['process_s']:>9.2f} "
              f"{rate(row['process_requests_per_s']):>9} "
              f"{row['warm_run_s']:>10.4f} {rate(row['warm_run_requests_per_s']):>9}")


if __name__ == "__main__":
    main()
