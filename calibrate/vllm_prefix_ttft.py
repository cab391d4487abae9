"""TTFT with prefix caching on: a real vLLM engine against mmsim calibrated from that same engine.

A shared-prefix trace (:func:`calibrate.vllm_prefix.prefix_trace`: tenants' system prompts, unique
suffixes, token ids that agree exactly where the prefix ids do) with Poisson arrivals is replayed at its
real arrival times through the engine that ``mmsim validate vllm`` drives (:class:`VllmEngine`: the same
threads, KV space and limits) with prefix caching switched on, and simulated by mmsim from a profile that
``mmsim calibrate --engine vllm`` fitted to that engine with the same limits, given as many KV blocks as
vLLM's pool holds (the calibrated engine's, ``VLLM_CPU_KVCACHE_SPACE``, unless ``kv_blocks`` fixes it).
Compared: mean, p50 and p90 TTFT (and E2E), and the prefix-cache hit rate, each engine's own counters
over every admission (:func:`calibrate.vllm_prefix._count_admissions` for vLLM).

mmsim prices a prefill that starts after C cached tokens as P new tokens whose attention also reads the C
cached ones (the prefill quadratic term ``P^2 + 2PC``, fitted on chunked prefills, whose later chunks
attend to the chunks before them in the same way).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from unittest import mock

import numpy as np
import pandas as pd

from calibrate.vllm_calibrate import predicted_step_s, step_sample
from calibrate.vllm_engine import TINY_QWEN2, EngineLimits, StepRecord, VllmEngine, engine_version
from calibrate.vllm_prefix import (MODEL, PrefixCase, PrefixRequest, _count_admissions, hit_rate_pct, prefix_trace,
                                   simulate_prefix_trace)
from calibrate.vllm_probes import Prober, plan_for
from calibrate.vllm_validate import engine_drift_pct, metrics, replay_step_diagnostics
from sim.catalogue import model_from_hf_config, register_model
from sim.costs import ModelCosts
from sim.errors import MmsimError
from sim.profile import load_profile

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

DTYPE = "fp32"  # this AVX2 CPU has no fast bf16
CONTEXT_GRID = ((64, 512), (64, 2048), (160, 512), (160, 2048), (320, 1024))
"""(new tokens, cached tokens) of the prefills that :func:`context_cost` times: a hit's shapes."""
COMPARED = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "e2e_mean_s", "e2e_p90_s", "throughput_tokens_per_s")


@dataclass(frozen=True)
class TtftCase:
    """A shared-prefix trace at a Poisson arrival rate, and the engine limits (``prefix``'s) it runs under."""

    prefix: PrefixCase = field(default_factory=lambda: PrefixCase(
        tenants=3, requests_per_tenant=10, system_tokens=512, suffix_tokens=(32, 256), max_num_seqs=8,
        max_num_batched_tokens=1024, max_model_len=EngineLimits().max_model_len))  # as `calibrate` starts it
    rate_per_s: float = 2.0
    output_tokens: tuple[int, int] = (8, 48)  # uniform in [low, high]
    kv_blocks: int | None = None  # vLLM's pool; None: what the calibrated engine's KV space holds

    @property
    def limits(self) -> EngineLimits:
        p = self.prefix
        return EngineLimits(max_num_seqs=p.max_num_seqs, max_num_batched_tokens=p.max_num_batched_tokens,
                            block_size=p.block_size, max_model_len=p.max_model_len)


def timed_trace(case: TtftCase) -> list[PrefixRequest]:
    """The case's prefix trace with Poisson arrivals at ``rate_per_s`` and outputs drawn from ``output_tokens``."""
    rng = random.Random(case.prefix.seed + 1)
    arrival, out = 0.0, []
    for request in prefix_trace(case.prefix):
        arrival += rng.expovariate(case.rate_per_s)
        out.append(replace(request, arrival_s=round(arrival, 6), output_tokens=rng.randint(*case.output_tokens)))
    return out


