"""Time-shared runs: co-resident instances' decode iterations fast-forwarded in their round-robin order.

Step costs are set by hand (decode: ``base + per_seq * batch + per_token * context`` per model; any step with
a prefill chunk: half a second), so that every iteration's end and every request's finish is a sum written
out here, apart from the engine's closed forms; both modes must give those times, and fast mode must get
them from fewer steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.catalogue import get_model
from sim.costs import ModelCosts, StepCoefficients
from sim.engine import build, timeshare
from sim.engine.gpu import Gpu
from sim.engine.memory import reserve_bytes
from sim.policies import Policy
from sim.policies.base import QueueOrder, sort_queue
from sim.profile import load_profile
from sim.scenario import parse_scenario, read_yaml
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import REPO, assert_same_times, scenario_dict

SMALL, LARGE = "qwen2.5-3b", "mistral-7b"
BASE_S = {SMALL: 0.010, LARGE: 0.020}
PER_SEQ_S = {SMALL: 0.001, LARGE: 0.002}
PER_TOKEN_S = {SMALL: 1e-5, LARGE: 2e-5}
PREFILL_S = 0.5
BUDGET, MAX_SEQS = 2048, 8


def decode_s(model: str, batch: int, context: int) -> float:
    """One decode iteration of ``batch`` sequences holding ``context`` tokens in all, by hand."""
    return BASE_S[model] + PER_SEQ_S[model] * batch + PER_TOKEN_S[model] * context


def a(context: int, batch: int = 1) -> float:
    return decode_s(SMALL, batch, context)


def b(context: int, batch: int = 1) -> float:
    return decode_s(LARGE, batch, context)


@pytest.fixture
def hand_costs(monkeypatch):
    """The engine's step costs replaced by the ones above (catalogue models of the aliases share theirs)."""
    def step_coefficients(self, batch, gpu_share=1.0):
        name = self.spec.name
        return StepCoefficients(BASE_S[name] + PER_SEQ_S[name] * batch, PER_TOKEN_S[name])

    def mixed_step_s(self, batch, context_tokens, prefill_tokens, prefill_quadratic, prefills, gpu_share=1.0):
        return PREFILL_S if prefills else step_coefficients(self, batch).step_s(context_tokens)

    monkeypatch.setattr(ModelCosts, "step_coefficients", step_coefficients)
    monkeypatch.setattr(ModelCosts, "mixed_step_s", mixed_step_s)


class CoResident(Policy):
    """Test policy: every model loaded on GPU 0 at time 0, in the scenario's order (the GPU's round-robin
    order); ``unload_at_s`` unloads the ``unload_model``-th (swapping its KV out), which (with ``reload``) is
    loaded again at once and takes its requests back. At each of ``probe_at_s`` it records, synced, what
    each instance and the GPU have done. Keeps the engine for the test to read."""

    name = "co-resident"
    engine = None
    probes: list = []

    @classmethod
    def param_defaults(cls) -> dict:
        return {"unload_at_s": None, "unload_model": 1, "reload": True, "probe_at_s": ()}

    def setup(self, view) -> None:
        CoResident.engine = view._engine
        CoResident.probes = []
        for model in range(len(view.model_names)):
            view.load(model, view.gpus[0])
        if self.unload_at_s is not None:
            view.call_at(self.unload_at_s, self.unload)
        for at in self.probe_at_s:
            view.call_at(at, self.probe)

    def unload(self, view) -> None:
        view.unload(view.instances_of(self.unload_model, ready_only=True)[0], mode="swap")

    def probe(self, view) -> None:
        gpu = view.gpus[0]
        view.sync(gpu)
        engine = view._engine
        CoResident.probes.append(([(i.busy_s, i.last_used_s, i.iteration, i.context_tokens, i.blocks)
                                   for i in engine.instances], gpu.busy_s, gpu._turn, engine.last_progress_s,
                                  gpu.in_flight_bytes()))

    def on_unloaded(self, instance, view) -> None:
        if self.reload:
            view.load(instance.model, view.gpus[0])

    def on_instance_ready(self, instance, view) -> None:
        for request in view.pending(instance.model):
            view.assign(request, instance)


@pytest.fixture
def co_resident(monkeypatch):
    import sim.policies.registry as registry

    monkeypatch.setitem(registry._REGISTRY, "co-resident", CoResident)


