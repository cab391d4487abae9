"""A policy's own preemptions at random times, on one or two models (sharing a GPU or not), with or without prefix
caching (Hypothesis).

Each run ends, accounts for every request, gives fast-forward the per-iteration reference's times, and loses
no request more time to its pauses (KV out, KV in, recompute, waiting) than it spent in the system: a swap-in
that began before its swap-out ended, or a recompute charged for prompt tokens it found cached, broke that.
Set ``MMSIM_RANDOM_EXAMPLES`` for a longer hunt.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.policies import registry
from sim.policies.static import StaticPolicy
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import assert_same_times, wall_clock_limit

EXAMPLES = max(10, int(os.environ.get("MMSIM_RANDOM_EXAMPLES", "60")) // 3)
RUN_LIMIT_S = 60
LOSSES = ["lost_kv_out_s", "lost_kv_in_s", "lost_recompute_s", "lost_waiting_s", "lost_reload_s", "lost_unload_s"]


class Preempter(StaticPolicy):
    """Static placement; at each of ``times_s`` it preempts, on every instance with a decoding request, the
    ``pick``-th of them (modulo how many) by ``modes`` in turn."""

    name = "random-preempter"

    @classmethod
    def param_defaults(cls) -> dict:
        return {**super().param_defaults(), "times_s": (), "modes": ("swap",), "pick": 0,
                "moves": False}  # True: run as a Mover

    def setup(self, view) -> None:
        super().setup(view)
        for k, time_s in enumerate(self.times_s):
            view.call_at(time_s, lambda v, k=k: self.preempt_some(v, k))

    def preempt_some(self, view, k: int) -> None:
        for instance in view.instances():
            view.sync(instance.gpu)
            if instance.status == "ready" and instance.running:
                request = instance.running[(self.pick + k) % len(instance.running)]
                view.preempt(instance, request, self.modes[k % len(self.modes)])
                self.after_preempt(view, instance, request)

    def after_preempt(self, view, instance, request) -> None:
        """Nothing more, unless the policy also moves requests."""


class Mover(Preempter):
    """A :class:`Preempter` that then assigns each request it preempted, and the youngest waiting one, to another
    replica of the model: at once, or (preempted mid-step) as the instance's step ends. Its hook on every step
    keeps fast-forward to windows of one iteration."""

    def setup(self, view) -> None:
        self.leaving: list = []
        super().setup(view)

    def after_preempt(self, view, instance, request) -> None:
        self.move(view, instance, request)
        if instance.waiting:
            self.move(view, instance, instance.waiting[-1])

    def move(self, view, instance, request) -> None:
        """Queue ``request`` at another replica if it is queued; one preempted mid-step waits for the step's end."""
        others = [other for other in view.instances_of(request.model) if other is not instance]
        if not others:
            return
        if request.state in ("waiting", "swapped"):
            view.assign(request, others[0])
        elif request.state == "running":
            self.leaving.append(request)

    def on_step(self, instance, view) -> None:
        leaving, self.leaving = self.leaving, []
        for request in leaving:
            if request.instance is instance:
                self.move(view, instance, request)
            elif request.state == "running":
                self.leaving.append(request)


@st.composite
def cases(draw):
    models = draw(st.sampled_from([["qwen2.5-3b"], ["qwen2.5-3b", "qwen3-8b"]]))
    rows = draw(st.lists(st.tuples(st.integers(0, 200).map(lambda centis: centis / 100), st.sampled_from(models),
                                   st.one_of(st.integers(1, 3000), st.integers(10_000, 20_000)), st.integers(1, 400),
                                   st.sampled_from([(), (1,), (1, 2), (1, 2, 3)])), min_size=1, max_size=10))
    times = draw(st.one_of(
        st.lists(st.integers(0, 3000).map(lambda centis: centis / 100), min_size=1, max_size=12),
        # a burst, one every few iterations: swap-outs queue on the link if nothing waits for them
        st.tuples(st.integers(0, 1000), st.integers(1, 10), st.integers(5, 40)).map(
            lambda burst: [burst[0] / 100 + k * burst[1] / 100 for k in range(burst[2])])))
    modes = draw(st.lists(st.sampled_from(["swap", "recompute"]), min_size=1, max_size=3))
    replicas = draw(st.integers(1, 2))  # with two, preempted and waiting requests move between them
    scenario = parse_scenario({
        "name": "preempting", "seed": 1, "profile": "paper-rtx5000",
        # One GPU for two models: they take turns, and a preemption asked while the other's step runs is at once.
        "cluster": {"nodes": 1, "gpus_per_node": draw(st.integers(1, len(models) * replicas)),
                    "host_memory_gb": draw(st.sampled_from([0.05, 64]))},
        "models": [{"name": m, "replicas": replicas} for m in models],
        "workload": {"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                   "mix": {m: 1.0 for m in models}, "prompt_tokens": {"dist": "constant", "value": 10},
                                   "output_tokens": {"dist": "constant", "value": 10}},
                     "prefix_block_tokens": 512},
        "engine": {"max_num_seqs": draw(st.sampled_from([2, 8])), "max_num_batched_tokens": 2048,
                   "prefix_caching": draw(st.booleans())},
    }, "random")
    params = {"times_s": tuple(sorted(times)), "modes": tuple(modes), "pick": draw(st.integers(0, 3)),
              "moves": replicas > 1 and draw(st.booleans())}
    return scenario, rows, params


def run(scenario, rows, params: dict, mode: str):
    gaps, models, prompts, outputs, prefix_ids = zip(*rows)
    ids = np.empty(len(rows), object)
    ids[:] = [value or None for value in prefix_ids]
    chunks = [RequestChunk(np.cumsum(gaps), np.array(models, object), np.array(prompts), np.array(outputs),
                           prefix_ids=ids)]
    policy = Mover if params["moves"] else Preempter
    registry._REGISTRY[Preempter.name] = lambda **given: policy(**{**params, **given})
    try:
        return simulate(scenario, policy=Preempter.name, chunks=chunks, mode=mode)
    finally:
        del registry._REGISTRY[Preempter.name]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_a_policys_preemptions_lose_no_request_more_time_than_it_spent(case):
    scenario, rows, params = case
    with wall_clock_limit(RUN_LIMIT_S):
        fast = run(scenario, rows, params, "fast")
        exact = run(scenario, rows, params, "exact")
    frame = fast.requests.set_index("id").sort_index()
    assert fast.summary["requests_completed"] == len(rows), set(frame["drop_reason"])
    reference = exact.requests.set_index("id").sort_index()
    assert_same_times(frame, reference, label=params)
    assert (frame["preemptions"] == reference["preemptions"]).all()
    lost = frame[LOSSES].sum(axis=1)
    assert (lost <= frame["e2e_s"] * (1 + 1e-9) + 1e-9).all(), frame.loc[lost > frame["e2e_s"], LOSSES + ["e2e_s"]]
