"""Parallel efficiency of a sweep on this machine: wall time vs the sum of its runs' times, for 1 and 2 workers.

Efficiency = (sum of run times) / (wall time × workers): 1.0 means the workers
were busy simulating the whole time; pool start-up, imports and result writing
pull it down. "vs 1 worker" is the plain wall-time speed-up, which also shows
runs slowing each other down when the cores are shared. Usage: python benchmarks/sweep_efficiency.py [SWEEP.yaml] [--ray]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from sim.engine import build
from sim.sweep.execute import run_sweep
from sim.sweep.spec import expand, load_sweep

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    use_ray = "--ray" in sys.argv
    path = Path(args[0]) if args else REPO / "scenarios" / "sweep-example.yaml"
    spec = load_sweep(path)
    tasks = expand(spec, path)
    print(f"sweep {path} ({len(tasks)} runs) on {'Ray' if use_ray else 'a process pool'}; engine: {build()}")
    print(f"{'workers':>8} {'wall s':>8} {'sum of runs s':>14} {'efficiency':>11} {'vs 1 worker':>12}")
    first_wall = None
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as out:
            outcome = run_sweep(tasks, Path(out), axes=list(spec.axes), workers=workers, use_ray=use_ray,
                                show_progress=False)
        wall, busy = outcome["wall_s"], outcome["run_seconds"]
        first_wall = first_wall or wall
        print(f"{workers:>8} {wall:>8.1f} {busy:>14.1f} {busy / (wall * workers):>11.0%} {first_wall / wall:>11.2f}×")


if __name__ == "__main__":
    main()