class Counts:
    """GPU steps ended, time-shared runs started (by their member count) and runs cut short, per mode."""

    def __init__(self, monkeypatch):
        self.steps = 0
        self.runs: list[int] = []
        self.cuts = 0
        step_done, start_run, cut_window = Gpu._step_done, timeshare.start_run, Gpu.cut_window

        def counted_step_done(gpu, now):
            self.steps += 1
            step_done(gpu, now)

        def counted_start_run(*args):
            run = start_run(*args)
            if run is not None:
                self.runs.append(len(run.members))
            return run

        def counted_cut_window(gpu):
            self.cuts += gpu.run is not None
            cut_window(gpu)

        monkeypatch.setattr(Gpu, "_step_done", counted_step_done)
        monkeypatch.setattr("sim.engine.gpu.start_run", counted_start_run)
        monkeypatch.setattr(Gpu, "cut_window", counted_cut_window)

    def reset(self) -> None:
        self.steps, self.runs, self.cuts = 0, [], 0


@pytest.fixture
def counts(monkeypatch):
    if build() == "compiled":
        pytest.skip("counts steps by patching the engine's methods: pure Python only")
    return Counts(monkeypatch)


def co_resident_scenario(models=(SMALL, LARGE), preemption_mode="recompute", policy="co-resident", **params):
    entries = [{"name": m} if m in BASE_S else {"name": SMALL, "alias": m} for m in models]
    return parse_scenario(scenario_dict(
        models=entries, cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 48, "host_memory_gb": 64},
        engine={"max_num_seqs": MAX_SEQS, "max_num_batched_tokens": BUDGET, "block_size": 16,
                "prefix_caching": False, "preemption_mode": preemption_mode},
        policy={"name": policy, "params": params}, sample_interval_s=0.05), "test")


def chunk(rows) -> list[RequestChunk]:
    """Requests as (arrival s, model, prompt tokens, output tokens)."""
    arrival, model, prompt, output = zip(*rows)
    return [RequestChunk(np.array(arrival, float), np.array(model, object), np.array(prompt), np.array(output))]


def both_modes(scenario, rows, counts):
    results = {}
    for mode in ("exact", "fast"):
        counts.reset()
        results[mode] = simulate(scenario, chunks=chunk(rows), mode=mode)
        results[mode].counts = (counts.steps, list(counts.runs), counts.cuts)
        results[mode].engine = CoResident.engine
        results[mode].probes = CoResident.probes
    fast, exact = (results[m].requests.set_index("id").sort_index() for m in ("fast", "exact"))
    assert (fast["status"] == exact["status"]).all() and (fast["preemptions"] == exact["preemptions"]).all()
    assert_same_times(fast, exact, ("first_scheduled_s", "first_token_s", "finish_s"))
    return results["fast"], results["exact"]


def finish_times(result) -> dict[int, tuple[float, float]]:
    frame = result.requests.set_index("id")
    return {rid: (frame.loc[rid, "first_token_s"], frame.loc[rid, "finish_s"]) for rid in frame.index}


def test_two_instances_take_turns_in_one_run_with_hand_computed_times(hand_costs, co_resident, counts):
    # A (small: 100-token prompt, 5 tokens out) and B (large: 200, 8) on one GPU. Prefills take half a second
    # each: A's at 100.0, B's (queued at 100.2) at 100.5. From 101.0 the two decode in turn, the small model
    # first (B's prefill took the turn before): A's 4 decodes, the last of which finishes A, interleaved with
    # B's first 3; then B alone for its last 4 decodes.
    rows = [(100.0, SMALL, 100, 5), (100.2, LARGE, 200, 8)]
    fast, exact = both_modes(co_resident_scenario(), rows, counts)
    turns = [a(101), b(201), a(102), b(202), a(103), b(203), a(104), b(204), b(205), b(206), b(207)]
    ends = 101.0 + np.cumsum(turns)
    for result in (fast, exact):
        times = finish_times(result)
        assert times[0] == pytest.approx((100.5, ends[6]), rel=1e-12, abs=0)
        assert times[1] == pytest.approx((101.0, ends[10]), rel=1e-12, abs=0)
        engine = result.engine
        small, large = engine.instances
        assert small.busy_s == pytest.approx(PREFILL_S + sum(turns[0:7:2]), rel=1e-12)
        assert large.busy_s == pytest.approx(PREFILL_S + sum(turns[1:7:2]) + sum(turns[7:]), rel=1e-12)
        assert engine.gpus[0].busy_s == pytest.approx(2 * PREFILL_S + sum(turns), rel=1e-12)
        assert small.last_used_s == pytest.approx(ends[6], rel=1e-12)
        assert large.last_used_s == pytest.approx(ends[10], rel=1e-12)
    # Exact: 2 prefill steps and 11 decode steps. Fast: the 7 decodes up to A's finish are one run, B's last
    # 4 one window; the samples every 0.05 s sync the run in between without ending it.
    assert exact.counts[0] == 13
    assert fast.counts == (4, [2], 0)
    busy = [r.timeseries.set_index(["time_s", "gpu"])["busy_share"] for r in (fast, exact)]
    assert np.allclose(busy[0].to_numpy(), busy[1].to_numpy(), rtol=1e-9, atol=1e-12)