class PrefixCachingEngine(VllmEngine):
    """:class:`VllmEngine` with prefix caching on (or explicitly off) and its pool, when ``kv_blocks`` is given,
    fixed at that many blocks; requests carry their own token ids, so that shared prefixes are shared."""

    def __init__(self, folder: Path, limits: EngineLimits, kv_blocks: int | None, caching: bool = True, seed: int = 0):
        # torch takes its thread count from OMP_NUM_THREADS when first imported, and importing vllm imports
        # torch: set as VllmEngine sets it, before the import, or the engine runs on every core (2 here),
        # unlike the calibrated one (45% faster on a quiet machine, twice as slow on a busy one).
        os.environ["OMP_NUM_THREADS"] = str(limits.threads)
        import torch
        import vllm

        original = vllm.EngineArgs
        # VllmEngine builds its EngineArgs with caching off; only these arguments differ from the engine that
        # was calibrated.
        changed: dict = {"enable_prefix_caching": caching}
        if kv_blocks is not None:
            changed["num_gpu_blocks_override"] = kv_blocks
        with mock.patch.object(vllm, "EngineArgs", lambda **kwargs: original(**(kwargs | changed))):
            super().__init__(folder, DTYPE, limits, "cpu", seed)
        if torch.get_num_threads() != limits.threads:
            raise MmsimError(f"torch runs {torch.get_num_threads()} threads, not the engine's {limits.threads}: it was "
                             "imported before OMP_NUM_THREADS was set")
        # The warm-up probes' random prompts came from random.Random(seed), the stream prefix_trace draws its
        # system prompts from: the warm-up then cached 18 blocks of two tenants' prompts before the trace began.
        self._rng = random.Random(f"warm-up probes {seed}")
        # The engine runs vLLM's own Scheduler, which keeps the KV cache manager its interface does not name.
        manager = cast("Scheduler", self.core().scheduler).kv_cache_manager
        self.admissions = _count_admissions(manager)
        self.pool_blocks = manager.block_pool.num_gpu_blocks
        self._alone = 0

    def add_tokens(self, request_id: str, tokens: tuple[int, ...], output_tokens: int) -> None:
        params = self._sampling(max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, detokenize=False,
                                temperature=0.0)
        self._prompt_tokens[request_id] = len(tokens)
        self.engine.add_request(request_id, self._prompt(prompt_token_ids=list(tokens)), params)

    def prefill_alone(self, tokens: tuple[int, ...]) -> list[StepRecord]:
        """Run a one-output request of ``tokens`` on an idle engine; the steps that prefilled it."""
        self._alone += 1
        self.add_tokens(f"alone{self._alone}", tokens, 1)
        steps = []
        while self.has_work():
            steps.append(self.step())
        return [s for s in steps if s.prefills]


def replay_tokens(engine: PrefixCachingEngine, requests: list[PrefixRequest], steps: list[StepRecord]) -> pd.DataFrame:
    """Run ``requests`` through ``engine`` at their arrival times (each added once its time has passed; first
    token and finish are the ends of the steps that produced them); one row per request, seconds from the start."""
    first: dict[str, float] = {}
    finish: dict[str, float] = {}
    start = time.perf_counter()
    index = 0
    while index < len(requests) or engine.has_work():
        now = time.perf_counter() - start
        while index < len(requests) and requests[index].arrival_s <= now:
            engine.add_tokens(f"q{index}", requests[index].tokens, requests[index].output_tokens)
            index += 1
        if not engine.has_work():
            time.sleep(min(0.05, max(0.0, requests[index].arrival_s - now)))
            continue
        record = engine.step()
        steps.append(record)
        for rid in record.first_tokens:
            first[rid] = record.end_s - start
        for rid in record.finished:
            finish[rid] = record.end_s - start
    ids = [f"q{i}" for i in range(len(requests))]
    return _frame(requests, [first[i] for i in ids], [finish[i] for i in ids])


def _frame(requests: list[PrefixRequest], first_token_s, finish_s) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": [r.arrival_s for r in requests],
                         "first_token_s": np.asarray(first_token_s, float), "finish_s": np.asarray(finish_s, float),
                         "prompt_tokens": [len(r.tokens) for r in requests],
                         "output_tokens": [r.output_tokens for r in requests]})


def latency_figures(frame: pd.DataFrame) -> dict:
    """:func:`calibrate.vllm_validate.metrics` and the median TTFT."""
    return metrics(frame) | {"ttft_p50_s": float(np.median(frame["first_token_s"] - frame["arrival_s"]))}


def simulated(case: TtftCase, requests: list[PrefixRequest], config: Path, profile: Path, caching: bool,
              pool_blocks: int) -> dict:
    """mmsim's run of ``requests`` with the blocks of a vLLM pool of ``pool_blocks``: its latency figures, hit
    rate, and per-request TTFT and cached tokens."""
    prefix = replace(case.prefix, kv_blocks=pool_blocks)
    result, lead_s = simulate_prefix_trace(prefix, requests, config, profile, caching)
    table = result.requests.sort_values("id").reset_index(drop=True)
    frame = _frame(requests, table["first_token_s"].to_numpy() - lead_s, table["finish_s"].to_numpy() - lead_s)
    counters = result.summary["prefix_cache"]
    queries, hits = counters["prefix_queried_tokens"], counters["prefix_hit_tokens"]
    return {"figures": latency_figures(frame), "hit_rate_pct": hit_rate_pct(hits, queries), "queries": queries,
            "hits": hits, "preemptions": int(table["preemptions"].sum()),
            "ttft_s": (frame["first_token_s"] - frame["arrival_s"]).round(6).tolist(),
            "cached_prompt_tokens": table["cached_prompt_tokens"].astype(int).tolist()}


