"""Random small clusters of what ``test_engine_random`` never generates, under every built-in policy with its
parameters varied (Hypothesis): the same trust contract — each run ends by itself, loses no request without a
reason, never overfills a GPU, and fast-forward gives the per-iteration reference's times.

Beyond that test's scenarios these cover ``prefix-swap-aware``; policy parameters from their edges to their
defaults (``benefit_ratio``, ``min_residency_s``, ``recheck_s``, ``aging_tokens_per_s``, ``kv_reserve_tokens``,
``keep_weights_on_host``, ``quantum_s``, the offload thresholds); tensor- and pipeline-parallel deployments over
two to four GPUs and one or two nodes; replicas and pinned GPUs; MIG slices; partial CPU offload
(``gpu_share``); fp8 weights and KV; a deployment's own ``max_model_len``; the other hardware profiles; SLOs
per model; predicted output lengths (``output_length_error``) and every routing rule. Set
``MMSIM_RANDOM_EXAMPLES`` for a longer hunt.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from sim.catalogue import get_model
from sim.costs import ModelCosts
from sim.engine.memory import reserve_bytes, shard_fractions
from sim.engine.progress import NoProgress
from sim.errors import MmsimError
from sim.profile import load_profile
from sim.scenario import parse_scenario

from conftest import assert_same_times, simulate_within_memory, wall_clock_limit
from test_engine_random import POLICIES, RUN_LIMIT_S, chunk, engine_sections

EXAMPLES = int(os.environ.get("MMSIM_RANDOM_EXAMPLES", "100"))
EMPHASIS = os.environ.get("MMSIM_RANDOM_EMPHASIS", "")
"""A hunt's emphasis: ``pressure`` (tight memory and bursts, always), ``parallel`` (multi-GPU deployments), or
none (everything mixed)."""
SWAPPING_POLICIES = (*POLICIES[1:], "prefix-swap-aware")
MODELS = ("qwen2.5-3b", "qwen3-8b", "llama-3-8b", "mistral-7b", "qwen2.5-7b")
PROFILES = ("paper-rtx5000", "paper-a6000", "a100-80gb", "h100-sxm")
MIG_SLICES = {"1g.10gb": 3, "2g.20gb": 3, "3g.40gb": 2}
"""MIG profiles and the most slices drawn of each (as many as one GPU holds, at most three)."""
SWAP_AWARE_PARAMS = {
    "benefit_ratio": st.sampled_from([0.0, 1.0, 16.0, 1e6]),
    "min_residency_s": st.sampled_from([1e-3, 0.5, 20.0]),
    "recheck_s": st.sampled_from([1e-3, 0.3, 1.0, 10.0]),
    "aging_tokens_per_s": st.sampled_from([1e-3, 0.5, 1000.0]),
    "kv_reserve_tokens": st.sampled_from([0, 100, 4096, 100_000]),
    "keep_weights_on_host": st.booleans(),
}
POLICY_PARAMS = {
    "static": {},
    "fcfs-swap": {"min_residency_s": st.sampled_from([1e-3, 0.5, 5.0])},
    "time-slice": {"quantum_s": st.sampled_from([1e-3, 0.05, 0.5, 5.0])},
    "swap-aware": SWAP_AWARE_PARAMS,
    "prefix-swap-aware": SWAP_AWARE_PARAMS,
    "slo-aware": SWAP_AWARE_PARAMS,
    "offload-aware": {**SWAP_AWARE_PARAMS, "short_output_tokens": st.sampled_from([1, 256, 10_000]),
                      "max_slowdown": st.sampled_from([1.0, 1.4, 5.0]),
                      "min_gpu_share": st.sampled_from([0.1, 0.5, 1.0])},
}


@st.composite
def policies(draw) -> dict:
    """A built-in policy with some of its parameters drawn, the rest at their defaults."""
    name = draw(st.sampled_from(sorted(POLICY_PARAMS)))
    params = {key: draw(values) for key, values in POLICY_PARAMS[name].items() if draw(st.booleans())}
    return {"name": name, "params": params}


@st.composite
def clusters(draw) -> dict:
    """One or two nodes of up to four GPUs in all, of any profile; sometimes MIG slices, sometimes less memory."""
    profile = draw(st.sampled_from(PROFILES))
    if profile in ("a100-80gb", "h100-sxm") and not EMPHASIS and draw(st.integers(0, 3)) == 0:
        mig = draw(st.sampled_from(sorted(MIG_SLICES)))
        return {"profile": profile, "nodes": 1, "gpus_per_node": 1, "host_memory_gb": draw(st.sampled_from([1, 64])),
                "mig": {"profile": mig, "slices_per_gpu": draw(st.integers(1, MIG_SLICES[mig]))}}
    nodes = draw(st.integers(1, 2))
    per_node = [1, 2] if nodes == 2 else [1, 2, 4]
    cluster = {"profile": profile, "nodes": nodes, "gpus_per_node": draw(st.sampled_from(per_node[EMPHASIS == "parallel":])),
               "host_memory_gb": draw(st.sampled_from([0.05, 1, 64]))}
    memory_gb = draw(st.sampled_from([None, 8, 12, 18, 24, 40]))
    if memory_gb is not None:
        cluster["gpu_memory_gb"] = memory_gb
    return cluster


def parallel_shapes(cluster: dict) -> list[tuple[int, int]]:
    """(tensor_parallel, pipeline_parallel) pairs that tile the cluster's nodes (as sim.fleet.hardware requires)."""
    if "mig" in cluster:
        return [(1, 1)]
    per_node, total = cluster["gpus_per_node"], cluster["gpus_per_node"] * cluster["nodes"]
    shapes = []
    for tp in (1, 2, 4):
        for pp in (1, 2, 4):
            size = tp * pp
            if per_node % tp == 0 and size <= total and not (per_node % size if size <= per_node else size % per_node):
                shapes.append((tp, pp))
    return shapes


