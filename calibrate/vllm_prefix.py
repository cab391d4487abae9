"""mmsim's prefix-cache hit rate against a real vLLM engine's, on one shared-prefix trace.

A :class:`PrefixTrace` is a few tenants' requests: each prompt is its tenant's system prompt followed by a
unique suffix, with ``prefix_ids`` one per full ``block_size`` block (the tenant's ids over blocks wholly in
the system prompt, fresh ids elsewhere) and token ids that agree exactly where the ids do. It is replayed
through an in-process vLLM engine with ``enable_prefix_caching=True`` and the pool fixed at ``kv_blocks``
(``num_gpu_blocks_override``), and simulated in mmsim with the same limits and pool.

Both hit rates are hits / queries in tokens over every admission of a waiting request. vLLM's scheduler
records each admission in ``kv_cache_manager.record_prefix_cache_stats(request, num_hits)``: queries are
``request.num_tokens`` (the prompt, plus tokens generated before a preemption), hits the locally cached
tokens found, at most the prompt's full blocks less the last token. It files re-admissions of preempted
requests apart (``preempted_queries``/``preempted_hits``); they are added back here, since mmsim's
prefix-cache counters (``prefix_queried_tokens``/``prefix_hit_tokens`` in the run summary) count every
admission alike. Arrivals are spaced so
that each request is served before the next arrives: the hit rates then depend only on what the caches
keep, not on either engine's step times.

vLLM's block pool keeps the first of its ``num_gpu_blocks`` as a null block, so mmsim is given one block
fewer (:func:`usable_blocks`). One difference remains, in mmsim's model: vLLM also caches the full blocks
that generated tokens complete, and a finished request's such block joins the LRU queue behind the older
prefix blocks, which are then evicted in its stead; mmsim frees it as uncached memory. With one output
token per request (no block completed by a generated token) the two hit rates agree exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pandas as pd

from calibrate.vllm_engine import TINY_QWEN2, require_vllm
from sim.catalogue import model_from_hf_config, register_model
from sim.costs import ModelCosts
from sim.engine.memory import reserve_bytes
from sim.profile import load_profile
from sim.scenario import parse_scenario
import sim.simulation as simulation
from sim.simulation import GIB, RunResult, simulate

MODEL = "tiny-qwen2"
PROFILE = Path(__file__).resolve().parent.parent / "sim" / "data" / "profiles" / "h100-sxm.json"
"""Any profile does: with requests served one after another, step times do not change what is cached."""


@dataclass(frozen=True)
class PrefixCase:
    """A shared-prefix trace's shape and the engine limits it runs under."""

    tenants: int = 3
    requests_per_tenant: int = 5
    system_tokens: int = 320
    suffix_tokens: tuple[int, int] = (40, 200)  # a unique suffix's length, uniform in [low, high]
    output_tokens: int = 4
    gap_s: float = 0.5  # between arrivals: each request is served before the next arrives
    kv_blocks: int = 2048
    block_size: int = 32
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 1024
    max_model_len: int = 640
    seed: int = 0


@dataclass(frozen=True)
class PrefixRequest:
    """One request of a prefix trace: its prompt's token ids and the prefix ids of its full blocks."""

    arrival_s: float
    tokens: tuple[int, ...]
    prefix_ids: tuple[int, ...]
    output_tokens: int


def prefix_trace(case: PrefixCase, vocab: int = TINY_QWEN2["vocab_size"]) -> list[PrefixRequest]:
    """The case's requests in arrival order: tenants in a shuffled order, prompts consistent with their ids."""
    rng = random.Random(case.seed)
    draw = lambda n: tuple(rng.randrange(3, vocab) for _ in range(n))
    systems = [draw(case.system_tokens) for _ in range(case.tenants)]
    shared_blocks = case.system_tokens // case.block_size
    order = [t for t in range(case.tenants) for _ in range(case.requests_per_tenant)]
    rng.shuffle(order)
    requests, next_id = [], case.tenants * shared_blocks
    for index, tenant in enumerate(order):
        tokens = systems[tenant] + draw(rng.randint(*case.suffix_tokens))
        full = len(tokens) // case.block_size
        ids = tuple(tenant * shared_blocks + k for k in range(min(full, shared_blocks)))
        fresh = max(0, full - shared_blocks)
        ids += tuple(range(next_id, next_id + fresh))
        next_id += fresh
        requests.append(PrefixRequest(index * case.gap_s, tokens, ids, case.output_tokens))
    return requests


