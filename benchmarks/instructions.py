"""Instructions per run of each shipped scenario, counted by valgrind: a speed figure this shared machine cannot move.

Wall-clock figures here swing by up to 2x from hour to hour (other tenants share the cores), which hides the
10-20% a change to the engine is worth. Instructions executed do not swing: ``valgrind --tool=cachegrind
--cache-sim=no`` counts them, and a run's count is the difference between a process that simulates the scenario
twice and one that simulates it once (imports and start-up cancel out). String hashing is fixed
(``PYTHONHASHSEED=0``) so that dict layouts, and the count, repeat, and numpy's and pyarrow's thread pools are
held to one thread (valgrind counts every thread's instructions, a waiting worker's spinning too). Counts track time only roughly (a cache miss
costs more than an add), so use them to compare two builds or two revisions, and wall time for targets.

Each scenario runs under its own policy (``--policy`` for another), in the engine build of the Python running
this script: run it from outside the checkout, or its ``sim/`` (pure Python) is what runs. Under valgrind a run
takes ~40x its time, so the two largest scenarios are left out unless named.

    python benchmarks/instructions.py [--only mixed,offload] [--policy swap-aware] [--baseline PYTHON] [--json]

``--baseline`` names another interpreter (e.g. a venv with the previous revision installed): its counts are
printed beside this one's, with the change.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from shipped_scenarios import chosen
from sim.engine import build

SLOW = frozenset({"large-cluster", "diurnal-autoscale"})
CHILD = """
import sys
from pathlib import Path
from sim.scenario import load_scenario
from sim.simulation import simulate
path, policy, runs = Path(sys.argv[1]), sys.argv[2] or None, int(sys.argv[3])
scenario = load_scenario(path)
for _ in range(runs):
    result = simulate(scenario, base_dir=path.parent, policy=policy)
print(result.summary["requests_total"])
"""


def counted(python: str, path: Path, policy: str, runs: int) -> tuple[int, int]:
    """Instructions of a ``python`` process that simulates ``path`` ``runs`` times, and the run's requests."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               python, "-c", CHILD, str(path), policy, str(runs)]
    # Thread pools count their spinning too: numpy's OpenBLAS and pyarrow's are held to one thread.
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "ARROW_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        sys.exit(f"valgrind failed on {path.name}: {done.stderr.strip()[-500:]}")
    return int(found.group(1).replace(",", "")), int(done.stdout.split()[-1])


def per_run(python: str, path: Path, policy: str) -> tuple[int, int]:
    """Instructions of one simulate() of ``path`` in ``python``, and its requests."""
    once, requests = counted(python, path, policy, 1)
    twice, _ = counted(python, path, policy, 2)
    return twice - once, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated scenario names (default: all but the two largest)")
    parser.add_argument("--policy", default="", help="run every scenario under this policy (default: its own)")
    parser.add_argument("--baseline", help="another Python (a venv with another revision): its counts beside these")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    rows = []
    for path in chosen(args.only, SLOW):
        instructions, requests = per_run(sys.executable, path, args.policy)
        row = {"scenario": path.stem, "policy": args.policy or "(its own)", "requests": requests,
               "instructions_per_run": instructions, "per_request": instructions / max(requests, 1)}
        if args.baseline:
            row["baseline_instructions_per_run"] = per_run(args.baseline, path, args.policy)[0]
        rows.append(row)
    if args.json:
        print(json.dumps({"engine_build": build(), "runs": rows}, indent=1))
        return
    print(f"engine build: {build()}; instructions of one simulate() (valgrind, PYTHONHASHSEED=0)")
    print(f"{'scenario':20} {'policy':16} {'requests':>9} {'M instructions':>15} {'per request':>12}"
          + (f" {'baseline M':>11} {'change':>8}" if args.baseline else ""))
    for row in rows:
        line = (f"{row['scenario']:20} {row['policy']:16} {row['requests']:>9,} {row['instructions_per_run'] / 1e6:>15,.1f} "
                f"{row['per_request']:>12,.0f}")
        if args.baseline:
            base = row["baseline_instructions_per_run"]
            line += f" {base / 1e6:>11,.1f} {(row['instructions_per_run'] - base) / base:>+8.1%}"
        print(line)


if __name__ == "__main__":
    main()