@st.composite
def deployments(draw, cluster: dict, policy: str) -> list[dict]:
    """One to three deployments (a catalogue model twice under an alias), each with its own shape and settings."""
    names = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3))
    gpu_count = cluster["nodes"] * cluster["gpus_per_node"] * cluster.get("mig", {}).get("slices_per_gpu", 1)
    # A GPU holds one-GPU instances or parallel ones over exactly its group, and only static places by groups: the
    # swapping policies look for room GPU by GPU, so a model whose group overlaps another shape's instances is
    # never loaded (see the report). They get one shape for all their models.
    shapes = parallel_shapes(cluster)
    if EMPHASIS == "parallel" and len(shapes) > 1:
        shapes = shapes[1:]
    if policy != "static":
        shapes = [draw(st.sampled_from(shapes))]
    entries = []
    for index, name in enumerate(names):
        entry = {"name": name} if name not in names[:index] else {"name": name, "alias": f"{name}-{index}"}
        tp, pp = draw(st.sampled_from(shapes))
        if tp > 1:
            entry["tensor_parallel"] = tp
        if pp > 1:
            entry["pipeline_parallel"] = pp
        # A deployment's gpu_share is its whole copy under every policy (offload-aware loads partial ones below it).
        if tp * pp == 1 and draw(st.integers(0, 4)) == 0:
            entry["gpu_share"] = draw(st.sampled_from([0.5, 0.75]))
        if draw(st.integers(0, 3)) == 0:
            entry["gpus"] = draw(st.lists(st.integers(0, gpu_count - 1), min_size=1, max_size=2, unique=True))
        elif draw(st.integers(0, 3)) == 0:
            entry["replicas"] = draw(st.integers(1, 2))
        if draw(st.booleans()):
            entry["kv_dtype"] = "fp8"
        if draw(st.integers(0, 3)) == 0:
            entry["dtype"] = "fp8"
        if draw(st.integers(0, 3)) == 0:
            entry["max_model_len"] = draw(st.sampled_from([64, 700, 4096]))
        entries.append(entry)
    return entries


@st.composite
def slos(draw, names: list[str]) -> dict:
    """A default SLO (TTFT, maybe TPOT), and for some models their own."""
    def slo():
        bounds = {"ttft_s": draw(st.sampled_from([0.2, 2.0, 30.0]))}
        if draw(st.booleans()):
            bounds["tpot_s"] = draw(st.sampled_from([0.01, 0.1, 1.0]))
        return bounds

    return {"default": slo(), **{name: slo() for name in names if draw(st.integers(0, 2)) == 0}}