def test_an_arrival_that_can_join_cuts_the_run_at_the_next_boundary(hand_costs, co_resident, counts):
    # As above, and C (small: 50 tokens, 3 out) arrives during A's second decode. The run ends with that
    # iteration; B decodes once more, then the small model's next turn is A's decode with C's prefill (half a
    # second); then both models' batches decode in turn, the small one of two sequences, until A finishes,
    # and C after one more turn; B ends alone.
    ends_before = 101.0 + np.cumsum([a(101), b(201), a(102)])
    rows = [(100.0, SMALL, 100, 5), (100.2, LARGE, 200, 8), ((ends_before[1] + ends_before[2]) / 2, SMALL, 50, 3)]
    fast, exact = both_modes(co_resident_scenario(), rows, counts)
    turns = [a(101), b(201), a(102), b(202), PREFILL_S, b(203), a(104 + 51, batch=2), b(204), a(52), b(205), b(206),
             b(207)]
    ends = 101.0 + np.cumsum(turns)
    for result in (fast, exact):
        times = finish_times(result)
        assert times[0] == pytest.approx((100.5, ends[6]), rel=1e-12, abs=0)
        assert times[1] == pytest.approx((101.0, ends[11]), rel=1e-12, abs=0)
        assert times[2] == pytest.approx((ends[4], ends[8]), rel=1e-12, abs=0)
        assert result.requests.set_index("id").loc[2, "first_scheduled_s"] == pytest.approx(ends[3], rel=1e-12)
    # Fast: the two prefills; the run from 101.0, cut; B's decode after the cut; the prefill step; a run of B's
    # decode and the two-sequence one (A finishes); B's and C's last decodes as a run; B's last three as a window.
    assert fast.counts == (8, [2, 2, 2], 1)
    assert exact.counts[0] == 14


@pytest.mark.parametrize("during", ["its own iteration", "the other's iteration"])
def test_unloading_a_member_mid_run_cuts_it_where_exact_mode_does(hand_costs, co_resident, counts, during):
    # B's model is unloaded mid-run (its KV swapped out); it loads again and takes B back. When the unload comes
    # during B's own iteration it waits for that iteration's end; during A's, B is drained at once.
    rows = [(100.0, SMALL, 100, 40), (100.2, LARGE, 200, 30)]
    ends = 101.0 + np.cumsum([a(101), b(201), a(102), b(202), a(103)])
    at = (ends[2] + ends[3]) / 2 if during == "its own iteration" else (ends[3] + ends[4]) / 2
    fast, exact = both_modes(co_resident_scenario(unload_at_s=at), rows, counts)
    assert fast.counts[2] >= 1 and fast.counts[0] < exact.counts[0] / 3
    events = [r.events for r in (fast, exact)]
    assert list(events[0]["kind"]) == list(events[1]["kind"])
    assert "preempt_swap" in set(events[0]["kind"]) and "unload" in set(events[0]["kind"])
    assert np.allclose(events[0]["time_s"], events[1]["time_s"], rtol=1e-12)
    unload = events[1].loc[events[1]["kind"] == "unload", "time_s"].iloc[0]
    assert unload == pytest.approx(ends[3] if during == "its own iteration" else at, rel=1e-12)


def block_bytes(model: str) -> int:
    return ModelCosts(load_profile("paper-rtx5000"), get_model(model)).kv_bytes_per_token * 16