def run_real(case: TtftCase, requests: list[PrefixRequest], folder: Path, profile: Path, caching: bool) -> dict:
    """vLLM's replay of ``requests`` after a warm-up: its latency figures, its own hit counters, how far its steps
    ran from the profile's prices (before the replay: ``engine_drift_pct``; during it: ``steps_vs_profile_pct``)
    and, with caching on, what cached tokens add to a prefill (:func:`context_cost`)."""
    spec = register_model(model_from_hf_config(folder / "config.json", MODEL))
    costs = ModelCosts(load_profile(profile), spec, DTYPE)
    engine = PrefixCachingEngine(folder, case.limits, case.kv_blocks, caching, case.prefix.seed)
    try:
        prober = Prober(engine)
        prober.warm_up(plan_for(True, case.limits))
        drift = engine_drift_pct(prober, costs)
        for key in engine.admissions:  # the warm-up's and drift probes' admissions are not the trace's
            engine.admissions[key] = 0
        steps: list[StepRecord] = []
        frame = replay_tokens(engine, requests, steps)
        counts = dict(engine.admissions)
        context = context_cost(engine, costs) if caching else []
    finally:
        engine.close()
    queries, hits = counts["queries"] + counts["preempted_queries"], counts["hits"] + counts["preempted_hits"]
    return {"figures": latency_figures(frame), "hit_rate_pct": hit_rate_pct(hits, queries), "queries": queries,
            "hits": hits, "preempted_requests": counts["preempted_requests"], "pool_blocks": engine.pool_blocks,
            "engine_drift_pct": drift, **replay_step_diagnostics(steps, costs), "context_cost": context,
            "ttft_s": (frame["first_token_s"] - frame["arrival_s"]).round(6).tolist()}


def context_cost(engine: PrefixCachingEngine, costs: ModelCosts, reps: int = 3) -> list[dict]:
    """What C cached tokens add to a prefill of P new ones, in the real engine and in mmsim's price: per (P, C)
    of ``CONTEXT_GRID``, the median over ``reps`` of t(P new after C cached) / t(P new alone), the two steps
    run back to back (in alternating order) so that the machine's speed cancels, timed in the engine thread's
    CPU time (time other processes took is left out)."""
    rng = random.Random("context probes")
    fresh = lambda n: tuple(rng.randrange(3, engine.vocab) for _ in range(n))
    ratios: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for rep in range(reps):
        for new, cached in CONTEXT_GRID:
            prefix = fresh(cached)
            engine.prefill_alone(prefix + fresh(engine.limits.block_size))  # caches the prefix's blocks
            runs = [(True, prefix + fresh(new)), (False, fresh(new))]
            timed = dict((hit, engine.prefill_alone(tokens)) for hit, tokens in (runs if rep % 2 else runs[::-1]))
            (after,), (alone,) = timed[True], timed[False]
            assert after.prefills == [(new, cached)] and alone.prefills == [(new, 0)], (after.prefills, alone.prefills)
            priced = predicted_step_s(costs, step_sample(after)) / predicted_step_s(costs, step_sample(alone))
            ratios.setdefault((new, cached), []).append((after.cpu_s / alone.cpu_s, priced))
    return [{"new_tokens": new, "cached_tokens": cached, "vllm_ratio": round(statistics.median(r for r, _ in v), 3),
             "mmsim_ratio": round(statistics.median(m for _, m in v), 3)} for (new, cached), v in ratios.items()]



def compare_ttft(case: TtftCase, profile: Path, workdir: Path, modes: tuple[bool, ...] = (True,)) -> dict:
    """For each caching mode (True: prefix caching on): vLLM's and mmsim's figures on ``case``'s trace, the
    errors (mmsim - vLLM, % of vLLM) of ``COMPARED``, and the hit rates' difference in points."""
    folder = Path(workdir) / MODEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_QWEN2, indent=1))
    requests = timed_trace(case)
    out: dict[str, Any] = {
        "engine": engine_version(), "case": {"prefix": case.prefix.__dict__, "rate_per_s": case.rate_per_s,
                                             "output_tokens": case.output_tokens, "kv_blocks": case.kv_blocks},
        "profile": str(profile), "requests": len(requests), "modes": {}}
    for caching in modes:
        real = run_real(case, requests, folder, profile, caching)
        sim = simulated(case, requests, folder / "config.json", profile, caching, real["pool_blocks"])
        errors = {name: round(100 * (sim["figures"][name] / real["figures"][name] - 1), 2) for name in COMPARED}
        out["modes"]["cached" if caching else "uncached"] = {
            "vllm": real, "mmsim": sim, "errors_pct": errors,
            "hit_rate_difference_pp": round(sim["hit_rate_pct"] - real["hit_rate_pct"], 3)}
    return out