def per_gpu_bytes(profile: str, entry: dict, engine: dict, tokens: int) -> tuple[int, int]:
    """(weights + reserve, KV of ``tokens`` tokens in whole blocks) that an instance of ``entry`` takes on each GPU."""
    spec = get_model(entry["name"])
    tp, pp = entry.get("tensor_parallel", 1), entry.get("pipeline_parallel", 1)
    costs = ModelCosts(load_profile(profile), spec, entry.get("dtype", "fp16"), entry.get("kv_dtype"), tp, pp)
    weights, kv = shard_fractions(spec, tp, pp)
    footprint = (int(costs.gpu_weight_bytes(entry.get("gpu_share", 1.0)) * weights)
                 + reserve_bytes(spec, engine["max_num_batched_tokens"], engine["max_num_seqs"], tp))
    block = engine["block_size"]
    return footprint, int(-(-tokens // block) * block * costs.kv_bytes_per_token * kv)


def tight_memory_gb(draw, profile: str, models: list[dict], rows, engine: dict) -> float:
    """GPU memory for the largest model alone, or for all of them together, with KV room beside them from a third
    of the longest request's to a few GB more: loads, unloads and preemption under KV pressure."""
    longest = max(prompt + output + 1 for _, _, prompt, output, _ in rows)
    sizes = [per_gpu_bytes(profile, m, engine, longest) for m in models]
    weights = sum(f for f, _ in sizes) if draw(st.booleans()) else max(f for f, _ in sizes)
    # Less room than the longest request needs makes the others preempt each other as their outputs grow (and
    # leaves that one too long for its deployment: dropped at arrival, as it should be).
    room = max(kv for _, kv in sizes) * draw(st.sampled_from([0.3, 0.6, 1.0])) + draw(st.sampled_from([0, 2**20, 2**28, 2**31]))
    return (weights + room) / engine["gpu_memory_utilization"] / 2**30


@st.composite
def cases(draw):
    cluster = draw(clusters())
    policy = draw(policies())
    models = draw(deployments(cluster, policy["name"]))
    names = [m.get("alias") or m["name"] for m in models]
    engine = draw(engine_sections()) | {"gpu_memory_utilization": draw(st.sampled_from([0.5, 0.9]))}
    rows = draw(st.lists(st.tuples(st.integers(0, draw(st.sampled_from([0, 20] if EMPHASIS == "pressure" else [0, 20, 100, 500]))).map(lambda centis: centis / 100),
                                   st.sampled_from(names),
                                   st.one_of(st.integers(1, 600), st.integers(600, 20_000)),
                                   st.one_of(st.integers(1, 3), st.integers(1, 600)),
                                   st.one_of(st.just(()), st.tuples(st.integers(0, 1), st.lists(st.integers(0, 1), max_size=6))
                                             .map(lambda ids: (ids[0], *ids[1])))),
                         min_size=8 if EMPHASIS == "pressure" else draw(st.sampled_from([1, 4, 8])), max_size=24))
    profile = cluster.pop("profile")
    if policy["name"] == "offload-aware" or any("gpu_share" in m for m in models):
        cluster["host_memory_gb"] = 512  # layers kept on the CPU live in host RAM: room for every copy a node holds
    if "mig" not in cluster and (EMPHASIS == "pressure" or draw(st.booleans())):
        cluster["gpu_memory_gb"] = tight_memory_gb(draw, profile, models, rows, engine)
    data = {
        "name": "random-more", "seed": 1, "profile": profile, "cluster": cluster, "models": models,
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {name: 1.0 for name in names}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}},
                     "output_length_error": draw(st.sampled_from([0.0, 0.3, 1.0])),
                     "prefix_block_tokens": draw(st.sampled_from([8, 64, 512]))},
        "slo": draw(slos(names)),
        "engine": engine,
        "routing": {"rule": draw(st.sampled_from(["least-loaded", "round-robin", "prefix-aware"]))},
        "policy": policy,
    }
    return parse_scenario(data, "random-more"), rows


def run(scenario, rows, mode: str):
    """The scenario under its own policy and parameters; a ``max_model_len`` longer than fits is the scenario's
    error (mmsim refuses it as vLLM refuses to start), so such a draw is rejected."""
    try:
        return simulate_within_memory(scenario, chunk(rows), None, mode)
    except MmsimError as error:
        if "max_model_len" in str(error) and "KV room" in str(error):
            reject()
        raise


def describe(scenario, result) -> None:
    """What an example exercised, for ``--hypothesis-show-statistics``: its policy, and which mechanisms acted."""
    event(f"policy {scenario.policy.name}")
    if result is None:
        event("stopped by the progress guard")
        return
    kinds = set(result.events["kind"])
    for kind in ("preempt_recompute", "preempt_swap", "unload", "load"):
        event(f"{kind} {'seen' if any(k.startswith(kind) for k in kinds) else 'not seen'}")
    completed = result.summary["requests_completed"]
    event(f"completed {'none' if completed == 0 else 'some'}")


