"""Whether a change to the engine or a policy left every shipped run as it was: a hash of each shipped scenario's
requests and events tables under each built-in policy (fast mode).

Speed work must not change a single result. Save the hashes with the build before the change, then compare the
build after it against them:

    python benchmarks/shipped_hashes.py --save /tmp/before.json           # in a venv of the old revision
    python benchmarks/shipped_hashes.py --against /tmp/before.json        # in a venv of the new one: exit 1 on a change

``--only`` names scenarios; ``large-cluster`` (a million requests per policy) is left out unless named. Run it
from outside the checkout, or its ``sim/`` (pure Python) is what runs; both builds give the same hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from shipped_scenarios import chosen
from sim.policies.registry import policy_descriptions
from sim.scenario import load_scenario
from sim.simulation import simulate

SLOW = frozenset({"large-cluster"})


def run_hash(path: Path, policy: str) -> str:
    """A hash of one run's requests and events tables, as CSV text."""
    result = simulate(load_scenario(path), base_dir=path.parent, policy=policy)
    digest = hashlib.sha1()
    for frame in (result.requests, result.events):
        digest.update(frame.to_csv(index=False).encode())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated scenario names (default: all but large-cluster)")
    parser.add_argument("--save", type=Path, help="write the hashes to this JSON file")
    parser.add_argument("--against", type=Path, help="compare with hashes saved earlier; exit 1 if any run differs")
    args = parser.parse_args()
    hashes: dict[str, str] = {}
    # Read before any run: a scenario naming a plug-in policy (paper-preemption's) registers it, which would add it
    # to the list for the scenarios after that one.
    policies = sorted(policy_descriptions())
    for path in chosen(args.only, SLOW):
        for policy in policies:
            hashes[f"{path.stem}/{policy}"] = run_hash(path, policy)
            print(f"{path.stem:20} {policy:18} {hashes[f'{path.stem}/{policy}']}", flush=True)
    if args.save:
        args.save.write_text(json.dumps(hashes, indent=1))
    if args.against:
        before = json.loads(args.against.read_text())
        changed = sorted(key for key in hashes if key in before and before[key] != hashes[key])
        unknown = sorted(key for key in hashes if key not in before)
        print(f"{len(hashes)} runs, {len(changed)} changed" + (f": {', '.join(changed)}" if changed else "")
              + (f"; not in {args.against}: {', '.join(unknown)}" if unknown else ""))
        if changed or unknown:
            sys.exit(1)


if __name__ == "__main__":
    main()