def kv_room(monkeypatch, models, blocks: dict[str, int], free_bytes: int):
    """GPU 0 sized for the weights and reserves of ``models`` (catalogue names, one per instance), ``blocks``
    KV blocks of each catalogue model, and ``free_bytes``."""
    from sim import simulation

    build_hardware = simulation.build_hardware
    profile = load_profile("paper-rtx5000")

    def sized(env, scenario, layouts):
        gpus, nodes = build_hardware(env, scenario, layouts)
        footprint = sum(ModelCosts(profile, get_model(m)).gpu_weight_bytes(1.0)
                        + reserve_bytes(get_model(m), BUDGET, MAX_SEQS) for m in models)
        held = sum(count * block_bytes(m) for m, count in blocks.items())
        gpus[0].capacity_bytes = footprint + held + free_bytes
        return gpus, nodes

    monkeypatch.setattr(simulation, "build_hardware", sized)


def test_kv_room_runs_out_across_members_where_exact_mode_preempts(hand_costs, co_resident, counts, monkeypatch):
    # A (100 + 1 tokens: 7 blocks of 16) and B (200 + 1: 13 blocks) leave room for one block of B and a third of
    # one of A. B's 8th decode (the run's 16th iteration) takes that block of B; A's 12th (the 23rd) needs a
    # block that is no longer free, though A's own blocks alone would fit: A preempts itself there, by recompute.
    kv_room(monkeypatch, (SMALL, LARGE), {SMALL: 7, LARGE: 13}, block_bytes(LARGE) + block_bytes(SMALL) // 3)
    rows = [(100.0, SMALL, 100, 30), (100.2, LARGE, 200, 40)]
    fast, exact = both_modes(co_resident_scenario(), rows, counts)
    preempted = 101.0 + sum(a(101 + k) for k in range(11)) + sum(b(201 + k) for k in range(11))
    for result in (fast, exact):
        events = result.events
        first = events[events["kind"].str.startswith("preempt")].iloc[0]
        assert (first["kind"], first["request_id"]) == ("preempt_recompute", 0)
        assert first["time_s"] == pytest.approx(preempted, rel=1e-12)
    assert fast.counts[1][0] == 2 and fast.counts[0] < exact.counts[0] / 2


def test_four_co_resident_instances_run_in_turn(hand_costs, co_resident, counts):
    models = (SMALL, "small-b", "small-c", "small-d")
    rng = np.random.default_rng(5)
    rows = [(100.0 + 0.1 * k, models[k % 4], int(rng.integers(50, 400)), int(rng.integers(5, 60))) for k in range(16)]
    fast, exact = both_modes(co_resident_scenario(models), rows, counts)
    assert 4 in fast.counts[1] and fast.counts[0] < exact.counts[0] / 3


@pytest.mark.parametrize(("policy", "most"), [("swap-aware", 3_000), ("fcfs-swap", 3_000), ("slo-aware", 16_000)])
def test_mixed_scenario_takes_fewer_steps(counts, policy, most):
    # Before time-shared runs: 41,087 steps (swap-aware), 31,815 (fcfs-swap) and 45,067 (slo-aware) for the 1,350
    # requests; 22,212, 2,596 and 24,945 with them, before windows ran past boundaries at which a sorted queue's
    # head (swap-aware) or every waiting request (slo-aware) could not start: 8,799 and 14,338; 2,752 for
    # swap-aware once runs too asked only its sorted queue's head of each co-resident instance.
    path = REPO / "scenarios" / "mixed.yaml"
    result = simulate(parse_scenario(read_yaml(path), str(path)), base_dir=path.parent, policy=policy)
    assert result.summary["requests_total"] == 1350
    assert counts.steps < most


def test_a_sync_mid_run_sees_what_exact_mode_has_done(hand_costs, co_resident, counts):
    # Probed (synced) during B's third decode, the run's sixth iteration: A has done 3 decodes and B 2, the
    # small model's turn came last, and its next iteration's KV is in flight; what each has done is what those
    # iterations' ends would have recorded.
    rows = [(100.0, SMALL, 100, 5), (100.2, LARGE, 200, 8)]
    turns = [a(101), b(201), a(102), b(202), a(103), b(203)]
    ends = 101.0 + np.cumsum(turns)
    fast, exact = both_modes(co_resident_scenario(probe_at_s=[(ends[4] + ends[5]) / 2]), rows, counts)
    assert fast.counts[1] == [2]
    for result in (fast, exact):
        [(instances, gpu_busy, turn, progress, in_flight)] = result.probes
        (small_busy, small_used, small_iteration, small_context, _), (large_busy, large_used, large_iteration, _, _) = instances
        assert (small_iteration, small_context, large_iteration, turn, in_flight) == (3 + 1, 104, 2 + 1, 1, 0)
        assert small_busy == pytest.approx(PREFILL_S + turns[0] + turns[2] + turns[4], rel=1e-12)
        assert large_busy == pytest.approx(PREFILL_S + turns[1] + turns[3], rel=1e-12)
        assert gpu_busy == pytest.approx(2 * PREFILL_S + sum(turns[:5]), rel=1e-12)
        assert (small_used, large_used, progress) == pytest.approx((ends[4], ends[3], ends[4]), rel=1e-12)
    assert np.allclose(np.array(fast.probes[0][0]), np.array(exact.probes[0][0]), rtol=1e-12, atol=0)


@pytest.mark.parametrize("prompt", [500, 20_000])
def test_an_idle_instance_given_work_cuts_the_run(hand_costs, co_resident, counts, monkeypatch, prompt):
    # A third deployment, idle, gets a request. It joins the round robin at the next boundary, and its request
    # starts at its first turn, which the run must not pass. One whose prompt never finds KV room cannot start,
    # but the GPU's round robin tries its instance at every boundary (exact mode) and passes over it (moving
    # on by one in the list without it: the large model then takes every turn until its batch is done), which
    # changes whose turn comes next: the run must end all the same.
    kv_room(monkeypatch, (SMALL, LARGE, SMALL), {SMALL: 7, LARGE: 13}, 64 * 2**20)
    rows = [(100.0, SMALL, 100, 30), (100.2, LARGE, 200, 40), (101.05, "small-b", prompt, 5)]
    fast, exact = both_modes(co_resident_scenario((SMALL, LARGE, "small-b")), rows, counts)
    assert fast.counts[1][0] == 2 and fast.counts[2] >= 1
    reason = list(fast.requests.set_index("id").sort_index()["drop_reason"])[2]
    assert reason == ("" if prompt == 500 else "not_scheduled")  # the long one never fits


def test_a_swapped_request_comes_back_at_its_instance_turn(hand_costs, co_resident, counts, monkeypatch):
    # KV room runs short: the small model swaps its younger request out. When its other request finishes, the
    # room is back; the large model's turn comes first, but the run it starts must end before the small
    # model's next turn, which brings the swapped request back.
    kv_room(monkeypatch, (SMALL, LARGE), {SMALL: 14, LARGE: 13}, 3 * block_bytes(LARGE))
    rows = [(100.0, SMALL, 100, 60), (100.1, SMALL, 100, 200), (100.2, LARGE, 200, 300)]
    fast, exact = both_modes(co_resident_scenario(preemption_mode="swap"), rows, counts)
    events = exact.events
    swapped = events.loc[events["kind"] == "preempt_swap", "request_id"]
    assert list(swapped)[:1] == [1] and "swap_in" in set(events["kind"])
    assert fast.counts[0] < exact.counts[0] / 3


def test_kv_freed_by_an_unload_reaches_the_instance_running_next(hand_costs, co_resident, counts, monkeypatch):
    # C's long prompt has no KV room while B holds its blocks. B's model is unloaded during B's own iteration:
    # the unload waits for it, the small model's next step starts at its end (fast-forwarded: B is no longer
    # active), and then B's KV is freed, room C starts in at the small model's next boundary.
    kv_room(monkeypatch, (SMALL, LARGE), {SMALL: 7, LARGE: 126}, 60 * 2**20)
    rows = [(100.0, SMALL, 100, 200), (100.2, LARGE, 2000, 300), (101.5, SMALL, 3000, 5)]
    at = 102.0 + b(2001) / 2  # B decodes from 101.0 at about 0.06 s a turn: its turn at 102.0 is near
    fast, exact = both_modes(co_resident_scenario(unload_at_s=at, reload=False), rows, counts)
    frame = exact.requests.set_index("id")
    assert frame.loc[1, "status"] == "dropped"  # B's model is not loaded again
    unload = exact.events.loc[exact.events["kind"] == "unload", "time_s"].iloc[0]
    assert unload > at and frame.loc[2, "first_scheduled_s"] < frame.loc[0, "finish_s"]


class ShortestPromptFirst(CoResident):
    """CoResident whose waiting queues are sorted by prompt length (then id): an order that never changes with the
    clock, declared so (``fixed-key``), as swap-aware's is."""

    name = "co-resident-shortest"
    waiting_order = "fixed-key"

    def order_waiting(self, instance, view) -> None:
        sort_queue(instance.waiting, ShorterPrompt())


class ShorterPrompt(QueueOrder):
    def before(self, a, b) -> bool:
        return (a.prompt_tokens, a.id) < (b.prompt_tokens, b.id)


def test_a_fixed_key_queue_is_asked_in_its_sorted_order_when_a_run_starts(hand_costs, co_resident, counts,
                                                                          monkeypatch):
    # B's second request (2,000 tokens) never finds KV room, so runs go on past B's boundaries. A short request for
    # B arrives during B's first decode of the run from 101.0: it sorts ahead and fits, so it cuts the run. A's
    # turn comes next, and the run A's step could start must not pass B's next boundary, where B's sort puts the
    # short request at the head and starts it. Asked in arrival order (the long request at the head, the short one
    # behind it), B's queue looked stuck: the run passed B's turns and the short request waited for A's finish.
    import sim.policies.registry as registry

    monkeypatch.setitem(registry._REGISTRY, ShortestPromptFirst.name, ShortestPromptFirst)
    kv_room(monkeypatch, (SMALL, LARGE), {SMALL: 7, LARGE: 13}, 30 * block_bytes(LARGE))
    arrives = 101.0 + a(101) + b(201) / 2
    rows = [(100.0, SMALL, 100, 30), (100.2, LARGE, 200, 40), (100.3, LARGE, 2000, 5), (arrives, LARGE, 50, 5)]
    fast, exact = both_modes(co_resident_scenario(policy=ShortestPromptFirst.name), rows, counts)
    starts = 101.0 + a(101) + b(201) + a(102)
    for result in (fast, exact):
        frame = result.requests.set_index("id")
        assert frame.loc[3, "first_scheduled_s"] == pytest.approx(starts, rel=1e-12, abs=0)
        assert frame.loc[2, "status"] == "dropped"  # never fits
    assert fast.counts[1][:1] == [2] and fast.counts[2] >= 1  # a run went past B's stuck head, and was cut


DYADIC_STEP_S = {SMALL: 2**-6 + 2**-10, LARGE: 2**-5 + 2**-9}
"""One decode iteration of one sequence, with no cost per context token: sums of these are exact in floating point
whatever their order, so an iteration's end is the same number in both modes and an arrival can land on it."""


@pytest.fixture
def dyadic_costs(monkeypatch):
    def step_coefficients(self, batch, gpu_share=1.0):
        return StepCoefficients(DYADIC_STEP_S[self.spec.name] * batch, 0.0)

    def mixed_step_s(self, batch, context_tokens, prefill_tokens, prefill_quadratic, prefills, gpu_share=1.0):
        return PREFILL_S if prefills else step_coefficients(self, batch).step_s(context_tokens)

    monkeypatch.setattr(ModelCosts, "step_coefficients", step_coefficients)
    monkeypatch.setattr(ModelCosts, "mixed_step_s", mixed_step_s)


@pytest.mark.parametrize("models, arrival_s", [
    # A alone: prefilled by 100.5, then a fast-forward window of decodes; C arrives at its third's end.
    ((SMALL,), 100.5 + 3 * DYADIC_STEP_S[SMALL]),
    # A and B decode in turn from 101.0 (a time-shared run); C, of A's model, arrives at the end of B's first
    # decode, the instant A's turn would start.
    ((SMALL, LARGE), 101.0 + DYADIC_STEP_S[SMALL] + DYADIC_STEP_S[LARGE]),
], ids=["window", "time-shared run"])
def test_an_arrival_at_an_iterations_end_joins_the_next_iteration_in_both_modes(dyadic_costs, co_resident, models,
                                                                                 arrival_s):
    """Arrivals come before a step's end at the same instant, so C is scheduled at once, in the iteration that
    starts there, and its prefill (half a second) gives its first token; a fast-forward window or run used to
    apply the iteration ending at the arrival first, and scheduled C one iteration later."""
    rows = [(100.0, SMALL, 100, 10), (100.2, LARGE, 200, 8)][:len(models)] + [(arrival_s, SMALL, 50, 3)]
    for mode in ("exact", "fast"):
        requests = simulate(co_resident_scenario(models), chunks=chunk(rows), mode=mode).requests.set_index("id")
        late = requests.loc[len(rows) - 1]
        assert late["first_scheduled_s"] == arrival_s, mode
        assert late["first_token_s"] == arrival_s + PREFILL_S, mode