def swaps_whatever_it_costs(scenario) -> bool:
    """A swapping policy told that any swap pays (``benefit_ratio`` of 1 or less), or time-slice on a quantum
    shorter than its default: two models with work evict each other every ``min_residency_s`` or quantum, and when
    that is shorter than their prompts' prefills neither finishes one. That loop is the parameters' (a design limit
    of the rules, not a bug); the progress guard must stop it."""
    params = scenario.policy.params
    return params.get("benefit_ratio", 16.0) <= 1.0 or params.get("quantum_s", 5.0) < 5.0


def pinned_together(scenario) -> bool:
    """Whether two deployments pin a GPU in common: static loads them there whatever KV room they leave each other
    (each one's max_model_len is what fits beside it alone), so a request may wait there for good. A pin of a
    deployment spanning S GPUs stands for the aligned group of S holding it (``gpus: [1]`` at PP4 is GPUs 0-3)."""
    pins = []
    for m in scenario.models:
        size = m.tensor_parallel * m.pipeline_parallel
        pins.extend({gpu for index in m.gpus or [] for gpu in range(index - index % size, index - index % size + size)})
    return len(pins) > len(set(pins))


def check_case(scenario, rows):
    """Both modes' runs of one case hold the contract; returns the fast-forward run (None when the progress guard
    stopped a policy told to swap whatever it costs, in both modes alike)."""
    policy = scenario.policy.name
    with wall_clock_limit(RUN_LIMIT_S):
        try:
            fast = run(scenario, rows, "fast")
        except NoProgress as stopped:
            if not swaps_whatever_it_costs(scenario):
                raise
            try:
                run(scenario, rows, "exact")
            except NoProgress as also:
                assert str(also) == str(stopped)
                return None
            raise AssertionError("the progress guard stopped only the fast-forward run") from stopped
        exact = run(scenario, rows, "exact")
    summary = fast.summary
    assert summary["requests_completed"] + summary["requests_dropped"] == len(rows)
    frame = fast.requests.set_index("id").sort_index()
    reasons = set(frame.loc[frame["status"] == "dropped", "drop_reason"])
    # As in test_engine_random: a swapping policy serves every request that fits its deployment.
    unavoidable = {"exceeds_max_model_len", "model_exceeds_gpu"} | ({"not_placed"} if policy == "static" else set())
    if policy == "static" and pinned_together(scenario):  # beside a neighbour that stays: refused, not queued
        unavoidable.add("exceeds_instance_max_model_len")
    assert reasons <= unavoidable, (policy, reasons)
    reference = exact.requests.set_index("id").sort_index()
    assert (frame["status"] == reference["status"]).all()
    assert (frame["cached_prompt_tokens"] == reference["cached_prompt_tokens"]).all()
    assert_same_times(frame, reference, columns=("first_scheduled_s", "first_token_s", "finish_s"), label=policy)
    return fast


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                        HealthCheck.filter_too_much])
@given(case=cases())
def test_more_random_runs_end_account_for_every_request_and_agree_across_modes(case):
    describe(case[0], check_case(*case))


def small_scenario(models: list[dict], engine: dict, **sections) -> object:
    """A scenario of ``models`` on the sections given, for the regression tests below (the generator's shape)."""
    names = [m.get("alias") or m["name"] for m in models]
    return parse_scenario({
        "name": "regression", "seed": 1, "models": models,
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {name: 1.0 for name in names}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}}, "prefix_block_tokens": 64},
        "slo": {"default": {"ttft_s": 2.0}}, "engine": engine, **sections}, "regression")


