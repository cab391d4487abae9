"""mmsim on the workload peers are measured on: one model on a few GPUs, Poisson arrivals, ShareGPT lengths.

This is the shape of Vidur's and sched-sim's benchmarks (one Llama-2-7B deployment, request lengths
resampled from the ShareGPT pairs Vidur ships, Poisson arrivals). Each size runs ``mmsim run`` as its own
process, pinned to one CPU core (the idlest), in fast-forward and in per-iteration (exact) mode, and reports the event
loop's speed (the summary's ``sim_wall_seconds``), the whole process's (start-up, workload, loop, writing
the run folder) and the process's peak RSS. The figures depend on the engine build: ``pip install .``
compiles it, ``pip install -e .`` leaves it pure Python; the script says which one it measured. Run it from
outside the checkout's folder, or its ``sim/`` (pure Python) is what runs.

The ShareGPT pairs are read from ``../shared/traces/sharegpt_vidur/`` beside the repository.

    python benchmarks/peers.py [--sizes 10000,50000,1000000] [--modes fast,exact] [--rate 4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import compileall
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAREGPT = ROOT.parent / "shared" / "traces" / "sharegpt_vidur" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
GPUS = 4


def scenario_yaml(requests: int, rate_per_s: float, lengths: Path) -> str:
    """One Llama-2-7B replica on each of four A100-80GB GPUs, Poisson arrivals, ShareGPT (prompt, output) pairs."""
    pairs = f"{{dist: empirical, path: {json.dumps(str(lengths))}}}"
    return f"""name: peers-{requests}
seed: 1
profile: a100-80gb
cluster: {{nodes: 1, gpus_per_node: {GPUS}, host_memory_gb: 512}}
models:
  - {{name: llama-2-7b, replicas: {GPUS}}}
workload:
  generator:
    max_requests: {requests}
    arrivals: {{process: poisson, rate_per_s: {rate_per_s}}}
    mix: {{llama-2-7b: 1}}
    prompt_tokens: {pairs}
    output_tokens: {pairs}
slo:
  default: {{ttft_s: 2.0, tpot_s: 0.1}}
engine: {{max_num_seqs: 128, max_num_batched_tokens: 4096}}
policy: {{name: static}}
"""


@functools.cache
def write_bytecode() -> None:
    """Compile the ``sim`` package the runs import to bytecode, as ``pip install .`` does: where
    PYTHONDONTWRITEBYTECODE is set (this project's machine sets it), each process would otherwise compile mmsim's
    sources again, ~50 ms that no installed copy pays."""
    spec = importlib.util.find_spec("sim")
    if spec is not None and spec.origin is not None:
        compileall.compile_dir(Path(spec.origin).parent, quiet=1)


def run_mmsim(args: list[str], core: int | None = None, cwd: Path | None = None) -> tuple[bytes, float, float]:
    """Run ``mmsim ARGS`` as its own process (pinned to CPU ``core`` if given): its stdout, wall seconds and
    peak RSS in MB. Exits with mmsim's error output if it fails."""
    write_bytecode()
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "sim.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                                   stderr=errors, preexec_fn=pin)
        stdout = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak RSS, which Popen.wait would not give
        wall_s = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status):
            errors.seek(0)
            raise SystemExit(f"mmsim {args[0]} failed ({os.waitstatus_to_exitcode(status)}): "
                             f"{errors.read().decode()[-2000:]}")
    return stdout, wall_s, usage.ru_maxrss / 1024


def run_once(scenario: Path, mode: str, out: Path, core: int) -> dict:
    """One ``mmsim run`` process: its summary, wall seconds and peak RSS."""
    # In the scenario's folder, not the checkout: ``-m`` puts the working folder first on the path.
    stdout, wall_s, rss_mb = run_mmsim(["run", str(scenario), "--mode", mode, "--out", str(out), "--force", "--json"],
                                       core, cwd=scenario.parent)
    return {"summary": json.loads(stdout), "wall_s": wall_s, "rss_mb": rss_mb}