def hit_rate_pct(hits: int, queries: int) -> float:
    return round(100 * hits / queries, 3) if queries else 0.0


def vllm_hit_rate(case: PrefixCase, requests: list[PrefixRequest], folder: Path) -> dict:
    """Replay ``requests`` through a real vLLM engine (the model config in ``folder``, random weights, prefix
    caching on, ``case.kv_blocks`` blocks); its own prefix-cache counters over every admission."""
    engine = _start_vllm(case, folder)
    counts = _count_admissions(engine.engine_core.engine_core.scheduler.kv_cache_manager)
    try:
        _replay(engine, requests)
    finally:
        engine.engine_core.shutdown()
    queries, hits = counts["queries"] + counts["preempted_queries"], counts["hits"] + counts["preempted_hits"]
    return {"queries": queries, "hits": hits, "hit_rate_pct": hit_rate_pct(hits, queries), **counts}


def _start_vllm(case: PrefixCase, folder: Path):
    require_vllm()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # its room; the pool itself is num_gpu_blocks_override
    from vllm import EngineArgs, LLMEngine

    dtype = json.loads((folder / "config.json").read_text()).get("torch_dtype", "float32")
    args = EngineArgs(model=str(folder), load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                      block_size=case.block_size, max_num_seqs=case.max_num_seqs,
                      max_num_batched_tokens=case.max_num_batched_tokens, max_model_len=case.max_model_len,
                      enable_prefix_caching=True, enable_chunked_prefill=True, enforce_eager=True, seed=case.seed,
                      num_gpu_blocks_override=case.kv_blocks)
    return LLMEngine.from_engine_args(args)


def _count_admissions(manager) -> dict:
    """Totals of what the scheduler records at each admission (``record_prefix_cache_stats``), kept here
    because the scheduler hands its own counters to the stats loggers and resets them every step."""
    counts = {"requests": 0, "queries": 0, "hits": 0, "preempted_requests": 0, "preempted_queries": 0,
              "preempted_hits": 0}
    record = manager.record_prefix_cache_stats

    def counting(request, num_hits: int) -> None:
        if manager.prefix_cache_lookup_enabled(request):
            kind = "preempted_" if request.num_preemptions > 0 else ""
            counts[f"{kind}requests"] += 1
            counts[f"{kind}queries"] += request.num_tokens
            counts[f"{kind}hits"] += num_hits
        record(request, num_hits)

    manager.record_prefix_cache_stats = counting
    return counts


def _replay(engine, requests: list[PrefixRequest]) -> None:
    """Each request added at its turn, the engine stepped until it is done: the arrivals' order, served one
    after another (what the trace's spacing gives in time, without depending on this machine's speed)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    for index, request in enumerate(requests):
        params = SamplingParams(max_tokens=request.output_tokens, min_tokens=request.output_tokens, ignore_eos=True,
                                detokenize=False, temperature=0.0)
        engine.add_request(f"p{index}", TokensPrompt(prompt_token_ids=list(request.tokens)), params)
        while engine.has_unfinished_requests():
            engine.step()


def usable_blocks(case: PrefixCase) -> int:
    """The blocks of vLLM's pool that hold KV: its block pool sets the first aside as the null block."""
    return case.kv_blocks - 1