def test_prefix_aware_routing_reads_a_fast_forwarding_instance_at_the_arrival():
    """Found by the hunt above: with two replicas behind prefix-aware routing, a request arrived while one of them
    fast-forwarded a decode; the router scored that instance's free KV as it stood at the window's start, and
    sent the request to the idle replica, where per-iteration mode sent it to the busy one that had its prefix
    cached (64 cached tokens against none, and other times)."""
    scenario = small_scenario(
        [{"name": "qwen2.5-3b", "gpu_share": 0.75}],
        {"max_num_seqs": 1, "max_num_batched_tokens": 4096, "block_size": 8, "chunked_prefill": False,
         "gpu_memory_utilization": 0.5},
        profile="a100-80gb", cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 11.015908241271973},
        routing={"rule": "prefix-aware"}, policy={"name": "static"})
    rows = [(1.79, "qwen2.5-3b", 3696, 3, (1, 0, 1, 1, 1, 1)), (1.95, "qwen2.5-3b", 8592, 255, (0, 1, 1)),
            (3.86, "qwen2.5-3b", 612, 1, (0,))]
    fast = check_case(scenario, rows).requests.set_index("id").sort_index()
    assert list(fast["gpu"]) == [0, 0, 0] and list(fast["cached_prompt_tokens"]) == [0, 0, 64]


def test_requests_of_an_unloaded_replica_go_to_their_models_other_replica():
    """Found by the hunt above: fcfs-swap evicted one of llama-3-8b's two pinned replicas for qwen2.5-3b; the
    request decoding there went back to llama-3-8b's pending queue, and stayed there to the end (dropped), since
    the policy only brings in absent models and the other replica was never asked to take it."""
    scenario = small_scenario(
        [{"name": "llama-3-8b", "gpus": [0, 1], "max_model_len": 4096}, {"name": "qwen2.5-3b"}],
        {"max_num_seqs": 2, "max_num_batched_tokens": 1024, "gpu_memory_utilization": 0.5, "prefix_caching": False},
        profile="paper-a6000", cluster={"nodes": 2, "gpus_per_node": 1, "gpu_memory_gb": 36.76462173461914},
        policy={"name": "fcfs-swap"})
    rows = [(3.68, "llama-3-8b", 2187, 512, ()), (1.72, "llama-3-8b", 156, 511, ()), (2.5, "qwen2.5-3b", 3604, 159, ()),
            (2.44, "llama-3-8b", 19, 541, ())]
    fast = check_case(scenario, rows).requests.set_index("id").sort_index()
    assert (fast["status"] == "completed").all() and list(fast["gpu"]) == [0, 1, 0, 1]


def test_the_progress_guard_stops_models_evicting_each_other_before_any_prompt_completes():
    """Found by the hunt above: swap-aware told that every swap pays (benefit_ratio 0) swapped two models in and out
    every 0.5 s, each residency too short to finish a 2,393- or 6,023-token prompt in 256-token chunks, so the
    chunks were recomputed for ever. Each chunk counted as progress, so the guard never fired: the run went on
    without end. Now a chunk is progress only where it takes its prompt further than any prefill of it got. (Since
    fp8 is priced from the profile's fp16 entry, the fp8 deployment is the one loaded and unloaded for ever.)"""
    scenario = small_scenario(
        [{"name": "qwen3-8b", "dtype": "fp8"}, {"name": "qwen3-8b", "alias": "qwen3-8b-1"}],
        {"max_num_seqs": 1, "max_num_batched_tokens": 256, "block_size": 8, "gpu_memory_utilization": 0.5,
         "prefix_caching": False},
        cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 33.88741207122803},
        policy={"name": "swap-aware", "params": {"benefit_ratio": 0.0, "min_residency_s": 0.5}})
    rows = [(0.13, "qwen3-8b-1", 2393, 452, ()), (0.19, "qwen3-8b", 6023, 102, ()), (0.13, "qwen3-8b", 170, 300, ())]
    for mode in ("fast", "exact"):
        with wall_clock_limit(RUN_LIMIT_S), pytest.raises(NoProgress, match="over and over|evict each other"):
            run(scenario, rows, mode)


def test_static_loads_one_tensor_parallel_instance_for_two_pinned_gpus_of_its_group():
    """Found by the hunt above: a TP2 deployment pinned to ``gpus: [0, 1]`` got two instances over the same two
    GPUs, one per index; the second took the KV room of the first, whose requests then waited to the end
    (dropped as not_scheduled)."""
    scenario = small_scenario(
        [{"name": "qwen3-8b", "dtype": "fp8", "kv_dtype": "fp8", "tensor_parallel": 2, "gpus": [0, 1]}],
        {"max_num_seqs": 2, "max_num_batched_tokens": 1024, "block_size": 8, "prefix_caching": False},
        profile="paper-a6000", cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 9.156383726331923},
        policy={"name": "static"})
    rows = [(0.0, "qwen3-8b", 4909, 2, ()), (0.0, "qwen3-8b", 369, 526, ()), (0.0, "qwen3-8b", 600, 1, ())]
    fast = check_case(scenario, rows)
    assert fast.summary["loads"] == 1 and (fast.requests["status"] == "completed").all()


