"""Shared test helpers: paths to the repository and to the read-only public traces."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MMSIM_CLI = [sys.executable, "-c", "from sim.cli import main; main()"]
"""The ``mmsim`` command of the Python running the tests, whatever other ``mmsim`` comes first on PATH."""


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def shared() -> Path:
    if not SHARED.exists():
        pytest.skip("../shared (public traces and paper reference) is not beside this checkout")
    return SHARED


def mmsim_in_process(capsys, *args) -> tuple[int, str, str]:
    """Run the CLI in this process as the ``mmsim`` entry point would; (exit code, stdout, stderr)."""
    import sys

    from sim.cli import main

    saved = sys.argv
    sys.argv = ["mmsim", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    finally:
        sys.argv = saved
    out, err = capsys.readouterr()
    return code, out, err


class Hung(Exception):
    """A run went on past its wall-clock bound."""


@contextmanager
def wall_clock_limit(seconds: int):
    """Raise :class:`Hung` in the block once ``seconds`` of wall time pass: a hang fails instead of stalling CI."""
    def expire(_signum, _frame):
        raise Hung(f"the runs did not end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def assert_same_times(fast, exact, columns=("first_token_s", "finish_s"), label: object = None) -> None:
    """Fast-forward and per-iteration runs give the same times, NaN where the other has NaN, up to the last bits
    of long sums (1e-9 relative): ``fast`` and ``exact`` are request frames in the same row order."""
    import numpy as np

    for column in columns:
        a, b = fast[column].to_numpy(float), exact[column].to_numpy(float)
        assert (np.isnan(a) == np.isnan(b)).all(), (label, column)
        both = ~np.isnan(a)
        assert (np.abs(a[both] - b[both]) <= 1e-9 * np.maximum(1.0, np.abs(b[both]))).all(), (label, column)


def assert_paged_blocks(instance) -> None:
    """The instance's KV blocks are exactly what paging its sequences gives: a running sequence of n tokens
    holds ceil(n / block_size) blocks, and a prefill holds those of the tokens its chunks have filled so far
    (vLLM allocates a prompt chunk by chunk), plus the first output token's slot once the prompt is in.
    Blocks shared through the prefix cache count once, and each cached block has as many holders as
    requests hold it."""
    from collections import Counter

    block_size = instance.config.block_size
    private, holders = 0, Counter()
    for request in instance.prefilling:
        expected = -(-request.prefilled // block_size)
        assert request.blocks == expected, (request.id, request.prefilled, request.blocks, expected)
        private += request.blocks - request.cache_blocks
        holders.update(path_blocks(request.prefix_path, request.cache_blocks))
    for request in instance.running:
        private += -(-(request.prompt_tokens + instance.generated(request)) // block_size) - request.cache_blocks
        holders.update(path_blocks(request.prefix_path, request.cache_blocks))
    cache = instance.prefix_cache
    if cache is not None:
        assert prefix_cache_blocks(cache)[0] == dict(holders), "prefix-cache holder counts"
    assert instance.blocks == private + len(holders), (instance.name, instance.blocks, private, len(holders))


def path_blocks(path, count: int) -> list[tuple[int, int]]:
    """The first ``count`` blocks of a prefix path, each as (segment key, offset in its segment)."""
    blocks, start = [], 0
    for key, end in zip(path.keys, path.ends) if count else ():
        blocks += [(key, offset) for offset in range(min(end, count) - start)]
        if end >= count:
            break
        start = end
    return blocks


def prefix_cache_blocks(cache) -> tuple[dict[tuple[int, int], int], list[tuple[tuple[int, int], int]]]:
    """A prefix cache block by block, each as (segment key, offset): the holders of each held one, and the
    idle ones in eviction order with their release numbers; checks that its segments and runs hold together
    (cached and held blocks runs from each segment's first, idle runs tiling the rest, oldest on top, the
    list of runs in release order and the counters right)."""
    holders, listed = {}, set()
    for key, segment in cache.segments.items():
        assert segment.key == key and 0 <= segment.held <= segment.cached and segment.cached > 0
        assert all(1 <= end <= segment.cached and n > 0 for end, n in segment.holder_runs().items())
        assert segment.held == max(segment.holder_runs(), default=0)
        assert all(end < segment.held for end in segment.shorter or {}) and (segment.longest > 0) == (segment.held > 0)
        for offset in range(segment.held):
            holders[key, offset] = sum(n for end, n in segment.holder_runs().items() if end > offset)
        top = segment.cached
        for run in segment.runs:  # top first
            assert run.segment is segment and run.hi == top and run.lo < run.hi
            top = run.lo
            listed.add(id(run))
        assert top == segment.held
        assert [run.seq for run in segment.runs] == sorted(run.seq for run in segment.runs)
    idle, run, seen = [], cache.lru.next, set()
    while run is not cache.lru:
        assert run.next.prev is run and (not idle or idle[-1][1] <= run.seq)
        idle += [((run.segment.key, offset), run.seq) for offset in range(run.hi - 1, run.lo - 1, -1)]
        seen.add(id(run))
        run = run.next
    assert seen == listed, "the list of idle runs is the segments' runs"
    assert cache.cached_blocks == sum(s.cached for s in cache.segments.values()) == len(holders) + len(idle)
    assert cache.idle_blocks == len(idle)
    return holders, idle


def kv_room_hardware(model: str, block_size: int, budget: int, max_seqs: int, room_blocks: int | None):
    """A stand-in for ``sim.simulation.build_hardware`` whose first GPU has exactly ``room_blocks`` KV blocks of
    ``model`` beside its weights and reserve (unchanged when None): patch it in to hand-work block counts."""
    from sim import simulation
    from sim.catalogue import get_model
    from sim.costs import ModelCosts
    from sim.engine.memory import reserve_bytes

    build_hardware = simulation.build_hardware

    def sized(env, scenario, layouts):
        gpus, nodes = build_hardware(env, scenario, layouts)
        profile = layouts[0].profile
        if room_blocks is not None:
            costs = ModelCosts(profile, get_model(model))
            gpus[0].capacity_bytes = (costs.gpu_weight_bytes(1.0) + reserve_bytes(get_model(model), budget, max_seqs)
                                      + room_blocks * block_size * costs.kv_bytes_per_token)
        return gpus, nodes

    return sized


def simulate_within_memory(scenario, chunks, policy: str, mode: str = "fast"):
    """Simulate, asserting after every GPU step that no GPU holds more than its memory and that the stepped
    instance's KV blocks are what paging its sequences gives."""
    from unittest import mock

    from sim.engine.engine import Engine
    from sim.simulation import simulate

    original = Engine.after_step

    def checked(engine, instance):
        for gpu in engine.gpus:
            assert gpu.used_bytes() + gpu.idle_cache_bytes() <= gpu.capacity_bytes, f"GPU {gpu.index} over capacity"
        if instance.status == "ready":
            assert_paged_blocks(instance)
        original(engine, instance)

    with mock.patch.object(Engine, "after_step", checked):
        return simulate(scenario, policy=policy, mode=mode, chunks=chunks)


def scenario_dict(**overrides) -> dict:
    """A small valid scenario; keyword arguments replace top-level sections."""
    data = {
        "name": "test",
        "seed": 3,
        "profile": "paper-rtx5000",
        "cluster": {"nodes": 1, "gpus_per_node": 2, "host_memory_gb": 64},
        "models": [{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}],
        "workload": {"generator": {"duration_s": 60, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                                   "mix": {"qwen2.5-3b": 0.5, "qwen3-8b": 0.5},
                                   "prompt_tokens": {"dist": "lognormal", "mean": 500, "cv": 1.0},
                                   "output_tokens": {"dist": "lognormal", "mean": 100, "cv": 1.0}}},
        "slo": {"default": {"ttft_s": 2.0, "tpot_s": 0.1}},
        "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048},
        "policy": {"name": "static"},
    }
    data.update(overrides)
    if "models" in overrides and "workload" not in overrides:  # the mix follows the models served
        names = [m.get("alias") or m["name"] for m in overrides["models"]]
        data["workload"]["generator"]["mix"] = {name: 1.0 / len(names) for name in names}
    return data