def mmsim_hit_rate(case: PrefixCase, requests: list[PrefixRequest], config: Path) -> dict:
    """Simulate ``requests`` in mmsim (see :func:`simulate_prefix_trace`); the run's prefix-cache counters over
    every admission."""
    result, _ = simulate_prefix_trace(case, requests, config, PROFILE)
    counters = result.summary["prefix_cache"]
    queries, hits = counters["prefix_queried_tokens"], counters["prefix_hit_tokens"]
    requests_table = result.requests
    return {"queries": queries, "hits": hits, "hit_rate_pct": hit_rate_pct(hits, queries),
            "first_prefill_cached_tokens": int(requests_table["cached_prompt_tokens"].sum()),
            "preemptions": int(requests_table["preemptions"].sum())}


def simulate_prefix_trace(case: PrefixCase, requests: list[PrefixRequest], config: Path, profile: Path,
                          caching: bool = True) -> tuple[RunResult, float]:
    """``requests`` through mmsim: one device, ``static`` policy, the case's limits and exactly the KV blocks
    vLLM can use of its ``case.kv_blocks``. Returns the run's result and ``lead_s``, the seconds added to every
    arrival so that the weights are loaded before the first one, as vLLM has them."""
    spec = register_model(model_from_hf_config(config, MODEL))
    dtype = "fp32"
    costs = ModelCosts(load_profile(profile), spec, dtype)
    resident = costs.gpu_weight_bytes(1.0) + reserve_bytes(spec, case.max_num_batched_tokens, case.max_num_seqs)
    block_bytes = case.block_size * costs.kv_bytes_per_token
    memory_gb = (resident + (usable_blocks(case) + 0.5) * block_bytes) / GIB
    lead_s = costs.reload_s() + 1.0
    with tempfile.TemporaryDirectory(prefix="mmsim-prefix-") as folder, _captured_engines() as engines:
        path = Path(folder) / "trace.jsonl"
        pd.DataFrame({"arrival_s": [lead_s + r.arrival_s for r in requests], "model": MODEL,
                      "prompt_tokens": [len(r.tokens) for r in requests],
                      "output_tokens": [r.output_tokens for r in requests],
                      "prefix_ids": [list(r.prefix_ids) for r in requests]}).to_json(path, orient="records", lines=True)
        data = {"name": "vllm-prefix", "profile": str(Path(profile).resolve()),
                "cluster": {"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64.0, "gpu_memory_gb": memory_gb},
                "models": [{"name": MODEL, "dtype": dtype, "config": str(Path(config).resolve()),
                            "max_model_len": case.max_model_len}],
                "workload": {"trace": {"path": str(path), "format": "mmsim"}, "prefix_block_tokens": case.block_size},
                "engine": {"max_num_seqs": case.max_num_seqs, "max_num_batched_tokens": case.max_num_batched_tokens,
                           "block_size": case.block_size, "chunked_prefill": True, "gpu_memory_utilization": 1.0,
                           "prefix_caching": caching},
                "policy": {"name": "static"}}
        result = simulate(parse_scenario(data, "vllm prefix"), base_dir=Path(folder), mode="fast")
    (engine,) = engines
    instance = engine.instances[0]
    pool = instance.free_blocks() + instance.blocks
    assert pool == usable_blocks(case), f"mmsim's pool is {pool} blocks, not {usable_blocks(case)}"
    return result, lead_s


@contextlib.contextmanager
def _captured_engines() -> Iterator[list]:
    """The Engines that ``sim.simulation.simulate`` builds meanwhile, to check the KV pool they were given."""

    built: list = []

    class Capturing(simulation.Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    with mock.patch.object(simulation, "Engine", Capturing):
        yield built


def compare(case: PrefixCase, workdir: Path) -> dict:
    """Both engines' prefix-cache hit rates on ``case``'s trace and the difference (mmsim - vLLM) in points."""
    folder = Path(workdir) / MODEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_QWEN2, indent=1))
    requests = prefix_trace(case)
    real = vllm_hit_rate(case, requests, folder)
    simulated = mmsim_hit_rate(case, requests, folder / "config.json")
    return {"case": case.__dict__, "vllm": real, "mmsim": simulated,
            "difference_pp": round(simulated["hit_rate_pct"] - real["hit_rate_pct"], 3)}