def test_pins_at_two_indices_of_one_aligned_group_count_as_pinned_together():
    """Found by a 6,000-example hunt: ``gpus: [0]`` and ``gpus: [1]`` at pipeline_parallel 4 both stand for GPUs
    0-3, so static loads both deployments there and a 6,069-token prompt of one finds too little KV room beside
    the other: refused there (it waited to the end of the run, dropped as not_scheduled, before instances under
    static placement sized max_model_len beside their neighbours). The hunt's classifier compared the pinned
    indices alone and took the documented limit for a defect."""
    models = [{"name": "qwen2.5-7b", "dtype": "fp16", "pipeline_parallel": 2},
              {"name": "qwen3-8b", "dtype": "fp16", "gpus": [0], "pipeline_parallel": 4},
              {"name": "mistral-7b", "dtype": "fp16", "gpus": [1], "pipeline_parallel": 4}]
    engine = {"max_num_seqs": 1, "max_num_batched_tokens": 256, "block_size": 8, "chunked_prefill": False,
              "gpu_memory_utilization": 0.5, "preemption_mode": "recompute", "prefix_caching": False}
    cluster = {"nodes": 1, "gpus_per_node": 4, "host_memory_gb": 0.05, "gpu_memory_gb": 15.288130760192871}
    scenario = small_scenario(models, engine, profile="paper-rtx5000", cluster=cluster, policy={"name": "static"})
    assert pinned_together(scenario)
    apart = small_scenario([dict(models[1], pipeline_parallel=1), dict(models[2], pipeline_parallel=1)], engine,
                           profile="paper-rtx5000", cluster=cluster, policy={"name": "static"})
    assert not pinned_together(apart)
    fast = check_case(scenario, [(0.0, "qwen2.5-7b", 1, 1, ())] * 15 + [(0.0, "qwen3-8b", 6069, 3, ())])
    assert fast.requests["drop_reason"].astype(str).tolist() == ["not_placed"] * 15 + ["exceeds_instance_max_model_len"]


def test_a_preemption_wakes_an_instance_passed_over_earlier_in_the_same_planning_round():
    """Found by a 4,000-example hunt (pressure): two copies of qwen2.5-3b share one GPU. The pinned copy's
    1,175-token prompt filled the KV room; the other copy, asked first at the next step boundary, found no block
    for its waiting request and was passed over as blocked; then the pinned copy's plan preempted its own request
    (recompute) for want of a block, freeing 147 of them. Nobody asked the other copy again: the GPU idled, both
    requests waited to the end of the run and were dropped as not_scheduled under a swapping policy. Now the
    preemption's freed blocks wake it: it runs its request at once, the policy then unloads it, and the pinned
    copy's prompt is served."""
    models = [{"name": "qwen2.5-3b", "dtype": "fp16", "kv_dtype": "fp8", "replicas": 1},
              {"name": "qwen2.5-3b", "alias": "qwen2.5-3b-1", "dtype": "fp16", "kv_dtype": "fp8", "gpus": [0]}]
    engine = {"max_num_seqs": 1, "max_num_batched_tokens": 256, "block_size": 8, "chunked_prefill": False,
              "gpu_memory_utilization": 0.9, "preemption_mode": "recompute", "prefix_caching": False}
    scenario = small_scenario(models, engine, profile="paper-rtx5000",
                              cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 0.05,
                                       "gpu_memory_gb": 13.286559846666124},
                              policy={"name": "offload-aware", "params": {
                                  "aging_tokens_per_s": 0.001, "kv_reserve_tokens": 0, "keep_weights_on_host": False,
                                  "max_slowdown": 1.0}})
    rows = ([(0.0, "qwen2.5-3b", 1, 1, ())] * 12 + [(0.0, "qwen2.5-3b", 1, 114, ())] * 2
            + [(0.0, "qwen2.5-3b-1", 1175, 2, ())])
    fast = check_case(scenario, rows)
    frame = fast.requests.set_index("id").sort_index()
    assert (frame["status"] == "completed").all()
    preempted_at = float(fast.events.loc[fast.events["kind"] == "preempt_recompute", "time_s"].iloc[0])
    assert frame.loc[13, "first_scheduled_s"] == pytest.approx(preempted_at, abs=1e-12)  # at once, not at the end