def measure(requests: int, mode: str, rate: float, repeat: int, folder: Path, core: int) -> dict:
    """The fastest of ``repeat`` runs (the others met noise), with the largest peak RSS of them."""
    scenario = folder / f"peers-{requests}.yaml"
    scenario.write_text(scenario_yaml(requests, rate, SHAREGPT))
    runs = [run_once(scenario, mode, folder / f"run-{requests}-{mode}", core) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["wall_s"])
    summary = best["summary"]
    loop_s = min(r["summary"]["sim_wall_seconds"] for r in runs)
    return {"requests": summary["requests_total"], "mode": mode, "loop_s": loop_s,
            "loop_requests_per_s": summary["requests_total"] / loop_s, "process_s": best["wall_s"],
            "process_requests_per_s": summary["requests_total"] / best["wall_s"],
            "peak_rss_mb": max(r["rss_mb"] for r in runs), "slo_attainment": summary["slo_attainment"],
            "simulated_s": summary["simulated_seconds"], "engine_build": summary["engine_build"],
            "folder": str(folder / f"run-{requests}-{mode}")}


def idlest_core(window_s: float = 0.3) -> int:
    """The CPU core of this process's set that was idle the most over ``window_s``: on a shared machine, pinning a
    run to a core another job keeps busy would halve its speed."""
    cores = sorted(os.sched_getaffinity(0))

    def idle() -> dict[int, int]:
        with open("/proc/stat") as stat:
            rows = [line.split() for line in stat if line.startswith("cpu") and line[3].isdigit()]
        return {int(row[0][3:]): int(row[4]) + int(row[5]) for row in rows}

    try:
        before = idle()
        time.sleep(window_s)
        after = idle()
    except OSError:
        return cores[0]
    return max(cores, key=lambda core: after.get(core, 0) - before.get(core, 0))


def same_finish_times(fast_folder: str, exact_folder: str) -> bool:
    import numpy as np
    import pyarrow.parquet as pq

    fast, exact = (pq.read_table(Path(f) / "requests.parquet", columns=["finish_s"]).column(0).to_numpy(zero_copy_only=False)
                   for f in (fast_folder, exact_folder))
    return bool(np.allclose(fast, exact, rtol=1e-9, atol=0, equal_nan=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,50000,1000000", help="requests per run, comma-separated")
    parser.add_argument("--modes", default="fast,exact", help="fast (fast-forward) and/or exact (per-iteration)")
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per second (4 GPUs serve about 5.5)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the fastest is reported")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not SHAREGPT.is_file():
        sys.exit(f"peers.py needs the ShareGPT length pairs at {SHAREGPT} (the shared traces folder beside the "
                 "repository, ../shared/traces/sharegpt_vidur/); it is not there")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmsim-peers-") as tmp:
        for size in (int(text) for text in args.sizes.split(",")):
            by_mode = {mode: measure(size, mode, args.rate, args.repeat, Path(tmp), idlest_core())
                       for mode in args.modes.split(",")}
            if {"fast", "exact"} <= set(by_mode):
                by_mode["exact"]["fast_equals_exact"] = same_finish_times(by_mode["fast"]["folder"], by_mode["exact"]["folder"])
            rows.extend(by_mode.values())
    for row in rows:
        row.pop("folder")
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"Vidur-shaped workload: llama-2-7b on {GPUS} A100-80GB, Poisson {args.rate}/s, ShareGPT lengths; "
          f"engine: {rows[0]['engine_build']}; one core, fastest of {args.repeat}; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'requests':>10} {'mode':>5} {'loop s':>8} {'loop req/s':>11} {'process s':>10} {'process req/s':>14} "
          f"{'peak RSS MB':>12} {'SLO':>6}")
    for row in rows:
        same = "" if "fast_equals_exact" not in row else f"  (finish times = fast: {row['fast_equals_exact']})"
        print(f"{row['requests']:>10,} {row['mode']:>5} {row['loop_s']:>8.2f} {row['loop_requests_per_s']:>11,.0f} "
              f"{row['process_s']:>10.2f} {row['process_requests_per_s']:>14,.0f} {row['peak_rss_mb']:>12,.0f} "
              f"{row['slo_attainment']:>6.1%}{same}")


if __name__ == "__main__":
    main()
